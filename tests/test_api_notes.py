"""The API says what its scores mean: a backbone's config note (the micro model: trained on the
demo world only; the smoke model: random weights) is every result's `backbone_note` and a
warning on the scorer's first call; `Scorer()` scores with the trained micro model, never the
random one; loading a model prints no progress bars."""
from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parent.parent
MICRO_NOTE = "trained on the demo world only: meaningful on shape scenes, not on photos"
SMOKE_NOTE = "random weights: a plumbing check, scores mean nothing"


def _photo_like() -> bytes:
    """Noise with a gradient: nothing like the demo's flat shapes on white."""
    import io

    from PIL import Image

    rng = np.random.default_rng(0)
    pixels = (rng.random((64, 80, 3)) * 128 + np.linspace(0, 127, 80)[None, :, None]).astype(np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def test_scorer_without_arguments_is_the_trained_micro_model_not_the_random_one():
    from pipeline import Scorer

    scorer = Scorer()
    assert scorer.backbone == "micro" and scorer.cfg.backbones["micro"].model_id == "builtin:micro-vlm"
    assert scorer.note == MICRO_NOTE


def test_micro_scores_of_photos_carry_the_note_and_warn_once(tmp_path):
    from pipeline import BackboneNote, Scorer

    scorer = Scorer("micro", metrics=["vqascore"], root=tmp_path, executor="local")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = scorer(images=[_photo_like()] * 2, texts=["a dog on a beach", "a red bus"])
        second = scorer(images=[_photo_like()], texts=["two cats on a sofa"])
    notes = [w for w in caught if issubclass(w.category, BackboneNote)]
    assert len(notes) == 1 and MICRO_NOTE in str(notes[0].message) and "'micro'" in str(notes[0].message), [str(w.message) for w in caught]
    assert first["backbone_note"].to_list() == [MICRO_NOTE] * 2 and second["backbone_note"].to_list() == [MICRO_NOTE]
    assert first["vqascore"].is_not_null().all()
    scorer.close()


def test_the_random_weight_model_says_its_scores_mean_nothing(tmp_path):
    from pipeline import BackboneNote, Scorer

    scorer = Scorer("smoke", metrics=["vqascore"], root=tmp_path, executor="local")
    with pytest.warns(BackboneNote, match="scores mean nothing"):
        scores = scorer(images=[_photo_like()], texts=["a red bus"])
    assert scores["backbone_note"].to_list() == [SMOKE_NOTE]
    scorer.close()


def test_a_backbone_without_a_note_adds_no_column_and_no_warning(tmp_path):
    from pipeline import Scorer

    scorer = Scorer("micro", metrics=["vqascore"], root=tmp_path, executor="local", overrides=["backbone_overrides.micro.note=''"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        scores = scorer(images=[_photo_like()], texts=["a red bus"])
    assert scorer.note == "" and "backbone_note" not in scores.columns
    scorer.close()


SCRIPT = """
import transformers  # imported by the caller first, its bars on, as in a notebook
from operators.demo_world import png_bytes, render, scene
from pipeline import Scorer
scores = Scorer("micro", metrics=["vqascore"], root={root!r}, executor="local")(
    images=[png_bytes(render(scene("red circle top left")))], texts=["a red circle"])
print("vqascore", round(scores["vqascore"][0], 3))
"""


@pytest.mark.parametrize("verbose", ["", "1"])
def test_the_api_prints_no_weight_loading_bar(tmp_path, verbose):
    """DEPICT_VERBOSE=1 brings the bar back: the test sees it when it is there."""
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_DISABLE_PROGRESS_BARS", "TRANSFORMERS_VERBOSITY")}
    env.update(PYTHONPATH=str(REPO), DEPICT_VERBOSE=verbose)
    done = subprocess.run([sys.executable, "-c", SCRIPT.format(root=str(tmp_path))], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "vqascore" in done.stdout, done.stderr[-3000:]
    assert ("Loading weights" in done.stderr) == bool(verbose), done.stderr[-3000:]
