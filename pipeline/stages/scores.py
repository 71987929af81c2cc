"""Scores: join answers back to (item, question) rows and apply the metric formulas."""
from __future__ import annotations

import polars as pl
import pyarrow as pa

from operators import metrics, schema
from pipeline.stages.answers import AnswerPlan


def _with_answer(frame: pl.DataFrame, answers: pl.DataFrame, key_col: str, suffix: str) -> pl.DataFrame:
    renamed = answers.rename({"key": key_col, "logp_yes": f"logp_yes{suffix}", "logp_no": f"logp_no{suffix}"})
    return frame.join(renamed, on=key_col, how="left")


def answered_questions(plan: AnswerPlan, answers: pl.DataFrame) -> pl.DataFrame:
    """The plan's (item, question) rows with the stored answer to their image request (`_v`)
    and to their caption-only request (`_t`): the one place p_v and p_t are told apart."""
    return _with_answer(_with_answer(plan.questions, answers, "key_v", "_v"), answers, "key_t", "_t")


def question_records(plan: AnswerPlan, answers: pl.DataFrame, backbone: str) -> pl.DataFrame:
    """Per-(item, question) evidence: the question, its answers on the image and from the
    caption alone. Reports (answer distributions) and curation outputs read this table."""
    if plan.questions is None or plan.questions.height == 0:
        return pl.DataFrame()
    q = answered_questions(plan, answers)
    return q.select(
        "item_id", "caption", "image_hash", "question_set", "question_id", "question", "parents", "claim_type",
        "logp_yes_v", "logp_no_v", "logp_yes_t", "logp_no_t",
    ).with_columns(backbone=pl.lit(backbone))


def errors_for_items(errors: pa.Table, plan: AnswerPlan, items: pl.DataFrame) -> pa.Table:
    """The answers stage's error rows, one per item they affect.

    The stage sees requests, not items: its rows carry a request key and no item_id. A request
    is shared by every item with the same image and question (or caption), so a row fans out to
    each of them here, with the item's benchmark. Rows whose key no item uses are kept as they
    are; rows that already name an item are untouched.
    """
    frame = pl.from_arrow(schema.conform(errors, schema.ERRORS))
    unplaced = pl.col("item_id").is_null() & pl.col("key").is_not_null()
    if not frame.filter(unplaced).height:
        return schema.conform(frame.to_arrow(), schema.ERRORS)
    users = []
    if plan.questions is not None:
        users += [plan.questions.select("item_id", pl.col(k).alias("key")) for k in ("key_v", "key_t")]
    if plan.holistic is not None:
        users.append(plan.holistic.select("item_id", pl.col("key_h").alias("key")))
    if not users:
        return schema.conform(frame.to_arrow(), schema.ERRORS)
    by_key = pl.concat(users).drop_nulls().unique(maintain_order=True)
    by_key = by_key.join(items.select("item_id", pl.col("benchmark").alias("item_benchmark")), on="item_id", how="left")
    placed = (
        frame.filter(unplaced).drop("item_id")
        .join(by_key, on="key", how="left", maintain_order="left")
        .with_columns(benchmark=pl.coalesce("benchmark", "item_benchmark"))
        .drop("item_benchmark")
    )
    out = pl.concat([frame.filter(~unplaced), placed.select(frame.columns)])
    return schema.conform(out.to_arrow(), schema.ERRORS)


def with_error_notes(scores: pl.DataFrame, errors: pa.Table) -> pl.DataFrame:
    """Name the real cause in the note of a score that is null for want of answers.

    A failed request leaves its items with "missing_answer: 1 of 5 questions"; the error rows
    say why (`prompt_too_long`, `engine_error`, ...). The note then leads with those reasons and
    the first detail, and keeps the count: "prompt_too_long (3012 prompt tokens > ...):
    missing_answer: 1 of 5 questions".
    """
    frame = pl.from_arrow(errors)
    frame = frame.filter(pl.col("item_id").is_not_null())
    if not frame.height or not scores.height:
        return scores
    causes = frame.group_by("item_id", maintain_order=True).agg(
        reasons=pl.col("reason").unique(maintain_order=True).str.join(", "),
        first_detail=pl.col("detail").first(),
    )
    cause = pl.format("{} ({}): ", "reasons", pl.col("first_detail").fill_null("no detail"))
    missing = pl.col("note").str.contains("missing_answer", literal=True) & pl.col("reasons").is_not_null()
    return (
        scores.join(causes, on="item_id", how="left", maintain_order="left")
        .with_columns(note=pl.when(missing).then(pl.concat_str(cause, pl.col("note"))).otherwise(pl.col("note")))
        .drop("reasons", "first_detail")
    )


def metric_inputs(plan: AnswerPlan, answers: pl.DataFrame) -> dict[str, pl.DataFrame | None]:
    """The long answer tables the metric formulas read (docs/DESIGN.md). A request with no
    stored answer (it failed) leaves nulls, which the formulas turn into null scores."""
    decomposed = claims = holistic = None
    if plan.questions is not None:  # even with no question at all: null scores with a note, not a missing metric
        q = answered_questions(plan, answers)
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
    errors: pa.Table | None = None,
) -> pl.DataFrame:
    """One row per (item, metric): operators.schema.SCORES. `errors`: the answers stage's
    rows for these items (`errors_for_items`), named in the notes of scores they leave null."""
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
    if errors is not None:
        wanted = with_error_notes(wanted, errors)
    scored = wanted.join(items.select("item_id", "benchmark"), on="item_id", how="left").with_columns(backbone=pl.lit(backbone))
    return pl.from_arrow(schema.conform(scored.to_arrow(), schema.SCORES, what="scores"))
