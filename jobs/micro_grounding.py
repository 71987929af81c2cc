r"""Train or measure the micro GroundingDINO (operators/micro_grounding_recipe.py):

    python jobs/micro_grounding.py train out=DIR [seconds=3600] [threads=1] [OPTION=VALUE ...]
    python jobs/micro_grounding.py train out=DIR seconds=S resume=DIR/checkpoint
    python jobs/micro_grounding.py evaluate model=DIR [seed=1] [scenes=300] [threshold=T] [out=DIR]
    python jobs/micro_grounding.py calibrate model=DIR [seed=2] [scenes=150]

`train` trains a transformers GroundingDinoForObjectDetection from scratch on the demo world's
training scenes, one phrase per query ("red circle", "circle", "red circles", and phrases that
name nothing there), for `seconds` of wall time. Every `checkpoint_minutes` the run goes to
DIR/checkpoint (model, optimizer, step, clock, generators) and is measured on held-out scenes
(one JSON line in the log); `resume=DIR/checkpoint` continues that run with its own options
(presence_weight, class_weight, checkpoint_minutes, eval_scenes and threads may change).
Options (operators/micro_grounding_recipe.py DEFAULTS): seed, threads, lr, batch, absent_share,
plural_share, class_weight, presence_weight, bbox_weight, giou_weight, warmup_steps, curriculum_seconds, d_model,
queries, swin_embed, text_hidden, text_layers, encoder_layers, decoder_layers, image_size,
aux_loss, two_stage, checkpoint_minutes, eval_scenes.

`calibrate` chooses the box (and text) threshold to run a saved detector at, on TRAINING scenes
(never the held-out ones `evaluate` measures): the grid value whose worst floor quantity is
highest; it prints the table and the choice (what `evidence.detector.box_threshold` and
`text_threshold` of a preset then say).

`evaluate` loads a saved model through operators/grounding.py (default thresholds 0.30 box / 0.25
text, or `threshold=T` for both) and reports
recall@IoU0.5 for colour + shape, shape-only and several-object phrases, the share of absent
phrases with no kept box, and whether queries asked alone match the batch, against FLOORS
(exit 1 when one is missed).

The shipped weights (builtin:micro-grounding-dino, operators/weights/micro_grounding_dino, 938,606
parameters, 3.8 MB in float32) are the checkpoint after 6,001 s (19,309 steps of 16 queries) of one
run on this project's 2-core build machine, shared with another training (threads=1):

    python jobs/micro_grounding.py train out=DIR seconds=14400 threads=1 lr=0.0004 absent_share=0.4 \
        class_weight=3 d_model=64 swin_embed=16 text_hidden=64 text_layers=2 encoder_layers=2 \
        decoder_layers=3 checkpoint_minutes=10 eval_scenes=300

resumed after 1,200 s with `presence_weight=3` (the presence loss was added then: before it, the
model found boxes but scored absent phrases like present ones), and taken at its latest checkpoint
when it was shipped (the run goes on). `calibrate` on training scenes chose 0.1; at it, `evaluate` on 300
held-out scenes: recall colour + shape 0.995, shape 0.985, several-object 0.983, absent phrases
clean 1.000, batch-invariant; at the operator's default thresholds (0.30 / 0.25) recall is lower
(0.92, 0.87, 0.84) because correct boxes score between 0.1 and 0.3.

Every argument is checked before any work: a bad value is one line and exit 2; an output
folder that cannot be written, one line and exit 4.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

if not __package__:  # run as a file (python jobs/<job>.py): this checkout's code, from a fresh clone
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pipeline.cli import InputError, guarded  # noqa: E402
from pipeline.micro_grounding_training import (  # noqa: E402
    DEFAULTS,
    calibrate_micro_grounding,
    check_train_arguments,
    check_writable,
    evaluate_micro_grounding,
    train_micro_grounding,
)


def boolean(value: str) -> bool:
    if value.lower() not in ("true", "false", "1", "0"):
        raise ValueError(value)
    return value.lower() in ("true", "1")


def _kind(default) -> type:
    return boolean if isinstance(default, bool) else type(default)


WRITTEN_AS = {boolean: "true or false", float: "number", int: "whole number", str: "text"}
ALLOWED = {"train": {"out": str, "seconds": float, "resume": str, **{k: _kind(v) for k, v in DEFAULTS.items()}},
           "evaluate": {"model": str, "seed": int, "scenes": int, "threshold": float, "out": str},
           "calibrate": {"model": str, "seed": int, "scenes": int}}


def parse(command: str, rest: list[str]) -> dict:
    """key=value arguments -> typed values, every one checked; InputError (one line) otherwise."""
    args = {}
    for arg in rest:
        key, sep, value = arg.partition("=")
        if not sep or key not in ALLOWED[command]:
            raise InputError(f"unexpected argument {arg!r} for {command} (valid: {', '.join(ALLOWED[command])})")
        try:
            args[key] = ALLOWED[command][key](value)
        except ValueError:
            raise InputError(f"{key} must be a {WRITTEN_AS[ALLOWED[command][key]]}, got {value!r}") from None
    try:
        if command == "train":
            if "out" not in args:
                raise ValueError("train needs out=DIR (a folder of your own)")
            options = {k: v for k, v in args.items() if k not in ("out", "seconds", "resume")}
            check_train_arguments(args.setdefault("seconds", 3600.0), args.get("resume"), options)
        else:
            if "model" not in args:
                raise ValueError(f"{command} needs model=DIR (a folder train wrote) or a model id")
            if args.get("scenes", 1) < 1:
                raise ValueError(f"scenes must be a whole number of 1 or more, got {args['scenes']}")
            if not 0.0 < args.get("threshold", 0.5) < 1.0:
                raise ValueError(f"threshold must be a number between 0 and 1, got {args['threshold']}")
    except ValueError as exc:
        raise InputError(str(exc)) from None
    return args


@guarded  # a bad argument: one line, exit 2; an output that cannot be written: one line, exit 4
def main(argv: list[str]) -> int:
    if not argv or {"-h", "--help"} & set(argv):
        print(__doc__)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command not in ALLOWED:
        print(f"the first argument must be train, evaluate or calibrate, got {command!r}", file=sys.stderr)
        return 2
    args = parse(command, rest)
    if "out" in args:
        check_writable(args["out"])
    if command == "train":
        report = train_micro_grounding(args.pop("out"), args.pop("seconds"), args.pop("resume", None), **args)
        print(json.dumps(report))
        return 0
    if command == "calibrate":
        calibrate_micro_grounding(**args)
        return 0
    report = evaluate_micro_grounding(**args)
    return 0 if report["passes"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
