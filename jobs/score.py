"""Score your own pairs: `python jobs/score.py pairs=FILE [key=value ...]`.

FILE is CSV, JSON Lines or Parquet with an image column (a path, relative to the file's
folder, or a URI such as s3://...; or image bytes in Parquet) and a caption column.
Keys: out=DIR (default: next to FILE, <name>.depict/), image=<column> caption=<column>,
backbone=smoke, metrics=[depict,vqascore], generator=<backbone that writes questions>,
questions=FILE (caption, question columns: use these instead of generating), root=DIR
(the answer store is <root>/store, shared with jobs/sweep.py), executor=auto|local|ray,
strict=false. Any other key is a sweep config override (lam=0.3, backbone_overrides....).
Answers are cached: a rerun, or a run killed half way, computes only what is missing.
"""
from __future__ import annotations

import sys
from pathlib import Path

if not __package__:  # run as a file (python jobs/<job>.py): this checkout's code, from a fresh clone
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pipeline import console  # noqa: E402
from pipeline.api import PairErrors  # noqa: E402
from pipeline.cli import guarded, key_values  # noqa: E402
from pipeline.config import ConfigError  # noqa: E402
from pipeline.pairs import PairsFileError, PairsJob, run_pairs  # noqa: E402

JOB_KEYS = {"pairs", "out", "image", "caption", "backbone", "metrics", "generator", "questions", "root", "executor", "strict"}


def parse(argv: list[str]) -> PairsJob:
    known, overrides = [], []
    for arg in argv:
        if "=" not in arg:
            raise ConfigError(arg, "arguments are written key=value (e.g. pairs=my_pairs.csv)")
        (known if arg.split("=", 1)[0] in JOB_KEYS else overrides).append(arg)
    values = key_values(known)
    if "pairs" not in values:
        raise ConfigError("pairs", "which file? pairs=FILE (CSV, JSONL or Parquet)")
    metrics = values.pop("metrics", None)
    if isinstance(metrics, str):
        metrics = [metrics]
    job = PairsJob(**{k: v for k, v in values.items()}, overrides=overrides)
    if metrics is not None:
        job.metrics = list(metrics)
    return job


@guarded  # bad input: one line, exit 2; storage failures exit 4; Ctrl-C exits 130
def main(argv: list[str]) -> int:
    if not argv or {"-h", "--help"} & set(argv):
        print(__doc__)
        return 0 if argv else 2
    argv = console.configure(argv)  # --verbose: Ray's and transformers' own messages too
    try:
        job = parse(argv)
        _, summary = run_pairs(job)
    except (ConfigError, PairsFileError, PairErrors) as exc:
        print(exc, file=sys.stderr)
        return 2
    print(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
