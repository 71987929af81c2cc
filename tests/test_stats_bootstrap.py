"""Group bootstrap: weighted SRCC equals scipy on the expanded sample, BCa agrees with scipy,
seeded determinism, coverage of the estimate, and significance when one metric is better."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from pipeline.stats import bootstrap
from pipeline.stats.correlation import srcc


def _data(n_groups=150, per_group=4, seed=0, noise_a=0.6, noise_b=1.5):
    r = np.random.default_rng(seed)
    n = n_groups * per_group
    human = r.integers(1, 6, size=(n, 3)).mean(axis=1)
    a = human + r.normal(0, noise_a, n)
    b = np.round(human + r.normal(0, noise_b, n), 1)
    groups, count = bootstrap.group_codes(np.repeat([f"g{i:04d}" for i in range(n_groups)], per_group))
    return human, a, b, groups, count


@settings(max_examples=30, deadline=None)
@given(st.data())
def test_weighted_srcc_equals_spearman_on_the_expanded_resample(data):
    n_groups = data.draw(st.integers(3, 8))
    per_group = data.draw(st.integers(1, 4))
    n = n_groups * per_group
    metric = np.array(data.draw(st.lists(st.integers(0, 4), min_size=n, max_size=n)), dtype=float)
    human = np.array(data.draw(st.lists(st.integers(0, 3), min_size=n, max_size=n)), dtype=float)
    counts = np.array(data.draw(st.lists(st.integers(0, 3), min_size=n_groups, max_size=n_groups)), dtype=float)
    groups = np.repeat(np.arange(n_groups), per_group)
    picks = np.repeat(np.arange(n), counts[groups].astype(int))
    value = bootstrap.srcc_statistic(metric, human, groups)(counts[None, :])[0]
    m, h = metric[picks], human[picks]
    expected = stats.spearmanr(m, h).statistic if picks.size > 1 and m.std() > 0 and h.std() > 0 else np.nan
    np.testing.assert_allclose(value, expected, atol=1e-10, equal_nan=True)


def test_point_estimate_is_the_plain_srcc():
    human, a, _, groups, count = _data()
    assert bootstrap.srcc_statistic(a, human, groups)(np.ones((1, count)))[0] == pytest.approx(srcc(a, human).value)


def test_item_statistic_matches_the_fast_path():
    human, a, _, groups, count = _data(n_groups=20)
    counts = np.random.default_rng(3).multinomial(count, [1 / count] * count, size=4).astype(float)
    generic = bootstrap.item_statistic(lambda m, h: srcc(m, h).value, a, human, groups)
    np.testing.assert_allclose(generic(counts), bootstrap.srcc_statistic(a, human, groups)(counts), atol=1e-12)


def test_mean_interval_equals_scipy_bootstrap_with_the_same_seed():
    # One item per group and a mean: our group bootstrap must be scipy's BCa, draw for draw.
    values = np.random.default_rng(5).exponential(size=80)
    ours = bootstrap.group_interval(bootstrap.ratio_statistic(values, np.ones(80)), 80, n_resamples=999, seed=11)
    reference = stats.bootstrap(
        (values,), np.mean, n_resamples=999, batch=bootstrap._BATCH, method="BCa", rng=np.random.default_rng(11)
    )
    assert ours.estimate == pytest.approx(values.mean())
    assert ours.low == pytest.approx(reference.confidence_interval.low, rel=1e-12)
    assert ours.high == pytest.approx(reference.confidence_interval.high, rel=1e-12)


def test_seeded_and_deterministic():
    human, a, b, groups, count = _data()
    stat_a, stat_b = bootstrap.srcc_statistic(a, human, groups), bootstrap.srcc_statistic(b, human, groups)
    first = bootstrap.paired_group_interval(stat_a, stat_b, count, n_resamples=300, seed=1)
    again = bootstrap.paired_group_interval(stat_a, stat_b, count, n_resamples=300, seed=1)
    other = bootstrap.paired_group_interval(stat_a, stat_b, count, n_resamples=300, seed=2)
    assert first == again
    assert (first.low, first.high) != (other.low, other.high)


def test_interval_contains_estimate_and_better_metric_is_significant():
    human, a, b, groups, count = _data()
    stat_a, stat_b = bootstrap.srcc_statistic(a, human, groups), bootstrap.srcc_statistic(b, human, groups)
    single = bootstrap.group_interval(stat_a, count, n_resamples=500, seed=0)
    assert single.low < single.estimate < single.high and single.note is None
    delta = bootstrap.paired_group_interval(stat_a, stat_b, count, n_resamples=500, seed=0)
    assert delta.estimate == pytest.approx(srcc(a, human).value - srcc(b, human).value)
    assert delta.low < delta.estimate < delta.high
    assert delta.low > 0 and delta.excludes_zero
    reverse = bootstrap.paired_group_interval(stat_b, stat_a, count, n_resamples=500, seed=0)
    assert reverse.high < 0 and reverse.excludes_zero


def test_equal_metrics_are_not_significant():
    human, a, _, groups, count = _data(seed=4)
    r = np.random.default_rng(9)
    twin = human + r.normal(0, 0.6, human.size)  # same quality, different noise
    stat_a, stat_t = bootstrap.srcc_statistic(a, human, groups), bootstrap.srcc_statistic(twin, human, groups)
    delta = bootstrap.paired_group_interval(stat_a, stat_t, count, n_resamples=500, seed=0)
    assert delta.low < 0 < delta.high and not delta.excludes_zero


def test_percentile_method_is_available():
    human, a, _, groups, count = _data()
    interval = bootstrap.group_interval(bootstrap.srcc_statistic(a, human, groups), count, n_resamples=300, method="percentile")
    assert interval.low < interval.estimate < interval.high


def test_no_spread_gives_a_point_interval_and_a_note():
    human, a, _, groups, count = _data(n_groups=30)
    stat = bootstrap.srcc_statistic(a, human, groups)
    same = bootstrap.paired_group_interval(stat, stat, count, n_resamples=200, seed=0)
    assert (same.estimate, same.low, same.high) == (0, 0, 0) and not same.excludes_zero
    assert same.note == "every resample gives the same value"
    perfect = bootstrap.group_interval(bootstrap.ratio_statistic(np.ones(20), np.ones(20)), 20, n_resamples=100)
    assert (perfect.low, perfect.high) == (1.0, 1.0)


def test_resamples_where_the_statistic_is_undefined_are_reported():
    # two groups, each constant inside: a resample drawing one group twice has no rank variance
    human = np.array([1.0, 1.0, 2.0, 2.0])
    metric = np.array([0.1, 0.1, 0.9, 0.9])
    stat = bootstrap.srcc_statistic(metric, human, np.array([0, 0, 1, 1]))
    interval = bootstrap.group_interval(stat, 2, n_resamples=100, seed=0)
    assert interval.estimate == pytest.approx(1.0) and "undefined in" in interval.note


def test_input_errors():
    with pytest.raises(ValueError, match="at least 2 groups"):
        bootstrap.group_interval(lambda c: c.sum(axis=1), 1)
    with pytest.raises(ValueError, match="equal in length"):
        bootstrap.ratio_statistic([1, 2], [1])
    with pytest.raises(ValueError, match="differ in length"):
        bootstrap.srcc_statistic([1, 2, 3], [1, 2, 3, 4], np.zeros(3, int))
