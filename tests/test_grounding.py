"""GroundingDINO wrapper (tiny random-weight model saved and reloaded) and the per-type rules."""
from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from operators.grounding import Detections, GroundingDetector, Thresholds, normalise_phrase, select_boxes
from operators.grounding_rules import claim_support, infer_type, pairwise_iou, plan_claim, relation_holds
from operators.metrics import grounding_only

SIZE = {"shortest_edge": 96, "longest_edge": 128}


def scene(seed: int, height: int = 120, width: int = 160) -> Image.Image:
    rng = np.random.default_rng(seed)
    pixels = np.full((height, width, 3), 240, np.uint8)
    for _ in range(4):
        x, y = rng.integers(0, width - 30), rng.integers(0, height - 30)
        pixels[y:y + 30, x:x + 30] = rng.integers(0, 255, 3)
    return Image.fromarray(pixels)


@pytest.fixture(scope="module")
def detector(tiny_gdino_dir):
    return GroundingDetector(tiny_gdino_dir, image_size=SIZE)


def reference_nms(boxes: np.ndarray, scores: np.ndarray, iou: float) -> list[int]:
    """Greedy NMS written out: keep the best, drop everything overlapping it more than `iou`."""
    order = list(np.argsort(-scores, kind="stable"))
    kept = []
    while order:
        best = order.pop(0)
        kept.append(best)
        order = [j for j in order if pairwise_iou(boxes[[best]], boxes[[j]])[0, 0] <= iou]
    return kept


def reference_detections(detector: GroundingDetector, image: Image.Image, phrase: str, th: Thresholds):
    """The wrapper's result recomputed from the raw model outputs with numpy."""
    inputs = detector.processor(images=[image], text=[normalise_phrase(phrase)], return_tensors="pt", **detector.processor_kwargs)
    with torch.no_grad():
        out = detector.model(**inputs)
    probs = torch.sigmoid(out.logits)[0].numpy()
    tokens = detector.processor.tokenizer.convert_ids_to_tokens(inputs["input_ids"][0])
    positions = [i for i, t in enumerate(tokens) if t not in ("[CLS]", "[SEP]", "[PAD]", ".")]
    box_score, text_score = probs[:, positions].max(1), probs[:, positions].mean(1)
    cx, cy, w, h = out.pred_boxes[0].numpy().T
    boxes = np.clip(np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], 1), 0, 1)
    candidates = np.flatnonzero((box_score > th.box) & (text_score > th.text))
    kept = candidates[reference_nms(boxes[candidates], box_score[candidates], th.nms_iou)][: th.max_boxes]
    scale = np.array([image.width, image.height] * 2)
    return boxes[kept] * scale, box_score[kept], text_score[kept]


# ---------------------------------------------------------------------- the detector


def test_detections_match_a_numpy_recomputation_from_the_raw_outputs(detector):
    image = scene(0)
    (found,) = detector.detect([image], ["red square"])
    boxes, box_scores, text_scores = reference_detections(detector, image, "red square", detector.thresholds)
    assert len(found) == len(boxes) > 0
    np.testing.assert_allclose(found.boxes, boxes, atol=1e-3)
    np.testing.assert_allclose(found.box_scores, box_scores, atol=1e-5)
    np.testing.assert_allclose(found.text_scores, text_scores, atol=1e-5)


def test_shapes_bounds_thresholds_nms_and_order(detector):
    images = [scene(1), scene(2, 100, 220)]
    for image, found in zip(images, detector.detect(images, ["circle", "blue star"])):
        n = len(found)
        assert found.boxes.shape == (n, 4) and found.box_scores.shape == found.text_scores.shape == (n,)
        assert (found.width, found.height) == image.size
        assert np.all(found.boxes[:, :2] >= 0) and np.all(found.boxes[:, 2] <= image.width) and np.all(found.boxes[:, 3] <= image.height)
        assert np.all(found.boxes[:, :2] <= found.boxes[:, 2:])
        np.testing.assert_allclose(found.boxes_norm, found.boxes / np.array([image.width, image.height] * 2))
        assert np.all(found.box_scores > 0.30) and np.all(found.text_scores > 0.25)
        assert np.all(np.diff(found.box_scores) <= 0)  # best first
        iou = pairwise_iou(found.boxes, found.boxes)
        assert np.all(iou[~np.eye(n, dtype=bool)] <= 0.5 + 1e-6)  # NMS


