"""The shipped micro GroundingDINO, loaded by the unchanged grounding operator through
`from_pretrained`, on held-out demo scenes: its floors, and each corruption of how the operator
reads boxes or passes the phrase failing a named floor (operators/micro_grounding_recipe.py FLOORS).

Mutations (operators/grounding.py):
- the model's (cx, cy, w, h) boxes read as corners (xyxy);
- normalised boxes taken as pixels (the scale to the image never applied);
- x and y swapped;
- the phrase never reaching the detector (one fixed prompt for every query)."""
from __future__ import annotations

import pytest
from mutation import mutated

from operators import grounding
from operators.grounding import Thresholds
from operators.micro_grounding_recipe import FLOORS, evaluate
from operators.tiny_models import resolve_model_id
from pipeline.config import load_config

pytestmark = pytest.mark.slow
SCENES = 60  # held-out scenes: about 300 queries, of every phrase kind and absent ones


def below(report: dict) -> set[str]:
    return {name for name, floor in FLOORS.items() if report.get(name) is None or report[name] < floor}


@pytest.fixture(scope="module")
def model() -> str:
    return resolve_model_id("builtin:micro-grounding-dino")


@pytest.fixture(scope="module")
def thresholds() -> Thresholds:
    """The thresholds the demo's evidence preset runs the detector at (chosen on training scenes)."""
    detector = load_config(["sweep=demo_evidence"]).sweep.evidence.detector
    return Thresholds(box=detector.box_threshold, text=detector.text_threshold)


def test_the_shipped_detector_meets_its_floors_and_is_batch_invariant(model, thresholds):
    report = evaluate(model, seed=1, scenes=SCENES, thresholds=thresholds)
    assert not below(report) and report["batch_invariant"], report


CORNERS = "boxes_norm = torch.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], dim=-1).clamp(0.0, 1.0)"


@pytest.mark.parametrize("old,new,failing", [
    (CORNERS, "boxes_norm = torch.stack([cx, cy, w, h], dim=-1).clamp(0.0, 1.0)", {"recall_colour_shape", "recall_shape", "recall_several"}),
    ("boxes=boxes_norm[i][keep].cpu().double().numpy().reshape(-1, 4) * scale,", "boxes=boxes_norm[i][keep].cpu().double().numpy().reshape(-1, 4),",
     {"recall_colour_shape", "recall_shape", "recall_several"}),
    (CORNERS, "boxes_norm = torch.stack([cy - h / 2, cx - w / 2, cy + h / 2, cx + w / 2], dim=-1).clamp(0.0, 1.0)",
     {"recall_colour_shape", "recall_shape", "recall_several"}),
    ("texts = [normalise_phrase(p) for p in phrases]", 'texts = [normalise_phrase("a shape") for p in phrases]', {"absent_clean"}),
], ids=["cxcywh-read-as-xyxy", "normalised-read-as-pixels", "x-and-y-swapped", "phrase-never-passed"])
def test_a_corrupted_operator_fails_a_named_floor(model, thresholds, old, new, failing):
    with mutated(grounding, old, new):
        report = evaluate(model, seed=1, scenes=SCENES, thresholds=thresholds)
    assert failing <= below(report), (below(report), report)
