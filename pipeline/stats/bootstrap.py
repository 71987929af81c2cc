"""Group bootstrap intervals, single-metric and paired, BCa as in scipy.stats.bootstrap.

Items of one group (a prompt's six images, a Winoground example, a NegBench image row) are
not independent, so we resample whole groups. Both metrics of a paired comparison see the
same resampled groups, which is what makes the difference's interval paired.

Statistics here are functions of group multiplicities: `counts` has shape (batch, n_groups)
and says how often each group occurs in a resample. That turns a resample into weights, so
SRCC of 2,000 resamples needs no sort per resample.

The resampling loop is scipy's (same generator calls, same batches of `_BATCH`), and the BCa
interval follows scipy's `_bca_interval` step for step, so an interval equals
`scipy.stats.bootstrap(..., method="BCa")` on the same resamples. What differs is BCa's
jackknife: scipy recomputes the statistic once per left-out group (quadratic in items for a
rank statistic); a `Statistic` may instead carry an exact leave-one-group-out shortcut
(`pipeline.stats.group_statistics`), which makes an interval linear (up to logs) in items.

Accuracies and their differences are computed in whole numbers (`pipeline.stats.exact`): a
resample equal to the estimate is an equal float, which BCa's bias correction counts as a tie.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from scipy.special import ndtr, ndtri

from pipeline.stats import exact
from pipeline.stats.correlation import check_pair
from pipeline.stats.group_statistics import kendall_statistic, pearson_statistic, srcc_statistic
from pipeline.stats.statistic import _BATCH, Statistic, as_statistic, naive_jackknife

GroupStatistic = Statistic
__all__ = [
    "Interval", "Statistic", "as_statistic", "bca_levels", "bootstrap_distribution", "difference", "group_codes",
    "group_interval", "item_statistic", "kendall_statistic", "mean_difference_statistic", "naive_jackknife",
    "paired_group_interval", "pearson_statistic", "ratio_statistic", "srcc_statistic",
]  # fmt: skip


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


def ratio_statistic(numerator, denominator) -> GroupStatistic:
    """sum(numerator) / sum(denominator) over resampled groups: accuracy, a share, a mean.

    With one value per group and denominator 1 this is the mean of per-group scores
    (Winoground, NegBench); with per-caption counts it is a share of questions. Discrete
    values (0/1 and 1/k credits, counts) are summed as whole numbers and divided once, so
    equal ratios are equal floats and BCa counts resamples equal to the estimate as ties
    (`pipeline.stats.exact`); other values are summed in floating point.
    """
    numerator = np.asarray(numerator, dtype=np.float64)
    denominator = np.asarray(denominator, dtype=np.float64)
    if numerator.shape != denominator.shape or numerator.ndim != 1:
        raise ValueError(f"numerator and denominator must be 1-D and equal in length: {numerator.shape} vs {denominator.shape}")
    exact_ratio = _exact_ratios((numerator, denominator))
    if exact_ratio is not None:
        return exact_ratio

    def statistic(counts: np.ndarray) -> np.ndarray:
        with np.errstate(invalid="ignore", divide="ignore"):
            return (counts @ numerator) / (counts @ denominator)

    def leave_one_out() -> np.ndarray:
        with np.errstate(invalid="ignore", divide="ignore"):
            return (numerator.sum() - numerator) / (denominator.sum() - denominator)

    return Statistic(statistic, leave_one_out, ratio=(numerator, denominator))


def _exact_ratios(first, second=None) -> Statistic | None:
    """The ratio `first` = (numerator, denominator), or first's ratio minus second's, from
    whole-number sums and one division; None when the values are not small fractions or a
    sum or product could leave float64's exact integers.

    a/b - c/d is (a d - c b) / (b d): every step exact, one rounding at the end.
    """
    arrays = [*first, *(second or ())]
    scale = exact.common_scale(*arrays)
    if scale is None:
        return None
    whole = np.column_stack([exact.scaled(a, scale) for a in arrays])
    reach = whole.shape[0] * float(np.abs(whole).max(initial=0.0))  # |a sum| over any resample
    if (reach if second is None else 2 * reach**2) >= exact.EXACT_BELOW:
        return None

    def value(sums: np.ndarray) -> np.ndarray:
        with np.errstate(invalid="ignore", divide="ignore"):
            if second is None:
                return sums[:, 0] / sums[:, 1]
            return (sums[:, 0] * sums[:, 3] - sums[:, 2] * sums[:, 1]) / (sums[:, 1] * sums[:, 3])

    def statistic(counts: np.ndarray) -> np.ndarray:
        return value(counts @ whole)  # whole numbers times whole counts: exact sums

    def leave_one_out() -> np.ndarray:
        return value(whole.sum(axis=0) - whole)

    return Statistic(statistic, leave_one_out, ratio=first if second is None else None)


def mean_difference_statistic(values_a, values_b) -> Statistic:
    """Mean of a minus mean of b over the same resampled groups: a paired accuracy difference.

    Exact for discrete credits (see `difference`): mean(a) - mean(b) in floating point gives
    -0.024999999999999967 for -0.025, and BCa then miscounts the resamples equal to it.
    """
    a = np.asarray(values_a, dtype=np.float64)
    b = np.asarray(values_b, dtype=np.float64)
    if a.shape != b.shape:
        raise ValueError(f"paired per-group values differ in length: {a.size} vs {b.size}")
    return difference(ratio_statistic(a, np.ones(a.size)), ratio_statistic(b, np.ones(b.size)))


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

    return Statistic(statistic)


def difference(statistic_a, statistic_b) -> Statistic:
    """statistic_a - statistic_b on the same resamples (and the same left-out groups).

    Two ratios of discrete values (accuracies, shares) become one exact ratio, so the
    difference is rounded once and resamples equal to the estimate are equal floats.
    """
    a, b = as_statistic(statistic_a), as_statistic(statistic_b)
    if a.ratio is not None and b.ratio is not None:
        exact_difference = _exact_ratios(a.ratio, b.ratio)
        if exact_difference is not None:
            return exact_difference
    shortcut = None
    if a.leave_one_out is not None and b.leave_one_out is not None:
        def shortcut():
            return a.leave_one_out() - b.leave_one_out()
    return Statistic(lambda counts: a(counts) - b(counts), shortcut, parts=(a, b))


def group_interval(
    statistic,
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
    if method.lower() not in ("bca", "percentile", "basic"):
        raise ValueError(f"method must be BCa, percentile or basic, got {method!r}")
    statistic = as_statistic(statistic)
    estimate = float(statistic(np.ones((1, n_groups)))[0])
    if not np.isfinite(estimate):
        return Interval(estimate, float("nan"), float("nan"), n_groups, n_resamples, "statistic undefined on the full data")
    distribution = bootstrap_distribution(statistic, n_groups, n_resamples, seed)
    undefined = int(np.count_nonzero(~np.isfinite(distribution)))
    if undefined:
        return Interval(estimate, float("nan"), float("nan"), n_groups, n_resamples, f"statistic undefined in {undefined} of {n_resamples} resamples")
    if np.all(distribution == distribution[0]):
        # e.g. an accuracy of 1.0, or two metrics that agree on every group: no spread at all
        value = float(distribution[0])
        return Interval(estimate, value, value, n_groups, n_resamples, "every resample gives the same value")
    alpha = (1.0 - confidence) / 2.0
    if method.lower() == "bca":
        levels, reason = bca_levels(estimate, distribution, statistic.jackknife(n_groups), alpha)
        if reason:
            return Interval(estimate, float("nan"), float("nan"), n_groups, n_resamples, f"interval not computable: {reason}")
    else:
        levels = (alpha, 1.0 - alpha)
    low, high = (float(v) for v in np.quantile(distribution, levels))
    if method.lower() == "basic":
        low, high = 2 * estimate - high, 2 * estimate - low
    return Interval(estimate, low, high, n_groups, n_resamples)


def bootstrap_distribution(statistic, n_groups: int, n_resamples: int, seed: int) -> np.ndarray:
    """The statistic on `n_resamples` group resamples, drawn exactly as scipy.stats.bootstrap does.

    Cached on the `Statistic`; a difference is the difference of its parts' distributions
    (the same subtraction, so the same numbers).
    """
    statistic = as_statistic(statistic)
    key = (n_groups, n_resamples, seed)
    if key in statistic.distributions:
        return statistic.distributions[key]
    if statistic.parts is not None:
        first, second = statistic.parts
        values = bootstrap_distribution(first, *key) - bootstrap_distribution(second, *key)
    else:
        values = _draw(statistic, n_groups, n_resamples, seed)
    statistic.distributions[key] = values
    return values


def _draw(statistic, n_groups: int, n_resamples: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    values = []
    for start in range(0, n_resamples, _BATCH):
        rows = min(_BATCH, n_resamples - start)
        indices = rng.integers(0, n_groups, (rows, n_groups))
        offsets = (np.arange(rows) * n_groups)[:, None]
        counts = np.bincount((indices + offsets).ravel(), minlength=rows * n_groups)
        values.append(statistic(counts.reshape(rows, n_groups).astype(np.float64)))
    return np.concatenate(values)


def bca_levels(estimate: float, distribution: np.ndarray, jackknife: np.ndarray, alpha: float):
    """BCa's adjusted quantile levels (scipy's `_bca_interval`), or (None, reason)."""
    share = (np.count_nonzero(distribution < estimate) + np.count_nonzero(distribution <= estimate)) / (2 * distribution.size)
    z0 = ndtri(share)
    n = float(jackknife.size)
    spread = (n - 1) * (jackknife.mean() - jackknife)
    with np.errstate(invalid="ignore", divide="ignore"):
        acceleration = 1 / 6 * (np.sum(spread**3) / n**3) / (np.sum(spread**2) / n**2) ** (3 / 2)
        z_alpha = float(ndtri(alpha))
        levels = []
        for z in (z_alpha, -z_alpha):
            levels.append(float(ndtr(z0 + (z0 + z) / (1 - acceleration * (z0 + z)))))
    if not all(np.isfinite(levels)):
        reason = "bias correction undefined" if not np.isfinite(z0) else "acceleration undefined (jackknife values all equal)"
        return None, reason
    return tuple(levels), None


def paired_group_interval(
    statistic_a,
    statistic_b,
    n_groups: int,
    **options,
) -> Interval:
    """Interval of statistic_a - statistic_b with both computed on the same resampled groups."""
    return group_interval(difference(statistic_a, statistic_b), n_groups, **options)