def test_stricter_thresholds_and_box_cap(tiny_gdino_dir, detector):
    image = scene(3)
    (loose,) = detector.detect([image], ["green square"])
    strict = GroundingDetector(tiny_gdino_dir, image_size=SIZE, thresholds=Thresholds(box=0.999, text=0.5))
    (tight,) = strict.detect([image], ["green square"])
    assert len(tight) < len(loose)
    assert np.all(tight.box_scores > 0.999) and np.all(tight.text_scores > 0.5)
    capped = GroundingDetector(tiny_gdino_dir, image_size=SIZE, thresholds=Thresholds(max_boxes=2))
    (two,) = capped.detect([image], ["green square"])
    assert len(two) == 2
    np.testing.assert_array_equal(two.boxes, loose.boxes[:2])  # the cap keeps the best boxes
    nothing = GroundingDetector(tiny_gdino_dir, image_size=SIZE, thresholds=Thresholds(box=1.0))
    (empty,) = nothing.detect([image], ["green square"])
    assert len(empty) == 0 and empty.boxes.shape == (0, 4)


def test_determinism_across_calls_instances_and_batch_sizes(tiny_gdino_dir, detector):
    images = [scene(4), scene(5), scene(6)]
    phrases = ["red circle"] * 3
    first = detector.detect(images, phrases)
    again = GroundingDetector(tiny_gdino_dir, image_size=SIZE, batch_size=1).detect(images, phrases)
    for a, b in zip(first, detector.detect(images, phrases)):
        np.testing.assert_array_equal(a.boxes, b.boxes)
        np.testing.assert_array_equal(a.box_scores, b.box_scores)
    for a, b in zip(first, again):  # same-size images: batching must not change the answer
        np.testing.assert_allclose(a.boxes, b.boxes, atol=1e-3)
        np.testing.assert_allclose(a.box_scores, b.box_scores, atol=1e-5)


def test_select_boxes_caps_at_32_and_agrees_with_reference_nms():
    rng = np.random.default_rng(0)
    corners = np.stack(np.meshgrid(np.arange(10), np.arange(10)), -1).reshape(-1, 2) / 10
    boxes = np.concatenate([corners, corners + 0.08], 1)  # 100 disjoint boxes
    scores = rng.uniform(0.5, 1.0, 100)
    kept = select_boxes(torch.tensor(boxes), torch.tensor(scores), torch.ones(100), Thresholds())
    assert len(kept) == 32
    np.testing.assert_array_equal(kept.numpy(), np.argsort(-scores)[:32])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(*[st.floats(0, 1)] * 4, st.floats(0, 1), st.floats(0, 1)), min_size=1, max_size=40))
def test_select_boxes_property(rows):
    data = np.array(rows)
    boxes = np.concatenate([np.minimum(data[:, :2], data[:, 2:4]), np.maximum(data[:, :2], data[:, 2:4]) + 1e-3], 1)
    box_scores, text_scores = data[:, 4], data[:, 5]
    th = Thresholds(max_boxes=5)
    kept = select_boxes(torch.tensor(boxes), torch.tensor(box_scores), torch.tensor(text_scores), th).numpy()
    candidates = np.flatnonzero((box_scores > th.box) & (text_scores > th.text))
    expected = candidates[reference_nms(boxes[candidates], box_scores[candidates], th.nms_iou)][: th.max_boxes]
    assert sorted(kept.tolist()) == sorted(expected.tolist())


def test_builtin_id_resolves_through_from_pretrained(tmp_path, monkeypatch):
    monkeypatch.setenv("DEPICT_CACHE", str(tmp_path))
    det = GroundingDetector("builtin:tiny-grounding-dino", image_size=SIZE)
    (found,) = det.detect([scene(7)], ["star"])
    assert (tmp_path / "builtin").is_dir() and found.boxes.shape[1] == 4


# --------------------------------------------------------------------------- rules


@pytest.mark.parametrize(
    ("text", "claim_type", "rule", "phrases", "extra"),
    [
        ("There is a red circle.", "object", "object", ("red circle",), {}),
        ("There is a red circle.", "attribute", "attribute", ("red circle",), {}),
        ("The apples are green.", "attribute", "attribute", ("green apples",), {}),
        ("There are exactly two circles.", "count", "count", ("circles",), {"count": 2, "at_least": False}),
        ("3 dogs on the grass", "count", "count", ("dogs",), {"count": 3}),
        ("At least four birds", "count", "count", ("birds",), {"count": 4, "at_least": True}),
        ("There are zero cats.", "count", "negation", ("cats",), {}),
        ("There is no blue star.", "negation", "negation", ("blue star",), {}),
        ("A man without a hat", "negation", "negation", ("hat",), {}),
        ("The red circle is above the blue square.", "spatial", "spatial", ("red circle", "blue square"), {"relation": "above"}),
        ("The square is to the left of the circle.", "spatial", "spatial", ("square", "circle"), {"relation": "left of"}),
        ("The apples are in the basket.", "spatial", "spatial", ("apples", "basket"), {"relation": "in"}),
        ("A cup on top of a table", "relation", "spatial", ("cup", "table"), {"relation": "on"}),
        ("A woman holding a blue umbrella", "relation", "contact", ("woman", "blue umbrella"), {}),
        ("Is there a red circle?", None, "object", ("red circle",), {}),
        ("Are there exactly two red circles?", None, "count", ("red circles",), {"count": 2}),
        ("Is the red circle above the blue square?", None, "spatial", ("red circle", "blue square"), {}),
        ("Is there no cat?", None, "negation", ("cat",), {}),
    ],
)
def test_plan_claim_reads_entities_counts_and_relations(text, claim_type, rule, phrases, extra):
    plan = plan_claim(text, claim_type)
    assert (plan.rule, plan.phrases) == (rule, phrases)
    for name, value in extra.items():
        assert getattr(plan, name) == value


