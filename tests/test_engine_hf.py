"""The transformers engine on the tiny VLM, and the yes/no reading it shares with vLLM."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image
from scipy.special import logsumexp

from operators.engines import load_engine
from operators.engines.base import Prompt
from operators.engines.hf import HFEngine
from operators.engines.spec import BackboneSpec
from operators.engines.yesno import (
    answer_token_ids,
    chat_messages,
    render_prompt,
    yes_no_logprobs,
    yes_no_token_ids,
)

# Tokenizer/processor/chat-template code: CI runs these again under the cluster pins (.ci/run).
pytestmark = pytest.mark.templates


def _image(seed: int, width: int, height: int) -> Image.Image:
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    return Image.fromarray(pixels, "RGB")


IMAGES = {"a": _image(0, 40, 60), "b": _image(1, 100, 70), "c": _image(2, 64, 64)}


def _prompt(user, image_id=None, system=None) -> Prompt:
    return Prompt(user=user, image=IMAGES.get(image_id), image_id=image_id, system=system)


# Different lengths, images of different sizes, caption-only prompts interleaved.
PROMPTS = [
    _prompt("Is there a red cat on the grass?", "a", "Answer yes or no."),
    _prompt("Is there a dog?"),
    _prompt("Does the image show two dogs near the river? Answer yes or no.", "b"),
    _prompt("Is there a cat?", "c"),
    _prompt('Does this figure show "a blue car"?', "a"),
    _prompt("Is the cat red?", None, "Be brief."),
    _prompt("no", "b"),
    _prompt("Is there a small bird under a bridge at the beach, inside a box?", "c"),
    _prompt("Does the caption say the bus is yellow?"),
]


@pytest.fixture(scope="module")
def spec(tiny_vlm_dir):
    return BackboneSpec(name="tiny", model_id=tiny_vlm_dir, engine="hf", batch_size=4)


@pytest.fixture(scope="module")
def engine(spec):
    engine = HFEngine(spec)
    yield engine
    engine.close()


# --- yes/no reading (pure) -------------------------------------------------------------

def test_answer_token_ids_first_token_deduplicated(engine):
    tok = engine.tokenizer
    yes = tok.encode("Yes", add_special_tokens=False)[0]
    assert answer_token_ids(tok, ["Yes", "Yes", "Yes."]) == [yes]  # "Yes." starts with "Yes"
    ids = answer_token_ids(tok, ["Yes", "yes", " Yes"])
    assert ids == [tok.convert_tokens_to_ids(t) for t in ["Yes", "yes", "ĠYes"]]


def test_yes_no_token_ids_rejects_overlap_and_empty(engine):
    tok = engine.tokenizer
    with pytest.raises(ValueError, match="share first tokens"):
        yes_no_token_ids(tok, ["Yes", "no"], ["No", "no"])
    with pytest.raises(ValueError, match="no answer spellings"):
        yes_no_token_ids(tok, [], ["No"])
    with pytest.raises(ValueError, match="encodes to no tokens"):
        answer_token_ids(tok, [""])


def test_yes_no_logprobs_matches_scipy_on_numpy_and_torch():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=50)
    row = logits - logsumexp(logits)
    yes, no = [3, 7, 7 + 1], [10, 0]
    expected = (logsumexp(row[yes]), logsumexp(row[no]))
    assert yes_no_logprobs(row, yes, no) == pytest.approx(expected, abs=1e-12)
    as_tensor = yes_no_logprobs(torch.tensor(row, dtype=torch.float32), yes, no)
    assert as_tensor == pytest.approx(expected, abs=1e-5)
    # Hand-computed: p(yes) = 0.1 + 0.2, p(no) = 0.4.
    probs = np.array([0.1, 0.2, 0.4, 0.3])
    assert np.exp(yes_no_logprobs(np.log(probs), [0, 1], [2])) == pytest.approx([0.3, 0.4])


def test_yes_no_logprobs_dict_missing_ids_contribute_nothing():
    row = {5: np.log(0.25), 9: np.log(0.5), 1: np.log(0.125)}
    assert np.exp(yes_no_logprobs(row, [5, 6, 1], [9, 2])) == pytest.approx([0.375, 0.5])
    logp_yes, logp_no = yes_no_logprobs(row, [5], [2, 3])
    assert logp_yes == pytest.approx(np.log(0.25)) and logp_no == -np.inf


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(-30, 0), min_size=4, max_size=12), st.data())
def test_yes_no_logprobs_dict_equals_dense_row(values, data):
    n = len(values)
    yes = data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=3, unique=True))
    no = data.draw(st.lists(st.integers(0, n - 1).filter(lambda i: i not in yes), min_size=1, max_size=3, unique=True))
    dense = yes_no_logprobs(np.array(values), yes, no)
    sparse = yes_no_logprobs({i: v for i, v in enumerate(values)}, yes, no)
    assert sparse == pytest.approx(dense, abs=1e-12)


def test_chat_messages_put_system_then_image_then_text():
    img = IMAGES["a"]
    messages = chat_messages(Prompt("Q?", img, "id", "S"))
    assert messages == [
        {"role": "system", "content": [{"type": "text", "text": "S"}]},
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Q?"}]},
    ]
    assert chat_messages(Prompt("Q?")) == [{"role": "user", "content": [{"type": "text", "text": "Q?"}]}]


def test_render_prompt_appends_assistant_prefix(engine):
    text = render_prompt(engine.processor, _prompt("Is it?", "a"), {}, "<think>\n\n</think>\n\n")
    assert text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert "<|vision_start|><|image_pad|><|vision_end|>Is it?" in text


# --- the engine -------------------------------------------------------------------------

def _reference(engine: HFEngine, prompt: Prompt) -> tuple[float, float]:
    """One prompt through the processor's own chat path and a full forward pass."""
    messages = chat_messages(prompt)
    if prompt.image is not None:
        messages[-1]["content"][0]["image"] = prompt.image
    inputs = engine.processor.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=True, return_tensors="pt"
    )
    with torch.no_grad():
        logits = engine.model(**inputs).logits[0, -1].double()
    logprobs = torch.log_softmax(logits, dim=-1)
    return (
        float(torch.logsumexp(logprobs[engine.yes_ids], 0)),
        float(torch.logsumexp(logprobs[engine.no_ids], 0)),
    )


