import numpy as np
import pyarrow as pa
import pytest

from operators import schema
from operators.answering import answer_batch, generate_batch
from operators.prompts import fill

TEMPLATES = {
    "answer_image": "Q: {question}",
    "answer_caption": 'Text: "{caption}" Q: {question}',
    "holistic": 'Does this figure show "{caption}"?',
    "claim": "Claim: {claim}",
    "generate_questions": 'Caption: {caption}\nExample: ["Is there a {{x}}?"]',
}


class RecordingEngine:
    """Answers p_yes = 0.8 for everything; fails on prompts containing 'EXPLODE'."""

    def __init__(self):
        self.calls = []

    def score_yes_no(self, prompts):
        self.calls.append(list(prompts))
        if any("EXPLODE" in p.user for p in prompts):
            raise RuntimeError("boom")
        return np.array([[np.log(0.8), np.log(0.2)]] * len(prompts))

    def generate(self, prompts, max_new_tokens):
        self.calls.append(list(prompts))
        return [f"out:{p.user[:12]}" for p in prompts]


def requests(rows):
    full = [{"backbone": "b", "prompt_id": "v1:x", "image_uri": None, "image_hash": None, "caption": None} | r for r in rows]
    return schema.conform(pa.Table.from_pylist(full), schema.REQUESTS)


def loader(uri, image_hash=None):
    if uri == "/bad.png":
        raise OSError("cannot identify image file '/bad.png'")
    return f"IMAGE<{uri}>"


def test_prompts_are_built_per_kind_with_image_first_and_caption_only_without_image():
    engine = RecordingEngine()
    batch = requests(
        [
            {"key": "k1", "kind": "image", "image_hash": "h1", "image_uri": "/a.png", "text": "Is there a cat?"},
            {"key": "k2", "kind": "caption", "caption": "a {cat}", "text": "Is there a cat?"},
            {"key": "k3", "kind": "holistic", "image_hash": "h1", "image_uri": "/a.png", "caption": "a cat", "text": "a cat"},
        ]
    )
    answers, errors = answer_batch(engine, batch, TEMPLATES, loader)
    assert errors.num_rows == 0
    assert answers.column("key").to_pylist() == ["k1", "k2", "k3"]
    np.testing.assert_allclose(answers.column("logp_yes").to_pylist(), np.log(0.8))
    (prompts,) = engine.calls  # one engine call for the whole batch
    assert prompts[0].user == "Q: Is there a cat?" and prompts[0].image == "IMAGE</a.png>" and prompts[0].image_id == "h1"
    assert prompts[1].user == 'Text: "a {cat}" Q: Is there a cat?' and prompts[1].image is None
    assert prompts[2].user == 'Does this figure show "a cat"?'


def test_unreadable_image_and_engine_failure_become_error_rows_and_the_rest_is_answered():
    engine = RecordingEngine()
    batch = requests(
        [
            {"key": "ok1", "kind": "image", "image_hash": "h1", "image_uri": "/a.png", "text": "q1"},
            {"key": "bad_img1", "kind": "image", "image_hash": "h2", "image_uri": "/bad.png", "text": "q1"},
            {"key": "bad_img2", "kind": "holistic", "image_hash": "h2", "image_uri": "/bad.png", "caption": "c", "text": "c"},
            {"key": "boom", "kind": "image", "image_hash": "h1", "image_uri": "/a.png", "text": "EXPLODE"},
            {"key": "ok2", "kind": "caption", "caption": "c", "text": "q2"},
        ]
    )
    answers, errors = answer_batch(engine, batch, TEMPLATES, loader)
    assert sorted(answers.column("key").to_pylist()) == ["ok1", "ok2"]
    reasons = dict(zip(errors.column("key").to_pylist(), errors.column("reason").to_pylist()))
    assert reasons == {"bad_img1": "unreadable_image", "bad_img2": "unreadable_image", "boom": "engine_error"}
    assert "cannot identify" in errors.filter(pa.compute.equal(errors["key"], "bad_img1"))["detail"][0].as_py()
    # every request is accounted for exactly once
    assert answers.num_rows + errors.num_rows == batch.num_rows


def test_generation_fills_caption_and_keeps_braces_in_templates():
    engine = RecordingEngine()
    batch = pa.table({"key": ["g1"], "backbone": ["b"], "kind": ["questions"], "caption": ["two {red} dogs"]})
    gens, errors = generate_batch(engine, batch, TEMPLATES, max_new_tokens=8)
    assert errors.num_rows == 0 and gens.column("text").to_pylist() == ["out:Caption: two"]
    assert engine.calls[0][0].user.startswith("Caption: two {red} dogs\nExample")


def test_fill_only_replaces_named_placeholders_and_rejects_holes():
    assert fill('{"a": 1} {caption}', caption="x{y}") == '{"a": 1} x{y}'
    with pytest.raises(KeyError):
        fill("{caption} {question}", caption="c")
