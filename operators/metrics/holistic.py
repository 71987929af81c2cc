"""Holistic score (VQAScore) and its merge with a decomposed term (DEPICT = agree + VQAScore).

VQAScore is P(yes) for one whole-caption question on the image, read under both
probability conventions. `merge` blends any decomposed metric with it,
lam * S_hol + (1 - lam) * term; `lambda_sweep` does so for many lambdas from a single
join, so a sensitivity curve costs no more than one merge.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import polars as pl
import pyarrow as pa

from operators.metrics.catalog import MERGE_PARTNER, ids, merged_id, names_of_merge
from operators.metrics.frames import (
    METRIC_COLUMNS,
    keyed_rows,
    long_scores,
    read_table,
    requested_items,
)
from operators.metrics.probability import (
    usable_answer_expr,
    yes_probability_expr,
)

HOLISTIC_METRICS = ids("holistic")
HOLISTIC_CONVENTIONS = {"vqascore": "normalized", "vqascore_raw": "raw"}  # the probability each one reads
DEPICT_LAMBDA = 0.5  # fixed a priori by the method, not tuned

_COLUMNS = {"item_id": pl.String, "logp_yes": pl.Float64, "logp_no": pl.Float64}
_MISSING = "missing_answer: logp_yes or logp_no is null, not finite or positive"


def holistic_scores(answers: pl.DataFrame | pa.Table, item_ids: Iterable[str]) -> pl.DataFrame:
    """`vqascore` (normalized) and `vqascore_raw` (exp(logp_yes)) per item.

    One answer per item; items without one score null with note "no_answer".
    """
    what = "holistic answers"
    items = requested_items(item_ids)
    rows = read_table(answers, _COLUMNS, what=what).join(items, on="item_id", how="semi")
    rows = keyed_rows(rows, ["item_id"], what=what)
    ok = usable_answer_expr("logp_yes", "logp_no")
    metrics = {
        metric: (
            pl.when(ok).then(yes_probability_expr("logp_yes", "logp_no", convention)).otherwise(None),
            pl.when(ok).then(pl.lit(None, dtype=pl.String)).otherwise(pl.lit(_MISSING)),
        )
        for metric, convention in ((m, HOLISTIC_CONVENTIONS[m]) for m in HOLISTIC_METRICS)
    }
    return long_scores(items, rows, metrics, absent_note="no_answer")


def merged_metric_id(term: str, holistic_metric: str = MERGE_PARTNER) -> str:
    return merged_id(term, holistic_metric)


def merged_metric_ids(term: str, holistic_metric: str = MERGE_PARTNER) -> list[str]:
    """Every metric id a merge of `term` with `holistic_metric` is emitted under: its own and
    the catalog's names for it (agree merged with vqascore is also "depict")."""
    merge = merged_metric_id(term, holistic_metric)
    return [merge, *names_of_merge(merge)]


def check_lambda(lam: float) -> float:
    lam = float(lam)
    if not 0.0 <= lam <= 1.0:  # also rejects NaN
        raise ValueError(f"lambda must be in [0, 1], got {lam}")
    return lam


def _one_metric(scores: pl.DataFrame | pa.Table, metric: str, prefix: str, what: str) -> pl.DataFrame:
    rows = read_table(scores, METRIC_COLUMNS, what=what).filter(pl.col("metric") == metric)
    rows = keyed_rows(rows, ["item_id", "metric"], what=what)
    return rows.select("item_id", pl.col("score").alias(f"{prefix}_score"), pl.col("note").alias(f"{prefix}_note"))


def _parts(
    decomposed_long: pl.DataFrame | pa.Table,
    holistic_long: pl.DataFrame | pa.Table,
    term: str,
    holistic_metric: str,
) -> pl.DataFrame:
    """One row per item found in either table: both parts' scores and the merged note.

    The note of a null merge names each null part and why; for a valid merge it carries
    the parts' own flags (e.g. agree's "all_undecided").
    """
    decomposed = _one_metric(decomposed_long, term, "term", "decomposed scores")
    holistic = _one_metric(holistic_long, holistic_metric, "hol", "holistic scores")
    items = pl.concat([decomposed.select("item_id"), holistic.select("item_id")]).unique(maintain_order=True)
    joined = items.join(decomposed, on="item_id", how="left", maintain_order="left").join(
        holistic, on="item_id", how="left", maintain_order="left"
    )

    def why_null(part: str, name: str) -> pl.Expr:
        reason = pl.col(f"{part}_note").fill_null("not scored")
        return pl.when(pl.col(f"{part}_score").is_null()).then(pl.format(f"{name} is null ({{}})", reason))

    null_note = pl.concat_str(
        [why_null("term", term), why_null("hol", holistic_metric)], separator="; ", ignore_nulls=True
    )
    flags = pl.concat_str([pl.col("term_note"), pl.col("hol_note")], separator="; ", ignore_nulls=True)
    valid = pl.col("term_score").is_not_null() & pl.col("hol_score").is_not_null()
    note = pl.when(valid).then(pl.when(flags != "").then(flags)).otherwise(null_note)
    return joined.select("item_id", "term_score", "hol_score", note.alias("note"))


def merge(
    decomposed_long: pl.DataFrame | pa.Table,
    holistic_long: pl.DataFrame | pa.Table,
    term: str,
    lam: float = DEPICT_LAMBDA,
    holistic_metric: str = "vqascore",
) -> pl.DataFrame:
    """Long rows of metric "<term>+<holistic_metric>" = lam * S_hol + (1 - lam) * term.

    `agree` merged with `vqascore` is DEPICT and is emitted twice: as "agree+vqascore"
    and as "depict". A null part gives a null merge whose note names that part.
    """
    lam = check_lambda(lam)
    parts = _parts(decomposed_long, holistic_long, term, holistic_metric)
    ids = merged_metric_ids(term, holistic_metric)
    score = lam * pl.col("hol_score") + (1.0 - lam) * pl.col("term_score")
    return pl.concat(
        [parts.select("item_id", pl.lit(metric).alias("metric"), score.alias("score"), "note") for metric in ids]
    )


def lambda_sweep(
    decomposed_long: pl.DataFrame | pa.Table,
    holistic_long: pl.DataFrame | pa.Table,
    term: str,
    lams: Sequence[float] = tuple(np.linspace(0.0, 1.0, 21)),
    holistic_metric: str = "vqascore",
) -> pl.DataFrame:
    """Merged scores for every lambda in `lams`: columns item_id, lam, score, note.

    The tables are joined once; each lambda is then one multiply-add per item.
    """
    grid = pl.DataFrame({"lam": [check_lambda(lam) for lam in lams]}, schema={"lam": pl.Float64})
    parts = _parts(decomposed_long, holistic_long, term, holistic_metric)
    return grid.join(parts, how="cross").select(
        "item_id",
        "lam",
        (pl.col("lam") * pl.col("hol_score") + (1.0 - pl.col("lam")) * pl.col("term_score")).alias("score"),
        "note",
    )
