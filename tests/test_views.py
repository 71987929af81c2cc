"""Control boxes (geometry constraints, ineligibility, seeding) and the masked views."""
from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from PIL import Image
from torchvision.transforms.functional import gaussian_blur

from operators.views import (
    ControlRules,
    area,
    aspect,
    blurred,
    box_mask,
    control_rng,
    draw_control,
    draw_controls,
    iou,
    pixel_box,
    png_bytes,
    render_view,
    view_key,
)

RULES = ControlRules()


def mask_iou(a, b, height, width) -> float:
    """IoU by counting pixels: an independent check of the box arithmetic."""
    ma, mb = box_mask([a], height, width), box_mask([b], height, width)
    return (ma & mb).sum() / (ma | mb).sum()


@st.composite
def evidence_cases(draw):
    width, height = draw(st.integers(40, 300)), draw(st.integers(40, 300))
    w, h = draw(st.integers(4, width // 2)), draw(st.integers(4, height // 2))
    x0, y0 = draw(st.integers(0, width - w)), draw(st.integers(0, height - h))
    others = draw(st.lists(st.tuples(st.integers(0, width - 2), st.integers(0, height - 2), st.integers(2, 60), st.integers(2, 60)), max_size=3))
    forbidden = [(x, y, min(x + bw, width), min(y + bh, height)) for x, y, bw, bh in others]
    return width, height, (x0, y0, x0 + w, y0 + h), forbidden, draw(st.integers(0, 2**32))


@settings(max_examples=200, deadline=None)
@given(evidence_cases())
def test_every_control_box_meets_the_constraints(case):
    width, height, evidence, others, seed = case
    forbidden = [evidence, *others]
    box, attempts = draw_control(evidence, forbidden, width, height, np.random.default_rng(seed))
    assert 1 <= attempts <= 200
    assume(box is not None)
    x0, y0, x1, y1 = box
    assert 0 <= x0 < x1 <= width and 0 <= y0 < y1 <= height
    mask = box_mask([box], height, width)
    assert 0.85 <= mask.sum() / area(evidence) <= 1.15  # area within +-15%, counted in pixels
    assert 0.8 <= ((x1 - x0) / (y1 - y0)) / aspect(evidence) <= 1.2  # aspect within +-20%
    for other in forbidden:
        assert mask_iou(box, other, height, width) < 0.10
        assert iou(box, other) == pytest.approx(mask_iou(box, other, height, width))


class CountingRng:
    """Wraps a generator and counts the draws, to see how many attempts really happened."""

    def __init__(self, seed):
        self.rng = np.random.default_rng(seed)
        self.uniform_calls = 0

    def uniform(self, *args):
        self.uniform_calls += 1
        return self.rng.uniform(*args)

    def integers(self, *args):
        return self.rng.integers(*args)


def test_evidence_covering_most_of_the_image_is_ineligible_after_exactly_200_attempts():
    evidence = (5, 5, 95, 95)  # 81% of a 100x100 image: no box of similar size can avoid it
    rng = CountingRng(0)
    box, attempts = draw_control(evidence, [evidence], 100, 100, rng)
    assert box is None and attempts == 200
    assert rng.uniform_calls == 2 * 200  # one area and one aspect draw per attempt
    result = draw_controls([evidence], [evidence], 100, 100, np.random.default_rng(0))
    assert not result.eligible and result.attempts == 200 and result.reason.startswith("no_control_box")
    assert draw_controls([], [], 100, 100, np.random.default_rng(0)).reason == "no_evidence"


def test_several_evidence_boxes_get_one_control_each_and_controls_avoid_each_other():
    evidence = [(10, 10, 30, 30), (60, 60, 75, 90)]
    result = draw_controls(evidence, evidence, 200, 200, control_rng("img", "claim", 0))
    assert result.eligible and len(result.boxes) == 2
    a, b = result.boxes
    assert iou(a, b) < 0.10
    for control, ev in zip(result.boxes, evidence):
        assert abs(area(control) / area(ev) - 1) <= 0.15 and all(iou(control, e) < 0.10 for e in evidence)


def test_same_seed_same_box_and_the_seed_depends_on_image_claim_and_config():
    evidence = [(20, 30, 60, 70)]

    def boxes(image_hash, claim, seed):
        return draw_controls(evidence, evidence, 256, 256, control_rng(image_hash, claim, seed)).boxes

    assert boxes("h1", "There is a dog.", 0) == boxes("h1", "There is a dog.", 0)
    others = {boxes("h2", "There is a dog.", 0), boxes("h1", "There is a cat.", 0), boxes("h1", "There is a dog.", 1)}
    assert boxes("h1", "There is a dog.", 0) not in others


def test_pixel_box_rounds_outwards_and_stays_inside():
    assert pixel_box([10.2, 5.7, 20.1, 9.0], 100, 50) == (10, 5, 21, 9)
    assert pixel_box([-3, -1, 120, 60], 100, 50) == (0, 0, 100, 50)
    assert pixel_box([99.5, 49.5, 99.6, 49.6], 100, 50) == (99, 49, 100, 50)  # never empty


def image(seed=0, height=64, width=80):
    return np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 70), st.integers(0, 55), st.integers(1, 30), st.integers(1, 30), st.sampled_from(["blur", "mean"]))
