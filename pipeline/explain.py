"""Per-question evidence in the terms DEPICT uses: p_v, p_t, commitment and agreement.

The records table (`records/<backbone>.parquet`) stores raw yes/no log-probabilities; the
API, the pairs command and the explorer all show them as the quantities of the formula
(docs/DESIGN.md), computed here once so the three never disagree.
"""
from __future__ import annotations

import polars as pl

from operators.metrics import yes_probability_expr


def question_table(records: pl.DataFrame, probability: str = "normalized") -> pl.DataFrame:
    """`records` plus p_v (on the image), p_t (from the caption alone), commitment
    w = |2 p_t - 1| and agreement a = p_v p_t + (1 - p_v)(1 - p_t).

    Rows without a caption-only answer (DSG, claims) have null p_t, commitment and agreement.
    """
    if records.height == 0 or "logp_yes_v" not in records.columns:
        return records
    p_v = yes_probability_expr("logp_yes_v", "logp_no_v", probability)
    p_t = yes_probability_expr("logp_yes_t", "logp_no_t", probability)
    return records.with_columns(p_v=p_v, p_t=p_t).with_columns(
        commitment=(2.0 * pl.col("p_t") - 1.0).abs(),
        agreement=pl.col("p_v") * pl.col("p_t") + (1.0 - pl.col("p_v")) * (1.0 - pl.col("p_t")),
    )
