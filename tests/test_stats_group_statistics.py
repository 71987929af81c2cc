"""Kendall tau-b, plain Pearson and SRCC as group statistics; the fast jackknife; BCa == scipy."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
from scipy import stats

from pipeline.stats import bootstrap, group_statistics
from pipeline.stats.correlation import DegenerateInputWarning, kendall, pearson
from pipeline.stats.dominance import QuadrantCounts
from pipeline.stats.group_statistics import kendall_statistic, pearson_statistic, srcc_statistic
from pipeline.stats.statistic import naive_jackknife

REFERENCES = {
    "srcc": (srcc_statistic, lambda x, y: stats.spearmanr(x, y).statistic),
    "kendall": (kendall_statistic, lambda x, y: stats.kendalltau(x, y).statistic),  # tau-b, scipy's default
    "pearson": (pearson_statistic, lambda x, y: stats.pearsonr(x, y).statistic),
}


def _tied_data(seed: int, n_groups: int = 25):
    """Unequal groups, coarse values on both sides (many ties, some across groups)."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, 6, n_groups)
    groups = np.repeat(np.arange(n_groups), sizes)
    metric = rng.integers(0, 6, groups.size).astype(float)
    human = np.round(metric + rng.normal(0, 2, groups.size)) / 2
    return metric, human, groups


def _on_indices(statistic, n_groups):
    """The same statistic in scipy.stats.bootstrap's calling convention (resampled group indices)."""

    def on_indices(indices, axis=-1):
        flat = indices.reshape(-1, indices.shape[-1])
        counts = np.stack([np.bincount(row, minlength=n_groups) for row in flat]).astype(float)
        return statistic(counts).reshape(indices.shape[:-1])

    return on_indices


def test_quadrant_counts_match_brute_force():
    rng = np.random.default_rng(0)
    for n in (1, 2, 7, 300):
        cx, cy = rng.integers(0, 5, n), rng.integers(0, 7, n)
        p, q = rng.integers(-2, 7, 200), rng.integers(-2, 9, 200)
        inside = (cx[None, :] > p[:, None]) & (cy[None, :] > q[:, None])
        quadrants = QuadrantCounts(cx, cy, p, q)
        np.testing.assert_array_equal(quadrants.counts(), inside.sum(axis=1))
        weights = rng.integers(0, 3, (4, n)).astype(float)
        np.testing.assert_allclose(quadrants.weighted(weights), weights @ inside.T.astype(float))


@pytest.mark.parametrize("name", sorted(REFERENCES))
@pytest.mark.parametrize("seed", range(4))
def test_statistic_equals_scipy_on_the_expanded_sample(name, seed):
    build, reference = REFERENCES[name]
    metric, human, groups = _tied_data(seed)
    statistic = build(metric, human, groups)
    n_groups = groups.max() + 1
    assert statistic(np.ones((1, n_groups)))[0] == pytest.approx(reference(metric, human), abs=1e-12)
    counts = np.random.default_rng(seed).integers(0, 3, (5, n_groups)).astype(float)
    values = statistic(counts)
    for row, value in zip(counts, values):
        picks = np.repeat(np.arange(metric.size), row[groups].astype(int))
        assert value == pytest.approx(reference(metric[picks], human[picks]), abs=1e-12)


@pytest.mark.parametrize("name", sorted(REFERENCES))
@pytest.mark.parametrize("seed", range(6))
def test_fast_jackknife_equals_the_naive_one(name, seed):
    build, _ = REFERENCES[name]
    metric, human, groups = _tied_data(seed)
    statistic = build(metric, human, groups)
    n_groups = groups.max() + 1
    fast = statistic.jackknife(n_groups)
    naive = naive_jackknife(statistic.function, n_groups)
    np.testing.assert_allclose(fast, naive, rtol=0, atol=1e-9)


def test_fast_jackknife_with_one_item_groups_and_all_tied_pairs():
    metric = np.array([1.0, 1, 1, 2, 2, 3, 3, 3, 4, 1])
    human = np.array([2.0, 2, 1, 1, 2, 3, 3, 2, 2, 2])
    groups = np.arange(10)
    for build, _ in REFERENCES.values():
        statistic = build(metric, human, groups)
        np.testing.assert_allclose(statistic.jackknife(10), naive_jackknife(statistic.function, 10), atol=1e-9)


def test_point_estimates_with_ties_match_scipy():
    metric, human, _ = _tied_data(9, n_groups=200)
    assert kendall(metric, human).value == pytest.approx(stats.kendalltau(metric, human).statistic, abs=1e-15)
    assert pearson(metric, human).value == pytest.approx(stats.pearsonr(metric, human).statistic, abs=1e-15)
    with pytest.warns(DegenerateInputWarning):
        assert np.isnan(kendall(np.ones(5), np.arange(5.0)).value)


