"""Decomposed metrics: per-question answers -> one score per item (docs/method.md, "DEPICT score").

`depict` question rows carry two answers per question, on the image (v) and from the
caption alone (t); they give DEPICT's agreement term and the fixed-yes baselines.
`dsg` question rows carry a dependency graph (`parents`) and give the DSG score.

Everything is a handful of polars group-bys over the long answer table, so scoring a whole
benchmark is one call. Nothing is silently dropped: an item with a missing or unusable
answer (null, non-finite or positive log-probability) gets a null score and a note saying
how many of its questions lacked an answer.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping

import polars as pl
import pyarrow as pa

from operators.metrics.catalog import ids
from operators.metrics.frames import (
    empty_scores,
    keyed_rows,
    long_scores,
    missing_note,
    read_table,
    requested_items,
)
from operators.metrics.probability import (
    check_convention,
    log_yes_probability_expr,
    usable_answer_expr,
    yes_probability_expr,
)

DEPICT_METRICS = ids("depict")  # from the depict question set (depict_scores)
DSG_METRICS = ids("dsg")  # from the dsg question set (dsg_scores)
DECOMPOSED_METRICS = DEPICT_METRICS + DSG_METRICS  # per-question metrics: the ones a probability convention applies to

UNDECIDED_BELOW = 0.2  # commitment w_k under this: the caption does not settle the answer
NO_PARENT = "0"  # DSG's "no parent" id (official parser and scorer skip parent id 0)

_KEY = ["item_id", "question_set", "question_id"]
_COLUMNS = {
    "item_id": pl.String,
    "question_set": pl.String,
    "question_id": pl.String,
    "logp_yes_v": pl.Float64,
    "logp_no_v": pl.Float64,
    "logp_yes_t": pl.Float64,
    "logp_no_t": pl.Float64,
}
_DSG_COLUMNS = {
    "item_id": pl.String,
    "question_set": pl.String,
    "question_id": pl.String,
    "parents": pl.List(pl.String),
    "logp_yes_v": pl.Float64,
    "logp_no_v": pl.Float64,
}


def resolve_conventions(probability: str | Mapping[str, str], metrics: Iterable[str]) -> dict[str, str]:
    """Probability convention of each metric.

    `probability` is one convention for all metrics, or a mapping from metric id to
    convention with an optional "default" entry (else "normalized") for the others.
    """
    if isinstance(probability, str):
        return {metric: check_convention(probability) for metric in metrics}
    unknown = set(probability) - set(DECOMPOSED_METRICS) - {"default"}
    if unknown:
        raise ValueError(f"probability conventions given for unknown metric(s): {', '.join(sorted(unknown))}")
    default = probability.get("default", "normalized")
    return {metric: check_convention(probability.get(metric, default)) for metric in metrics}


def _question_rows(
    answers: pl.DataFrame | pa.Table, item_ids: Iterable[str], question_set: str, columns: dict, what: str
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Requested items, and the rows of `question_set` belonging to them (checked for repeats)."""
    items = requested_items(item_ids)
    frame = read_table(answers, columns, what=what)
    rows = frame.filter(pl.col("question_set") == question_set).join(items, on="item_id", how="semi")
    nameless = rows.filter(pl.col("question_id").is_null())
    if nameless.height:
        raise ValueError(f"{what}: item {nameless.item(0, 'item_id')!r} has a {question_set} row without a question_id")
    rows = keyed_rows(rows, _KEY, what=what)
    return items, rows


def _depict_per_item(rows: pl.DataFrame, convention: str, undecided_below: float) -> pl.DataFrame:
    """Per-item sums and means that every depict-set metric is read from, under one convention."""
    p_v = yes_probability_expr("logp_yes_v", "logp_no_v", convention)
    p_t = yes_probability_expr("logp_yes_t", "logp_no_t", convention)
    return (
        rows.with_columns(
            p_v=p_v,
            log_p_v=log_yes_probability_expr("logp_yes_v", "logp_no_v", convention),
            agreement=p_v * p_t + (1.0 - p_v) * (1.0 - p_t),
            commitment=(2.0 * p_t - 1.0).abs(),
        )
        .group_by("item_id")
        .agg(
            n=pl.len(),
            bad_v=(~pl.col("ok_v")).sum(),
            bad_t=(~pl.col("ok_t")).sum(),
            bad_vt=(~(pl.col("ok_v") & pl.col("ok_t"))).sum(),
            sum_w=pl.col("commitment").sum(),
            sum_wa=(pl.col("commitment") * pl.col("agreement")).sum(),
            mean_a=pl.col("agreement").mean(),
            mean_w=pl.col("commitment").mean(),
            mean_p_v=pl.col("p_v").mean(),
            mean_log_p_v=pl.col("log_p_v").mean(),
            share_yes=(pl.col("p_v") > 0.5).cast(pl.Float64).mean(),
            all_undecided=(pl.col("commitment") < undecided_below).all(),
        )
    )


