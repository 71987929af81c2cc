"""Diagnostics of the DEPICT answers: how often captions imply "no", and what weighting buys.

- `answer_distribution`: over unique (caption, question) pairs, the share the caption
  answers "no" (p_t < 0.5) and the share it leaves undecided (commitment
  w = |2 p_t - 1| < 0.2), with intervals from resampling captions (questions of one caption
  are generated together, so the caption is the independent unit).
- `correlation_weighting_gain` / `choice_weighting_gain`: a statistic of the
  commitment-weighted metric minus the same statistic of its unweighted twin, on all items
  and on the least committed quartile (lowest `mean_commitment`, which the metrics module
  emits per item), with a paired group-bootstrap interval.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from pipeline.stats import bootstrap, exact
from pipeline.stats.correlation import as_float_array, check_pair

UNDECIDED_BELOW = 0.2  # commitment under this: the caption barely fixes the answer


@dataclass(frozen=True)
class AnswerDistribution:
    n_pairs: int  # unique (caption, question) pairs
    n_captions: int
    no_share: bootstrap.Interval  # share with p_t < 0.5
    undecided: bootstrap.Interval  # share with |2 p_t - 1| < UNDECIDED_BELOW


def answer_distribution(
    answers: pl.DataFrame,
    *,
    question_column: str = "question",
    undecided_below: float = UNDECIDED_BELOW,
    n_resamples: int = 2000,
    seed: int = 0,
) -> AnswerDistribution:
    """Shares of "no" and undecided caption-only answers, with caption-level bootstrap intervals.

    `answers` has `caption`, `question_column` and either `p_t` or the raw
    `logp_yes_t`, `logp_no_t` (then p_t = sigmoid(logp_yes_t - logp_no_t)). Repeated rows of
    the same pair count once; the same pair with two different p_t values is a ValueError
    (answers of two backbones or prompt versions mixed up).
    """
    needed = ["caption", question_column]
    if "p_t" not in answers.columns:
        needed += ["logp_yes_t", "logp_no_t"]
    missing = [c for c in needed if c not in answers.columns]
    if missing:
        raise ValueError(f"answers: missing column(s) {missing} (need p_t or logp_yes_t/logp_no_t)")
    if "p_t" not in answers.columns:
        answers = answers.with_columns(p_t=1.0 / (1.0 + (pl.col("logp_no_t") - pl.col("logp_yes_t")).exp()))
    pairs = answers.select("caption", pl.col(question_column).alias("question"), pl.col("p_t").cast(pl.Float64)).unique()
    bad = pairs.filter(pl.col("p_t").is_null() | pl.col("p_t").is_nan() | (pl.col("p_t") < 0) | (pl.col("p_t") > 1))
    if bad.height:
        raise ValueError(f"answers: {bad.height} pair(s) with p_t missing or outside [0, 1], e.g. {bad.row(0)}")
    clash = pairs.group_by("caption", "question").agg(pl.len()).filter(pl.col("len") > 1)
    if clash.height:
        raise ValueError(f"answers: {clash.height} (caption, question) pair(s) with different p_t, e.g. {clash.row(0)[:2]}")

    per_caption = pairs.group_by("caption").agg(
        n=pl.len(),
        no=(pl.col("p_t") < 0.5).sum(),
        undecided=((2 * pl.col("p_t") - 1).abs() < undecided_below).sum(),
    )
    n_captions = per_caption.height
    denominator = per_caption["n"].to_numpy()

    def share(column: str) -> bootstrap.Interval:
        statistic = bootstrap.ratio_statistic(per_caption[column].to_numpy(), denominator)
        if n_captions < 2:
            value = float(statistic(np.ones((1, n_captions)))[0])
            return bootstrap.Interval(value, float("nan"), float("nan"), n_captions, 0, "fewer than 2 captions")
        return bootstrap.group_interval(statistic, n_captions, n_resamples=n_resamples, seed=seed)

    return AnswerDistribution(pairs.height, n_captions, share("no"), share("undecided"))


@dataclass(frozen=True)
class WeightingGain:
    subset: str  # "all" or "least_committed"
    weighted: float
    unweighted: float
    gain: bootstrap.Interval  # estimate = weighted - unweighted, paired group bootstrap
    n: int  # items (correlation) or groups (choice) in the subset
    threshold: float | None  # the mean_commitment cut of the least committed quartile


def least_committed(commitment) -> tuple[np.ndarray, float]:
    """Mask of the quartile with the lowest commitment (<= its 25th percentile) and the cut."""
    commitment = as_float_array(commitment, "mean_commitment")
    if not np.all(np.isfinite(commitment)):
        raise ValueError("mean_commitment has NaN values; drop those items first")
    cut = float(np.quantile(commitment, 0.25))
    return commitment <= cut, cut


def correlation_weighting_gain(
    weighted, unweighted, human, commitment, group_ids, *, n_resamples: int = 2000, seed: int = 0
) -> list[WeightingGain]:
    """SRCC(weighted) - SRCC(unweighted), on all items and on the least committed quartile."""
    weighted, human = check_pair(weighted, human, x_name="weighted")
    unweighted, _ = check_pair(unweighted, human, x_name="unweighted")
    low, cut = least_committed(commitment)
    group_ids = np.asarray(group_ids)
    gains = []
    for subset, mask, threshold in (("all", np.ones(human.size, bool), None), ("least_committed", low, cut)):
        groups, n_groups = bootstrap.group_codes(group_ids[mask])
        stat_w = bootstrap.srcc_statistic(weighted[mask], human[mask], groups)
        stat_u = bootstrap.srcc_statistic(unweighted[mask], human[mask], groups)
        ones = np.ones((1, n_groups))
        interval = bootstrap.paired_group_interval(stat_w, stat_u, n_groups, n_resamples=n_resamples, seed=seed)
        gains.append(WeightingGain(subset, float(stat_w(ones)[0]), float(stat_u(ones)[0]), interval, int(mask.sum()), threshold))
    return gains


def choice_weighting_gain(
    weighted_credit, unweighted_credit, group_commitment, *, n_resamples: int = 2000, seed: int = 0
) -> list[WeightingGain]:
    """Accuracy(weighted) - accuracy(unweighted) from per-group credit, all groups and the
    least committed quartile of groups (by each group's mean commitment)."""
    weighted = as_float_array(weighted_credit, "weighted credit")
    unweighted = as_float_array(unweighted_credit, "unweighted credit")
    if weighted.shape != unweighted.shape:
        raise ValueError(f"credit arrays differ in length: {weighted.size} vs {unweighted.size}")
    low, cut = least_committed(group_commitment)
    gains = []
    for subset, mask, threshold in (("all", np.ones(weighted.size, bool), None), ("least_committed", low, cut)):
        difference = bootstrap.mean_difference_statistic(weighted[mask], unweighted[mask])  # exact for discrete credit
        interval = bootstrap.group_interval(difference, int(mask.sum()), n_resamples=n_resamples, seed=seed)
        gains.append(
            WeightingGain(subset, exact.mean(weighted[mask]), exact.mean(unweighted[mask]), interval, int(mask.sum()), threshold)
        )
    return gains