def test_scores_have_the_contract_shape(engine):
    scores = engine.score_yes_no(PROMPTS)
    assert scores.shape == (len(PROMPTS), 2) and scores.dtype == np.float64
    assert np.isfinite(scores).all() and (scores < 0).all()
    assert (logsumexp(scores, axis=1) < 0).all()  # yes and no are disjoint events
    assert engine.score_yes_no([]).shape == (0, 2)


def test_single_prompt_matches_reference_forward(engine):
    # Image "c" is within the pixel budget, so the engine passes it on unresized.
    for prompt in [_prompt("Is there a cat?", "c", "Answer yes or no."), PROMPTS[1], PROMPTS[5]]:
        assert engine.score_yes_no([prompt])[0] == pytest.approx(_reference(engine, prompt), abs=1e-4)


def test_mixed_batch_equals_scoring_alone(engine):
    # Left padding, attention masks and multimodal positions must not leak across rows.
    batched = engine.score_yes_no(PROMPTS)
    alone = np.array([engine.score_yes_no([p])[0] for p in PROMPTS])
    np.testing.assert_allclose(batched, alone, atol=1e-4, rtol=0)
    assert np.ptp(batched[:, 0]) > 1e-3  # rows differ: the check above is not vacuous


def test_results_follow_input_order_and_are_deterministic(engine):
    forward = engine.score_yes_no(PROMPTS)
    backward = engine.score_yes_no(PROMPTS[::-1])
    np.testing.assert_allclose(backward[::-1], forward, atol=1e-4, rtol=0)
    assert np.array_equal(engine.score_yes_no(PROMPTS), forward)


