"""SRCC and 4PL PLCC: agreement with scipy, invariants, failed fits, bad input."""
from __future__ import annotations

import warnings
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import optimize, stats

from pipeline.stats import correlation
from pipeline.stats.correlation import (
    DegenerateInputWarning,
    logistic4,
    pearson,
    plcc,
    srcc,
)

rng = np.random.default_rng(7)


def _noisy_logistic(n=300, seed=0):
    r = np.random.default_rng(seed)
    x = r.normal(size=n)
    y = 1 + 4 / (1 + np.exp(-2.5 * x)) + r.normal(0, 0.4, n)
    return x, y


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 3)), min_size=3, max_size=40))
def test_srcc_matches_scipy_with_ties(pairs):
    x, y = (np.array(v, dtype=float) for v in zip(*pairs))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DegenerateInputWarning)
        result = srcc(x, y)
    expected = stats.spearmanr(x, y).statistic if x.std() and y.std() else np.nan
    np.testing.assert_allclose(result.value, expected, equal_nan=True, atol=1e-12)
    assert result.n == len(pairs)


def test_pearson_matches_scipy():
    x, y = rng.normal(size=50), rng.normal(size=50)
    assert pearson(x, y).value == pytest.approx(stats.pearsonr(x, y).statistic)


def test_plcc_is_pearson_of_human_and_fitted_curve():
    x, y = _noisy_logistic()
    result = plcc(x, y)
    assert result.fit_ok and result.note is None
    fitted = logistic4(x, *result.params)
    assert result.value == pytest.approx(stats.pearsonr(y, fitted).statistic, abs=1e-9)
    # the curve bends where the data bends, so it beats a straight line here
    assert result.value > result.linear_pearson + 0.01
    b1, b2, b3, _ = result.params
    assert b1 == pytest.approx(5, abs=0.3) and b2 == pytest.approx(1, abs=0.3) and b3 == pytest.approx(0, abs=0.15)


def test_plcc_does_no_worse_than_linear_on_linear_data():
    x = rng.normal(size=400)
    y = 3 * x + rng.normal(0, 1, 400)
    result = plcc(x, y)
    assert result.fit_ok
    assert result.value >= result.linear_pearson - 1e-3


def test_metric_equal_to_human_is_perfect():
    human = rng.integers(1, 6, size=(200, 3)).mean(axis=1)
    assert srcc(human, human).value == pytest.approx(1.0)
    assert plcc(human, human).value == pytest.approx(1.0, abs=1e-3)


def test_decreasing_metric_keeps_its_sign():
    x, y = _noisy_logistic()
    assert srcc(-np.exp(x), x).value == pytest.approx(-1.0)
    falling = plcc(-x, y)
    assert falling.fit_ok and falling.value < -0.9
    assert falling.value == pytest.approx(-plcc(x, y).value, abs=1e-6)
    assert falling.params[0] < falling.params[1]  # b1 < b2: the fitted curve falls


def test_shuffling_items_changes_nothing():
    x, y = _noisy_logistic(seed=3)
    order = rng.permutation(x.size)
    assert srcc(x[order], y[order]).value == pytest.approx(srcc(x, y).value, abs=1e-12)
    assert plcc(x[order], y[order]).value == pytest.approx(plcc(x, y).value, abs=1e-6)


def test_scale_of_the_metric_does_not_matter():
    x, y = _noisy_logistic(seed=4)
    assert plcc(1e-4 * x + 3, y).value == pytest.approx(plcc(x, y).value, abs=1e-6)


@pytest.mark.parametrize("function", [srcc, plcc, pearson])
def test_bad_input_is_a_clear_value_error(function):
    with pytest.raises(ValueError, match="differ in length"):
        function([1, 2, 3], [1, 2])
    with pytest.raises(ValueError, match="NaN"):
        function([1, np.nan, 3, 4], [1, 2, 3, 4])
    with pytest.raises(ValueError, match="at least 3"):
        function([1, 2], [1, 2])
    with pytest.raises(ValueError, match="one-dimensional"):
        function([[1, 2, 3]], [[1, 2, 3]])


