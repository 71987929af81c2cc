"""Offline 2-D dominance counts: for many queries (p, q), how many points have cx > p and cy > q.

The leave-one-group-out jackknife of a rank statistic (SRCC, Kendall) needs, for every item,
sums like sum_i sgn(x_i - x_j) sgn(y_i - y_l): a count of points in a quadrant. Asked naively
that is O(N) per item and O(N^2) in all. Here points are ordered by cx (descending), so the
points with cx > p are a prefix of that order, and a merge-sort tree over cy answers "how
many in this prefix have cy > q" with one binary search per tree level: O(log^2 N) per query,
vectorised over all queries with numpy. Optional per-point weights (a batch of rows) turn the
counts into weighted sums, for bootstrap resamples where an item occurs several times.
"""
from __future__ import annotations

import numpy as np


class QuadrantCounts:
    """Counts (or weighted sums) of points with cx > p and cy > q, for fixed points and queries.

    `cx`, `cy`: integer codes of the points (e.g. dense ranks); `p`, `q`: integer thresholds of
    the queries (any integers). The structure is built once; `counts()` and `weighted(w)`
    answer every query.
    """

    def __init__(self, cx: np.ndarray, cy: np.ndarray, p: np.ndarray, q: np.ndarray):
        cx, cy = np.asarray(cx, dtype=np.int64), np.asarray(cy, dtype=np.int64)
        p, q = np.asarray(p, dtype=np.int64), np.asarray(q, dtype=np.int64)
        n = cx.size
        self.n_queries = p.size
        self.order = np.argsort(-cx, kind="stable")  # points by cx descending
        prefix = n - np.searchsorted(np.sort(cx), p, side="right")  # points with cx > p
        low = min(int(cy.min(initial=0)), int(q.min(initial=0))) - 1
        span = max(int(cy.max(initial=0)), int(q.max(initial=0))) - low + 2
        sequence = cy[self.order] - low  # shifted to >= 1 so block keys never collide
        # Answer each distinct query once, in sorted order (binary searches of sorted needles
        # reuse their previous position, several times faster on large inputs).
        unique, self.inverse = np.unique(prefix * span + (q - low), return_inverse=True)
        prefix, shifted_q = unique // span, unique % span
        self.n_unique = unique.size
        position = np.arange(n)
        # per level: (points' permutation, queries with this level's bit, their search index, block end)
        self.levels = []
        level = 0
        while (1 << level) <= n:
            size = 1 << level
            block = position >> level
            permutation = np.lexsort((sequence, block))
            keys = block[permutation] * span + sequence[permutation]
            chosen = np.flatnonzero((prefix >> level) & 1)
            if chosen.size:
                query_block = (prefix[chosen] >> (level + 1)) << 1
                index = np.searchsorted(keys, query_block * span + shifted_q[chosen], side="right")
                end = (query_block + 1) * size
                self.levels.append((permutation, chosen, index, end))
            level += 1

    def counts(self) -> np.ndarray:
        total = np.zeros(self.n_unique, dtype=np.int64)
        for _, chosen, index, end in self.levels:
            total[chosen] += end - index  # each query appears at most once per level
        return total[self.inverse]

    def weighted(self, weights: np.ndarray) -> np.ndarray:
        """Weighted sums for a batch of weight rows (batch, n_points) -> (batch, n_queries)."""
        weights = np.asarray(weights, dtype=np.float64)
        # Resample multiplicities are small integers: int32 running sums are exact and move
        # half the memory of float64 (the cost here is memory traffic, ~4 passes per level).
        integral = weights.size and np.all(weights == np.round(weights)) and weights.sum(axis=1).max() < 2**31
        kind = np.int32 if integral else np.float64
        ordered = weights[:, self.order].astype(kind)
        total = np.zeros((weights.shape[0], self.n_unique), dtype=np.int64 if integral else np.float64)
        running = np.zeros((weights.shape[0], self.order.size + 1), dtype=kind)
        for permutation, chosen, index, end in self.levels:
            np.cumsum(ordered[:, permutation], axis=1, out=running[:, 1:])
            total[:, chosen] += running[:, end] - running[:, index]
        return total[:, self.inverse].astype(np.float64)


class PrefixCounts:
    """For a fixed sequence of integer codes: how many of its first t entries exceed q.

    The same merge-sort tree as `QuadrantCounts`, built once for the sequence and asked with
    new (t, q) queries each time (pairwise accuracy asks once per candidate epsilon).
    """

    def __init__(self, codes: np.ndarray):
        codes = np.asarray(codes, dtype=np.int64)
        self.n = codes.size
        self.low = int(codes.min(initial=0)) - 1
        self.span = int(codes.max(initial=0)) - self.low + 2
        sequence = codes - self.low  # >= 1
        position = np.arange(self.n)
        self.keys = []
        level = 0
        while (1 << level) <= self.n:
            block = position >> level
            permutation = np.lexsort((sequence, block))
            self.keys.append(block[permutation] * self.span + sequence[permutation])
            level += 1

    def greater(self, prefix: np.ndarray, q: np.ndarray) -> np.ndarray:
        """#{j < prefix: codes_j > q} per query (q is clipped into the codes' range)."""
        prefix = np.asarray(prefix, dtype=np.int64)
        shifted = np.clip(np.asarray(q, dtype=np.int64) - self.low, 0, self.span - 1)
        order = np.lexsort((shifted, prefix))  # sorted needles: faster binary searches
        prefix, shifted = prefix[order], shifted[order]
        total = np.zeros(prefix.size, dtype=np.int64)
        for level, keys in enumerate(self.keys):
            chosen = np.flatnonzero((prefix >> level) & 1)
            if chosen.size:
                block = (prefix[chosen] >> (level + 1)) << 1
                index = np.searchsorted(keys, block * self.span + shifted[chosen], side="right")
                total[chosen] += (block + 1) * (1 << level) - index
        result = np.empty_like(total)
        result[order] = total
        return result
