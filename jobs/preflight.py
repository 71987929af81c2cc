"""Check backbones before a sweep: `python jobs/preflight.py backbones=[qwen3_5-4b,gemma4-12b]`.

Run it first on a GPU node. For each backbone it loads the engine(s), scores a fixed small
set of demo prompts and prints answer mass per request kind, hf-vs-vLLM agreement,
prefix-cache hit rate, requests/s, prompt tokens/s and GPU memory, and how far an answer
moves with its batch on this hardware (each prompt alone vs all in one call, prefix cache on
vs off), written as an invariance record to <store>/invariance/<backbone>.json for every later
run's manifest.json; it exits 1 when a check fails (low mass, engines disagreeing), 2 on a bad
config.

Preflight options (the rest are sweep overrides, as for jobs/sweep.py):
  min_mass=0.5     lowest allowed median answer mass per request kind
  min_p5=0.05      lowest allowed 5th percentile
  tolerance=0.05   largest allowed |P(yes) hf - P(yes) vLLM|
  compare_hf=true  also score vLLM backbones with transformers
  images=3         demo images to ask about
  invariance=true  measure the batch invariance (loads each engine once more, prefix cache off)
On CPU the default is the tiny built-in model (`backbones=[smoke]`): random weights, so its
mass is low and the check fails by design (add min_mass=0 min_p5=0 to see it pass).
"""
from __future__ import annotations

import logging
import sys
from pathlib import Path

if not __package__:  # run as a file (python jobs/<job>.py): this checkout's code, from a fresh clone
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pipeline import console  # noqa: E402
from pipeline.cli import guarded  # noqa: E402
from pipeline.config import ConfigError, load_config  # noqa: E402
from pipeline.preflight_checks import PreflightOptions, run_preflight  # noqa: E402


def flag(value: str) -> bool:
    """true/false (1/0, yes/no); anything else is refused rather than read as false."""
    if value.lower() not in ("1", "true", "yes", "0", "false", "no"):
        raise ValueError(value)
    return value.lower() in ("1", "true", "yes")


OPTIONS = {"min_mass": ("min_median_mass", float), "min_p5": ("min_p5_mass", float), "tolerance": ("tolerance", float),
           "compare_hf": ("compare_hf", flag), "images": ("images", int), "invariance": ("invariance", flag)}


@guarded  # bad input: one line, exit 2; storage failures exit 4; Ctrl-C exits 130
def main(argv: list[str]) -> int:
    if {"-h", "--help"} & set(argv):
        print(__doc__)
        return 0
    argv = console.configure(argv, logging.WARNING)  # --verbose: Ray's and transformers' own messages too
    options, rest = PreflightOptions(), []
    for arg in argv:
        key, _, value = arg.partition("=")
        if key in OPTIONS:
            field, parse = OPTIONS[key]
            try:
                setattr(options, field, parse(value))
            except ValueError:
                print(f"preflight: {key}={value!r} is not a valid {parse.__name__}", file=sys.stderr)
                return 2
        else:
            rest.append(arg)
    try:
        # The demo benchmark supplies the prompts, whatever the sweep preset lists.
        preset = [] if any(a.startswith("sweep=") for a in rest) else ["sweep=smoke"]
        cfg = load_config([*preset, *rest, "benchmarks=[demo]"])
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    report, ok = run_preflight(cfg, options)
    print(report)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
