"""A score judged as a keep rule against known labels: ROC AUC as a group-bootstrap statistic.

ROC AUC is the chance that a positive (a pair whose caption matches) scores above a negative
(a mismatch), ties counted half: the Mann-Whitney U of the two classes over the product of
their sizes. As a `Statistic` of group multiplicities (one group per labelled row), a resample
weights each row by how often it was drawn, so AUC over 2,000 resamples needs one sort, not one
per resample; leaving a row out removes its own wins from U, so BCa's jackknife is exact and
linear. Precision and recall of a keep decision are ratios of 0/1 sums
(`bootstrap.ratio_statistic`).
"""
from __future__ import annotations

import numpy as np

from pipeline.stats.statistic import Statistic


def auc_statistic(scores, positive, negative=None) -> Statistic:
    """ROC AUC of `scores` separating `positive` rows from `negative` rows (default: every row
    not positive); rows in neither class count for nothing, so one labelled table gives the AUC
    of matches against each mismatch kind. Scores of rows in a class must be finite."""
    scores = np.asarray(scores, dtype=np.float64)
    positive = np.asarray(positive, dtype=bool)
    negative = ~positive if negative is None else np.asarray(negative, dtype=bool)
    if not scores.ndim == positive.ndim == negative.ndim == 1 or not scores.size == positive.size == negative.size:
        raise ValueError(f"scores and class masks must be 1-D and equal in length: {scores.shape}, {positive.shape}, {negative.shape}")
    if np.any(positive & negative):
        raise ValueError("a row cannot be both positive and negative")
    if not np.all(np.isfinite(scores[positive | negative])):
        raise ValueError("scores of the compared rows must be finite (leave rows without a score out of both classes)")
    order = np.argsort(scores, kind="stable")
    ordered = scores[order]
    lo = np.searchsorted(ordered, ordered, "left")  # first sorted position of each row's score
    hi = np.searchsorted(ordered, ordered, "right")  # one past its last
    pos = np.flatnonzero(positive[order])  # sorted positions of the positives
    neg_sorted = negative[order].astype(np.float64)
    pos_sorted = positive[order].astype(np.float64)

    def statistic(counts: np.ndarray) -> np.ndarray:
        weights = counts[:, order]
        below = np.concatenate([np.zeros((weights.shape[0], 1)), np.cumsum(weights * neg_sorted, axis=1)], axis=1)
        wins = below[:, lo[pos]] + 0.5 * (below[:, hi[pos]] - below[:, lo[pos]])  # negatives under each positive
        u = np.sum(weights[:, pos] * wins, axis=1)
        with np.errstate(invalid="ignore", divide="ignore"):
            return u / ((weights @ pos_sorted) * (weights @ neg_sorted))

    def leave_one_out() -> np.ndarray:
        below = np.concatenate([[0.0], np.cumsum(neg_sorted)])
        above = np.concatenate([[0.0], np.cumsum(pos_sorted)])
        n_pos, n_neg = pos_sorted.sum(), neg_sorted.sum()
        wins = below[lo] + 0.5 * (below[hi] - below[lo])  # per sorted row: negatives it beats
        losses = (n_pos - above[hi]) + 0.5 * (above[hi] - above[lo])  # positives that beat it
        u = float(np.sum(wins[pos]))
        out = np.empty(scores.size)
        with np.errstate(invalid="ignore", divide="ignore"):
            out[order] = np.where(
                pos_sorted == 1, (u - wins) / ((n_pos - 1) * n_neg),
                np.where(neg_sorted == 1, (u - losses) / (n_pos * (n_neg - 1)), u / (n_pos * n_neg)),
            )
        return out

    return Statistic(statistic, leave_one_out)


def roc_auc(scores, positive, negative=None) -> float:
    """ROC AUC on the rows as they are (NaN when a class is empty)."""
    statistic = auc_statistic(scores, positive, negative)
    return float(statistic(np.ones((1, np.asarray(scores).size)))[0])