@pytest.mark.parametrize("name", sorted(REFERENCES))
def test_group_bca_equals_scipy_bootstrap_on_the_same_resamples(name):
    build, _ = REFERENCES[name]
    metric, human, groups = _tied_data(3, n_groups=40)
    n_groups = groups.max() + 1
    statistic = build(metric, human, groups)
    ours = bootstrap.group_interval(statistic, n_groups, n_resamples=400, seed=7)
    reference = stats.bootstrap(
        (np.arange(n_groups),), _on_indices(statistic, n_groups), n_resamples=400, batch=bootstrap._BATCH,
        vectorized=True, method="BCa", rng=np.random.default_rng(7),
    )  # fmt: skip
    assert ours.low == pytest.approx(reference.confidence_interval.low, abs=1e-9)
    assert ours.high == pytest.approx(reference.confidence_interval.high, abs=1e-9)


def test_paired_accuracy_difference_equals_scipy_on_per_group_differences():
    # Credit in {0, 1/2, 1} (ties under the expected policy). The difference is a mean of
    # per-group differences, so the estimate is exact and BCa counts equal resamples right.
    mismatches = 0
    for seed in range(40):
        rng = np.random.default_rng(seed)
        a = rng.choice([0.0, 0.5, 1.0], 80, p=[0.3, 0.1, 0.6])
        b = rng.choice([0.0, 0.5, 1.0], 80, p=[0.35, 0.1, 0.55])
        ours = bootstrap.group_interval(bootstrap.mean_difference_statistic(a, b), 80, n_resamples=500, seed=seed)
        reference = stats.bootstrap(
            (a - b,), np.mean, n_resamples=500, batch=bootstrap._BATCH, method="BCa", rng=np.random.default_rng(seed)
        )
        assert ours.estimate == float(np.mean(a - b))
        if not (
            abs(ours.low - reference.confidence_interval.low) <= 1e-9
            and abs(ours.high - reference.confidence_interval.high) <= 1e-9
        ):
            mismatches += 1
    assert mismatches == 0


def test_difference_keeps_the_fast_jackknife():
    metric, human, groups = _tied_data(1)
    other = np.round(human + np.random.default_rng(1).normal(0, 1, human.size))
    n_groups = groups.max() + 1
    a, b = srcc_statistic(metric, human, groups), srcc_statistic(other, human, groups)
    both = bootstrap.difference(a, b)
    assert both.leave_one_out is not None
    np.testing.assert_allclose(both.jackknife(n_groups), naive_jackknife(both.function, n_groups), atol=1e-9)


def test_cached_distributions_give_the_same_paired_interval():
    # A metric's interval caches its resamples; the paired delta reuses them (no redraw) and
    # must equal the interval computed from scratch.
    metric, human, groups = _tied_data(2, n_groups=30)
    other = np.round(human + np.random.default_rng(2).normal(0, 1, human.size))
    n_groups = groups.max() + 1
    a, b = srcc_statistic(metric, human, groups), srcc_statistic(other, human, groups)
    bootstrap.group_interval(a, n_groups, n_resamples=300, seed=4)
    bootstrap.group_interval(b, n_groups, n_resamples=300, seed=4)
    reused = bootstrap.paired_group_interval(a, b, n_groups, n_resamples=300, seed=4)
    fresh = bootstrap.paired_group_interval(
        srcc_statistic(metric, human, groups), srcc_statistic(other, human, groups), n_groups, n_resamples=300, seed=4
    )
    assert reused == fresh
    assert (n_groups, 300, 4) in a.distributions


def _expanded_kendall(metric, human, groups, counts_row):
    picks = np.repeat(np.arange(metric.size), counts_row[groups].astype(int))
    return stats.kendalltau(metric[picks], human[picks]).statistic


