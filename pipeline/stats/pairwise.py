"""Pairwise accuracy with tie calibration ("acc23", Deutsch, Foster & Freitag 2023).

Over all pairs of items: accuracy = (concordant pairs + pairs tied in both) / all pairs.
Human ties are exact equality; a metric tie is |dm| <= eps. Tie calibration chooses eps
among 0 and every distinct |dm| to maximise accuracy, the smallest eps at the maximum.
This matches `tau_optimization(..., TauSufficientStats.acc_23)` in
google-research/mt-metrics-eval for one row of scores ("no grouping").

Why it is exact without visiting every pair. With items sorted by metric, the pairs with
|dm| <= eps are, for each item i, a window of the items after it. For one eps the two
counts that matter are then per-item window counts: human-tied pairs (binary searches among
the items of the same human value) and concordant pairs (a prefix-dominance count,
`dominance.PrefixCounts`), O(N log^2 N) per eps instead of O(N^2). Correct pairs at eps are
concordant_total - concordant(|dm| <= eps) + tied_in_both(|dm| <= eps); over an eps
interval (lo, hi] they can never exceed correct(lo) + ties(hi) - ties(lo). So a branch and
bound over eps intervals evaluates a few dozen eps values, discards every interval that
cannot reach the best value found, splits the others between distinct |dm| values, and
enumerates exactly the pairs of intervals small enough (tens of thousands of pairs), sorted by
|dm|. The result is the same eps and counts as sorting all N^2/2 pairs.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipeline.stats.correlation import check_pair
from pipeline.stats.dominance import PrefixCounts


@dataclass(frozen=True)
class PairwiseAccuracy:
    value: float  # (concordant + tied in both) / n_pairs at `epsilon`
    epsilon: float  # metric tie threshold: chosen by calibration, or the one given
    n: int  # items
    n_pairs: int
    concordant: int  # pairs ordered the same way by metric and humans, |dm| > epsilon
    ties_both: int  # pairs tied for humans and with |dm| <= epsilon
    note: str | None = None


def pairwise_accuracy(metric, human, *, epsilon: float | None = None) -> PairwiseAccuracy:
    """acc23 of `metric` against `human`; eps is tie-calibrated unless `epsilon` is given.

    Same input rules as `correlation.check_pair` (ValueError for mismatched lengths, NaN,
    fewer than 3 items). Constant inputs are fine here: every pair is then a tie on that
    side, which acc23 scores without dividing by zero.
    """
    metric, human = check_pair(metric, human)
    order = np.argsort(metric, kind="stable")
    windows = _Windows(metric[order], human[order])
    n_pairs = metric.size * (metric.size - 1) // 2
    if epsilon is None:
        epsilon, concordant, ties_both = windows.calibrate()
    elif not np.isfinite(epsilon) or epsilon < 0:
        raise ValueError(f"epsilon must be a finite number >= 0, got {epsilon}")
    else:
        at = windows.at(float(epsilon))
        concordant, ties_both = windows.concordant_total - at.losses, at.ties
    return PairwiseAccuracy(
        (concordant + ties_both) / n_pairs, float(epsilon), metric.size, n_pairs, int(concordant), int(ties_both)
    )


@dataclass(frozen=True)
class _At:
    """Counts over the pairs with dm <= eps (items sorted by metric, dm >= 0)."""

    eps: float
    upper: np.ndarray  # per item i: the first j with m_j - m_i > eps
    ties: int  # human-tied pairs (they count as correct)
    losses: int  # concordant pairs with 0 < dm (they stop counting)
    pairs: int


class _Windows:
    """Per-eps counts in O(N log^2 N), and the branch and bound over eps (module doc)."""

    def __init__(self, metric: np.ndarray, human: np.ndarray):
        self.m, self.h = metric, human
        n = self.n = metric.size
        _, codes = np.unique(human, return_inverse=True)
        self.codes = codes.astype(np.int64)
        self.position = np.arange(n)
        self.by_human = np.sort(self.codes * (n + 1) + self.position)  # (human value, position) order
        self.prefix = PrefixCounts(self.codes)
        self.greater_before = self.prefix.greater(self.position + 1, self.codes)  # j <= i with h_j > h_i
        self.above_at_zero = self._above(self.upper(0.0))  # dm == 0 pairs: never concordant
        self.everything = self.at(np.inf)
        self.concordant_total = self.everything.losses

    def upper(self, eps: float) -> np.ndarray:
        """First j with m_j - m_i > eps, comparing the rounded difference like a pair loop does."""
        m, n = self.m, self.n
        if eps == np.inf:
            return np.full(n, n)
        upper = np.searchsorted(m, m + eps, side="right")
        for _ in range(64):  # m + eps and m_j - m_i round differently only near the boundary
            inside = np.flatnonzero(upper < n)
            grow = inside[m[upper[inside]] - m[inside] <= eps]
            shrink = np.flatnonzero((upper > 0) & (m[np.maximum(upper - 1, 0)] - m > eps))
            if not grow.size and not shrink.size:
                return upper
            upper[grow] = np.searchsorted(m, m[upper[grow]], side="right")  # past that whole value
            upper[shrink] = np.searchsorted(m, m[upper[shrink] - 1], side="left")
        raise RuntimeError("pairwise accuracy: window bounds did not settle")

    def _above(self, upper: np.ndarray) -> int:
        """Pairs i < j < upper_i with h_j > h_i."""
        return int((self.prefix.greater(upper, self.codes) - self.greater_before).sum())

    def at(self, eps: float) -> _At:
        upper = self.upper(eps)
        key = self.codes * (self.n + 1)
        ties = np.searchsorted(self.by_human, key + upper - 1, side="right") - np.searchsorted(self.by_human, key + self.position, side="right")
        losses = self._above(upper) - self.above_at_zero
        return _At(eps, upper, int(ties.sum()), losses, int((upper - self.position - 1).sum()))

    def value(self, at: _At) -> int:
        return self.concordant_total - at.losses + at.ties

    def calibrate(self) -> tuple[float, int, int]:
        """The smallest eps with the most correct pairs, and (concordant, ties_both) there."""
        zero = self.at(0.0)
        if zero.pairs == self.n * (self.n - 1) // 2:  # every pair has dm == 0
            return 0.0, self.concordant_total, zero.ties
        points = [zero] + [self.at(e) for e in self._grid()] + [self.everything]
        candidates = {0.0: self.value(zero)}
        for point in points[1:]:
            candidates[self._largest_dm(point)] = self.value(point)
        best_value = max(candidates.values())
        intervals = [(lo, hi) for lo, hi in zip(points[:-1], points[1:]) if hi.pairs > lo.pairs]
        while intervals:
            lo, hi = intervals.pop()
            if hi.pairs == lo.pairs:
                continue  # no pair difference in (lo, hi]: nothing new
            if self.value(lo) + (hi.ties - lo.ties) < best_value:
                continue  # no eps in (lo, hi] can reach the best value
            if hi.pairs - lo.pairs <= _ENUMERATE:
                for eps, value in self._exact(lo, hi):
                    candidates[eps] = value
                best_value = max(best_value, *candidates.values())
                continue
            first, last = self._smallest_dm_above(lo), self._largest_dm(hi)
            if first >= last:  # a single distinct dm in the interval: its value is hi's
                candidates[last] = self.value(hi)
                best_value = max(best_value, candidates[last])
                continue
            split = first + (last - first) / 2
            if not first <= split < last:  # adjacent floats: split right after the first value
                split = first
            middle = self.at(split)
            candidates[self._largest_dm(middle)] = self.value(middle)
            best_value = max(best_value, candidates[self._largest_dm(middle)])
            intervals += [(lo, middle), (middle, hi)]
        best_eps = min(eps for eps, value in candidates.items() if value == best_value)
        final = self.at(best_eps)
        return float(best_eps), int(self.concordant_total - final.losses), int(final.ties)

    def _grid(self) -> list[float]:
        """Starting eps values: quantiles of |dm| over a fixed random sample of pairs."""
        rng = np.random.default_rng(0)
        i = rng.integers(0, self.n, _SAMPLE)
        j = rng.integers(0, self.n, _SAMPLE)
        dm = np.abs(self.m[j] - self.m[i])
        dm = dm[dm > 0]
        if not dm.size:
            return []
        return sorted(set(np.quantile(dm, np.linspace(0, 1, _GRID + 1)[1:-1]).tolist()))

    def _largest_dm(self, at: _At) -> float:
        """The largest pair difference <= at.eps (0.0 if none is positive)."""
        has = np.flatnonzero(at.upper - 1 > self.position)
        if not has.size:
            return 0.0
        return float(np.max(self.m[at.upper[has] - 1] - self.m[has]))

    def _smallest_dm_above(self, at: _At) -> float:
        has = np.flatnonzero(at.upper < self.n)
        return float(np.min(self.m[at.upper[has]] - self.m[has])) if has.size else np.inf

    def _exact(self, lo: _At, hi: _At):
        """(eps, correct pairs) at every distinct dm in (lo.eps, hi.eps], by listing those pairs."""
        counts = hi.upper - lo.upper
        first = np.repeat(self.position, counts)
        offset = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
        second = np.repeat(lo.upper, counts) + offset
        dm = self.m[second] - self.m[first]
        dh = self.h[second] - self.h[first]
        values, where = np.unique(dm, return_inverse=True)
        gains = np.cumsum(np.bincount(where, weights=(dh == 0), minlength=values.size))
        losses = np.cumsum(np.bincount(where, weights=(dh > 0) & (dm > 0), minlength=values.size))
        base = self.value(lo)
        return [(float(v), int(round(base + g - c))) for v, g, c in zip(values, gains, losses)]


_ENUMERATE = 50_000  # pairs listed exactly at once: below this, listing beats splitting further
_SAMPLE = 200_000  # random pairs whose |dm| quantiles seed the search
_GRID = 32
