"""Meta-evaluate precomputed scores against human judgments, from the command line.

    python jobs/metaeval.py scores=scores.parquet human=items.csv kind=correlation
        [out=dir] [metrics=[depict,vqascore]] [target=depict] [baselines=[vqascore]]
        [n_resamples=2000] [seed=0] [tie_policy=expected] [no_questions=exclude|zero]

    python jobs/metaeval.py released=dsg scores=mplug_dsg.csv human=tifa160-likert-anns.csv
        [answer_rule=dsg|strict] [split=tifa160] ...
    python jobs/metaeval.py released=tifa scores=human_annotations_with_scores.json ...
    python jobs/metaeval.py released=genai_bench scores=scores.csv human=genai_image.json
        [skills=genai_skills.json] ...

`kind` is correlation, winoground or multiple_choice. Correlation statistics: srcc, kendall
(tau-b), pearson (plain), plcc (4PL), pairwise_acc. `n_resamples` is the bootstrap size of
the group BCa intervals (at least 10), or 0 for point estimates only: ci_low, ci_high and the
deltas' `significant` are then empty. `released` reads a source's released per-item files
with that source's protocol (docs/reproducing.md). Prints the statistics table and writes
statistics/deltas as .parquet and .csv under `out` (default ./metaeval_results). See
pipeline.metaeval.evaluate_files for the file formats.
"""
from __future__ import annotations

import sys
from pathlib import Path

if not __package__:  # run as a file (python jobs/<job>.py): this checkout's code, from a fresh clone
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pipeline.cli import InputError, guarded, key_values  # noqa: E402
from pipeline.config import MIN_RESAMPLES, PROTOCOL_STATISTICS, TIE_POLICIES, ConfigError  # noqa: E402
from pipeline.metaeval import evaluate_files, evaluate_released, format_table, write_result  # noqa: E402

DEFAULTS = {
    "scores": None, "human": None, "kind": "correlation", "out": "metaeval_results",
    "metrics": None, "target": None, "baselines": None, "n_resamples": 2000, "seed": 0,
    "tie_policy": "expected", "no_questions": None, "released": None, "answer_rule": None,
    "split": "tifa160", "skills": None,
}  # fmt: skip
READER_OPTIONS = {"dsg": ("answer_rule", "split"), "tifa": (), "genai_bench": ("skills",)}


def check(args: dict) -> None:
    """Ranges and choices, before any file is read."""
    if args["kind"] not in PROTOCOL_STATISTICS:
        raise ConfigError("kind", f"must be one of {tuple(PROTOCOL_STATISTICS)}, got {args['kind']!r}")
    if args["tie_policy"] not in TIE_POLICIES:
        raise ConfigError("tie_policy", f"must be one of {TIE_POLICIES}, got {args['tie_policy']!r}")
    for key, low in (("n_resamples", MIN_RESAMPLES), ("seed", 0)):
        value = args[key]
        whole = isinstance(value, int) and not isinstance(value, bool)
        if key == "n_resamples" and whole and value == 0:
            continue  # no intervals: `evaluate` then leaves ci_low/ci_high and `significant` empty
        if not whole or value < low:
            zero = "0 (no intervals) or " if key == "n_resamples" else ""
            raise ConfigError(key, f"must be {zero}a whole number >= {low}, got {value!r}")
    for key in ("metrics", "baselines"):
        value = args[key]
        if value is not None and (isinstance(value, str) or not all(isinstance(v, str) and v for v in value)):
            raise ConfigError(key, f"must be a list of metric ids like [depict,vqascore], got {value!r}")


@guarded  # a bad option or a missing file: one line, exit 2
def main(argv: list[str] | None = None) -> int:
    argv = list(argv if argv is not None else sys.argv[1:])
    if {"-h", "--help"} & set(argv):
        print(__doc__)
        return 0
    args = key_values(argv, DEFAULTS)  # "key=value" only; a malformed value names its key
    unknown = sorted(set(args) - set(DEFAULTS))
    needs_human = args["released"] in (None, "dsg", "genai_bench")
    if unknown or args["scores"] is None or (needs_human and args["human"] is None):
        print(__doc__ + (f"\nunknown option(s): {unknown}" if unknown else ""), file=sys.stderr)
        return 2
    check(args)

    def as_list(value):
        return None if value is None else [str(v) for v in value]

    common = dict(baselines=as_list(args["baselines"]), n_resamples=int(args["n_resamples"]), seed=int(args["seed"]))
    try:
        if args["released"] is not None:
            reader = {k: args[k] for k in READER_OPTIONS.get(str(args["released"]), ()) if args[k] is not None}
            result = evaluate_released(
                str(args["released"]), args["scores"], args["human"], reader_options=reader,
                no_questions=args["no_questions"], target=args["target"], **common,
            )  # fmt: skip
        else:
            result = evaluate_files(
                args["scores"], args["human"], args["kind"], metrics=as_list(args["metrics"]),
                no_questions=args["no_questions"], target=args["target"] or "depict", tie_policy=args["tie_policy"], **common,
            )  # fmt: skip
    except ValueError as exc:  # a malformed input file: the message names file and column
        raise InputError(str(exc)) from exc
    print(format_table(result))
    for path in write_result(result, args["out"]):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