@pytest.mark.parametrize("seed", range(5))
def test_kendall_resamples_equal_scipy_on_the_expanded_sample(seed):
    # Many resamples of data with ties on both sides, unequal groups (1-5 items), and groups
    # drawn 0..4 times: every value is scipy's tau-b of the expanded sample (NaN where scipy's is).
    rng = np.random.default_rng(100 + seed)
    metric, human, groups = _tied_data(seed, n_groups=30)
    if seed % 2:
        metric = metric + rng.normal(0, 1e-3, metric.size) * (rng.random(metric.size) < 0.5)  # some distinct
    n_groups = groups.max() + 1
    counts = rng.multinomial(n_groups, np.ones(n_groups) / n_groups, size=60).astype(float)
    counts[0] = 0.0
    counts[0, :2] = 1.0  # a tiny resample, possibly all tied
    values = kendall_statistic(metric, human, groups)(counts)
    expected = []
    for row in counts:
        with np.errstate(invalid="ignore", divide="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            expected.append(_expanded_kendall(metric, human, groups, row))
    np.testing.assert_allclose(values, expected, rtol=1e-12, atol=1e-15, equal_nan=True)


def test_kendall_interval_equals_scipy_bootstrap_of_scipy_kendalltau():
    # The reference end to end: scipy.stats.bootstrap resampling groups, scipy's kendalltau on
    # the expanded items, BCa with scipy's own jackknife; same seed, same interval.
    metric, human, groups = _tied_data(4, n_groups=24)
    n_groups = groups.max() + 1
    ours = bootstrap.group_interval(kendall_statistic(metric, human, groups), n_groups, n_resamples=300, seed=3)

    def on_indices(indices, axis=-1):
        flat = indices.reshape(-1, indices.shape[-1])
        rows = [_expanded_kendall(metric, human, groups, np.bincount(r, minlength=n_groups)) for r in flat]
        return np.array(rows).reshape(indices.shape[:-1])

    reference = stats.bootstrap(
        (np.arange(n_groups),), on_indices, n_resamples=300, batch=bootstrap._BATCH,
        vectorized=True, method="BCa", rng=np.random.default_rng(3),
    )  # fmt: skip
    assert ours.estimate == pytest.approx(stats.kendalltau(metric, human).statistic, rel=1e-12)
    assert ours.low == pytest.approx(reference.confidence_interval.low, abs=1e-9)
    assert ours.high == pytest.approx(reference.confidence_interval.high, abs=1e-9)


@pytest.mark.parametrize("seed", range(6))
def test_kendall_compiled_resamples_equal_the_merge_sort_tree_path_exactly(seed, monkeypatch):
    # The fast path (expanded samples counted by scipy's compiled Fenwick tree) must give the
    # very same floats as the general numpy path; seeds alternate which variable has fewer
    # distinct values (the tree runs over that one), and include empty and one-item resamples.
    rng = np.random.default_rng(seed)
    metric, human, groups = _tied_data(seed, n_groups=40)
    if seed % 2:
        metric, human = human, metric + rng.normal(0, 1, metric.size)
    n_groups = groups.max() + 1
    counts = rng.multinomial(n_groups, np.ones(n_groups) / n_groups, size=50).astype(float)
    counts[0] = 0.0
    counts[1] = 0.0
    counts[1, 0] = 1.0
    fast = kendall_statistic(metric, human, groups)
    monkeypatch.setattr(group_statistics, "_kendall_dis", None)
    general = kendall_statistic(metric, human, groups)
    np.testing.assert_array_equal(fast(counts), general(counts))
    fractional = counts[2:5] * 0.5  # not multiplicities: the general path, still defined
    np.testing.assert_array_equal(fast(fractional), general(fractional))


def test_scipy_discordant_count_is_available_and_counts_inversions():
    # The fast Kendall resamples rely on scipy's private `_kendall_dis`; if scipy renames or
    # changes it, this fails loudly instead of the bootstrap silently becoming 10x slower.
    assert group_statistics._kendall_dis is not None
    rng = np.random.default_rng(0)
    sequence = rng.integers(1, 6, 200).astype(np.intp)
    expected = int(np.sum(np.triu(sequence[:, None] > sequence[None, :], 1)))
    assert group_statistics._kendall_dis(np.arange(200, dtype=np.intp), sequence) == expected


def _average_ranks(values, weights):
    below = (weights[None, :] * (values[None, :] < values[:, None])).sum(axis=1)
    return below + ((weights[None, :] * (values[None, :] == values[:, None])).sum(axis=1) + 1) / 2


def test_srcc_with_fractional_weights_is_the_weighted_pearson_of_average_ranks():
    # Not resamples, but the statistic is defined for any weights: an item's average rank is
    # the weight strictly below its value plus (its value's weight + 1) / 2; brute force here.
    rng = np.random.default_rng(8)
    metric, human, groups = _tied_data(8, n_groups=20)
    counts = rng.random((4, groups.max() + 1)) * 3
    values = srcc_statistic(metric, human, groups)(counts)
    for row, value in zip(counts, values):
        w = row[groups]

        centre = (w.sum() + 1) / 2
        dx, dy = _average_ranks(metric, w) - centre, _average_ranks(human, w) - centre
        expected = (w * dx * dy).sum() / np.sqrt((w * dx * dx).sum() * (w * dy * dy).sum())
        assert value == pytest.approx(expected, rel=1e-12)
