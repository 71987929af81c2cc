"""From stored answers to yes-probabilities.

An answer is stored as two raw log-probabilities (`logp_yes`, `logp_no`), so the same
answers serve either convention of reading them as a probability:

- ``normalized``: p = sigmoid(logp_yes - logp_no) = P(yes) / (P(yes) + P(no))
- ``raw``: p = exp(logp_yes), the original VQAScore reading (logp_yes above 0, which
  only float rounding can produce, is read as 0 so that p stays a probability)
"""
from __future__ import annotations

import numpy as np
import polars as pl
from scipy.special import expit, log_expit

CONVENTIONS = ("normalized", "raw")
LOGP_SLACK = 1e-6  # a log-sum-exp of log-probabilities may round to just above 0


def check_convention(name: str) -> str:
    """Return `name` if it is a known probability convention, else raise naming the choices."""
    if name not in CONVENTIONS:
        raise ValueError(f"unknown probability convention {name!r}; expected one of {', '.join(CONVENTIONS)}")
    return name


def _as_expr(column: str | pl.Expr) -> pl.Expr:
    return pl.col(column) if isinstance(column, str) else column


def yes_probability_expr(logp_yes: str | pl.Expr, logp_no: str | pl.Expr, convention: str = "normalized") -> pl.Expr:
    """Polars expression for P(yes) under `convention`.

    1 / (1 + exp(-x)) never produces NaN from finite input: a very negative x overflows
    exp(-x) to inf and gives exactly 0, the correct limit.
    """
    check_convention(convention)
    yes = _as_expr(logp_yes)
    if convention == "raw":
        return yes.clip(upper_bound=0.0).exp()
    return 1.0 / (1.0 + (_as_expr(logp_no) - yes).exp())


def log_yes_probability_expr(
    logp_yes: str | pl.Expr, logp_no: str | pl.Expr, convention: str = "normalized"
) -> pl.Expr:
    """Polars expression for log P(yes), computed in log space (for geometric means).

    log sigmoid(x) = -softplus(-x), with softplus(z) = max(z, 0) + log1p(exp(-|z|)), which
    stays finite where log(sigmoid(x)) would underflow to log(0) = -inf.
    """
    check_convention(convention)
    yes = _as_expr(logp_yes)
    if convention == "raw":
        return yes.clip(upper_bound=0.0)
    z = _as_expr(logp_no) - yes
    return -(z.clip(lower_bound=0.0) + (-z.abs()).exp().log1p())


def yes_probability(logp_yes: np.ndarray, logp_no: np.ndarray, convention: str = "normalized") -> np.ndarray:
    """NumPy P(yes) under `convention` (scipy's expit is stable for any finite input)."""
    check_convention(convention)
    logp_yes = np.asarray(logp_yes, dtype=np.float64)
    if convention == "raw":
        return np.exp(np.minimum(logp_yes, 0.0))
    return expit(logp_yes - np.asarray(logp_no, dtype=np.float64))


def log_yes_probability(logp_yes: np.ndarray, logp_no: np.ndarray, convention: str = "normalized") -> np.ndarray:
    """NumPy log P(yes) under `convention`, computed in log space."""
    check_convention(convention)
    logp_yes = np.asarray(logp_yes, dtype=np.float64)
    if convention == "raw":
        return np.minimum(logp_yes, 0.0)
    return log_expit(logp_yes - np.asarray(logp_no, dtype=np.float64))


def usable_answer_expr(logp_yes: str, logp_no: str) -> pl.Expr:
    """True where both log-probabilities are present, finite and not positive.

    A null, NaN, infinite or positive (beyond float rounding) value is not an answer;
    the metrics turn it into a null score with a note instead of a number.
    """
    ok = pl.lit(True)
    for column in (logp_yes, logp_no):
        ok = ok & pl.col(column).is_finite().fill_null(False) & (pl.col(column) <= LOGP_SLACK)
    return ok