@pytest.mark.parametrize(
    ("text", "claim_type", "reason"),
    [
        ("The dog is running.", "action", "action_claim"),
        ("The scene feels peaceful.", "other", "other_claim"),
        ("The cat is behind the sofa.", "spatial", "depth_relation"),
        ("The dog chases the cat.", "relation", "abstract_relation"),
        ("Several apples hang from the tree.", "count", "no_stated_count"),
        ("It is sunny.", "negation", "no_negated_entity"),
    ],
)
def test_ungroundable_claims_say_why(text, claim_type, reason):
    plan = plan_claim(text, claim_type)
    assert not plan.groundable and plan.reason == reason
    support = claim_support(plan, {})
    assert support.groundable is False and support.s is None and support.note == reason


def test_infer_type():
    assert infer_type("Is there a dog?") == "object"
    assert infer_type("Are there three dogs?") == "count"
    assert infer_type("Is the dog under the table?") == "spatial"
    assert infer_type("Is there no dog?") == "negation"


def dets(boxes, box_scores, text_scores=None, size=(100, 100)) -> Detections:
    boxes = np.asarray(boxes, dtype=float).reshape(-1, 4)
    box_scores = np.asarray(box_scores, dtype=float)
    text = np.asarray(text_scores if text_scores is not None else box_scores, dtype=float)
    return Detections(boxes, box_scores, text, *size)


NONE = dets([], [])


def test_object_and_negation_use_the_best_box():
    found = dets([[0, 0, 10, 10], [20, 20, 40, 40]], [0.4, 0.9])
    s = claim_support(plan_claim("There is a dog.", "object"), {"dog": found})
    assert s.s == pytest.approx(0.9) and s.evidence.tolist() == [[20, 20, 40, 40]]
    assert claim_support(plan_claim("There is a dog.", "object"), {"dog": NONE}).s == 0.0
    neg = plan_claim("There is no dog.", "negation")
    assert claim_support(neg, {"dog": found}).s == pytest.approx(0.1)
    assert claim_support(neg, {"dog": NONE}).s == 1.0


def test_count_compares_detections_with_the_stated_number():
    three = dets([[0, 0, 5, 5], [10, 10, 15, 15], [20, 20, 25, 25]], [0.5, 0.9, 0.8])
    exactly_two = plan_claim("There are exactly two dogs.", "count")
    s = claim_support(exactly_two, {"dogs": three})
    assert s.s == pytest.approx(2 / 3 * (0.9 + 0.8) / 2)
    assert s.evidence.tolist() == [[10, 10, 15, 15], [20, 20, 25, 25]]
    assert claim_support(plan_claim("There are three dogs.", "count"), {"dogs": three}).s == pytest.approx((0.5 + 0.9 + 0.8) / 3)
    assert claim_support(plan_claim("At least two dogs", "count"), {"dogs": three}).s == pytest.approx((0.9 + 0.8) / 2)
    assert claim_support(plan_claim("At least five dogs", "count"), {"dogs": three}).s == pytest.approx(3 / 5 * (0.5 + 0.9 + 0.8) / 3)
    assert claim_support(exactly_two, {"dogs": NONE}).s == 0.0


def test_attribute_uses_the_text_score_over_the_whole_phrase():
    found = dets([[0, 0, 10, 10], [50, 50, 60, 60]], box_scores=[0.95, 0.6], text_scores=[0.3, 0.7])
    s = claim_support(plan_claim("The apple is red.", "attribute"), {"red apple": found})
    assert s.s == pytest.approx(0.7) and s.evidence.tolist() == [[50, 50, 60, 60]]


