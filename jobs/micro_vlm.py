r"""Train or measure the built-in micro VLM (builtin:micro-vlm):

    python jobs/micro_vlm.py train out=DIR [seconds=2400] [seed=0] [checkpoint_minutes=10]
    python jobs/micro_vlm.py evaluate [backbone=micro] [n_per_type=200] [n_views=200] [n_writing=40] [seed=0] [out=DIR]
    python jobs/micro_vlm.py writing [backbone=micro-writer] [n=200] [seed=0] [judge=false]

`train` needs `out=`: a folder of your own, or `out=builtin` to replace the shipped weights
(operators/weights/micro_vlm, inside the installed package), which nothing else writes. Every
argument is checked and `out` is written to before training starts (a bad value: one line, exit
2; a folder that cannot be written: one line, exit 4). Every `checkpoint_minutes` the model is
saved to out/checkpoint (float32), so a kill or a failed final save loses minutes, not the run:
`resume=DIR/checkpoint out=DIR` goes on with that run where it stopped (its step, clock, schedule,
optimizer and draws), `init=DIR/checkpoint` starts a new run from its weights; the checkpoint is
removed once the final model is saved.

`train` runs the recipe of operators/micro_vlm_recipe.py: a Qwen3-VL (1,333,696 parameters, text
hidden 128 in 4 layers, head_dim 32, 2,048 positions) trained on fresh draws of the demo world,
saved with save_pretrained in float16 (2.7 MB) beside training.json (the options and the last
check). It trains for `seconds` of wall time (threads=2 by default, threads=1 on a shared 2-core
machine); `init=` continues from a saved folder, with that folder's tokenizer;
`per_step=image:N,caption:N,holistic:N,claim:N,view:N` sets how many requests of each kind a step
draws (`claim`: a claim statement on the scene, `view`: on one of the evidence checks' masked
views, true as far as the view still shows it: operators/demo_views.py); `hybrid_share=` draws
that share of caption-only requests from hybrid captions (a thing stated beside a thing denied),
`negbench_share=` that share of those in the multiple-choice part's short form (one thing stated,
one denied); `open_share=` that share of caption-only requests ask what their caption leaves
open (the colour of an uncoloured thing, whether a single thing is one of two, the relation
between unrelated things), trained toward P(yes) = 0.5; `write_per_step=depict:N,dsg:N,claims:N,
judge_holistic:N,judge_decomposed:N` adds writing lessons (operators/micro_vlm_writing.py: the
generation prompts answered as a faithful writer would), for which the tokenizer is trained on
the lessons too; `write_clause_weights=N,N,N` draws their captions with 1, 2 and 3 clauses that
often (default 45,45,10, the world's own mix) and `write_repeat_share=` at least that share of
them from captions that name one shape twice (default 0); `hidden=` (a multiple of 64; default
128) and `layers=` (default 4) size the text model of a run from scratch, and `layers=` with
`init=` deepens the saved model: its new layers start out computing nothing
(operators/micro_vlm_recipe.py's `deepen`), so training goes on from what it writes.

The shipped weights are one run from scratch of 14,409 s (threads=1, 2 cores shared with other
work; 7,548 steps, 946,338 requests and lessons), started as

    python jobs/micro_vlm.py train out=DIR seconds=14400 threads=1 lr=0.0015 warmup_seconds=900 \
        position_weight=1 type_weights=existence:0.5,attribute:1.5,count:1,negation:1.5,spatial:2 \
        per_step=image:64,caption:48,holistic:24 hybrid_share=0.5 negbench_share=0.5 open_share=0.3 \
        write_per_step=depict:2,dsg:2,claims:2,judge_holistic:2,judge_decomposed:2

(its seed was not recorded; the recipe now writes training.json beside the weights) and resumed
three times with a new mix (editing the checkpoint's training.json): at 4,202 s
write_per_step=depict:4,dsg:4,claims:4,judge_holistic:2,judge_decomposed:4; at 6,003 s
per_step=image:32,caption:24,holistic:12 and write_per_step=depict:6,dsg:6,claims:6,
judge_holistic:2,judge_decomposed:2; at 6,604 s per_step=image:32,caption:24,holistic:12,claim:8,view:8
(claims on scenes and on masked views, for the evidence checks). Its last held-out check: image
1.000, caption 1.000, holistic 0.95, claims 1.000, claims on masked views 0.995, open questions'
median |P(yes) - 0.5| 0.013; the writing is not yet good enough to ship as a question writer
(greedy text equal to the faithful text for 0.375-0.625 of 8 held-out lessons per format), so
conf/backbones/micro.yaml keeps `writes_questions: false`.

The shipped question writer (builtin:micro-writer, operators/weights/micro_writer,
conf/backbones/micro-writer.yaml) is the same recipe and model size taught to write only, one run
from scratch started as

    python jobs/micro_vlm.py train out=DIR seconds=14400 threads=1 warmup_seconds=0 per_step=caption:1 \
        write_per_step=depict:8,dsg:8,claims:8

(lr 0.002, refusal_share 0.05 and write_open_share 0.25 by default; seed 0) and resumed at 1,800 s
with seconds=7800 threads=2 (editing the checkpoint's training.json), so that its schedule ended
on the machine's time (7,802 s, 26,065 steps), then trained on from those weights as

    python jobs/micro_vlm.py train out=DIR init=WRITER seconds=5100 threads=2 seed=1 lr=0.001 \
        warmup_seconds=0 per_step=caption:1 write_per_step=depict:8,dsg:8,claims:8

and resumed at 1,800 s with write_clause_weights=30,40,30 (three-clause captions, where its
mistakes were, three times as often): 5,102 s, 15,915 steps more; then its files copied into
operators/weights/micro_writer (training.json, the second run's, among them). On 200 held-out
captions (`writing`) that 4-layer writer parsed every set and wrote exactly the world's 0.945
(DEPICT), 0.905 (DSG) and 0.955 (claims) of the time. It was then deepened to 6 layers
(1,727,552 parameters; the two new layers start as no-ops) and trained on as

    python jobs/micro_vlm.py train out=DIR init=WRITER layers=6 seconds=6300 threads=2 seed=5 \
        lr=0.0008 warmup_seconds=0 per_step=caption:1 write_per_step=depict:8,dsg:8,claims:8 \
        write_clause_weights=20,50,30 write_repeat_share=0.5

(11,131 steps more; on the same 200 draws 0.970, 0.930 and 0.950), then trained on with more DSG
lessons and more captions that name one shape twice, at a lower rate:

    python jobs/micro_vlm.py train out=DIR init=WRITER seconds=4800 threads=2 seed=6 lr=0.0005 \
        warmup_seconds=0 per_step=caption:1 write_per_step=depict:6,dsg:12,claims:6 \
        write_clause_weights=20,50,30 write_repeat_share=0.6

(6,948 steps more), which is what operators/weights/micro_writer holds: on the same 200 draws
0.965 (DEPICT), 0.935 (DSG) and 0.960 (claims), every miss but one DSG graph in captions that name
one shape twice (0.89-0.94 of two-clause ones, 0.60-0.73 of three-clause ones); with seed=1
0.980, 0.960 and 0.985; over seeds 1 to 5 (1,000 draws) 0.966, 0.951 and 0.970 (the 6-layer
writer before it: 0.967, 0.944, 0.965); on the default's 185 captions 0.995 (DEPICT) and 0.989
(DSG), which is what the default relies on.

It draws only the demo world's training content slots (operators/demo_world.py: a hash of each
scene's objects and each caption's words), so neither the held-out draws `evaluate` measures nor
any benchmark item was ever a training draw, word for word or otherwise.

`evaluate` answers held-out draws and the demo benchmark's own requests through the engine the
backbone config names (hf or vllm) and prints accuracy per request kind and fact type, the
holistic AUC and the median answer mass, for caption-only questions the caption leaves open the
median |P(yes) - 0.5| (kind caption_open), against the floors of `FLOORS`, and the same for
held-out caption-only requests about hybrid captions (the hardest kind for them); claims on masked
views of `n_views` held-out scenes (pipeline/micro_vlm_views.py: how far hiding a true claim's
evidence drops P(yes), how little a matched control moves it, and how well the causal delta tells
true claims from false); for a backbone that writes questions, `n_writing` held-out captions'
question sets and judge verdicts (pipeline/micro_vlm_writing.py: parse rate and exact match per
format); then how many held-out and benchmark requests repeat a request of a 300,000-draw training
stream word for word. Its backbone is a config name (conf/backbones/micro.yaml); to measure a
folder `train` wrote elsewhere, give a backbones/<name>.yaml with model_id: <that folder> in a
$DEPICT_CONF folder.

`writing` measures a question writer alone (default the shipped micro-writer): the three question
sets of `n` held-out captions through the backbone's engine and the run's templates, read by the
production parsers, with parse rate and exact match per format against the floors of
pipeline/micro_vlm_writing.py; `judge=true` adds both judge verdicts on the captions' scenes (for
a backbone that sees images).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

if not __package__:  # run as a file (python jobs/<job>.py): this checkout's code, from a fresh clone
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pipeline.cli import InputError, guarded  # noqa: E402
from pipeline.micro_vlm_training import (  # noqa: E402
    check_train_options,
    check_writable,
    evaluate_micro_vlm,
    evaluate_writing,
    fact_type_weights,
    lessons_per_step,
    requests_per_step,
    resume_options,
    shipped_folder,
    train_micro_vlm,
)

BUILTIN_OUT = "builtin"  # out=builtin: the explicit request to replace the shipped weights


def share(value: str) -> float:
    """`hybrid_share=0.6`: a share of requests."""
    number = float(value)
    if not 0.0 <= number <= 1.0:
        raise ValueError(value)
    return number


def yes_no(value: str) -> bool:
    """`judge=true`."""
    if value.lower() not in ("true", "false"):
        raise ValueError(value)
    return value.lower() == "true"


def clause_weights(value: str) -> tuple[float, ...]:
    """`write_clause_weights=30,40,30`: how often captions of 1, 2 and 3 clauses."""
    return tuple(float(w) for w in value.split(","))


WRITTEN_AS = {yes_no: "boolean (true or false)", fact_type_weights: "list of fact_type:weight", requests_per_step: "list of kind:count",
              lessons_per_step: "list of lesson_kind:count",
              share: "number between 0 and 1", clause_weights: "list of three numbers"}
ALLOWED = {"train": {"out": str, "seconds": float, "seed": int, "threads": int, "lr": float, "init": str,
                     "warmup_seconds": float, "position_weight": float, "type_weights": fact_type_weights,
                     "per_step": requests_per_step, "hybrid_share": share, "negbench_share": share, "open_share": share,
                     "checkpoint_minutes": float, "write_per_step": lessons_per_step, "write_weight": float,
                     "refusal_share": share, "write_open_share": float, "write_eval_every": float, "resume": str,
                     "write_clause_weights": clause_weights, "write_repeat_share": share,
                     "hidden": int, "layers": int},
           "evaluate": {"backbone": str, "n_per_type": int, "n_views": int, "n_writing": int, "seed": int, "out": str},
           "writing": {"backbone": str, "n": int, "seed": int, "judge": yes_no}}


def parse(command: str, rest: list[str]) -> dict:
    """key=value arguments -> typed values, every one checked; InputError (one line) otherwise."""
    args = {}
    for arg in rest:
        key, sep, value = arg.partition("=")
        if not sep or key not in ALLOWED[command]:
            raise InputError(f"unexpected argument {arg!r} for {command} (valid: {', '.join(ALLOWED[command])})")
        try:
            args[key] = ALLOWED[command][key](value)
        except ValueError as exc:
            kind = WRITTEN_AS.get(ALLOWED[command][key], ALLOWED[command][key].__name__)
            which = f" ({exc})" if "; valid: " in str(exc) else ""  # an unknown name: the valid ones
            raise InputError(f"{key} must be a {kind}, got {value!r}{which}") from None
    try:
        if command == "train":
            if "out" not in args:
                raise ValueError(f"train needs out=DIR (a folder of your own), or out={BUILTIN_OUT} to replace the shipped "
                                 f"weights in {shipped_folder()}")
            if args["out"] == BUILTIN_OUT:
                args["out"] = shipped_folder()
            if "resume" in args:  # the checkpoint's own options, the same run going on
                extra = sorted(set(args) - {"out", "threads", "resume"})
                if extra:
                    raise ValueError(f"resume= goes on with the checkpoint's own options; leave out {', '.join(extra)}")
                folder = args.pop("resume")
                args = {**resume_options(folder), **args, "init": folder, "resume": True}
            check_train_options(**args)
        else:
            for name, least in (("n_per_type", 1), ("n_views", 1), ("n_writing", 0), ("n", 1)):
                if args.get(name, least) < least:
                    raise ValueError(f"{name} must be a whole number of {least} or more, got {args[name]}")
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
        print(f"the first argument must be train, evaluate or writing, got {command!r}", file=sys.stderr)
        return 2
    args = parse(command, rest)
    if "out" in args:
        check_writable(args["out"])
    if command == "train":
        report = train_micro_vlm(args.pop("out"), args.pop("seconds", 2400.0), **args)
        print(json.dumps({k: v for k, v in report.items() if k != "history"}))
        return 0
    if command == "writing":
        evaluate_writing(**args)
        return 0
    evaluate_micro_vlm(**args)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
