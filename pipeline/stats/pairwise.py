"""Pairwise accuracy with tie calibration ("acc23", Deutsch, Foster & Freitag 2023).

Over all pairs of items: accuracy = (concordant pairs + pairs tied in both) / all pairs.
Human ties are exact equality; a metric tie is |dm| <= eps. Tie calibration chooses eps
among 0 and every distinct |dm| to maximise accuracy, the smallest eps at the maximum.
This matches `tau_optimization(..., TauSufficientStats.acc_23)` in
google-research/mt-metrics-eval for one row of scores ("no grouping").

Why it is exact and fast. Raising eps only changes a pair once, when eps reaches its |dm|:
a human-tied pair starts to count (+1) and a concordant pair stops counting (-1).
So accuracy(eps) * n_pairs = concordant_total + (sum of those +1/-1 over pairs with
|dm| <= eps), a running sum over pairs sorted by |dm|. Sorting all 46M pairs of 9,600
items would be slow, so we (1) histogram the +1/-1 steps into value bins in one vectorised
pass over blocks of pairs, (2) bound the best running sum reachable inside each bin, and
(3) sort exactly only the pairs in bins that could hold the maximum (usually a handful).
Items are sorted by metric first, so within a block every dm is >= 0 and a block's range
of dm is known without computing it, which lets the second pass skip most blocks.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipeline.stats.correlation import check_pair

_HUMAN_TIE, _CONCORDANT, _OTHER = 0, 1, 2
_BLOCK = 1024
_BINS = 1 << 16


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
    pairs = _SortedPairs(metric[order], human[order])
    n_pairs = metric.size * (metric.size - 1) // 2
    if epsilon is None:
        epsilon, concordant, ties_both = pairs.calibrate()
    elif not np.isfinite(epsilon) or epsilon < 0:
        raise ValueError(f"epsilon must be a finite number >= 0, got {epsilon}")
    else:
        concordant, ties_both = pairs.counts_at(float(epsilon))
    return PairwiseAccuracy(
        (concordant + ties_both) / n_pairs, float(epsilon), metric.size, n_pairs, concordant, ties_both
    )


class _SortedPairs:
    """All pairs i < j of items sorted by metric, visited block by block (dm >= 0 everywhere)."""

    def __init__(self, metric: np.ndarray, human: np.ndarray):
        self.metric, self.human = metric, human
        n = metric.size
        self.starts = list(range(0, n, _BLOCK))
        span = float(metric[-1] - metric[0])
        self.scale = _BINS / span if span > 0 else 0.0

    def blocks(self, keep=None):
        """Yield (dm, dh) for every pair once; `keep(dm_low, dm_high)` may skip a block."""
        m, h, n = self.metric, self.human, self.metric.size
        for a in self.starts:
            rows = slice(a, min(a + _BLOCK, n))
            for b in self.starts[self.starts.index(a):]:
                cols = slice(b, min(b + _BLOCK, n))
                if keep is not None:
                    low = max(m[b] - m[rows.stop - 1], 0.0)  # smallest possible dm in the block
                    if not keep(low, m[cols.stop - 1] - m[a]):
                        continue
                dm = m[cols][None, :] - m[rows][:, None]
                dh = h[cols][None, :] - h[rows][:, None]
                if a == b:  # diagonal block: the pairs above the diagonal only
                    upper = np.triu_indices(dm.shape[0], 1)
                    yield dm[upper], dh[upper]
                else:
                    yield dm.ravel(), dh.ravel()

    def bin_of(self, dm):
        """Monotone bin index: 0 for dm == 0 exactly, then _BINS equal-width bins."""
        inner = np.minimum((np.asarray(dm) * self.scale).astype(np.int64), _BINS - 1) + 1
        return np.where(np.asarray(dm) == 0, 0, inner)

    @staticmethod
    def kind(dm, dh):
        return np.where(dh == 0, _HUMAN_TIE, np.where((dh > 0) & (dm > 0), _CONCORDANT, _OTHER))

    def counts_at(self, epsilon: float) -> tuple[int, int]:
        concordant = ties_both = 0
        for dm, dh in self.blocks():
            tied = dm <= epsilon
            ties_both += int(np.count_nonzero(tied & (dh == 0)))
            concordant += int(np.count_nonzero(~tied & (dh > 0)))
        return concordant, ties_both

    def calibrate(self) -> tuple[float, int, int]:
        """The smallest eps with the most correct pairs, and (concordant, ties_both) there."""
        # Pass 1: per bin, how many human-tied (+1) and concordant (-1) pairs it holds.
        counts = np.zeros((_BINS + 1) * 3, dtype=np.int64)
        for dm, dh in self.blocks():
            counts += np.bincount(self.bin_of(dm) * 3 + self.kind(dm, dh), minlength=counts.size)
        counts = counts.reshape(-1, 3)
        gain, loss = counts[:, _HUMAN_TIE], counts[:, _CONCORDANT]
        concordant_total = int(loss.sum())  # with eps = 0; loss[0] is 0 as dm = 0 is never concordant
        gain_before = np.concatenate([[0], np.cumsum(gain)[:-1]])
        loss_before = np.concatenate([[0], np.cumsum(loss)[:-1]])
        before = concordant_total + gain_before - loss_before  # correct pairs just below each bin
        at_end = before + gain - loss  # ... and with eps at the end of each bin
        # Every bin end is a reachable eps (or has the value of an earlier one), so the best
        # bin end is a lower bound; a bin can beat it only if all its gains come first.
        candidate = (before + gain >= at_end.max()) & (gain > 0)
        candidate[0] = False  # eps = 0 is exact already: at_end[0]
        if not candidate.any():
            return 0.0, concordant_total, int(gain[0])

        # Pass 2: the exact running count inside the candidate bins only, by distinct |dm|.
        dm, gains, losses = self._steps_in(candidate)
        bins = self.bin_of(dm)
        start = np.searchsorted(bins, bins, side="left")  # first distinct value of each bin
        ties = gain_before[bins] + _cumsum_from(gains, start)
        lost = loss_before[bins] + _cumsum_from(losses, start)
        value = ties + concordant_total - lost
        best = int(np.argmax(value))  # first maximum: the smallest eps
        if at_end[0] >= value[best]:
            return 0.0, concordant_total, int(gain[0])
        return float(dm[best]), int(concordant_total - lost[best]), int(ties[best])

    def _steps_in(self, candidate: np.ndarray):
        """Distinct dm (sorted) in the candidate bins, with their human-tied and concordant counts."""
        prefix = np.concatenate([[0], np.cumsum(candidate)])
        first, last = np.flatnonzero(candidate)[[0, -1]]

        def keep(low, high):
            lo, hi = self.bin_of([low, high])
            return lo <= last and hi >= first and prefix[hi + 1] > prefix[lo]

        values, gains, losses = [], [], []
        for dm, dh in self.blocks(keep):
            chosen = np.flatnonzero(candidate[self.bin_of(dm)])
            dm, dh = dm[chosen], dh[chosen]
            if dm.size and dm[0] == dm.min() == dm.max():  # common with discrete metrics: skip a sort
                values.append(dm[:1])
                gains.append([np.count_nonzero(dh == 0)])
                losses.append([np.count_nonzero(dh > 0)])
            else:
                values.append(dm)
                gains.append(dh == 0)
                losses.append(dh > 0)
        dm, where = np.unique(np.concatenate(values), return_inverse=True)
        gains = np.bincount(where, weights=np.concatenate(gains), minlength=dm.size).astype(np.int64)
        losses = np.bincount(where, weights=np.concatenate(losses), minlength=dm.size).astype(np.int64)
        return dm, gains, losses


def _cumsum_from(counts: np.ndarray, start: np.ndarray) -> np.ndarray:
    """Running sum of `counts` restarted at each `start` index (the first element of a run)."""
    total = np.cumsum(counts)
    return total - np.where(start > 0, total[start - 1], 0)
