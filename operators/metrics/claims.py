"""Claim-level metrics: VisExMEM-style claim means and the grounding-only baseline.

Claim means read q_i = sigmoid(logp_yes - logp_no) for "is this claim true of the image?"
and average them four ways (arithmetic, geometric, harmonic, minimum). Geometric and
harmonic means are computed from the log-probabilities directly, so a claim whose q_i
underflows to 0 gives a score of 0 instead of NaN.

The grounding-only score combines per-claim detector scores s_i (the per-type rules that
produce s_i live with the grounding operators):
    score = (M / N) * exp(mean_i log max(s_i, 1e-6)) over the M groundable of N claims.
"""
from __future__ import annotations

from collections.abc import Iterable

import polars as pl
import pyarrow as pa

from operators.metrics.catalog import ids
from operators.metrics.frames import (
    keyed_rows,
    long_scores,
    missing_note,
    read_table,
    requested_items,
)
from operators.metrics.probability import (
    log_yes_probability_expr,
    usable_answer_expr,
    yes_probability_expr,
)

CLAIM_METRICS = ids("claims")
_CLAIM_MEANS = {"claim_mean_am": "am", "claim_mean_gm": "gm", "claim_mean_hm": "hm", "claim_mean_min": "min"}  # id -> column below
S_FLOOR = 1e-6  # keeps one undetected claim from sending the geometric mean to 0

_CLAIM_COLUMNS = {"item_id": pl.String, "claim_id": pl.String, "logp_yes": pl.Float64, "logp_no": pl.Float64}
_GROUNDING_COLUMNS = {"item_id": pl.String, "claim_id": pl.String, "groundable": pl.Boolean, "s": pl.Float64}


def claim_scores(answers: pl.DataFrame | pa.Table, item_ids: Iterable[str]) -> pl.DataFrame:
    """Arithmetic, geometric, harmonic mean and minimum of the claims' q_i, per item.

    Items without claims score null with note "no_claims"; an item with any null or
    non-finite answer scores null with a "missing_answer" note.
    """
    what = "claim answers"
    items = requested_items(item_ids)
    rows = read_table(answers, _CLAIM_COLUMNS, what=what).join(items, on="item_id", how="semi")
    rows = keyed_rows(rows, ["item_id", "claim_id"], what=what)
    per_item = (
        rows.with_columns(
            ok=usable_answer_expr("logp_yes", "logp_no"),
            q=yes_probability_expr("logp_yes", "logp_no"),
            log_q=log_yes_probability_expr("logp_yes", "logp_no"),
            # 1 / sigmoid(x) = 1 + exp(-x): inf (not a division by zero) when q underflows.
            inverse_q=1.0 + (pl.col("logp_no") - pl.col("logp_yes")).exp(),
        )
        .group_by("item_id")
        .agg(
            n=pl.len(),
            bad=(~pl.col("ok")).sum(),
            am=pl.col("q").mean(),
            gm=pl.col("log_q").mean().exp(),
            hm=pl.len() / pl.col("inverse_q").sum(),
            min=pl.col("q").min(),
        )
    )
    valid = pl.col("bad") == 0
    note = pl.when(valid).then(pl.lit(None, dtype=pl.String)).otherwise(missing_note("bad", "n", "claims"))
    metrics = {metric: (pl.when(valid).then(pl.col(_CLAIM_MEANS[metric])), note) for metric in CLAIM_METRICS}
    return long_scores(items, per_item, metrics, absent_note="no_claims")


def grounding_only(results: pl.DataFrame | pa.Table, item_ids: Iterable[str]) -> pl.DataFrame:
    """Grounding-only score per item from per-claim (groundable, s) results.

    Null with a note when the item has no claims ("no_claims"), none groundable
    ("no_groundable_claims"), or a claim whose result is unusable: `groundable` null, or a
    groundable claim whose s is null, non-finite or outside [0, 1] ("invalid_grounding").
    """
    what = "grounding results"
    items = requested_items(item_ids)
    rows = read_table(results, _GROUNDING_COLUMNS, what=what).join(items, on="item_id", how="semi")
    rows = keyed_rows(rows, ["item_id", "claim_id"], what=what)
    groundable = pl.col("groundable")
    usable_s = pl.col("s").is_finite().fill_null(False) & pl.col("s").is_between(0.0, 1.0)
    per_item = (
        rows.with_columns(
            bad=groundable.is_null() | (groundable.fill_null(False) & ~usable_s),
            log_s=pl.col("s").clip(lower_bound=S_FLOOR).log(),
        )
        .group_by("item_id")
        .agg(
            n=pl.len(),
            bad=pl.col("bad").sum(),
            m=groundable.fill_null(False).sum(),
            mean_log_s=pl.col("log_s").filter(groundable.fill_null(False)).mean(),
        )
    )
    valid = (pl.col("bad") == 0) & (pl.col("m") > 0)
    score = pl.when(valid).then(pl.col("m") / pl.col("n") * pl.col("mean_log_s").exp())
    note = (
        pl.when(pl.col("bad") > 0)
        .then(pl.format("invalid_grounding: {} of {} claims", "bad", "n"))
        .when(pl.col("m") == 0)
        .then(pl.lit("no_groundable_claims"))
        .otherwise(None)
    )
    return long_scores(items, per_item, {"grounding_only": (score, note)}, absent_note="no_claims")