def test_spatial_takes_the_best_pair_that_satisfies_the_geometry():
    circles = dets([[40, 0, 60, 10], [40, 80, 60, 90]], [0.8, 0.9])  # top, bottom
    squares = dets([[40, 40, 60, 50]], [0.64])  # middle
    plan = plan_claim("The circle is above the square.", "spatial")
    s = claim_support(plan, {"circle": circles, "square": squares})
    assert s.s == pytest.approx(math.sqrt(0.8 * 0.64))  # only the top circle is above
    assert s.evidence.tolist() == [[40, 0, 60, 10], [40, 40, 60, 50]]
    below = claim_support(plan_claim("The circle is below the square.", "spatial"), {"circle": circles, "square": squares})
    assert below.s == pytest.approx(math.sqrt(0.9 * 0.64))
    missing = claim_support(plan, {"circle": circles, "square": NONE})
    assert missing.s == 0.0 and missing.note == "entity_not_found"
    left = claim_support(plan_claim("The circle is left of the square.", "spatial"), {"circle": circles, "square": squares})
    assert left.s == 0.0 and left.note == "relation_not_seen"


def test_a_thing_is_never_in_relation_with_itself():
    one = dets([[0, 0, 10, 10]], [0.9])
    plan = plan_claim("A circle is left of a circle.", "spatial")
    assert claim_support(plan, {"circle": one}).s == 0.0
    two = dets([[0, 0, 10, 10], [50, 0, 60, 10]], [0.9, 0.4])
    assert claim_support(plan, {"circle": two}).s == pytest.approx(math.sqrt(0.9 * 0.4))


def test_relation_geometry_by_hand():
    a = np.array([[0, 0, 10, 10]], float)
    b = np.array([[5, 20, 30, 30]], float)
    assert relation_holds("left of", a, b)[0, 0] and not relation_holds("right of", a, b)[0, 0]
    assert relation_holds("above", a, b)[0, 0] and not relation_holds("below", a, b)[0, 0]
    assert relation_holds("on", a, b)[0, 0]  # above and horizontally overlapping
    assert not relation_holds("on", np.array([[40, 0, 50, 10]], float), b)[0, 0]
    assert relation_holds("in", np.array([[10, 22, 14, 26]], float), b)[0, 0]
    assert relation_holds("near", a, b)[0, 0] and not relation_holds("near", a, np.array([[90, 90, 95, 95]], float))[0, 0]
    assert not relation_holds("touch", a, b)[0, 0] and relation_holds("touch", np.array([[6, 19, 8, 21]], float), b)[0, 0]


def test_contact_relations_need_touching_boxes():
    plan = plan_claim("A woman holding an umbrella", "relation")
    woman = dets([[0, 0, 50, 100]], [0.81])
    touching, apart = dets([[40, 0, 80, 30]], [0.49]), dets([[70, 0, 99, 30]], [0.49])
    assert claim_support(plan, {"woman": woman, "umbrella": touching}).s == pytest.approx(0.9 * 0.7)
    assert claim_support(plan, {"woman": woman, "umbrella": apart}).s == 0.0


def test_rules_feed_the_grounding_only_metric():
    claims = [("1", "There is a dog.", "object", {"dog": dets([[0, 0, 5, 5]], [0.9])}),
              ("2", "There is no cat.", "negation", {"cat": dets([[0, 0, 5, 5]], [0.6])}),
              ("3", "The dog is running.", "action", {})]
    rows = []
    for claim_id, text, kind, found in claims:
        s = claim_support(plan_claim(text, kind), found)
        rows.append({"item_id": "a", "claim_id": claim_id, "groundable": s.groundable, "s": s.s})
    score = grounding_only(pl.DataFrame(rows), ["a"])["score"][0]
    assert score == pytest.approx(2 / 3 * math.sqrt(0.9 * 0.4))  # M/N times the geometric mean


def test_a_query_does_not_depend_on_its_batch_neighbours(tiny_gdino_dir):
    """Same (image, phrase) alone and next to different-sized images and longer phrases:
    identical boxes and scores (the per-(image, phrase) cache relies on it)."""
    loose = Thresholds(box=0.0, text=0.0, max_boxes=900)  # every box: the scores themselves are compared
    detector = GroundingDetector(tiny_gdino_dir, image_size=SIZE, thresholds=loose, batch_size=8)
    image, phrase = scene(1, 90, 160), "red square"
    alone = detector.detect([image], [phrase])[0]
    neighbours = [scene(2, 160, 120), image, scene(3, 100, 100), scene(4, 120, 160)]
    phrases = ["a big blue circle on the left of a green triangle", phrase, "cat", "two yellow squares"]
    mixed = detector.detect(neighbours, phrases)[1]
    assert len(alone) == len(mixed) > 0
    np.testing.assert_allclose(mixed.box_scores, alone.box_scores, rtol=0, atol=1e-6)
    np.testing.assert_allclose(mixed.text_scores, alone.text_scores, rtol=0, atol=1e-6)
    np.testing.assert_allclose(mixed.boxes, alone.boxes, rtol=0, atol=1e-6 * 160)
