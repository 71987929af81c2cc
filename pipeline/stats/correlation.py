"""Rank and linear correlation between a metric and human judgments.

`srcc` is Spearman's rank correlation, `kendall` Kendall's tau-b, `pearson` the plain
Pearson correlation. `plcc` is the Pearson correlation after a four-parameter logistic (4PL)
fit of the human score on the metric, the usual way to compare a metric whose scale is not
linear in human ratings.

Input rules shared by every statistic in this package (see `check_pair`):
- lengths differ, a value is NaN/inf, or fewer than 3 items -> ValueError (a caller bug
  or missing scores that should have been dropped and reported upstream);
- a constant vector -> the value is NaN, `note` says why and a `DegenerateInputWarning`
  is emitted (a metric that gives every item the same score has no correlation; that is
  a result to report, not a crash).

Sign convention for PLCC: the fitted curve is either increasing or decreasing in the
metric. PLCC = Pearson(y, yhat) multiplied by that direction (+1 increasing, -1
decreasing), so a metric that ranks items backwards gets a negative PLCC, like its SRCC.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
from scipy import optimize, stats

MIN_ITEMS = 3
MIN_ITEMS_LOGISTIC = 5  # a 4-parameter curve through 4 points fits anything


class DegenerateInputWarning(UserWarning):
    """A statistic is undefined for this input (e.g. a constant vector) and is NaN."""


@dataclass(frozen=True)
class Correlation:
    value: float  # NaN when undefined; `note` then says why
    n: int
    note: str | None = None


@dataclass(frozen=True)
class LogisticCorrelation(Correlation):
    """PLCC plus what the fit did, so a bad fit is visible in the output tables."""

    params: tuple[float, float, float, float] | None = None  # b1, b2, b3, b4 in original units
    linear_pearson: float = float("nan")  # plain Pearson(x, y), for comparison
    fit_ok: bool = False


def as_float_array(values, name: str) -> np.ndarray:
    array = np.asarray(values, dtype=np.float64)
    if array.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional, got shape {array.shape}")
    return array


def check_pair(x, y, *, x_name: str = "metric", y_name: str = "human") -> tuple[np.ndarray, np.ndarray]:
    """Return x, y as float arrays or raise ValueError saying what is wrong with them."""
    x = as_float_array(x, x_name)
    y = as_float_array(y, y_name)
    if x.shape != y.shape:
        raise ValueError(f"{x_name} and {y_name} differ in length: {x.size} vs {y.size}")
    for name, array in ((x_name, x), (y_name, y)):
        bad = np.flatnonzero(~np.isfinite(array))
        if bad.size:
            raise ValueError(
                f"{name} has {bad.size} NaN/inf value(s), first at position(s) {bad[:5].tolist()}; "
                "drop those items (and report them) before computing statistics"
            )
    if x.size < MIN_ITEMS:
        raise ValueError(f"need at least {MIN_ITEMS} items, got {x.size}")
    return x, y


# Spread, relative to the values' size, that float rounding alone produces: the same score
# averaged over different question counts differs in its last bits, and ranking those bits
# would report noise as a correlation.
ROUNDING_SPREAD = 1e-12


def constant_note(x: np.ndarray, y: np.ndarray, *, x_name: str = "metric", y_name: str = "human") -> str | None:
    """Why a correlation is undefined (an input constant, or constant up to float rounding), or None."""
    for name, array in ((x_name, x), (y_name, y)):
        if np.all(array == array[0]):
            return f"{name} is constant ({array[0]:g} for all {array.size} items)"
        if np.ptp(array) <= ROUNDING_SPREAD * np.max(np.abs(array)):
            return f"{name} is constant up to float rounding ({array[0]:g} for all {array.size} items)"
    return None


def _undefined(note: str) -> None:
    warnings.warn(note, DegenerateInputWarning, stacklevel=3)


def _rank_or_linear(x, y, name: str, compute) -> Correlation:
    """One correlation with the shared input rules: checked pair, NaN with a note when undefined."""
    x, y = check_pair(x, y)
    note = constant_note(x, y)
    if note:
        _undefined(f"{name} undefined: {note}")
        return Correlation(float("nan"), x.size, note)
    return Correlation(float(compute(x, y).statistic), x.size)


def srcc(x, y) -> Correlation:
    """Spearman rank correlation of metric `x` with human `y` (average ranks for ties)."""
    return _rank_or_linear(x, y, "SRCC", stats.spearmanr)


def pearson(x, y) -> Correlation:
    """Plain Pearson correlation (no fit), with the same input rules as `srcc`."""
    return _rank_or_linear(x, y, "Pearson", stats.pearsonr)


def kendall(x, y) -> Correlation:
    """Kendall tau-b (ties corrected on both sides), scipy.stats.kendalltau's default."""
    return _rank_or_linear(x, y, "Kendall tau", stats.kendalltau)


