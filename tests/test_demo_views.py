"""Masked views of demo scenes (operators/demo_views.py): which things a view still shows, and
the truth of a claim asked on it, checked by hand on drawn scenes."""
from __future__ import annotations

import random

import numpy as np
import pytest

from operators import demo_views, demo_world, views
from operators.demo_world import Fact, scene


def box(shape: str, row: int, col: int):
    return demo_world.object_box(shape, row, col)


def test_a_scenes_pixels_are_its_pngs():
    from operators.images import decode_image

    drawn = scene("red circle top left", "blue star middle centre")
    png = decode_image(demo_world.png_bytes(demo_world.render(drawn)), "s.png")
    assert np.array_equal(np.asarray(png), demo_views.rgb(drawn))


def test_filling_a_things_box_hides_it_and_keeps_the_others():
    drawn = scene("red circle top left", "blue star middle centre", "green square bottom right")
    circle, star, square = drawn
    gone = demo_views.SceneView(drawn, "minus_evidence", (box("circle", 0, 0),), "blur")
    assert gone.kept()[circle] == 0.0 and gone.kept()[star] == gone.kept()[square] == 1.0
    assert gone.shown() == (star, square)
    only = demo_views.SceneView(drawn, "only_evidence", (box("circle", 0, 0),), "mean")
    assert only.shown() == (circle,)
    assert demo_views.SceneView(drawn, "full", (), "blur").shown() == drawn


def test_a_view_cutting_a_thing_in_half_has_no_truth():
    drawn = scene("red circle top left")
    x0, y0, x1, y1 = box("circle", 0, 0)
    half = demo_views.SceneView(drawn, "minus_control", ((x0, y0, (x0 + x1) // 2, y1),), "blur")
    assert 0.4 < half.kept()[drawn[0]] < 0.6 and half.shown() is None


def test_the_view_pixels_are_the_production_views():
    drawn = scene("red circle top left", "blue star middle centre")
    boxes = (box("star", 1, 1),)
    seen = demo_views.SceneView(drawn, "minus_evidence", boxes, "mean")
    want = views.render_view(demo_views.rgb(drawn), "minus_evidence", boxes, "mean")
    assert np.array_equal(seen.pixels(), want)
    inside = views.box_mask(boxes, demo_world.SIZE, demo_world.SIZE)
    assert np.array_equal(seen.pixels()[~inside], demo_views.rgb(drawn)[~inside])


def test_a_claims_evidence_is_every_thing_it_names():
    drawn = scene("red circle top left", "red circle top right", "blue circle bottom left", "green star middle centre")
    assert demo_views.named_boxes(drawn, Fact("colour", "circle", "red")) == [box("circle", 0, 0), box("circle", 0, 2)]
    assert len(demo_views.named_boxes(drawn, Fact("present", "circle"))) == 3
    relation = Fact("spatial", "star", None, relation="below", other=("circle", "red"))
    assert demo_views.named_boxes(drawn, relation) == [box("star", 1, 1), box("circle", 0, 0), box("circle", 0, 2)]


@pytest.mark.parametrize("view", ["minus_evidence", "only_evidence", "minus_control", "only_control"])
def test_drawn_views_keep_the_production_rules(view):
    rng = random.Random(3)
    drawn = scene("red circle top left", "blue star middle centre", "green square bottom right")
    fact = Fact("colour", "star", "blue")
    for _ in range(20):
        seen = demo_views.draw_view(drawn, fact, view, "blur", rng)
        if seen is None:
            continue
        evidence = box("star", 1, 1)
        if view in demo_views.EVIDENCE_VIEWS:  # the detector's box, off by at most 3 px a side
            assert len(seen.boxes) == 1 and max(abs(a - b) for a, b in zip(seen.boxes[0], evidence)) <= 3
        else:  # a control of matched size that stays off the evidence
            (control,) = seen.boxes
            assert abs(views.area(control) / views.area(evidence) - 1) <= 0.2 and views.iou(control, evidence) < 0.15


def test_claims_on_views_answer_what_the_view_shows():
    sampler = demo_world.WorldSampler(0, "train")
    for view in ("full", "minus_evidence", "only_evidence", "minus_control", "only_control"):
        for _ in range(100):
            r = demo_views.claim_request(sampler, view)
            assert r.kind == "claim" and r.form == "claims" and r.question == r.facts[0].claim().text
            assert (r.view is None) == (view == "full")
            assert r.answer == r.facts[0].holds(r.scene)  # on what the view shows
            if r.view is not None:
                assert set(r.scene) <= set(r.view.scene)
                kept = r.view.kept()
                assert all(kept[o] >= demo_views.CLEAR for o in r.scene)
                assert all(kept[o] <= demo_views.GONE for o in set(r.view.scene) - set(r.scene))
    # hiding the evidence of a claim about a thing that is there makes the claim false
    for _ in range(100):
        r = demo_views.claim_request(sampler, "minus_evidence")
        fact = r.facts[0]
        if fact.kind in ("present", "colour") and fact.holds(r.view.scene):
            assert r.answer is False
