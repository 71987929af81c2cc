"""Meta-evaluate precomputed scores against human judgments, from the command line.

    python jobs/metaeval.py scores=scores.parquet human=items.csv kind=correlation
        [out=dir] [metrics=[depict,vqascore]] [target=depict] [baselines=[vqascore]]
        [n_resamples=2000] [seed=0] [tie_policy=expected]

`kind` is correlation, winoground or multiple_choice. Prints the statistics table and writes
statistics/deltas as .parquet and .csv under `out` (default ./metaeval_results).
See pipeline.metaeval.evaluate_files for the file formats.
"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

if importlib.util.find_spec("pipeline") is None:  # a fresh clone without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from omegaconf import OmegaConf

from pipeline.metaeval import evaluate_files, format_table, write_result

DEFAULTS = {
    "scores": "???", "human": "???", "kind": "correlation", "out": "metaeval_results",
    "metrics": None, "target": "depict", "baselines": None, "n_resamples": 2000, "seed": 0,
    "tie_policy": "expected",
}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = OmegaConf.merge(OmegaConf.create(DEFAULTS), OmegaConf.from_cli(argv if argv is not None else sys.argv[1:]))
    unknown = sorted(set(args) - set(DEFAULTS))
    if unknown or OmegaConf.is_missing(args, "scores") or OmegaConf.is_missing(args, "human"):
        print(__doc__ + (f"\nunknown option(s): {unknown}" if unknown else ""), file=sys.stderr)
        return 2
    def as_list(value):
        return None if value is None else [str(v) for v in value]
    result = evaluate_files(
        args.scores, args.human, args.kind,
        metrics=as_list(args.metrics), target=args.target, baselines=as_list(args.baselines),
        n_resamples=int(args.n_resamples), seed=int(args.seed), tie_policy=args.tie_policy,
    )  # fmt: skip
    print(format_table(result))
    for path in write_result(result, args.out):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