def logistic4(x, b1, b2, b3, b4):
    """y = b2 + (b1 - b2) / (1 + exp(-(x - b3) / |b4|)); b1, b2 are the two plateaus."""
    z = -(x - b3) / np.abs(b4)
    return b2 + (b1 - b2) * _sigmoid_of_minus(z)


def _sigmoid_of_minus(z):
    """1 / (1 + exp(z)) without overflow."""
    return 0.5 * (1.0 - np.tanh(0.5 * z))


def _logistic4_jacobian(x, b1, b2, b3, b4):
    """Analytic derivatives of `logistic4`: several times fewer function calls than finite differences."""
    scale = np.abs(b4)
    z = -(x - b3) / scale
    s = _sigmoid_of_minus(z)
    slope = -(b1 - b2) * s * (1.0 - s)  # d y / d z
    return np.column_stack([s, 1.0 - s, slope / scale, slope * (x - b3) / scale**2 * np.sign(b4)])


def _starting_points(x: np.ndarray, y: np.ndarray, slope: float) -> list[tuple[float, float, float, float]]:
    """A few starts on standardized data, all rising or falling like the least-squares line.

    Plateaus at the extremes of y with a unit and a narrow width, and a very wide logistic
    that matches the line itself, so the fit can always get at least as close as a line.
    (Starting in the opposite direction rarely helps and costs many evaluations.)
    """
    lo, hi, centre = float(y.min()), float(y.max()), float(np.median(x))
    top, bottom = (hi, lo) if slope >= 0 else (lo, hi)
    iqr = float(np.subtract(*np.percentile(x, [75, 25]))) or 1.0
    width = 10.0
    rise = 4.0 * slope * width  # the logistic's slope at its centre is (b1 - b2) / (4 b4)
    return [
        (top, bottom, centre, 1.0),
        (top, bottom, centre, iqr / 4.0),
        (float(y.mean()) + rise / 2.0, float(y.mean()) - rise / 2.0, float(x.mean()), width),
    ]