@pytest.mark.parametrize("function", [srcc, plcc, pearson])
def test_constant_input_is_nan_with_a_warning(function):
    with pytest.warns(DegenerateInputWarning, match="constant"):
        result = function([0.5] * 10, np.arange(10.0))
    assert np.isnan(result.value) and "metric is constant" in result.note


def test_plcc_needs_five_items():
    result = plcc([1.0, 2, 3, 4], [1.0, 3, 2, 4])
    assert np.isnan(result.value) and not result.fit_ok and "at least 5" in result.note
    assert result.linear_pearson == pytest.approx(0.8)


def _fake_fit(params):
    def least_squares(fun, start, **kwargs):
        p = np.asarray(params, dtype=float)
        return SimpleNamespace(x=p, cost=0.5 * float(np.sum(fun(p) ** 2)), status=1)

    return least_squares


@pytest.mark.parametrize(
    "fake, message",
    [
        (_fake_fit([0.0, 0.0, 0.0, 1.0]), "flat"),  # b1 == b2: constant prediction
        (_fake_fit([-1.0, 1.0, 1.0, 0.01]), "worse than a straight line"),  # a backwards step
        (_fake_fit([np.nan, 0.0, 0.0, 1.0]), "non-finite"),
    ],
)
def test_failed_fits_are_reported(monkeypatch, fake, message):
    monkeypatch.setattr(correlation.optimize, "least_squares", fake)
    x, y = _noisy_logistic(n=50)
    result = plcc(x, y)
    assert np.isnan(result.value) and not result.fit_ok and message in result.note
    assert result.linear_pearson == pytest.approx(stats.pearsonr(x, y).statistic)


def test_fit_that_raises_is_reported(monkeypatch):
    def boom(*args, **kwargs):
        raise ValueError("Residuals are not finite in the initial point.")

    monkeypatch.setattr(correlation.optimize, "least_squares", boom)
    result = plcc(*_noisy_logistic(n=50))
    assert np.isnan(result.value) and "failed from every start" in result.note and "Residuals" in result.note


def test_unrelated_metric_gets_a_small_value_not_a_crash():
    result = plcc(rng.normal(size=2000), rng.normal(size=2000))
    assert result.fit_ok and abs(result.value) < 0.2


def test_bounded_fit_is_kept_and_its_binding_bound_named_when_the_refit_fails(monkeypatch):
    # A straight relation with noise: the bounded fit runs to a plateau bound. The unbounded
    # refit goes past it (a better fit, nothing to note); if the refit fails, the bounded fit
    # is reported and the note names the bound it ends on.
    r = np.random.default_rng(10)
    x = r.normal(size=200)
    y = x + r.normal(0, 1.0, 200)
    refitted = plcc(x, y)
    assert refitted.fit_ok and refitted.note is None
    least_squares = correlation.optimize.least_squares

    def no_refit(*args, **kwargs):
        if kwargs.get("method") == "lm":
            raise ValueError("refit failed")
        return least_squares(*args, **kwargs)

    monkeypatch.setattr(correlation.optimize, "least_squares", no_refit)
    bounded = plcc(x, y)
    assert bounded.fit_ok
    assert "4PL bound binds: upper plateau b1 at upper bound 50" in bounded.note
    assert refitted.value > bounded.value


def test_plcc_never_below_plain_pearson():
    # y = x + 0.02 x^3 steepens towards both ends, the opposite of any logistic's bend: the
    # least-squares curve is the line itself, at infinite width, and no finite fit reaches it
    # (the reference fit's PLCC is below Pearson too). The fallback rule reports the linear
    # fit instead, and the note names it.
    x = np.linspace(-1, 1, 41)
    y = x + 0.02 * x**3
    linear = stats.pearsonr(x, y).statistic
    assert _videval_fit(x, y)[1] < linear
    result = plcc(x, y)
    assert result.value == result.linear_pearson == pytest.approx(linear)
    assert not result.fit_ok and result.params is None
    assert "below plain Pearson" in result.note and "linear fit used" in result.note