def test_masks_change_exactly_the_intended_pixels(x0, y0, w, h, how):
    pixels = image()
    box = (x0, y0, min(x0 + w, 80), min(y0 + h, 64))
    inside = box_mask([box], 64, 80)
    minus = render_view(pixels, "minus_evidence", [box], how)
    only = render_view(pixels, "only_evidence", [box], how)
    np.testing.assert_array_equal(minus[~inside], pixels[~inside])  # outside E: bit for bit
    np.testing.assert_array_equal(only[inside], pixels[inside])  # only E kept
    if how == "mean":
        np.testing.assert_array_equal(minus[inside], np.broadcast_to(np.round(pixels[inside].mean(0)).astype(np.uint8), minus[inside].shape))
        np.testing.assert_array_equal(only[~inside], np.broadcast_to(np.round(pixels[~inside].mean(0)).astype(np.uint8), only[~inside].shape))
    else:
        blur = blurred(pixels, 0.1)
        np.testing.assert_array_equal(minus[inside], blur[inside])
        np.testing.assert_array_equal(only[~inside], blur[~inside])
    np.testing.assert_array_equal(render_view(pixels, "full", [], how), pixels)


def test_the_random_image_really_changes_under_each_fill():
    pixels = image(1)
    box = (10, 10, 40, 40)
    for how in ("blur", "mean"):
        assert not np.array_equal(render_view(pixels, "minus_evidence", [box], how)[10:40, 10:40], pixels[10:40, 10:40])


def test_blur_matches_torchvision_gaussian_blur():
    pixels = image(2, 60, 90)
    sigma = 0.1 * 60
    half = int(3 * sigma + 0.5)
    reference = gaussian_blur(torch.from_numpy(pixels.copy()).permute(2, 0, 1).float(), [2 * half + 1] * 2, [sigma, sigma])
    reference = reference.round().clamp(0, 255).to(torch.uint8).permute(1, 2, 0).numpy()
    assert np.abs(blurred(pixels, 0.1).astype(int) - reference.astype(int)).max() <= 1


def test_png_is_lossless_and_keys_follow_the_recipe():
    pixels = image(3)
    decoded = np.asarray(Image.open(io.BytesIO(png_bytes(pixels))).convert("RGB"))
    np.testing.assert_array_equal(decoded, pixels)
    base = view_key("h", "minus_evidence", [(1, 2, 3, 4)], "blur", 0.1)
    assert base == view_key("h", "minus_evidence", [(1, 2, 3, 4)], "blur", 0.1)
    assert len({base, view_key("h", "minus_evidence", [(1, 2, 3, 5)], "blur", 0.1), view_key("h", "minus_evidence", [(1, 2, 3, 4)], "mean", 0.1),
                view_key("h", "minus_control", [(1, 2, 3, 4)], "blur", 0.1), view_key("h", "minus_evidence", [(1, 2, 3, 4)], "blur", 0.2)}) == 5
    assert view_key("h", "minus_evidence", [(1, 2, 3, 4)], "mean", 0.1) == view_key("h", "minus_evidence", [(1, 2, 3, 4)], "mean", 0.3)


def test_importing_the_evidence_code_pulls_in_no_torch():
    import subprocess
    import sys

    code = (
        "import sys, operators.views, operators.grounding, operators.grounding_rules, operators.judge_output, "
        "pipeline.stages.evidence, pipeline.stages.judge, pipeline.scoring; "
        "print(sorted(m for m in ('torch', 'torchvision', 'transformers', 'vllm') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
