"""The scripted engine, and engine selection by name."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from scipy.special import expit

from operators.engines import ENGINES, load_engine
from operators.engines.base import Prompt
from operators.engines.scripted import LOGIT_RANGE, ScriptedEngine
from operators.engines.spec import BackboneSpec


def _engine(**options) -> ScriptedEngine:
    return load_engine(BackboneSpec(name="scripted", model_id="none", engine="scripted", engine_options=options))


PROMPTS = [
    Prompt("Is there a cat?", image_id="img1"),
    Prompt("Is there a cat?", image_id="img2"),
    Prompt("Is there a cat?"),
    Prompt("Is there a cat?", image_id="img1", system="Answer yes or no."),
    Prompt("Is the cat red?", image_id="img1"),
]


def test_hashed_answers_are_valid_distinct_and_stable():
    scores = _engine().score_yes_no(PROMPTS)
    assert scores.shape == (len(PROMPTS), 2) and scores.dtype == np.float64
    np.testing.assert_allclose(np.exp(scores).sum(axis=1), 1.0, rtol=1e-12)  # log sigmoid(l), log sigmoid(-l)
    assert len({round(s, 12) for s in scores[:, 0]}) == len(PROMPTS)  # every field of the prompt matters
    np.testing.assert_array_equal(_engine().score_yes_no(PROMPTS), scores)  # a fresh engine agrees
    np.testing.assert_array_equal(_engine().score_yes_no(PROMPTS[::-1])[::-1], scores)
    logits = scores[:, 0] - scores[:, 1]
    assert (np.abs(logits) <= LOGIT_RANGE).all()
    assert not np.array_equal(_engine(seed=1).score_yes_no(PROMPTS), scores)


def test_hashed_logits_spread_over_the_range():
    prompts = [Prompt(f"question {i}", image_id="x") for i in range(400)]
    logits = np.array([_engine().yes_logit(p) for p in prompts])
    assert logits.min() < -0.8 * LOGIT_RANGE and logits.max() > 0.8 * LOGIT_RANGE
    assert abs(np.mean(logits)) < 0.5


def test_answer_rules_first_match_wins_and_image_filter():
    engine = _engine(answers=[
        {"contains": "cat", "image_id": "img2", "p_yes": 0.9},
        {"contains": "cat", "p_yes": 0.2},
        {"contains": "red", "p_yes": 1.0},
    ])
    scores = engine.score_yes_no(PROMPTS)
    np.testing.assert_allclose(np.exp(scores[0]), [0.2, 0.8])  # img1: the image rule does not apply
    np.testing.assert_allclose(np.exp(scores[1]), [0.9, 0.1])  # img2: first rule
    np.testing.assert_allclose(np.exp(scores[2]), [0.2, 0.8])
    np.testing.assert_allclose(np.exp(scores[4]), [0.2, 0.8])  # "cat" matches before "red"
    only_red = _engine(answers=[{"contains": "red", "p_yes": 1.0}]).score_yes_no([PROMPTS[4]])[0]
    assert only_red[0] == 0.0 and only_red[1] == -np.inf


def test_rule_answers_match_sigmoid_of_logit():
    engine = _engine(answers=[{"contains": "cat", "p_yes": 0.7}])
    logit = engine.yes_logit(PROMPTS[0])
    assert expit(logit) == pytest.approx(0.7)
    np.testing.assert_allclose(engine.score_yes_no(PROMPTS[:1])[0], np.log([0.7, 0.3]))


def test_bad_rules_are_rejected():
    with pytest.raises(ValueError, match=r"answers\[0\] needs 'contains' and 'p_yes'"):
        _engine(answers=[{"contains": "cat"}])
    with pytest.raises(ValueError, match=r"answers\[1\]\.p_yes must be in \[0, 1\]"):
        _engine(answers=[{"contains": "a", "p_yes": 0.5}, {"contains": "b", "p_yes": 1.5}])
    with pytest.raises(ValueError, match=r"generations\[0\] needs 'contains' and 'text'"):
        _engine(generations=[{"text": "x"}])


def test_generation_rules_and_clear_error():
    engine = _engine(generations=[
        {"contains": "questions", "text": "1. Is there a cat?"},
        {"contains": "", "text": "fallback"},
    ])
    assert engine.generate([Prompt("Write questions for: a cat"), Prompt("Judge this")], 100) == [
        "1. Is there a cat?", "fallback",
    ]
    with pytest.raises(ValueError, match="no engine_options.generations rule matches the prompt 'Judge"):
        _engine(generations=[{"contains": "questions", "text": "x"}]).generate([Prompt("Judge this")], 10)


def test_counters():
    engine = _engine(generations=[{"contains": "", "text": "ok"}])
    engine.score_yes_no(PROMPTS)
    engine.score_yes_no(PROMPTS[:2])
    engine.generate(PROMPTS[:3], 5)
    assert (engine.n_scored, engine.n_score_calls) == (7, 2)
    assert (engine.n_generated, engine.n_generate_calls) == (3, 1)
    assert engine.score_yes_no([]).shape == (0, 2)


def test_unknown_engine_lists_valid_ones():
    with pytest.raises(ValueError, match=r"unknown engine 'tgi'; valid engines: \['hf', 'scripted', 'vllm', 'world_oracle'\]"):
        load_engine(BackboneSpec(name="x", model_id="m", engine="tgi"))
    assert set(ENGINES) == {"hf", "vllm", "scripted", "world_oracle"}


def test_importing_engines_does_not_import_torch_or_vllm():
    code = (
        "import sys, operators.engines, operators.engines.vllm_requests, operators.engines.scripted, operators.engines.world_oracle, "
        "operators.images, operators.tiny_models; "
        "print(sorted(m for m in ('torch', 'transformers', 'vllm') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
