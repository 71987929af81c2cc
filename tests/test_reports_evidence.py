"""The run summary's evidence deltas (pipeline/reports/evidence.py), by hand."""
from __future__ import annotations

import math

import numpy as np
import polars as pl

from pipeline.reports.evidence import DELTAS, delta_lines, delta_summary


def claims(rows):
    """rows: (item_id, d_sel, d_rnd, note); d_suff = 2 * d_sel, d_anchor = 1."""
    return pl.DataFrame({
        "item_id": [r[0] for r in rows], "d_sel": [r[1] for r in rows], "d_rnd": [r[2] for r in rows],
        "d_suff": [None if r[1] is None else 2 * r[1] for r in rows], "d_anchor": [None if r[1] is None else 1.0 for r in rows],
        "note": [r[3] for r in rows],
    }, schema={"item_id": pl.String, **{d: pl.Float64 for d in DELTAS}, "note": pl.String})


def test_means_over_claims_with_images_resampled():
    frame = claims([("a", 4.0, 0.0, None), ("a", 2.0, 3.0, None), ("b", 9.0, 1.0, None), ("c", 0.0, 0.5, None),
                    ("c", None, None, "no_evidence"), ("d", None, None, "no_control_box")])
    s = delta_summary(frame, n_resamples=500, seed=1)
    assert s["claims"] == 4 and s["images"] == 3 and s["left_out"] == {"no_control_box": 1, "no_evidence": 1}
    assert math.isclose(s["d_sel"][0], 3.75) and math.isclose(s["d_rnd"][0], 1.125) and math.isclose(s["d_suff"][0], 7.5)
    assert math.isclose(s["d_sel > d_rnd"][0], 0.5)  # claims 1 and 3 of 4
    assert s["d_anchor"][1:] == (1.0, 1.0)  # every resample gives 1: a single point
    low, high = s["d_sel"][1:]
    assert low <= 3.75 <= high and low < high
    # weighting per claim, not per image: image a's two claims count twice
    assert not math.isclose(s["d_sel"][0], np.mean([3.0, 9.0, 0.0]))


def test_the_block_names_each_backbone_and_what_was_left_out():
    frame = claims([("a", 4.0, 0.0, None), ("b", 2.0, 1.0, None), ("c", None, None, "no_evidence")])
    lines = delta_lines({"micro": delta_summary(frame, 200), "other": delta_summary(claims([("a", None, None, "no_evidence")]), 200)})
    assert lines[2].split()[:3] == ["micro", "2", "3.00"] and "claims left out: no_evidence 1" in lines[3]
    assert lines[4].startswith("other") and "no claim has every delta (no_evidence 1)" in lines[4]
