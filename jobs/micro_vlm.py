r"""Train or measure the built-in micro VLM (builtin:micro-vlm):

    python jobs/micro_vlm.py train [out=operators/weights/micro_vlm] [seconds=2400] [seed=0]
    python jobs/micro_vlm.py evaluate [backbone=micro] [n_per_type=200] [seed=0] [out=DIR]

`train` runs the recipe of operators/micro_vlm_recipe.py: a Qwen3-VL (1,219,008 parameters, text head_dim
32) trained on fresh draws of the demo world's three yes/no request kinds, saved with save_pretrained
in float16 (2.4 MB). It trains for `seconds` of wall time (threads=2 by default, threads=1 on a
shared 2-core machine); `init=` continues from a saved folder, with that folder's tokenizer;
`per_step=image:N,caption:N,holistic:N` sets how many requests of each kind a step draws;
`hybrid_share=` draws that share of caption-only requests from hybrid captions (a thing stated
beside a thing denied), `negbench_share=` that share of those in the multiple-choice part's short
form (one thing stated, one denied). The shipped weights took six runs (threads=1, 2 cores shared
with other jobs):

    python jobs/micro_vlm.py train out=/tmp/micro-1 seconds=2400 threads=1
    python jobs/micro_vlm.py train init=/tmp/micro-1 out=/tmp/micro-2 seconds=2700 threads=1 lr=0.001 warmup_seconds=0 \
        position_weight=1 type_weights=existence:0.5,attribute:1.5,count:1,negation:1.5,spatial:2
    python jobs/micro_vlm.py train init=/tmp/micro-2 out=/tmp/micro-3 seconds=2100 threads=1 seed=2 lr=0.0003 warmup_seconds=0 \
        position_weight=1 type_weights=existence:0.5,attribute:1.5,count:1,negation:1.5,spatial:2 \
        per_step=image:64,caption:32,holistic:32
    python jobs/micro_vlm.py train init=/tmp/micro-3 out=/tmp/micro-4 seconds=2100 threads=1 seed=4 lr=0.0003 warmup_seconds=0 \
        position_weight=1 type_weights=existence:0.5,attribute:1.5,count:1,negation:1.5,spatial:2 \
        per_step=image:64,caption:48,holistic:24 hybrid_share=0.5
    python jobs/micro_vlm.py train init=/tmp/micro-4 out=/tmp/micro-5 seconds=2100 threads=1 seed=5 lr=0.0003 warmup_seconds=0 \
        position_weight=1 type_weights=existence:0.5,attribute:1.5,count:1,negation:1.5,spatial:2 \
        per_step=image:64,caption:48,holistic:24 hybrid_share=0.6 negbench_share=0.5
    python jobs/micro_vlm.py train init=/tmp/micro-5 seconds=2100 threads=1 seed=6 lr=0.0002 warmup_seconds=0 \
        position_weight=1 type_weights=existence:0.5,attribute:1.5,count:1,negation:1.5,spatial:2 \
        per_step=image:64,caption:48,holistic:24 hybrid_share=0.6 negbench_share=0.7

The first alone reached image 0.78 on held-out draws (spatial 0.59); the second adds a head asking
each merged visual token for its cell's row and column and weights the harder fact types: held-out
image 0.967 (every fact type >= 0.91), caption-only 0.958, holistic AUC 0.990, answer mass 1.00.
The third (2026-12-05, 35 minutes) continues at a lower rate on fresh draws of another seed, twice
as many image requests per step: held-out image 0.990 (every fact type >= 0.97), caption-only
0.956 (attribute 0.83: the floor of 0.97 is still missed), holistic AUC 0.995; on the demo
benchmark's own requests image 0.993 (from 0.948), caption-only 0.899 (from 0.871), holistic AUC
0.999. The first two runs drew from the whole demo world (commit 6456ff0), the third and fourth
from today's sampler. A caption-heavy try from the third (seed=3, per_step=image:48,caption:64,
holistic:16, attribute:3) reached held-out caption-only 0.962 and left the demo's requests as
they were; not shipped. Every caption-only miss on the demo's requests (13 of 139) was one kind:
the thing a hybrid caption does name, asked about ("a star and no circle", "Is there a star?":
No). The fourth run (2026-12-06, 35 minutes) draws half its caption-only requests from hybrid
captions: on `evaluate`'s 600 held-out hybrid-caption requests 0.870 -> 0.915 (attribute 0.20 ->
0.62, existence 0.85 -> 0.87, denied things 0.997 -> 0.987); held-out caption-only 0.966 (attribute
0.89), image 0.993, holistic AUC 0.996; the demo's requests caption-only 0.914 (existence
0.78 -> 0.85, but 3 of its 22 denied things now at p = 0.50-0.53), image 0.993, holistic AUC
1.000. The caption-only floor of 0.97 was still missed: the hybrid existence questions were where.
The fifth run (2026-12-06, 35 minutes) draws 60% of its caption-only requests from hybrid captions,
half of those in the multiple-choice part's short form: held-out caption-only 0.966 -> 0.986 (the
floor met; attribute 0.89 -> 0.94), image 0.996, holistic AUC 0.997; hybrid captions 0.915 ->
0.933; the demo's requests caption-only 0.914 -> 0.964 (5 misses of 139: 3 of its 22 denied
things, 2 of 59 stated ones), image 0.996, holistic AUC 1.000. The sixth (2026-12-06, 35
minutes, 70% of the hybrid draws in the short form, a lower rate) meets every floor on both sets:
held-out image 0.997 (every fact type >= 0.99), caption-only 0.988, holistic AUC 0.998; the
demo's requests image 0.996 (spatial 0.96), caption-only 1.000 (139 of 139), holistic AUC 1.000;
hybrid captions 0.943 (attribute 0.80); median answer mass 1.00. It is the shipped one.
Today's sampler never draws the large demo's reserved space (conf/benchmarks/demo_large.yaml), so
the first two commands now train a model that has never seen a drawn benchmark item; one such run (2026-12-05, same machine) stopped short of
the second run's (held-out image 0.845, attribute 0.71, caption-only 0.962, holistic AUC 0.87): a
longer or luckier run is needed before the weights are replaced and the default run moves to the
large demo. A second try (2026-12-05, seed=1, position_weight=1 and attribute:2 from the first run
on) reached held-out image 0.865, spatial 0.9, attribute 0.68, caption-only 0.955. Both fail the
same way: asked the colour of a shape that is there in another colour ("Is the square green?"
beside a red square) they answer Yes (0-29% right, against 27-100% for the second run's model): colour
is not yet bound to shape. A recipe that draws those near misses more often is the next thing to try.
`evaluate` answers held-out draws and the demo benchmark's own requests through the engine the
backbone config names (hf or vllm) and prints accuracy per request kind and fact type, the
holistic AUC and the median answer mass, against issue 27's floors (pipeline/micro_vlm_training.py), and
the same for held-out caption-only requests about hybrid captions (the hardest kind for them). Its
backbone is a config name (conf/backbones/micro.yaml); to measure a folder `train` wrote elsewhere,
give a backbones/<name>.yaml with model_id: <that folder> in a $DEPICT_CONF folder.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

if not __package__:  # run as a file (python jobs/<job>.py): this checkout's code, from a fresh clone
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pipeline.micro_vlm_training import evaluate_micro_vlm, train_micro_vlm  # noqa: E402

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


def requests_per_step(text: str) -> dict[str, int]:
    """`image:64,caption:32,holistic:32` -> requests of each kind in one training step."""
    from operators.demo_world import REQUEST_KINDS

    out = {}
    for part in text.split(","):
        name, _, value = part.partition(":")
        if name not in REQUEST_KINDS:
            raise ValueError(f"unknown request kind {name!r}; valid: {', '.join(REQUEST_KINDS)}")
        out[name] = int(value)
    return out


requests_per_step.__name__ = "list of kind:count"


def share(value: str) -> float:
    """`hybrid_share=0.6`: a share of requests."""
    number = float(value)
    if not 0.0 <= number <= 1.0:
        raise ValueError(value)
    return number


share.__name__ = "number between 0 and 1"
ALLOWED = {"train": {"out": str, "seconds": float, "seed": int, "threads": int, "lr": float, "init": str,
                     "warmup_seconds": float, "position_weight": float, "type_weights": weights_of_types,
                     "per_step": requests_per_step, "hybrid_share": share, "negbench_share": share},
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
