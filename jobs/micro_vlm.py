"""Train or measure the built-in micro VLM (builtin:micro-vlm):

    python jobs/micro_vlm.py train [out=operators/weights/micro_vlm] [seconds=2400] [seed=0]
    python jobs/micro_vlm.py evaluate [backbone=micro] [n_per_type=200] [seed=0] [out=DIR]

`train` runs the recipe of operators/micro_vlm.py from scratch: a Qwen3-VL (1,219,008 parameters,
text head_dim 32) trained on fresh draws of the demo world's three yes/no request kinds, saved with
save_pretrained in float16 (2.4 MB). It trains for `seconds` of wall time (default 2400: 40 minutes;
threads=2 by default, threads=1 on a shared 2-core machine). The first run (seed 0, threads=1, on 2
cores shared with other jobs: 3,303 steps, 384,688 examples) reached on held-out draws image 0.78
(existence 1.00, count 0.88, negation 0.72, attribute 0.69, spatial 0.59), caption-only 0.95,
holistic AUC 0.80, answer mass median 1.00: short of issue 27's floors, so builtin:micro-vlm is not
shipped yet (operators/weights/micro_vlm is where `train` writes by default, and where
operators.tiny_models looks for it).
`evaluate` answers held-out draws and the demo benchmark's own requests through the engine the
backbone config names (hf or vllm) and prints accuracy per request kind and fact type, the
holistic AUC and the median answer mass, against issue 27's floors (pipeline/micro_vlm.py). Its
backbone is a config name: until the weights ship with conf/backbones/micro.yaml, give one in a
$DEPICT_CONF folder (backbones/micro.yaml with model_id: <the folder `train` wrote>).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

if not __package__:  # run as a file (python jobs/<job>.py): this checkout's code, from a fresh clone
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pipeline.micro_vlm import evaluate_micro_vlm, train_micro_vlm  # noqa: E402

DEFAULT_OUT = str(Path(__file__).resolve().parent.parent / "operators" / "weights" / "micro_vlm")
def weights_of_types(text: str) -> dict[str, float]:
    """`attribute:1.5,spatial:2` -> {"attribute": 1.5, "spatial": 2.0} (fact types of image questions)."""
    from operators.demo_world import FACT_TYPES

    out = {}
    for part in text.split(","):
        name, _, value = part.partition(":")
        if name not in FACT_TYPES.values():
            raise ValueError(f"unknown fact type {name!r}; valid: {', '.join(FACT_TYPES.values())}")
        out[name] = float(value)
    return out


weights_of_types.__name__ = "list of fact_type:weight"
ALLOWED = {"train": {"out": str, "seconds": float, "seed": int, "threads": int, "lr": float, "init": str,
                     "warmup_seconds": float, "position_weight": float, "type_weights": weights_of_types},
           "evaluate": {"backbone": str, "n_per_type": int, "seed": int, "out": str}}


def main(argv: list[str]) -> int:
    if not argv or {"-h", "--help"} & set(argv):
        print(__doc__)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command not in ALLOWED:
        print(f"the first argument must be train or evaluate, got {command!r}", file=sys.stderr)
        return 2
    args = {}
    for arg in rest:
        key, sep, value = arg.partition("=")
        if not sep or key not in ALLOWED[command]:
            print(f"unexpected argument {arg!r} for {command} (valid: {', '.join(ALLOWED[command])})", file=sys.stderr)
            return 2
        try:
            args[key] = ALLOWED[command][key](value)
        except ValueError:
            print(f"{key} must be a {ALLOWED[command][key].__name__}, got {value!r}", file=sys.stderr)
            return 2
    if command == "train":
        report = train_micro_vlm(args.pop("out", DEFAULT_OUT), args.pop("seconds", 2400.0), **args)
        print(json.dumps({k: v for k, v in report.items() if k != "history"}))
        return 0
    evaluate_micro_vlm(**args)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