def test_image_and_system_prompt_change_the_answer(engine):
    base = engine.score_yes_no([_prompt("Is there a cat?", "c")])[0]
    other_image = engine.score_yes_no([_prompt("Is there a cat?", "a")])[0]
    no_image = engine.score_yes_no([_prompt("Is there a cat?")])[0]
    with_system = engine.score_yes_no([_prompt("Is there a cat?", "c", "Answer yes or no.")])[0]
    for other in (other_image, no_image, with_system):
        assert np.abs(base - other).max() > 1e-5


def test_images_are_fitted_to_the_pixel_budget(spec, engine):
    big = _image(3, 300, 200)
    small_spec = BackboneSpec(**{**spec.__dict__, "max_image_pixels": 64 * 64, "min_image_pixels": 32 * 32})
    fitted_engine = HFEngine(small_spec)
    try:
        fitted = fitted_engine.score_yes_no([Prompt("Is there a cat?", big, "big")])[0]
    finally:
        fitted_engine.close()
    resized = big.resize((78, 52), Image.Resampling.BICUBIC)  # sqrt(4096 / 60000) * (300, 200), floored
    assert engine.score_yes_no([Prompt("Is there a cat?", resized, "big")])[0] == pytest.approx(fitted, abs=1e-5)


def test_cpu_dtype_option(spec, engine):
    assert engine.model.dtype == torch.float32  # default on CPU, although spec.dtype is bfloat16
    bf16 = HFEngine(BackboneSpec(**{**spec.__dict__, "engine_options": {"cpu_dtype": "bfloat16"}}))
    try:
        assert bf16.model.dtype == torch.bfloat16
        scores = bf16.score_yes_no(PROMPTS[:3])
    finally:
        bf16.close()
    np.testing.assert_allclose(scores, engine.score_yes_no(PROMPTS[:3]), atol=0.05)


def test_generate_is_greedy_batched_and_ordered(engine):
    prompts = PROMPTS[:5]
    texts = engine.generate(prompts, max_new_tokens=6)
    assert len(texts) == len(prompts) and all(isinstance(t, str) for t in texts)
    assert texts == [engine.generate([p], max_new_tokens=6)[0] for p in prompts]
    assert texts == engine.generate(prompts, max_new_tokens=6)
    for text in texts:
        assert "<|im_end|>" not in text and "<|endoftext|>" not in text


def test_generate_decodes_only_new_tokens(engine):
    prompt = _prompt("Is there a dog?")
    inputs = engine._encode([prompt])
    with torch.no_grad():
        tokens = engine.model.generate(**inputs, max_new_tokens=3, do_sample=False)
    expected = engine.tokenizer.decode(tokens[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True)
    assert engine.generate([prompt], max_new_tokens=3) == [expected]
    assert "Is there a dog?" not in expected


def test_load_engine_resolves_builtin(monkeypatch, tmp_path):
    monkeypatch.setenv("DEPICT_CACHE", str(tmp_path))
    engine = load_engine(BackboneSpec(name="tiny", model_id="builtin:tiny-vlm", engine="hf"))
    try:
        assert isinstance(engine, HFEngine)
        assert engine.score_yes_no([Prompt("Is there a cat?", IMAGES["c"], "c")]).shape == (1, 2)
    finally:
        engine.close()
    assert engine.model is None


def test_images_reach_the_processor_one_list_per_prompt(engine, monkeypatch):
    """Gemma-4's processor nests images per prompt (transformers' make_nested_list_of_images):
    a flat list of n images is read as one prompt with n images and a batch above 1 fails."""
    from transformers.image_utils import make_nested_list_of_images

    seen = {}
    processor = engine.processor

    class Recording:
        def __getattr__(self, name):
            return getattr(processor, name)

        def __call__(self, **kwargs):
            seen.update(kwargs)
            return processor(**kwargs)

    monkeypatch.setattr(engine, "processor", Recording())
    monkeypatch.setattr(engine, "batch_invariant", False)  # batched rows: one processor call for the three
    batch = [p for p in PROMPTS if p.image is not None][:3]
    engine.score_yes_no(batch)
    nested = make_nested_list_of_images(seen["images"])
    assert [len(images) for images in nested] == [1] * len(seen["text"]) == [1, 1, 1]
