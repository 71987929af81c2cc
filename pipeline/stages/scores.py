"""Scores: join answers back to (item, question) rows and apply the metric formulas."""
from __future__ import annotations

import polars as pl

from operators import metrics, schema
from pipeline.stages.answers import AnswerPlan


def _with_answer(frame: pl.DataFrame, answers: pl.DataFrame, key_col: str, suffix: str) -> pl.DataFrame:
    renamed = answers.rename({"key": key_col, "logp_yes": f"logp_yes{suffix}", "logp_no": f"logp_no{suffix}"})
    return frame.join(renamed, on=key_col, how="left")


def question_records(plan: AnswerPlan, answers: pl.DataFrame, backbone: str) -> pl.DataFrame:
    """Per-(item, question) evidence: the question, its answers on the image and from the
    caption alone. Reports (answer distributions) and curation outputs read this table."""
    if plan.questions is None or plan.questions.height == 0:
        return pl.DataFrame()
    q = _with_answer(_with_answer(plan.questions, answers, "key_v", "_v"), answers, "key_t", "_t")
    return q.select(
        "item_id", "caption", "image_hash", "question_set", "question_id", "question", "parents", "claim_type",
        "logp_yes_v", "logp_no_v", "logp_yes_t", "logp_no_t",
    ).with_columns(backbone=pl.lit(backbone))


def metric_inputs(plan: AnswerPlan, answers: pl.DataFrame) -> dict[str, pl.DataFrame | None]:
    """The long answer tables the metric formulas read (docs/DESIGN.md). A request with no
    stored answer (it failed) leaves nulls, which the formulas turn into null scores."""
    decomposed = claims = holistic = None
    if plan.questions is not None:  # even with no question at all: null scores with a note, not a missing metric
        q = _with_answer(_with_answer(plan.questions, answers, "key_v", "_v"), answers, "key_t", "_t")
        decomposed = q.filter(pl.col("question_set") != "claims").select(
            "item_id", "question_set", "question_id", "parents", "logp_yes_v", "logp_no_v", "logp_yes_t", "logp_no_t"
        )
        claims = q.filter(pl.col("question_set") == "claims").select(
            "item_id", pl.col("question_id").alias("claim_id"), "claim_type", pl.col("logp_yes_v").alias("logp_yes"), pl.col("logp_no_v").alias("logp_no")
        )
    if plan.holistic is not None:
        holistic = _with_answer(plan.holistic, answers, "key_h", "").select("item_id", "logp_yes", "logp_no")
    return {"decomposed": decomposed, "holistic": holistic, "claims": claims}


def score_items(
    items: pl.DataFrame,
    plan: AnswerPlan,
    answers: pl.DataFrame,
    *,
    backbone: str,
    metric_ids: list[str],
    lam: float,
    probability: str,
) -> pl.DataFrame:
    """One row per (item, metric): operators.schema.SCORES."""
    inputs = metric_inputs(plan, answers)
    long = metrics.score_all(  # merges nobody asked for are not computed (each is a join over the items)
        item_ids=items["item_id"], lam=lam, probability=probability, merge_terms=metrics.merge_terms_for(metric_ids), **inputs
    )
    long = pl.from_arrow(long) if not isinstance(long, pl.DataFrame) else long
    wanted = long.filter(pl.col("metric").is_in(metric_ids))
    missing = sorted(set(metric_ids) - set(wanted["metric"].unique().to_list()))
    if missing:
        # A requested metric the inputs cannot produce is a configuration mistake, not a 0.
        raise ValueError(f"metrics {missing} could not be computed from the available answers")
    scored = wanted.join(items.select("item_id", "benchmark"), on="item_id", how="left").with_columns(backbone=pl.lit(backbone))
    return pl.from_arrow(schema.conform(scored.to_arrow(), schema.SCORES, what="scores"))
