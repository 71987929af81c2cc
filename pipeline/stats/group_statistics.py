"""SRCC, Kendall tau-b and Pearson as group-bootstrap statistics, each with an exact fast jackknife.

A statistic takes group multiplicities `counts` (batch, n_groups) and returns one value per
row: the statistic on the sample where every item of group g occurs counts[g] times (ties
between copies of an item count as ties, as in the expanded sample). `leave_one_out()`
gives the n_groups values with one group dropped, which BCa's acceleration needs.

Why the jackknife is cheap. Drop the items R of one group. For every other item i its new
average rank is r_i - a_i with a_i = sum_{j in R} H(x_i - x_j) (H = 1, 1/2, 0 for >, =, <),
and the centred rank is d_i - e_i with e_i = 1/2 sum_{j in R} sgn(x_i - x_j). Expanding the
sums of products over all items splits them into per-item sums (prefix sums after one sort)
and, per pair (j, l) of items of the same group, a quadrant count
sum_i sgn(x_i - x_j) sgn(y_i - y_l) (`dominance.QuadrantCounts`); the dropped items' own
terms are subtracted directly. Kendall's S loses each dropped item's concordance sum (one
quadrant count per item) and regains the pairs inside the group. Pearson needs per-group
sums only. All is O((N + sum of squared group sizes) log^2 N) instead of O(N x n_groups).

Why the resamples are cheap (2,000 of them per interval). Both rank statistics sort the
items once by the two variables (`_JointClasses`); a resample's weight per distinct value
and per distinct (metric, human) pair is then one gather and a segment sum, and average
ranks are prefix sums over distinct values, so SRCC never sorts or ranks per resample.
Kendall's discordant pairs of a resample are the inversions, in that order, of the second
variable's codes repeated by multiplicity, counted by scipy's compiled Fenwick tree
(`_KendallResamples`; the second variable is the one with fewer distinct values). On
integer multiplicities every count is an exact integer, so values equal the per-item
formulas bit for bit; fractional weights use the merge-sort-tree sums (`_SignProducts`).
"""
from __future__ import annotations

import numpy as np
from scipy import sparse, stats

from pipeline.stats.correlation import check_pair
from pipeline.stats.dominance import QuadrantCounts
from pipeline.stats.statistic import Statistic, naive_jackknife

try:  # scipy's compiled discordant-pair count (the Fenwick tree inside kendalltau); private API
    from scipy.stats._stats import _kendall_dis
except ImportError:  # pragma: no cover - a scipy without it uses the numpy merge-sort tree
    _kendall_dis = None

_MAX_GROUP_PAIRS = 20_000_000  # beyond this many within-group pairs, jackknife by recomputation


