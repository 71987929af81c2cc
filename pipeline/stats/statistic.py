"""A group-bootstrap statistic: a function of group multiplicities, with an optional jackknife shortcut."""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

_BATCH = 100  # resamples (or left-out groups) per call: (100 x 9,600) float arrays stay small


class Statistic:
    """A statistic of group multiplicities: counts (batch, n_groups) -> values (batch,).

    `leave_one_out`, when given, returns the n_groups jackknife values (each group left out
    once) without recomputing the statistic per group. `parts` = (a, b) marks a difference
    a - b, whose bootstrap distribution is the difference of the parts' (same resamples);
    `distributions` caches a statistic's bootstrap distribution per (n_groups, n_resamples,
    seed), so a metric's interval and its paired delta draw and compute each resample once.
    `ratio` = (numerator, denominator) marks sum(numerator) / sum(denominator) over groups, so
    that `bootstrap.difference` can subtract two ratios exactly.
    """

    def __init__(
        self,
        function: Callable[[np.ndarray], np.ndarray],
        leave_one_out: Callable[[], np.ndarray] | None = None,
        parts: tuple[Statistic, Statistic] | None = None,
        ratio: tuple[np.ndarray, np.ndarray] | None = None,
    ):
        self.function = function
        self.leave_one_out = leave_one_out
        self.parts = parts
        self.ratio = ratio
        self.distributions: dict[tuple[int, int, int], np.ndarray] = {}

    def __call__(self, counts: np.ndarray) -> np.ndarray:
        return self.function(counts)

    def jackknife(self, n_groups: int) -> np.ndarray:
        if self.leave_one_out is not None:
            return np.asarray(self.leave_one_out(), dtype=np.float64)
        return naive_jackknife(self.function, n_groups)


def naive_jackknife(function: Callable[[np.ndarray], np.ndarray], n_groups: int) -> np.ndarray:
    """The statistic recomputed with each group left out in turn (the reference)."""
    values = []
    for start in range(0, n_groups, _BATCH):
        rows = min(_BATCH, n_groups - start)
        counts = np.ones((rows, n_groups))
        counts[np.arange(rows), start + np.arange(rows)] = 0.0
        values.append(function(counts))
    return np.concatenate(values)


def as_statistic(statistic) -> Statistic:
    return statistic if isinstance(statistic, Statistic) else Statistic(statistic)
