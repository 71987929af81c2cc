"""Write a curation corpus whose mismatches are known: `python jobs/demo_corpus.py out=DIR [key=value ...]`.

Shape-world pairs drawn from the demo world's benchmark content slot (no training draw saw
them), each caption true of its image or made false in a named way: swapped_attribute,
wrong_count, flipped_negation, other_caption. Written as Parquet shards (DIR/parquet/) and the
same pairs as WebDataset tars (DIR/webdataset/), with each caption's questions
(DIR/questions.parquet) and, apart from the inputs, the truth (DIR/truth.parquet).
Keys: pairs=300, mismatch_share=0.5, kinds.<kind>=<weight> (default: the four kinds evenly;
naming any kind lists them all: kinds.wrong_count=1 kinds.flipped_negation=1 draws only those
two, half each), seed=0, open_share=0 (0 to 0.5: the share of each caption's questions that
ask what it leaves open), pairs_per_shard=100.
Then: python jobs/curate.py curation=demo inputs=[DIR/parquet/] questions.file=DIR/questions.parquet truth=DIR/truth.parquet
See docs/curation.md, "Does the filter keep the right pairs?".
"""
from __future__ import annotations

import sys
from pathlib import Path

if not __package__:  # run as a file (python jobs/<job>.py): this checkout's code, from a fresh clone
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pipeline.cli import guarded, key_values  # noqa: E402
from pipeline.config import ConfigError  # noqa: E402
from pipeline.curation.demo_corpus import write_demo_corpus  # noqa: E402

JOB_KEYS = ("out", "pairs", "mismatch_share", "kinds", "seed", "open_share", "pairs_per_shard")


@guarded  # bad input: one line, exit 2
def main(argv: list[str]) -> int:
    if not argv or {"-h", "--help"} & set(argv):
        print(__doc__)
        return 0 if argv else 2
    values = key_values(argv)
    unknown = sorted(set(values) - set(JOB_KEYS))
    if unknown:
        raise ConfigError(unknown[0], f"unknown key; valid: {', '.join(JOB_KEYS)}")
    if "out" not in values:
        raise ConfigError("out", "which folder? out=DIR")
    print(write_demo_corpus(**values).summary())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