def plcc(x, y, *, maxfev: int = 200) -> LogisticCorrelation:
    """Pearson correlation of human `y` with its 4PL fit on metric `x`, signed (see module doc).

    Least squares on z-scored data in two steps. First a bounded fit (plateaus, centre, width
    in z-units) from a few starting points, the best of which wins: the bounds keep a start
    from drifting off on a flat objective. Then an unbounded refit (Levenberg-Marquardt, what
    the references' curve_fit runs) from that best fit, kept when it fits better: the optimum
    often lies beyond the bounds (a saturating relation puts a plateau far away, a
    near-linear one wants a very wide curve), and a bounded fit stopped there is below the
    references' PLCC. Each fit may use `maxfev` evaluations per start (the refit ten times
    that); one still improving at its limit is kept, and `note` says so.

    A fit that raises, gives non-finite parameters, a flat prediction, or a worse fit than a
    straight line is a failure: value NaN, `fit_ok` False and `note` saying which. Fewer than
    5 items also give NaN (a 4-parameter curve fits 4 points exactly). If only the bounded fit
    is usable, `note` names every bound it ends on. Fallback rule: if the fit's PLCC is below
    plain Pearson in magnitude, the linear fit is reported instead (value = Pearson, `fit_ok`
    False, `note` says so): a PLCC is never below the straight line's correlation.
    """
    x, y = check_pair(x, y)
    note = constant_note(x, y)
    if note:
        _undefined(f"PLCC undefined: {note}")
        return LogisticCorrelation(float("nan"), x.size, note)
    linear = float(stats.pearsonr(x, y).statistic)
    if x.size < MIN_ITEMS_LOGISTIC:
        return _failed(x.size, linear, f"a 4-parameter fit needs at least {MIN_ITEMS_LOGISTIC} items, got {x.size}")

    # Fit on z-scores: the same curve family, better conditioned for any score scale.
    mx, sx, my, sy = x.mean(), x.std(), y.mean(), y.std()
    xs, ys = (x - mx) / sx, (y - my) / sy
    line = np.polyfit(xs, ys, 1)
    slope, sse_linear = float(line[0]), float(np.sum((ys - np.polyval(line, xs)) ** 2))
    # In z-units y spans a few units; these bounds allow a near-linear curve (width 20,
    # plateaus at +-50) while stopping the starts' drift towards infinite width on a flat
    # objective. They are no model constraint: the unbounded refit below may leave them.
    bounds = ([-50.0, -50.0, -20.0, 1e-3], [50.0, 50.0, 20.0, 20.0])
    best, errors = None, []
    for start in _starting_points(xs, ys, slope):
        fit = _fit(xs, ys, start, errors, bounds=bounds, max_nfev=maxfev)
        if fit is not None and (best is None or fit.cost < best.cost):
            best = fit
    if best is None:
        return _failed(x.size, linear, "logistic fit failed from every start: " + "; ".join(errors))
    refit = _fit(xs, ys, best.x, errors, method="lm", max_nfev=10 * maxfev)
    bounded = refit is None or not refit.cost < best.cost
    if not bounded:
        best = refit
    best_sse = 2.0 * float(best.cost)
    fitted = logistic4(xs, *best.x)
    if np.std(fitted) <= 1e-9:
        return _failed(x.size, linear, "logistic fit is flat (constant prediction)")
    if best_sse > sse_linear * (1 + 1e-3) + 1e-4 * x.size:
        return _failed(x.size, linear, f"logistic fit is worse than a straight line (SSE {best_sse:.4g} > {sse_linear:.4g})")

    b1, b2, b3, b4 = (float(v) for v in best.x)
    direction = 1.0 if b1 >= b2 else -1.0
    value = direction * float(np.corrcoef(ys, fitted)[0, 1])
    params = (float(my + sy * b1), float(my + sy * b2), float(mx + sx * b3), float(sx * abs(b4)))
    # A fit still improving at the evaluation limit (flat objective, e.g. an unrelated metric)
    # is kept: it already fits at least as well as a line. The note says so.
    limit = maxfev if bounded else 10 * maxfev
    notes = [f"fit stopped at the evaluation limit ({limit})"] if best.status == 0 else []
    binding = _binding_bounds(best.x, getattr(best, "active_mask", None), bounds) if bounded else []
    if binding:
        notes.append("4PL bound binds: " + ", ".join(binding))
    if abs(value) < abs(linear):
        # The curve fits worse than the line it contains in the limit: report the linear fit
        # (its correlation is plain Pearson) rather than a PLCC below Pearson.
        notes.append(f"4PL PLCC {value:.6g} below plain Pearson {linear:.6g}: linear fit used")
        return LogisticCorrelation(linear, x.size, "; ".join(notes), None, linear, False)
    return LogisticCorrelation(value, x.size, "; ".join(notes) or None, params, linear, True)


def _fit(xs: np.ndarray, ys: np.ndarray, start, errors: list[str], **options):
    """One least-squares fit of `logistic4` (scipy.optimize.least_squares, analytic Jacobian,
    called directly so a fit that reaches its evaluation limit is not thrown away); None, with
    the reason appended to `errors`, when it raises or ends on non-finite parameters."""
    try:
        fit = optimize.least_squares(
            lambda p: logistic4(xs, *p) - ys, start, jac=lambda p: _logistic4_jacobian(xs, *p), **options
        )
    except (ValueError, np.linalg.LinAlgError) as exc:
        errors.append(str(exc).splitlines()[0])
        return None
    if not np.all(np.isfinite(fit.x)) or not np.isfinite(fit.cost):
        errors.append("non-finite parameters")
        return None
    return fit


_PARAMETER_NAMES = ("upper plateau b1", "lower plateau b2", "centre b3", "width b4")


def _binding_bounds(params, active, bounds) -> list[str]:
    """Parameters held at a bound by the fit (least_squares' active set), named with the bound."""
    names = []
    for index, name in enumerate(_PARAMETER_NAMES):
        side = int(active[index]) if active is not None else 0
        if side == 0:  # also catch a parameter sitting on a bound the active set did not flag
            low, high = bounds[0][index], bounds[1][index]
            tolerance = 1e-9 * max(1.0, abs(high - low))
            side = -1 if params[index] - low <= tolerance else (1 if high - params[index] <= tolerance else 0)
        if side:
            limit = bounds[0][index] if side < 0 else bounds[1][index]
            names.append(f"{name} at {'lower' if side < 0 else 'upper'} bound {limit:g} (z-units)")
    return names


def _failed(n: int, linear: float, note: str) -> LogisticCorrelation:
    return LogisticCorrelation(float("nan"), n, note, None, linear, False)