def question_table(records: pl.DataFrame, probability: str = "normalized") -> pl.DataFrame:
    """`records` (`records/<backbone>.parquet`: raw yes/no log-probabilities per question) plus
    the quantities of the DEPICT formula: p_v (on the image), p_t (from the caption alone),
    commitment w = |2 p_t - 1| and agreement a = p_v p_t + (1 - p_v)(1 - p_t). The API, the pairs
    command and the explorer show these, computed here beside the formula so they never disagree.

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


def _depict_metric_columns(stats: pl.DataFrame, metrics: Iterable[str]) -> pl.DataFrame:
    """`score__<metric>` and `note__<metric>` columns for the requested metrics."""
    no_weight = pl.col("sum_w") == 0.0
    value = {
        # S_dec = sum w a / sum w; with no weight at all, the plain mean of a (flagged).
        "agree": pl.when(no_weight).then(pl.col("mean_a")).otherwise(pl.col("sum_wa") / pl.col("sum_w")),
        "agree_unweighted": pl.col("mean_a"),
        "soft_tifa_am": pl.col("mean_p_v"),
        # exp(mean log p_v), log p_v taken from the logps directly: an underflowed p_v keeps
        # its true log and the score underflows to 0 instead of becoming NaN.
        "soft_tifa_gm": pl.col("mean_log_p_v").exp(),
        "hard_fixed_yes": pl.col("share_yes"),
        "mean_commitment": pl.col("mean_w"),
    }
    flag = {
        # all_weights_zero implies all_undecided; the note names the more specific fact.
        "agree": pl.when(no_weight)
        .then(pl.lit("all_weights_zero"))
        .when(pl.col("all_undecided"))
        .then(pl.lit("all_undecided"))
        .otherwise(None),
    }
    needs = {"agree": "bad_vt", "agree_unweighted": "bad_vt", "mean_commitment": "bad_t"}  # others: bad_v
    columns = [pl.col("item_id")]
    for metric in metrics:
        bad = pl.col(needs.get(metric, "bad_v"))
        columns.append(pl.when(bad == 0).then(value[metric]).otherwise(None).alias(f"score__{metric}"))
        note = flag.get(metric, pl.lit(None, dtype=pl.String))
        columns.append(pl.when(bad == 0).then(note).otherwise(missing_note(bad, "n")).alias(f"note__{metric}"))
    return stats.select(columns)


def depict_scores(
    answers: pl.DataFrame | pa.Table,
    item_ids: Iterable[str],
    *,
    probability: str | Mapping[str, str] = "normalized",
    undecided_below: float = UNDECIDED_BELOW,
) -> pl.DataFrame:
    """Agreement (weighted and unweighted), Soft-TIFA AM/GM, hard fixed-yes and mean commitment.

    Reads the `question_set == "depict"` rows of the decomposed answers table. Items without
    such rows score null with note "no_questions".
    """
    if not 0.0 <= undecided_below <= 1.0:
        raise ValueError(f"undecided_below must be in [0, 1], got {undecided_below}")
    what = "decomposed answers"
    items, rows = _question_rows(answers, item_ids, "depict", _COLUMNS, what)
    rows = rows.with_columns(
        ok_v=usable_answer_expr("logp_yes_v", "logp_no_v"), ok_t=usable_answer_expr("logp_yes_t", "logp_no_t")
    )
    conventions = resolve_conventions(probability, DEPICT_METRICS)
    per_item = items.join(rows.select("item_id").unique(), on="item_id", how="semi")
    for name in sorted(set(conventions.values())):
        uses = [metric for metric in DEPICT_METRICS if conventions[metric] == name]
        columns = _depict_metric_columns(_depict_per_item(rows, name, undecided_below), uses)
        per_item = per_item.join(columns, on="item_id", how="left")
    metrics = {metric: (pl.col(f"score__{metric}"), pl.col(f"note__{metric}")) for metric in DEPICT_METRICS}
    return long_scores(items, per_item, metrics, absent_note="no_questions")


def _dsg_per_item(rows: pl.DataFrame, edges: pl.DataFrame, convention: str) -> pl.DataFrame:
    """Per-item DSG scores with and without the dependency rule, under one convention.

    Rule of the official DSG scorer (j-min/DSG, dsg/vqa_utils.py `calc_vqa_score`): a
    question is zeroed when any parent's ORIGINAL answer (`qid2scores`, before filtering)
    is "no"; the filtered scores are not chained through the graph, and parent id 0 means
    "no parent". The official code would raise KeyError on a parent id that is not a
    question of the item; here such a parent is ignored (the question counts as a root)
    and the item's `dsg` note says how many questions had one.
    """
    answered = rows.select(
        "item_id", "question_id", "ok_v", yes=yes_probability_expr("logp_yes_v", "logp_no_v", convention) > 0.5
    )
    parent_answers = answered.select(
        "item_id", parent=pl.col("question_id"), parent_yes=pl.col("yes"), parent_known=pl.lit(True)
    )
    per_question = (
        edges.join(parent_answers, on=["item_id", "parent"], how="left")
        .group_by("item_id", "question_id")
        .agg(
            blocked=(pl.col("parent_known").fill_null(False) & ~pl.col("parent_yes").fill_null(True)).any(),
            unknown_parent=pl.col("parent_known").is_null().any(),
        )
    )
    return (
        answered.join(per_question, on=["item_id", "question_id"], how="left")
        .with_columns(pl.col("blocked", "unknown_parent").fill_null(False))
        .group_by("item_id")
        .agg(
            n=pl.len(),
            bad_v=(~pl.col("ok_v")).sum(),
            nodep=pl.col("yes").cast(pl.Float64).mean(),
            dep=(pl.col("yes") & ~pl.col("blocked")).cast(pl.Float64).mean(),
            unknown_parent=pl.col("unknown_parent").sum(),
        )
    )


def dsg_scores(
    answers: pl.DataFrame | pa.Table,
    item_ids: Iterable[str],
    *,
    probability: str | Mapping[str, str] = "normalized",
) -> pl.DataFrame:
    """DSG (hard answers, a question with a "no" parent scores 0) and DSG without the graph.

    Reads the `question_set == "dsg"` rows; items without such rows score null with note
    "no_questions".
    """
    what = "decomposed answers"
    items, rows = _question_rows(answers, item_ids, "dsg", _DSG_COLUMNS, what)
    rows = rows.with_columns(ok_v=usable_answer_expr("logp_yes_v", "logp_no_v"))
    edges = (
        rows.select("item_id", "question_id", parent=pl.col("parents"))
        .explode("parent")
        .filter(pl.col("parent").is_not_null() & (pl.col("parent") != NO_PARENT))
    )
    conventions = resolve_conventions(probability, DSG_METRICS)
    per_item = items.join(rows.select("item_id").unique(), on="item_id", how="semi")
    for name in sorted(set(conventions.values())):
        stats = _dsg_per_item(rows, edges, name)
        valid = pl.col("bad_v") == 0
        unknown_note = (
            pl.when(pl.col("unknown_parent") > 0)
            .then(pl.format("unknown_parent: {} of {} questions (ignored)", "unknown_parent", "n"))
            .otherwise(None)
        )
        notes = {"dsg": unknown_note, "dsg_nodep": pl.lit(None, dtype=pl.String)}
        sources = {"dsg": "dep", "dsg_nodep": "nodep"}
        columns = [pl.col("item_id")]
        for metric in (m for m in DSG_METRICS if conventions[m] == name):
            columns.append(pl.when(valid).then(pl.col(sources[metric])).otherwise(None).alias(f"score__{metric}"))
            columns.append(
                pl.when(valid).then(notes[metric]).otherwise(missing_note("bad_v", "n")).alias(f"note__{metric}")
            )
        per_item = per_item.join(stats.select(columns), on="item_id", how="left")
    metrics = {metric: (pl.col(f"score__{metric}"), pl.col(f"note__{metric}")) for metric in DSG_METRICS}
    return long_scores(items, per_item, metrics, absent_note="no_questions")


def decomposed_scores(
    answers: pl.DataFrame | pa.Table,
    item_ids: Iterable[str],
    *,
    probability: str | Mapping[str, str] = "normalized",
    undecided_below: float = UNDECIDED_BELOW,
    question_sets: Iterable[str] = ("depict", "dsg"),
) -> pl.DataFrame:
    """Long scores of every metric of the given question sets, concatenated."""
    items = requested_items(item_ids)["item_id"]
    frames = []
    for question_set in question_sets:
        if question_set == "depict":
            frames.append(depict_scores(answers, items, probability=probability, undecided_below=undecided_below))
        elif question_set == "dsg":
            frames.append(dsg_scores(answers, items, probability=probability))
        else:
            raise ValueError(f"unknown decomposed question set {question_set!r}; expected depict or dsg")
    return pl.concat(frames) if frames else empty_scores()
