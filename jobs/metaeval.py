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
(tau-b), pearson (plain), plcc (4PL), pairwise_acc. `released` reads a source's released
per-item files with that source's protocol (docs/reproducing.md). Prints the statistics
table and writes statistics/deltas as .parquet and .csv under `out` (default
./metaeval_results). See pipeline.metaeval.evaluate_files for the file formats.
"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

if importlib.util.find_spec("pipeline") is None:  # a fresh clone without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from omegaconf import OmegaConf

from pipeline.metaeval import evaluate_files, evaluate_released, format_table, write_result

DEFAULTS = {
    "scores": "???", "human": None, "kind": "correlation", "out": "metaeval_results",
    "metrics": None, "target": None, "baselines": None, "n_resamples": 2000, "seed": 0,
    "tie_policy": "expected", "no_questions": None, "released": None, "answer_rule": None,
    "split": "tifa160", "skills": None,
}  # fmt: skip
READER_OPTIONS = {"dsg": ("answer_rule", "split"), "tifa": (), "genai_bench": ("skills",)}


def main(argv: list[str] | None = None) -> int:
    args = OmegaConf.merge(OmegaConf.create(DEFAULTS), OmegaConf.from_cli(argv if argv is not None else sys.argv[1:]))
    unknown = sorted(set(args) - set(DEFAULTS))
    needs_human = args.released in (None, "dsg", "genai_bench")
    if unknown or OmegaConf.is_missing(args, "scores") or (needs_human and args.human is None):
        print(__doc__ + (f"\nunknown option(s): {unknown}" if unknown else ""), file=sys.stderr)
        return 2

    def as_list(value):
        return None if value is None else [str(v) for v in value]

    common = dict(baselines=as_list(args.baselines), n_resamples=int(args.n_resamples), seed=int(args.seed))
    if args.released is not None:
        reader = {k: args[k] for k in READER_OPTIONS.get(str(args.released), ()) if args[k] is not None}
        result = evaluate_released(
            str(args.released), args.scores, args.human, reader_options=reader,
            no_questions=args.no_questions, target=args.target, **common,
        )  # fmt: skip
    else:
        result = evaluate_files(
            args.scores, args.human, args.kind, metrics=as_list(args.metrics), no_questions=args.no_questions,
            target=args.target or "depict", tie_policy=args.tie_policy, **common,
        )  # fmt: skip
    print(format_table(result))
    for path in write_result(result, args.out):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
