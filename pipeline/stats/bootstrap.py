"""Group bootstrap intervals, single-metric and paired, via scipy.stats.bootstrap (BCa).

Items of one group (a prompt's six images, a Winoground example, a NegBench image row) are
not independent, so we resample whole groups. scipy resamples the group *indices*; both
metrics of a paired comparison see the same resampled groups, which is what makes the
difference's interval paired.

Statistics here are functions of group multiplicities: `counts` has shape (batch, n_groups)
and says how often each group occurs in a resample (a jackknife sample has one 0). That
turns a resample into weights, so SRCC of 2,000 resamples plus 1,600 jackknife samples
needs no sort per resample: items are sorted once and each resample's average ranks come
from a cumulative sum of weights in that fixed order.
"""
from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from scipy import stats

from pipeline.stats.correlation import check_pair

GroupStatistic = Callable[[np.ndarray], np.ndarray]  # counts (batch, n_groups) -> values (batch,)
_BATCH = 100  # resamples per call: (100 x 9,600) float arrays stay small


@dataclass(frozen=True)
class Interval:
    estimate: float  # the statistic on the original data
    low: float  # NaN when the interval cannot be computed; `note` says why
    high: float
    n_groups: int
    n_resamples: int
    note: str | None = None

    @property
    def excludes_zero(self) -> bool:
        return bool(self.low > 0 or self.high < 0)


def group_codes(group_ids) -> tuple[np.ndarray, int]:
    """Integer group index per item (0..n_groups-1, in sorted id order) and the group count."""
    labels = np.asarray(group_ids)
    if labels.ndim != 1:
        raise ValueError(f"group ids must be one-dimensional, got shape {labels.shape}")
    uniques, codes = np.unique(labels, return_inverse=True)
    return codes.astype(np.int64), int(uniques.size)


class _AverageRanks:
    """Average ranks (ties share the mean rank) of one variable under any item weights."""

    def __init__(self, values: np.ndarray):
        self.order = np.argsort(values, kind="stable")
        ordered = values[self.order]
        is_last = np.append(ordered[1:] != ordered[:-1], True)
        self.last = np.flatnonzero(is_last)  # sorted position of the last item of each distinct value
        tie_group = np.concatenate([[0], np.cumsum(is_last)[:-1]])
        self.item_group = np.empty(values.size, dtype=np.int64)
        self.item_group[self.order] = tie_group

    def __call__(self, weights: np.ndarray) -> np.ndarray:
        ends = np.cumsum(weights[:, self.order], axis=1)[:, self.last]
        starts = np.concatenate([np.zeros((weights.shape[0], 1)), ends[:, :-1]], axis=1)
        return ((starts + ends + 1.0) / 2.0)[:, self.item_group]


