"""Tie-calibrated pairwise accuracy (acc23): hand-computed values, brute force, invariants."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.stats.pairwise import pairwise_accuracy


def brute_force(metric, human):
    """Literal definition: every candidate eps, every pair (like mt-metrics-eval acc_23)."""
    metric, human = np.asarray(metric, float), np.asarray(human, float)
    n = metric.size
    pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
    candidates = sorted({0.0} | {abs(metric[i] - metric[j]) for i, j in pairs})
    best_value, best_eps = -1.0, None
    for eps in candidates:
        correct = 0
        for i, j in pairs:
            dm, dh = metric[i] - metric[j], human[i] - human[j]
            if abs(dm) <= eps:
                correct += dh == 0
            else:
                correct += dh != 0 and (dm > 0) == (dh > 0)
        if correct / len(pairs) > best_value:  # strict: keeps the smallest eps at the maximum
            best_value, best_eps = correct / len(pairs), eps
    return best_value, best_eps


def sorted_pairs_reference(metric, human):
    """Exact O(P log P) reference: sort every pair by |dm| and take the best running count."""
    i, j = np.triu_indices(metric.size, 1)
    d, dh = metric[j] - metric[i], human[j] - human[i]
    concordant = ((dh > 0) & (d > 0)) | ((dh < 0) & (d < 0))
    step = (dh == 0).astype(int) - concordant
    values, where = np.unique(np.abs(d), return_inverse=True)
    running = concordant.sum() + np.cumsum(np.bincount(where, weights=step))
    if values[0] > 0:
        values, running = np.append(0.0, values), np.append(concordant.sum(), running)
    best = int(np.argmax(running))
    return running[best] / i.size, values[best]


def test_hand_computed_example_with_calibrated_eps():
    human = [1, 1, 2, 3]
    metric = [0.10, 0.15, 0.50, 0.40]
    # pairs: (0,1) human tie, |dm| .05; (0,2),(0,3),(1,2),(1,3) concordant with |dm| .4,.3,.35,.25;
    # (2,3) discordant, |dm| .1. eps=0: 4/6. eps=.05: the human tie becomes a tie in both: 5/6.
    # eps=.1 is also 5/6 (the discordant pair only becomes a metric tie) -> the smaller eps wins.
    result = pairwise_accuracy(metric, human)
    assert result.value == pytest.approx(5 / 6)
    assert result.epsilon == pytest.approx(0.05)
    assert (result.concordant, result.ties_both, result.n_pairs) == (4, 1, 6)


def test_fixed_epsilon():
    human, metric = [1, 1, 2, 3], [0.10, 0.15, 0.50, 0.40]
    assert pairwise_accuracy(metric, human, epsilon=0.0).value == pytest.approx(4 / 6)
    at_quarter = pairwise_accuracy(metric, human, epsilon=0.26)  # also ties the (1,3) concordant pair
    assert (at_quarter.concordant, at_quarter.ties_both) == (3, 1)
    with pytest.raises(ValueError, match="epsilon"):
        pairwise_accuracy(metric, human, epsilon=-1)


def test_metric_ties_count_only_where_humans_tie():
    # every metric value equal: each pair is a metric tie; right only where humans tie (1 of 3)
    result = pairwise_accuracy([0.5, 0.5, 0.5], [1, 1, 2])
    assert result.value == pytest.approx(1 / 3) and result.epsilon == 0.0


def test_eps_zero_when_ties_do_not_help():
    result = pairwise_accuracy([1.0, 2.0, 3.0, 4.0], [1, 2, 3, 4])
    assert result.value == 1.0 and result.epsilon == 0.0


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 6), st.integers(0, 3)), min_size=3, max_size=25),
    st.sampled_from([1.0, 0.1, 1 / 3, 1e-9]),
)
def test_matches_brute_force_on_small_inputs_with_many_ties(pairs, unit):
    metric, human = (np.array(v, dtype=float) for v in zip(*pairs))
    metric = metric * unit
    result = pairwise_accuracy(metric, human)
    value, eps = brute_force(metric, human)
    assert result.value == pytest.approx(value, abs=1e-12)
    assert result.epsilon == eps


@pytest.mark.parametrize(
    "n, human_levels, noise, decimals",
    [(1500, 3, 0.3, None), (2100, 5, 1.0, 1), (1300, 2, 0.05, 2), (1100, 9, 0.5, None)],
)
def test_matches_exact_reference_across_many_blocks_and_bins(n, human_levels, noise, decimals):
    r = np.random.default_rng(n)
    human = r.integers(0, human_levels, n).astype(float)
    metric = human + r.normal(0, noise, n)
    if decimals is not None:
        metric = np.round(metric, decimals)
    result = pairwise_accuracy(metric, human)
    value, eps = sorted_pairs_reference(metric, human)
    assert result.value == pytest.approx(value, abs=1e-12)
    assert result.epsilon == eps
    assert result.value * result.n_pairs == pytest.approx(result.concordant + result.ties_both)


def test_properties():
    r = np.random.default_rng(1)
    human = r.integers(1, 6, size=(300, 3)).mean(axis=1)
    assert pairwise_accuracy(human, human).value == 1.0
    metric = human + r.normal(0, 0.5, 300)
    base = pairwise_accuracy(metric, human)
    order = r.permutation(300)
    shuffled = pairwise_accuracy(metric[order], human[order])
    assert (shuffled.value, shuffled.epsilon) == (base.value, base.epsilon)
    # a strictly decreasing transform orders every untied pair backwards
    backwards = pairwise_accuracy(-np.exp(human), human)
    assert backwards.concordant == 0 and backwards.value < 0.2


def test_bad_input():
    with pytest.raises(ValueError, match="differ in length"):
        pairwise_accuracy([1, 2, 3], [1, 2])
    with pytest.raises(ValueError, match="NaN"):
        pairwise_accuracy([1, 2, np.nan], [1, 2, 3])
    with pytest.raises(ValueError, match="at least 3"):
        pairwise_accuracy([1, 2], [1, 2])


@pytest.mark.parametrize("kind", ["continuous", "rounded", "three_values", "tiny_steps", "outlier"])
def test_branch_and_bound_splits_and_enumerates_exactly(kind, monkeypatch):
    # Tiny enumeration budget and grid: the search must split intervals between distinct
    # |dm| values many times and still land on the reference's eps and value.
    from pipeline.stats import pairwise

    monkeypatch.setattr(pairwise, "_ENUMERATE", 150)
    monkeypatch.setattr(pairwise, "_GRID", 3)
    monkeypatch.setattr(pairwise, "_SAMPLE", 40)
    r = np.random.default_rng(len(kind))
    for n in (7, 60, 240):
        human = r.integers(1, 5, n).astype(float)
        metric = {
            "continuous": human + r.normal(0, 1, n),
            "rounded": np.round(human + r.normal(0, 1, n), 1),
            "three_values": r.integers(0, 3, n).astype(float),
            "tiny_steps": np.round(r.random(n) * 1e-3 + human * 0.1, 7),
            "outlier": r.choice([0.1, 0.2, 0.3, 0.7, 1e9], n),
        }[kind]
        result = pairwise_accuracy(metric, human)
        value, eps = sorted_pairs_reference(metric, human)
        assert result.value == pytest.approx(value, abs=1e-12) and result.epsilon == eps, n


def test_fixed_epsilon_counts_match_the_reference_loop():
    r = np.random.default_rng(4)
    human = r.integers(1, 4, 200).astype(float)
    metric = np.round(human + r.normal(0, 1, 200), 1)
    i, j = np.triu_indices(200, 1)
    dm, dh = np.abs(metric[j] - metric[i]), human[j] - human[i]
    same_sign = np.sign(metric[j] - metric[i]) == np.sign(dh)
    for eps in (0.0, 0.1, 0.35, 5.0):
        result = pairwise_accuracy(metric, human, epsilon=eps)
        assert result.ties_both == int(np.sum((dm <= eps) & (dh == 0)))
        assert result.concordant == int(np.sum((dm > eps) & (dh != 0) & same_sign))
