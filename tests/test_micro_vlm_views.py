"""Claims on masked views, measured through an engine (pipeline/micro_vlm_views.py): the summary's
arithmetic by hand, and the shipped micro VLM's answers moving with what a view hides, which a
mask filled outside its box (a corrupted `operators.views.render_view`) undoes."""
from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest
from mutation import mutated

from operators import views
from pipeline import micro_vlm_views as MV


def frame(rows):
    names = ["truth", "truth_without_evidence", "truth_without_control", "p_image", "p_without_evidence", "p_without_control"]
    out = pl.DataFrame([dict(zip(names, r)) for r in rows])
    odds = {c: (pl.col(c) / (1 - pl.col(c))).log() for c in names[3:]}
    return out.with_columns(d_sel=odds["p_image"] - odds["p_without_evidence"], d_rnd=odds["p_image"] - odds["p_without_control"])


def test_the_summary_by_hand():
    answers = frame([
        (True, False, True, 0.9, 0.2, 0.8),   # hidden: drop 0.7, control moves 0.1
        (True, False, True, 0.8, 0.5, 0.8),   # hidden: drop 0.3, control 0
        (True, True, False, 0.9, 0.9, 0.4),   # the control hid something: not in the control mean
        (False, False, False, 0.1, 0.1, 0.3),  # false claim: control moves 0.2
    ])
    s = MV.summarize_views(answers)
    assert s["drop_n"] == 2 and math.isclose(s["drop_mean"], 0.5)
    assert s["control_n"] == 3 and math.isclose(s["control_move_mean"], round((0.1 + 0 + 0.2) / 3, 4))
    delta = (answers["d_sel"] - answers["d_rnd"]).to_list()
    # AUC of the causal delta: each true claim the masked view makes false (rows 0 and 1; row 2
    # stays true without its evidence) against the one false claim; over all three for _all
    false_delta = delta[3]
    assert s["delta_auc_n"] == 3
    assert math.isclose(s["delta_auc"], round(sum(d > false_delta for d in delta[:2]) / 2, 4))
    assert math.isclose(s["delta_auc_all"], round(sum(d > false_delta for d in delta[:3]) / 3, 4))
    assert s["delta_auc"] == 1.0 and s["delta_auc_all"] < 1.0  # row 2: d_sel 0, d_rnd 2.6, under row 3's 1.35
    floors = MV.view_floors(s)
    assert list(floors.values()) == [True, True, s["delta_auc"] >= 0.9]  # both at the floor exactly


def test_heldout_claims_have_views_that_cut_nothing_in_half():
    claims = MV.heldout_claims(40, seed=3)
    assert len(claims) == 40 and sum(c.truth for c in claims) == 20
    for c in claims:
        assert c.evidence.view == "minus_evidence" and c.control.view == "minus_control"
        assert c.truth_without_evidence == c.fact.holds(c.evidence.shown())
        for box in c.control.boxes:
            assert all(views.iou(box, e) < 0.1 for e in c.evidence.boxes)
    assert MV.heldout_claims(5, seed=3) == claims[:5]


@pytest.mark.slow
def test_the_shipped_model_answers_what_the_views_show_and_a_mask_outside_its_box_breaks_it():
    from operators.engines import load_engine
    from pipeline.config import load_config

    cfg = load_config(["backbones=[micro]"])
    spec, templates = cfg.backbones["micro"], dict(cfg.prompts.templates)
    claims = MV.heldout_claims(40, seed=1)
    engine = load_engine(spec)
    try:
        good = MV.summarize_views(MV.answer_views(engine, claims, templates))
        with mutated(views, 'return fill(pixels, inside, how, sigma_fraction, blur_cache)',
                     'return fill(pixels, ~inside, how, sigma_fraction, blur_cache)'):
            outside = MV.summarize_views(MV.answer_views(engine, claims, templates))
    finally:
        engine.close()
    assert MV.view_floors(good)[f"drop on hiding the evidence of a true claim >= {MV.FLOORS['drop_mean']}"], good
    assert good["control_move_mean"] <= MV.FLOORS["control_move_mean"], good
    assert outside["drop_mean"] < 0.2 and outside["control_move_mean"] > 0.2, outside
    assert np.isfinite(good["delta_auc"])