def _weighted_rank_correlation(rank_x: np.ndarray, rank_y: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Pearson correlation of average ranks with item weights: Spearman on the expanded sample."""
    total = weights.sum(axis=1, keepdims=True)
    centre = (total + 1.0) / 2.0  # the mean of average ranks 1..N is always (N + 1) / 2
    dx, dy = rank_x - centre, rank_y - centre
    wdx = weights * dx
    with np.errstate(invalid="ignore", divide="ignore"):
        return (wdx * dy).sum(axis=1) / np.sqrt((wdx * dx).sum(axis=1) * (weights * dy * dy).sum(axis=1))


def srcc_statistic(metric, human, groups: np.ndarray) -> GroupStatistic:
    """SRCC of `metric` with `human` on the items of the resampled groups (`groups`: item -> code)."""
    metric, human = check_pair(metric, human)
    rank_metric, rank_human = _AverageRanks(metric), _AverageRanks(human)

    def statistic(counts: np.ndarray) -> np.ndarray:
        weights = counts[:, groups]
        return _weighted_rank_correlation(rank_metric(weights), rank_human(weights), weights)

    return statistic


def ratio_statistic(numerator, denominator) -> GroupStatistic:
    """sum(numerator) / sum(denominator) over resampled groups: accuracy, a share, a mean.

    With one value per group and denominator 1 this is the mean of per-group scores
    (Winoground, NegBench); with per-caption counts it is a share of questions.
    """
    numerator = np.asarray(numerator, dtype=np.float64)
    denominator = np.asarray(denominator, dtype=np.float64)
    if numerator.shape != denominator.shape or numerator.ndim != 1:
        raise ValueError(f"numerator and denominator must be 1-D and equal in length: {numerator.shape} vs {denominator.shape}")

    def statistic(counts: np.ndarray) -> np.ndarray:
        with np.errstate(invalid="ignore", divide="ignore"):
            return (counts @ numerator) / (counts @ denominator)

    return statistic


def item_statistic(function: Callable[[np.ndarray, np.ndarray], float], metric, human, groups: np.ndarray) -> GroupStatistic:
    """Any statistic of (metric, human) item vectors, by expanding each resample (slow, general).

    Use it for statistics with no weighted form (e.g. PLCC's logistic fit); expect about one
    call of `function` per resample plus one per group for BCa's jackknife.
    """
    metric, human = check_pair(metric, human)
    order = np.argsort(groups, kind="stable")
    bounds = np.searchsorted(groups[order], np.arange(groups.max() + 2))

    def one(counts_row: np.ndarray) -> float:
        picks = np.concatenate([np.tile(order[bounds[g] : bounds[g + 1]], int(c)) for g, c in enumerate(counts_row) if c])
        return float(function(metric[picks], human[picks]))

    def statistic(counts: np.ndarray) -> np.ndarray:
        return np.array([one(row) for row in counts])

    return statistic


def difference(statistic_a: GroupStatistic, statistic_b: GroupStatistic) -> GroupStatistic:
    return lambda counts: statistic_a(counts) - statistic_b(counts)


def group_interval(
    statistic: GroupStatistic,
    n_groups: int,
    *,
    n_resamples: int = 2000,
    seed: int = 0,
    confidence: float = 0.95,
    method: str = "BCa",
) -> Interval:
    """Bootstrap interval of `statistic` resampling `n_groups` groups with replacement, seeded.

    `method` is scipy's: "BCa" (default), "percentile" or "basic". If every resample gives
    the same value the interval is that single point (BCa itself is undefined then); if the
    statistic is undefined in some resamples (NaN) the bounds are NaN. Both come with a note.
    """
    if n_groups < 2:
        raise ValueError(f"a group bootstrap needs at least 2 groups, got {n_groups}")
    if n_resamples < 1:
        raise ValueError(f"n_resamples must be positive, got {n_resamples}")

    def on_indices(indices: np.ndarray, axis: int = -1) -> np.ndarray:
        flat = indices.reshape(-1, indices.shape[-1])
        offsets = (np.arange(flat.shape[0]) * n_groups)[:, None]
        counts = np.bincount((flat + offsets).ravel(), minlength=flat.shape[0] * n_groups)
        values = statistic(counts.reshape(flat.shape[0], n_groups).astype(np.float64))
        return values.reshape(indices.shape[:-1])

    estimate = float(statistic(np.ones((1, n_groups)))[0])
    if not np.isfinite(estimate):
        return Interval(estimate, float("nan"), float("nan"), n_groups, n_resamples, "statistic undefined on the full data")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = stats.bootstrap(
            (np.arange(n_groups),),
            on_indices,
            n_resamples=n_resamples,
            batch=_BATCH,
            vectorized=True,
            confidence_level=confidence,
            method=method,
            rng=np.random.default_rng(seed),
        )
    low, high = float(result.confidence_interval.low), float(result.confidence_interval.high)
    note = None
    distribution = result.bootstrap_distribution
    undefined = int(np.count_nonzero(~np.isfinite(distribution)))
    if not undefined and np.all(distribution == distribution[0]):
        # e.g. an accuracy of 1.0, or two metrics that agree on every group: no spread at all
        low = high = float(distribution[0])
        note = "every resample gives the same value"
    elif undefined:
        note = f"statistic undefined in {undefined} of {n_resamples} resamples"
    elif not (np.isfinite(low) and np.isfinite(high)):
        messages = {str(w.message).split(".")[0] for w in caught}
        note = "interval not computable: " + ("; ".join(sorted(messages)) or "degenerate bootstrap distribution")
    return Interval(estimate, low, high, n_groups, n_resamples, note)


def paired_group_interval(
    statistic_a: GroupStatistic,
    statistic_b: GroupStatistic,
    n_groups: int,
    **options,
) -> Interval:
    """Interval of statistic_a - statistic_b with both computed on the same resampled groups."""
    return group_interval(difference(statistic_a, statistic_b), n_groups, **options)
