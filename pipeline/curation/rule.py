"""The decision: which of a shard's scored rows are kept (a threshold, a top fraction, or both)."""
from __future__ import annotations

import math
from dataclasses import dataclass

import polars as pl

from pipeline.curation.curation_config import CurationConfig


@dataclass(frozen=True)
class Rule:
    """Which rows to keep: score >= min_score, and among the best `top_fraction` of the
    shard's scored rows. A row without a score (bad input, failed answer) is never kept."""

    metric: str
    min_score: float | None = None
    top_fraction: float | None = None

    @classmethod
    def from_config(cls, c: CurationConfig) -> Rule:
        return cls(metric=c.metric, min_score=c.min_score, top_fraction=c.top_fraction)

    def as_dict(self) -> dict:
        return {"metric": self.metric, "min_score": self.min_score, "top_fraction": self.top_fraction}



def apply_rule(rows: pl.DataFrame, rule: Rule) -> pl.DataFrame:
    """`rows` (one shard) with a `keep` column.

    top_fraction keeps the k = ceil(f * n) best of the n scored rows, and every row tied
    with the k-th score, so the decision never depends on row order. It is per shard: a
    shard's outputs depend on that shard alone, whichever shards arrived the same night.
    """
    column = f"score_{rule.metric}"
    if column not in rows.columns:
        raise ValueError(f"no stored scores for metric {rule.metric!r} (columns: {rows.columns})")
    score = pl.col(column)
    valid = score.is_not_null() & score.is_not_nan()
    keep = valid
    if rule.min_score is not None:
        keep = keep & (score >= rule.min_score)
    if rule.top_fraction is not None:
        scored = rows.filter(valid)[column].sort(descending=True)
        k = math.ceil(round(rule.top_fraction * scored.len(), 9))
        keep = keep & (score >= scored[k - 1]) if k > 0 else pl.lit(False)
    return rows.with_columns(keep=keep.fill_null(False))