class _JointClasses:
    """Items sorted once by (r, t); per batch of resamples, the weight of each distinct value and pair.

    r and t are dense codes of the two variables. After one sort by (r, t), the items of each
    distinct r value are a run, and inside it the items of each distinct (r, t) pair are a run
    too, so class weights are `np.add.reduceat` over the sorted item weights, or the weights
    themselves when every class is a single item (a continuous metric). Weights per t value
    come straight from the group multiplicities through a sparse (group x t value) count.
    """

    def __init__(self, cr: np.ndarray, ct: np.ndarray, groups: np.ndarray):
        order = np.lexsort((ct, cr))
        self.item_groups = groups[order]
        self.runs, self.tree = cr[order], ct[order]
        new_pair = np.append(True, (self.runs[1:] != self.runs[:-1]) | (self.tree[1:] != self.tree[:-1]))
        self.pair_starts = np.flatnonzero(new_pair)  # first item of each distinct (r, t) pair
        pair_runs = self.runs[self.pair_starts]
        self.pair_t = self.tree[self.pair_starts]  # t code of each pair (codes are dense, 0-based)
        self.run_starts = np.flatnonzero(np.append(True, pair_runs[1:] != pair_runs[:-1]))  # among pairs
        self.single_pairs = self.pair_starts.size == cr.size  # every (r, t) pair is one item
        self.single_runs = self.run_starts.size == self.pair_starts.size  # every r value is one pair
        n_groups = int(groups.max()) + 1
        self.group_sizes = np.bincount(groups, minlength=n_groups).astype(np.float64)
        self.t_per_group = sparse.csr_matrix((np.ones(ct.size), (groups, ct)), shape=(n_groups, int(ct.max()) + 1))
        self.t_per_group.sum_duplicates()

    def weights(self, counts: np.ndarray, dtype=np.float64) -> np.ndarray:
        """Item weights (batch, items) in (r, t) order from group multiplicities."""
        return np.take(counts.astype(dtype), self.item_groups, axis=1)

    def per_class(self, counts: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Weights per distinct (r, t) pair, per r value and per t value, in code order."""
        per_pair = weights if self.single_pairs else np.add.reduceat(weights, self.pair_starts, axis=1)
        per_r = per_pair if self.single_runs else np.add.reduceat(per_pair, self.run_starts, axis=1)
        per_t = np.asarray(counts.astype(np.float64) @ self.t_per_group)
        return per_pair, per_r, per_t

    def pairs_within(self, counts: np.ndarray, per_value: np.ndarray, single: bool) -> np.ndarray:
        """Pairs of the resample tied inside a class, sum W (W - 1) / 2; exact (integers < 2**53).

        When every class is one item, W is its group's multiplicity c: sum over groups instead.
        """
        if single:
            counts = counts.astype(np.float64)
            return _times(counts * (counts - 1.0), self.group_sizes) / 2
        return (np.sum(per_value * (per_value - 1), axis=1) // 2).astype(np.float64)


def _times(rows: np.ndarray, vector: np.ndarray) -> np.ndarray:
    """rows @ vector without BLAS: its threads spin and thrash on a busy machine (small product)."""
    return np.einsum("bg,g->b", rows, vector)


def _centred_ranks(per_value: np.ndarray, centre: np.ndarray) -> np.ndarray:
    """Average rank minus the centre for each distinct value, from its weight (values in order)."""
    return np.cumsum(per_value, axis=1) - (per_value - 1.0) / 2.0 - centre


class _Pairs:
    """Ordered pairs (j, k) of items of the same group, j == k included, and helpers on codes."""

    def __init__(self, groups: np.ndarray, n_groups: int):
        sizes = np.bincount(groups, minlength=n_groups)
        self.too_many = int(np.sum(sizes.astype(np.int64) ** 2)) > _MAX_GROUP_PAIRS
        if self.too_many:
            return
        order = np.argsort(groups, kind="stable")
        ordered_groups = groups[order]
        starts = np.searchsorted(ordered_groups, ordered_groups, side="left")
        repeats = sizes[ordered_groups]
        first = np.repeat(np.arange(groups.size), repeats)
        offset = np.arange(repeats.sum()) - np.repeat(np.cumsum(repeats) - repeats, repeats)
        self.j = order[first]
        self.k = order[np.repeat(starts, repeats) + offset]
        self.group = ordered_groups[first]
        self.n_groups = n_groups

    def per_group(self, values: np.ndarray) -> np.ndarray:
        return np.bincount(self.group, weights=values, minlength=self.n_groups)


def _codes(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Dense integer codes 0..D-1 (order-preserving) and the count of each code."""
    _, codes = np.unique(values, return_inverse=True)
    return codes.astype(np.int64), np.bincount(codes)


def _signed_sums(weights: np.ndarray, values: np.ndarray) -> np.ndarray:
    """For every item j: sum_i weights_i * sgn(values_i - values_j)."""
    order = np.argsort(values, kind="stable")
    ordered = values[order]
    running = np.concatenate([[0.0], np.cumsum(weights[order])])
    below = running[np.searchsorted(ordered, values, side="left")]
    above = running[-1] - running[np.searchsorted(ordered, values, side="right")]
    return above - below


def _sign_products_1d(cx: np.ndarray, count: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """sum_i sgn(x_i - x_a) sgn(x_i - x_b) from codes (a, b are item codes)."""
    cumulative = np.cumsum(count)
    n = cumulative[-1]
    lower, upper = np.minimum(a, b), np.maximum(a, b)
    at_most = cumulative[lower]
    below = at_most - count[lower]
    above = n - cumulative[upper]
    between = np.maximum((cumulative[upper] - count[upper]) - at_most, 0)
    return below + above - between


class _SignProducts:
    """sum_i w_i sgn(x_i - X) sgn(y_i - Y) for query codes (X, Y); w = 1 or rows of weights.

    With Q = w(x > X, y > Y) (one quadrant count) and the weight at X or Y (binary searches
    in (x, y) and (y, x) order), the four sign quadrants follow by inclusion-exclusion.
    """

    def __init__(self, cx, cy, qx, qy):
        self.n = cx.size
        span = int(max(cx.max(), cy.max(), qx.max(), qy.max())) + 2
        keys_x, keys_y = cx * span + cy, cy * span + cx
        self.order_x, self.order_y = np.argsort(keys_x, kind="stable"), np.argsort(keys_y, kind="stable")
        keys_x, keys_y = keys_x[self.order_x], keys_y[self.order_y]
        # sorted positions from which the points satisfy each condition (tails of the order)
        self.tails_x = [np.searchsorted(keys_x, key, side=side) for key, side in (
            ((qx + 1) * span, "left"),  # x > X
            (qx * span, "left"),  # x >= X
            (qx * span + qy, "right"),  # x > X, or x = X and y > Y
            (qx * span + qy, "left"),  # ... or x = X and y >= Y
        )]  # fmt: skip
        self.tails_y = [np.searchsorted(keys_y, key, side=side) for key, side in (
            ((qy + 1) * span, "left"),  # y > Y
            (qy * span, "left"),  # y >= Y
            (qy * span + qx, "right"),  # y > Y, or y = Y and x > X
        )]  # fmt: skip
        self.quadrants = QuadrantCounts(cx, cy, qx, qy)

    def sums(self, weights: np.ndarray | None = None) -> np.ndarray:
        if weights is None:
            tail_x = [self.n - t for t in self.tails_x]
            tail_y = [self.n - t for t in self.tails_y]
            q = self.quadrants.counts().astype(np.float64)
            total = float(self.n)
        else:
            total = weights.sum(axis=1, keepdims=True)
            running_x = np.concatenate([np.zeros((weights.shape[0], 1)), np.cumsum(weights[:, self.order_x], axis=1)], axis=1)
            running_y = np.concatenate([np.zeros((weights.shape[0], 1)), np.cumsum(weights[:, self.order_y], axis=1)], axis=1)
            tail_x = [total - running_x[:, t] for t in self.tails_x]
            tail_y = [total - running_y[:, t] for t in self.tails_y]
            q = self.quadrants.weighted(weights)
        gx, gex, x_after, x_from = tail_x
        gy, gey, y_after = tail_y
        e1, e2, e3 = x_after - gx, y_after - gy, x_from - x_after  # x = X & y > Y; y = Y & x > X; both equal
        # #(>,>) + #(<,<) - #(>,<) - #(<,>), with #(>=X, >=Y) = q + e1 + e2 + e3
        return q + (total - gex - gey + q + e1 + e2 + e3) - (gx - q - e2) - (gy - q - e1)


def _tied_pairs(weights: np.ndarray, codes: np.ndarray, count: np.ndarray) -> np.ndarray:
    """Pairs of the weighted sample tied in one variable: sum over values of W_v (W_v - 1) / 2."""
    order = np.argsort(codes, kind="stable")
    per_value = np.add.reduceat(weights[:, order], np.concatenate([[0], np.cumsum(count)[:-1]]), axis=1)
    return np.sum(per_value * (per_value - 1), axis=1) / 2


class _KendallResamples:
    """Kendall's S and tie counts of integer resamples, one compiled O(N log D) pass per resample.

    Why this is fast. Items sorted once by (r, t) with ascending t inside each run of equal r:
    then every inversion of the t sequence (an earlier item with a larger t) is a discordant
    pair, and every discordant pair is one. A resample's expanded sample in that order is the
    t sequence repeated by multiplicity (`np.repeat`, no sort), and scipy's `_kendall_dis`
    (kendalltau's Fenwick tree over t, compiled) counts its inversions in O(N log D_t). The
    tree runs over whichever variable has fewer distinct values (human ratings, usually).
    Tied pairs come from weights summed per distinct value and per distinct (x, y) pair,
    batched over resamples; then S = pairs - ties_x - ties_y + ties_xy - 2 * discordant, as
    in scipy. Every count is an integer below 2**53, so S equals the merge-sort-tree sum exactly.
    """

    def __init__(self, cx: np.ndarray, cy: np.ndarray, groups: np.ndarray):
        self.swap = int(cy.max()) > int(cx.max())  # dense codes: the tree over x if x has fewer values
        self.classes = _JointClasses(cy, cx, groups) if self.swap else _JointClasses(cx, cy, groups)
        self.tree = (self.classes.tree + 1).astype(np.intp)  # the t sequence, 1-based for the tree
        self.positions = np.arange(0, dtype=np.intp)  # distinct "x" per expanded item, grown on demand
        self.count_inversions = _kendall_dis

    @staticmethod
    def accepts(counts: np.ndarray) -> bool:
        """Non-negative integer multiplicities (resamples, jackknife rows); others take the general path."""
        return bool(counts.size and np.all(counts >= 0) and np.all(counts == np.round(counts)) and counts.sum(axis=1).max() < 2**31)

    def __call__(self, counts: np.ndarray):
        classes = self.classes
        weights = classes.weights(counts, np.intp)
        per_pair, per_runs, per_tree = classes.per_class(counts, weights)
        discordant = np.array([self._inversions(np.repeat(self.tree, row)) for row in weights], dtype=np.float64)
        total = _times(counts, classes.group_sizes)
        ties_both = classes.pairs_within(counts, per_pair, classes.single_pairs)
        ties_runs = ties_both if classes.single_runs else classes.pairs_within(counts, per_runs, False)
        ties_tree = classes.pairs_within(counts, per_tree, False)
        s = total * (total - 1) / 2 - ties_runs - ties_tree + ties_both - 2 * discordant
        ties_x, ties_y = (ties_tree, ties_runs) if self.swap else (ties_runs, ties_tree)
        return s, total, ties_x, ties_y

    def _inversions(self, sequence: np.ndarray) -> int:
        if sequence.size < 2:
            return 0
        if self.positions.size < sequence.size:
            self.positions = np.arange(2 * sequence.size, dtype=np.intp)
        return int(self.count_inversions(self.positions[: sequence.size], sequence))


def srcc_statistic(metric, human, groups: np.ndarray) -> Statistic:
    """SRCC of `metric` with `human` on the items of the resampled groups (`groups`: item -> code)."""
    metric, human = check_pair(metric, human)
    groups = np.asarray(groups, dtype=np.int64)
    classes = _JointClasses(_codes(metric)[0], _codes(human)[0], groups)

    def statistic(counts: np.ndarray) -> np.ndarray:
        # Spearman on the expanded sample = Pearson of average ranks, which depend only on the
        # value: sums over distinct values and (metric, human) pairs, not over items.
        per_pair, per_x, per_y = classes.per_class(counts, classes.weights(counts))
        centre = (per_x.sum(axis=1, keepdims=True) + 1.0) / 2.0  # mean of average ranks 1..N
        dx, dy = _centred_ranks(per_x, centre), _centred_ranks(per_y, centre)
        along_x = per_pair * dy[:, classes.pair_t]
        if not classes.single_runs:
            along_x = np.add.reduceat(along_x, classes.run_starts, axis=1)
        sxy = np.sum(along_x * dx, axis=1)
        with np.errstate(invalid="ignore", divide="ignore"):
            return sxy / np.sqrt(np.sum(per_x * dx * dx, axis=1) * np.sum(per_y * dy * dy, axis=1))

    def leave_one_out() -> np.ndarray:
        n_groups = int(groups.max()) + 1
        pairs = _Pairs(groups, n_groups)
        if pairs.too_many:
            return naive_jackknife(statistic, n_groups)
        return _srcc_jackknife(metric, human, pairs)

    return Statistic(statistic, leave_one_out)


def _srcc_jackknife(x: np.ndarray, y: np.ndarray, pairs: _Pairs) -> np.ndarray:
    n = x.size
    dx = stats.rankdata(x) - (n + 1) / 2.0
    dy = stats.rankdata(y) - (n + 1) / 2.0
    cx, count_x = _codes(x)
    cy, count_y = _codes(y)
    j, k = pairs.j, pairs.k
    # sums over all items of the centred ranks after the drop, expanded (module doc)
    cross = _SignProducts(cx, cy, cx[j], cy[k]).sums()
    sxy = (dx @ dy) - 0.5 * pairs.per_group(np.where(j == k, _signed_sums(dx, y)[j] + _signed_sums(dy, x)[j], 0.0))
    sxy += 0.25 * pairs.per_group(cross)
    sxx = (dx @ dx) - pairs.per_group(np.where(j == k, _signed_sums(dx, x)[j], 0.0))
    sxx += 0.25 * pairs.per_group(_sign_products_1d(cx, count_x, cx[j], cx[k]).astype(np.float64))
    syy = (dy @ dy) - pairs.per_group(np.where(j == k, _signed_sums(dy, y)[j], 0.0))
    syy += 0.25 * pairs.per_group(_sign_products_1d(cy, count_y, cy[j], cy[k]).astype(np.float64))
    # the dropped items' own terms: e_j = 1/2 sum_{l in R} sgn(x_j - x_l)
    e = np.bincount(j, weights=0.5 * np.sign(x[j] - x[k]), minlength=n)
    f = np.bincount(j, weights=0.5 * np.sign(y[j] - y[k]), minlength=n)
    own = np.flatnonzero(j == k)
    items, group = j[own], pairs.group[own]

    def inside(u, v):
        return np.bincount(group, weights=u[items] * v[items], minlength=pairs.n_groups)

    sxy -= inside(dx - e, dy - f)
    sxx -= inside(dx - e, dx - e)
    syy -= inside(dy - f, dy - f)
    with np.errstate(invalid="ignore", divide="ignore"):
        return sxy / np.sqrt(sxx * syy)


def kendall_statistic(metric, human, groups: np.ndarray) -> Statistic:
    """Kendall tau-b (scipy.stats.kendalltau's default) on the items of the resampled groups."""
    metric, human = check_pair(metric, human)
    groups = np.asarray(groups, dtype=np.int64)
    cx, count_x = _codes(metric)
    cy, count_y = _codes(human)
    signs = _SignProducts(cx, cy, cx, cy)  # per item: sum_i sgn(x_i - x_j) sgn(y_i - y_j)
    resamples = _KendallResamples(cx, cy, groups) if _kendall_dis is not None else None

    def weighted_s(weights: np.ndarray) -> np.ndarray:
        """S on any item weights (also fractional ones): merge-sort-tree sums, O(log^2 N) passes."""
        return 0.5 * np.sum(weights * signs.sums(weights), axis=1)

    def statistic(counts: np.ndarray) -> np.ndarray:
        if resamples is not None and resamples.accepts(counts):
            s, total, ties_x, ties_y = resamples(counts)
        else:
            weights = counts[:, groups]
            s, total = weighted_s(weights), weights.sum(axis=1)
            ties_x, ties_y = _tied_pairs(weights, cx, count_x), _tied_pairs(weights, cy, count_y)
        pairs_all = total * (total - 1) / 2
        with np.errstate(invalid="ignore", divide="ignore"):
            return s / np.sqrt(pairs_all - ties_x) / np.sqrt(pairs_all - ties_y)

    def leave_one_out() -> np.ndarray:
        n_groups = int(groups.max()) + 1
        pairs = _Pairs(groups, n_groups)
        if pairs.too_many:
            return naive_jackknife(statistic, n_groups)
        j, k = pairs.j, pairs.k
        per_item = signs.sums()
        s = 0.5 * per_item.sum()
        within = pairs.per_group(np.sign(metric[j] - metric[k]) * np.sign(human[j] - human[k]))
        s_left = s - np.bincount(groups, weights=per_item, minlength=n_groups) + 0.5 * within
        n = metric.size
        size = np.bincount(groups, minlength=n_groups).astype(np.float64)
        left = n - size

        def ties_left(codes, count):
            tied = np.sum(count * (count - 1.0)) / 2
            touching = np.bincount(groups, weights=count[codes] - 1.0, minlength=n_groups)
            inside = 0.5 * (pairs.per_group((codes[j] == codes[k]).astype(np.float64)) - size)
            return tied - (touching - inside)

        pairs_left = left * (left - 1) / 2
        with np.errstate(invalid="ignore", divide="ignore"):
            return s_left / np.sqrt(pairs_left - ties_left(cx, count_x)) / np.sqrt(pairs_left - ties_left(cy, count_y))

    return Statistic(statistic, leave_one_out)


def pearson_statistic(metric, human, groups: np.ndarray) -> Statistic:
    """Plain Pearson correlation on the items of the resampled groups."""
    metric, human = check_pair(metric, human)
    groups = np.asarray(groups, dtype=np.int64)
    x, y = metric - metric.mean(), human - human.mean()  # centred once: less cancellation
    columns = np.stack([np.ones_like(x), x, y, x * x, y * y, x * y])

    def correlation(sums: np.ndarray) -> np.ndarray:
        n, sx, sy, sxx, syy, sxy = sums
        with np.errstate(invalid="ignore", divide="ignore"):
            return (sxy - sx * sy / n) / np.sqrt((sxx - sx * sx / n) * (syy - sy * sy / n))

    n_groups = int(groups.max()) + 1
    per_group = np.stack([np.bincount(groups, weights=c, minlength=n_groups) for c in columns])

    def statistic(counts: np.ndarray) -> np.ndarray:
        # einsum without BLAS: a small product, and BLAS threads thrash on a busy machine
        return correlation(np.einsum("bg,cg->cb", counts, per_group))

    def leave_one_out() -> np.ndarray:
        return correlation(columns.sum(axis=1)[:, None] - per_group)

    return Statistic(statistic, leave_one_out)