# ---------------------------------------------------------------------------------------------
# The least-squares optimum the references reach


def _videval_fit(x, y) -> tuple[float, float]:
    """The reference fit: VIDEVAL-style scipy curve_fit of the same 4PL, unbounded, from
    [max(y), min(y), mean(x), std(x) / 4]. Returns (SSE, PLCC signed like `plcc`)."""

    def curve(x, b1, b2, b3, b4):
        return (b1 - b2) / (1 + np.exp(-(x - b3) / np.abs(b4))) + b2

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # overflow in exp far from the centre is harmless here
        params, _ = optimize.curve_fit(curve, x, y, p0=[y.max(), y.min(), x.mean(), x.std() / 4], maxfev=100_000)
    fitted = curve(x, *params)
    return float(np.sum((y - fitted) ** 2)), float(np.sign(params[0] - params[1]) * np.corrcoef(y, fitted)[0, 1])


def _saturating(seed):  # humans keep rising where the metric's scale saturates: a far plateau
    r = np.random.default_rng(seed)
    x = r.uniform(0, 1, 300)
    return x, np.log(x + 0.05) + r.normal(0, 0.3, 300)


def _convex(seed):  # the mirror image: a steep rise at the top of the metric's range
    r = np.random.default_rng(seed)
    x = r.normal(size=300)
    return x, np.exp(x) + r.normal(0, 0.5, 300)


def _heavy_tailed(seed):
    r = np.random.default_rng(seed)
    x = r.standard_t(2, 300)
    return x, x + r.normal(0, 1, 300)


def _near_linear(seed):
    r = np.random.default_rng(seed)
    x = r.uniform(-1, 1, 300)
    return x, x + r.normal(0, 0.05, 300)


REFERENCE_DATA = {"saturating": _saturating, "convex": _convex, "heavy_tailed": _heavy_tailed, "near_linear": _near_linear}


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize("shape", sorted(REFERENCE_DATA))
def test_plcc_reaches_the_reference_least_squares_fit(shape, seed):
    x, y = REFERENCE_DATA[shape](seed + 18 * (shape == "near_linear"))
    reference_sse, reference_value = _videval_fit(x, y)
    result = plcc(x, y)
    assert result.fit_ok, result.note
    sse = float(np.sum((y - logistic4(x, *result.params)) ** 2))
    assert sse <= reference_sse * (1 + 1e-9)
    assert result.value >= reference_value - 1e-9
    if abs(reference_value) >= abs(result.linear_pearson):
        assert abs(result.value) >= abs(result.linear_pearson)


@pytest.mark.parametrize("function", [srcc, correlation.kendall, pearson, plcc])
def test_a_metric_constant_up_to_float_rounding_is_constant(function):
    """Per-item means of one value over different question counts differ in the last bits
    (sum([0.82] * k) / k); ranking that noise would give an SRCC of 0.085 and scipy's
    NearConstantInputWarning on stderr. It is a constant metric: NaN with the note."""
    metric = [sum([0.82] * k) / k for k in range(1, 25)]
    assert len(set(metric)) > 1  # the rounding noise the statistic must not rank
    human = np.linspace(1.0, 5.0, 24)
    with warnings.catch_warnings():
        warnings.simplefilter("error", stats.NearConstantInputWarning)
        warnings.simplefilter("ignore", DegenerateInputWarning)
        result = function(metric, human)
    assert np.isnan(result.value) and "metric is constant up to float rounding" in result.note


def test_tiny_but_distinct_scores_are_not_constant():
    """A geometric mean can be tiny for every item and still rank them: only spread within
    rounding of the values' own size counts as constant."""
    metric = np.array([1e-30, 3e-30, 2e-29, 5e-28, 1e-27])
    assert srcc(metric, [1.0, 2.0, 3.0, 4.0, 5.0]).value == pytest.approx(1.0)
