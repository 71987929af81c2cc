"""Answer mass diagnostics: did the model actually mean to answer yes or no?

Every stored answer carries `answer_mass` = P(yes spellings) + P(no spellings) at the first
generated position (see `operators.engines.yesno.answer_mass`). A well-set-up instruction
model puts nearly all of its mass there; a wrong chat template, a missing or doubled BOS, or
a thought/channel prefix the model wants to write first all show up here first, as a low
mass, while the normalised p(yes) still looks like a number. These helpers summarise the mass
per request kind and say what to check.
"""
from __future__ import annotations

import polars as pl

# Below these a backbone's answers are suspect (instruction-tuned VLMs put > 0.9 on the answer).
LOW_MEDIAN = 0.5
LOW_P5 = 0.05

LIKELY_CAUSES = (
    "likely causes: a chat template or assistant prefix the checkpoint does not expect, a missing "
    "or doubled BOS token, thinking/thought-channel output before the answer (set chat_template_kwargs "
    "or assistant_prefix; jobs/preflight.py compares assistant_prefix_candidates), answer spellings "
    "that are not single tokens, or random weights"
)


def summarize(answers: pl.DataFrame) -> pl.DataFrame:
    """Median and 5th percentile of `answer_mass` per request kind.

    `answers` has columns kind and answer_mass (nulls, from parts written before the column
    existed, are not counted). Returns kind, n, median, p5, sorted by kind.
    """
    known = answers.filter(pl.col("answer_mass").is_not_null())
    return (
        known.group_by("kind")
        .agg(
            n=pl.len(),
            median=pl.col("answer_mass").median(),
            p5=pl.col("answer_mass").quantile(0.05, interpolation="linear"),
        )
        .sort("kind")
    )


def is_low(median: float, p5: float) -> bool:
    return median < LOW_MEDIAN or p5 < LOW_P5


def summary_lines(backbone: str, summary: pl.DataFrame) -> list[str]:
    """One line per request kind, then a warning naming the likely causes when mass is low."""
    lines, low = [], []
    for row in summary.iter_rows(named=True):
        flag = is_low(row["median"], row["p5"])
        lines.append(
            f"answer mass {backbone:<16} {row['kind']:<9} n={row['n']:<7} median {row['median']:.3f}  "
            f"p5 {row['p5']:.3f}{'  LOW' if flag else ''}"
        )
        if flag:
            low.append(row["kind"])
    if low:
        lines.append(
            f"WARNING: {backbone}: low answer mass for {', '.join(low)} (median < {LOW_MEDIAN} or "
            f"p5 < {LOW_P5}): the yes/no reading is unreliable; {LIKELY_CAUSES}"
        )
    return lines
