"""A run's evidence checks in numbers: the causal deltas per backbone (docs/method.md, "Causal
deltas"), each a mean over the eligible claims with a bootstrap interval that resamples images
(claims of one image share its boxes and its answers, so they are not independent).

d_sel well above d_rnd says hiding the evidence matters more than hiding a matched random
region; the share of claims with d_sel > d_rnd says for how many claims that holds.
"""
from __future__ import annotations

import math

import numpy as np
import polars as pl

from pipeline.stats.bootstrap import group_codes, group_interval, ratio_statistic

DELTAS = ("d_sel", "d_rnd", "d_suff", "d_anchor")


def delta_summary(deltas: pl.DataFrame, n_resamples: int = 1000, seed: int = 0, confidence: float = 0.95) -> dict:
    """Claims counted, and per delta (and for the share with d_sel > d_rnd) the mean with its
    95% BCa interval over images; claims without every delta are left out and counted by
    their note (no_evidence, no_control_box, missing_view_answer, ...)."""
    complete = pl.all_horizontal([pl.col(d).is_not_null() & pl.col(d).is_finite() for d in DELTAS])
    usable = deltas.filter(complete)
    reasons = deltas.filter(~complete).group_by(pl.col("note").fill_null("missing_delta")).len().sort("note")
    out: dict = {"claims": usable.height, "left_out": dict(zip(reasons["note"].to_list(), reasons["len"].to_list()))}
    if usable.height == 0:
        return out
    codes, n_images = group_codes(usable["item_id"].to_numpy())
    per_image_claims = np.bincount(codes, minlength=n_images).astype(np.float64)
    values = {d: usable[d].to_numpy() for d in DELTAS}
    values["d_sel > d_rnd"] = (usable["d_sel"] > usable["d_rnd"]).cast(pl.Float64).to_numpy()
    for name, v in values.items():
        sums = np.bincount(codes, weights=v, minlength=n_images)
        if n_images < 2:
            out[name] = (float(sums.sum() / per_image_claims.sum()), math.nan, math.nan)
            continue
        interval = group_interval(ratio_statistic(sums, per_image_claims), n_images, n_resamples=n_resamples, seed=seed, confidence=confidence)
        out[name] = (interval.estimate, interval.low, interval.high)
    out["images"] = n_images
    return out


def delta_lines(summaries: dict[str, dict]) -> list[str]:
    """The summary's block: one line per backbone."""
    def cell(value) -> str:
        estimate, low, high = value
        return f"{estimate:.2f} [{low:.2f}, {high:.2f}]" if math.isfinite(low) else f"{estimate:.2f}"

    names = (*DELTAS, "d_sel > d_rnd")
    lines = ["evidence deltas (log-odds of Yes; mean over claims, bootstrap interval over images):",
             (f"{'backbone':<10} {'claims':>7}  " + "  ".join(f"{n:<20}" for n in names)).rstrip()]
    for backbone, s in summaries.items():
        left_out = ", ".join(f"{note} {n}" for note, n in s["left_out"].items())
        if not s["claims"]:
            lines.append(f"{backbone:<10} {0:>7}  no claim has every delta ({left_out})")
            continue
        lines.append(f"{backbone:<10} {s['claims']:>7}  " + "  ".join(f"{cell(s[n]):<20}" for n in names).rstrip())
        if left_out:
            lines.append(f"{'':<10} {'':>7}  claims left out: {left_out}")
    return lines
