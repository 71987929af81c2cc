"""Metric formulas: stored yes/no answers -> the long metric table (docs/DESIGN.md).

`catalog` lists every metric id with its family, question set, answer kind, mergeability
and label; the formula modules compute the rows of their families.

Every function takes the answer table(s) and the ids of the items to score, and returns a
polars DataFrame `item_id, metric, score, note` (operators.schema.METRIC_SCORES) with one
row per requested item and metric; a score that cannot be computed is null and its note
says why. `score_all` runs every family whose answers are at hand.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import polars as pl
import pyarrow as pa

from operators.metrics import catalog
from operators.metrics.catalog import MERGE_TERMS
from operators.metrics.claims import CLAIM_METRICS, claim_scores, grounding_only
from operators.metrics.decomposed import (
    DECOMPOSED_METRICS,
    DEPICT_METRICS,
    DSG_METRICS,
    UNDECIDED_BELOW,
    decomposed_scores,
    depict_scores,
    dsg_scores,
    resolve_conventions,
)
from operators.metrics.frames import (
    empty_scores,
    requested_items,
)
from operators.metrics.holistic import (
    DEPICT_LAMBDA,
    HOLISTIC_METRICS,
    check_lambda,
    holistic_scores,
    lambda_sweep,
    merge,
    merged_metric_id,
    merged_metric_ids,
)
from operators.metrics.probability import (
    CONVENTIONS,
    check_convention,
    log_yes_probability,
    log_yes_probability_expr,
    yes_probability,
    yes_probability_expr,
)
from operators.schema import METRIC_SCORES, conform

__all__ = [
    "CLAIM_METRICS",
    "CONVENTIONS",
    "DECOMPOSED_METRICS",
    "DEPICT_LAMBDA",
    "DEPICT_METRICS",
    "DSG_METRICS",
    "HOLISTIC_METRICS",
    "MERGE_TERMS",
    "UNDECIDED_BELOW",
    "catalog",
    "check_convention",
    "check_lambda",
    "claim_scores",
    "decomposed_scores",
    "depict_scores",
    "dsg_scores",
    "empty_scores",
    "grounding_only",
    "holistic_scores",
    "lambda_sweep",
    "log_yes_probability",
    "log_yes_probability_expr",
    "merge",
    "merge_terms_for",
    "merged_metric_id",
    "merged_metric_ids",
    "resolve_conventions",
    "score_all",
    "to_arrow",
    "yes_probability",
    "yes_probability_expr",
]

Table = pl.DataFrame | pa.Table


def score_all(
    item_ids: Iterable[str],
    *,
    decomposed: Table | None = None,
    holistic: Table | None = None,
    claims: Table | None = None,
    grounding: Table | None = None,
    lam: float = DEPICT_LAMBDA,
    probability: str | Mapping[str, str] = "normalized",
    undecided_below: float = UNDECIDED_BELOW,
    question_sets: Sequence[str] = ("depict", "dsg"),
    merge_terms: Sequence[str] = MERGE_TERMS,
    holistic_metric: str = "vqascore",
) -> pl.DataFrame:
    """Every metric computable from the tables given, as one long table.

    A family is scored when its table is given (then every requested item gets its rows,
    null where the item has no answers). `probability` is the convention of the decomposed
    metrics (one name, or per metric id). With holistic answers, each term of
    `merge_terms` that was scored is also merged with `holistic_metric` at weight `lam`;
    `agree` merged with `vqascore` is DEPICT.
    """
    unknown = [term for term in merge_terms if term not in MERGE_TERMS]
    if unknown:
        raise ValueError(f"cannot merge unknown metric(s) {', '.join(unknown)}; mergeable: {', '.join(MERGE_TERMS)}")
    lam = check_lambda(lam)
    items = requested_items(item_ids)["item_id"]
    terms = []
    if decomposed is not None:
        terms.append(
            decomposed_scores(
                decomposed, items, probability=probability, undecided_below=undecided_below, question_sets=question_sets
            )
        )
    if claims is not None:
        terms.append(claim_scores(claims, items))
    if grounding is not None:
        terms.append(grounding_only(grounding, items))
    frames = list(terms)
    if holistic is not None:
        holistic_long = holistic_scores(holistic, items)
        frames.append(holistic_long)
        by_term = pl.concat(terms).partition_by("metric", as_dict=True) if terms else {}
        for term in merge_terms:
            if (term,) in by_term:
                frames.append(merge(by_term[(term,)], holistic_long, term, lam, holistic_metric))
    return pl.concat(frames) if frames else empty_scores()


def merge_terms_for(metric_ids: Iterable[str], holistic_metric: str = "vqascore") -> tuple[str, ...]:
    """The terms of MERGE_TERMS whose merge with `holistic_metric` is among `metric_ids`
    ("depict" is agree's): a caller that keeps only some metrics merges only those."""
    wanted = set(metric_ids)
    return tuple(term for term in MERGE_TERMS if wanted.intersection(merged_metric_ids(term, holistic_metric)))


def to_arrow(scores: pl.DataFrame) -> pa.Table:
    """The metric table as Arrow with exactly operators.schema.METRIC_SCORES."""
    return conform(scores.to_arrow(), METRIC_SCORES, what="metric scores")
