"""Exact arithmetic for discrete statistics: values as whole numbers over one common denominator.

An accuracy is a sum of per-group credits over a count of groups, with credits 0/1
(Winoground) or 1/k when k options tie (multiple choice, `expected` policy). BCa's bias
correction counts the resamples below the estimate and those equal to it, and with discrete
credits many resamples equal it exactly. Floating-point sums break such ties at random: the
sum of the same credits in another order, or mean(a) - mean(b) (-0.024999999999999967 for
-0.025), rounds to a neighbouring float, so resamples equal to the estimate count as below or
above it and an interval end moves by a whole step. Scaled to whole numbers (1/3 -> 4 of 12)
every sum and product is exact in float64, and the single division at the end rounds the
rational value to the same float whichever resample, or estimate, it comes from.
"""
from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

MAX_DENOMINATOR = 1000  # a value is read as p/q only for q up to this (tie credits 1/k, shares)
MAX_SCALE = 10**6  # a larger common denominator is not a discrete statistic worth this path
EXACT_BELOW = 2.0**53  # float64 holds every whole number smaller than this in magnitude


def common_scale(*arrays) -> int | None:
    """The smallest L with L * value whole for every value, or None when a value is not a small fraction.

    A value is the fraction p/q (q <= MAX_DENOMINATOR) only if it is exactly the float nearest
    to p/q: 1.0 / 3 is, 0.1 + 0.2 is not (it is a float near 3/10, the sum of rounded parts).
    """
    scale = 1
    values = np.concatenate([np.ravel(np.asarray(a, dtype=np.float64)) for a in arrays]) if arrays else np.empty(0)
    for value in np.unique(values):
        if not np.isfinite(value):
            return None
        fraction = Fraction(float(value)).limit_denominator(MAX_DENOMINATOR)
        if float(fraction) != value:
            return None
        scale = math.lcm(scale, fraction.denominator)
        if scale > MAX_SCALE:
            return None
    return scale


def scaled(values, scale: int) -> np.ndarray:
    """values * scale as whole numbers (float64); `scale` from `common_scale`."""
    return np.rint(np.asarray(values, dtype=np.float64) * scale)


def mean(values) -> float:
    """The mean, rounded once from its exact value when the values are small fractions.

    The same integers and the same division as `bootstrap.ratio_statistic` on all groups, so
    a table's accuracy equals its interval's estimate bit for bit. NaN when empty.
    """
    values = np.asarray(values, dtype=np.float64)
    if values.size == 0:
        return float("nan")
    scale = common_scale(values)
    if scale is None:
        return float(values.mean())
    whole = scaled(values, scale)
    if float(np.abs(whole).sum()) >= EXACT_BELOW:
        return float(values.mean())
    return float(whole.sum() / (values.size * scale))
