"""vLLM request building (pure) and the vLLM adapter against a recording fake `vllm`."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image
from scipy.special import logsumexp

from operators.engines import load_engine, vllm_requests
from operators.engines.base import Prompt
from operators.engines.spec import BackboneSpec
from operators.engines.yesno import render_prompt

FAKE_VLLM = Path(__file__).parent / "fake_vllm" / "vllm" / "__init__.py"

IMAGES = {
    "img-a": Image.new("RGB", (64, 64), (200, 0, 0)),
    "img-b": Image.new("RGB", (300, 200), (0, 200, 0)),  # over the budget below: gets resized
}

# Tokenizer/processor/chat-template code: CI runs these again under the cluster pins (.ci/run).
pytestmark = pytest.mark.templates


def _prompt(user, image_id=None, system=None, anonymous_image=False) -> Prompt:
    if anonymous_image:
        return Prompt(user=user, image=Image.new("RGB", (48, 48), (9, 9, 9)), system=system)
    return Prompt(user=user, image=IMAGES.get(image_id), image_id=image_id, system=system)


PROMPTS = [
    _prompt("Is there a cat?", "img-a"),
    _prompt("Is there a dog?", "img-b"),
    _prompt("Is the cat red?", "img-a", "Answer yes or no."),
    _prompt("Does the caption imply a cat?"),
    _prompt("Is the dog green?", "img-b"),
    _prompt("Is it dark?", anonymous_image=True),
    _prompt("Is the car blue?"),
]


# --- pure request building ---------------------------------------------------------------

def test_image_grouped_order_hand_example():
    order = vllm_requests.image_grouped_order(PROMPTS)
    # Groups by first appearance: img-a (0, 2), img-b (1, 4), caption-only (3, 6), anonymous (5).
    assert order.tolist() == [0, 2, 1, 4, 3, 6, 5]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(["a", "b", "c", None, "anon"]), max_size=30))
def test_image_grouped_order_invariants(kinds):
    image = Image.new("RGB", (2, 2))
    prompts = [
        Prompt(f"q{i}", None if k is None else image, None if k in (None, "anon") else k)
        for i, k in enumerate(kinds)
    ]
    order = vllm_requests.image_grouped_order(prompts)
    assert sorted(order.tolist()) == list(range(len(prompts)))
    ids = [prompts[i].image_id for i in order if prompts[i].image_id is not None]
    for image_id in set(ids):  # each image's requests are contiguous
        positions = [k for k, x in enumerate(ids) if x == image_id]
        assert positions == list(range(positions[0], positions[0] + len(positions)))
    for group in set(kinds) - {"anon"}:  # within a group, input order is kept
        members = [i for i in order if kinds[i] == group]
        assert members == sorted(members)
    grouped = [prompts[i].user for i in order]
    assert vllm_requests.restore_order(grouped, order) == [p.user for p in prompts]


def test_restore_order_rejects_wrong_length():
    with pytest.raises(ValueError, match="2 results for 3 requests"):
        vllm_requests.restore_order([1, 2], np.array([0, 1, 2]))


def test_build_request_fields():
    request = vllm_requests.build_request(_prompt("Q?", "img-b"), "TEXT", max_pixels=100 * 100, min_pixels=10)
    assert set(request) == {"prompt", "multi_modal_data", "multi_modal_uuids"}
    assert request["prompt"] == "TEXT"
    assert request["multi_modal_uuids"] == {"image": ["img-b"]}
    image = request["multi_modal_data"]["image"]
    assert isinstance(image, Image.Image) and image.size == (122, 81)  # 300x200 scaled by sqrt(1e4/6e4)
    assert vllm_requests.build_request(_prompt("Q?"), "T", 100, 10) == {"prompt": "T"}
    anonymous = vllm_requests.build_request(_prompt("Q?", anonymous_image=True), "T", 10_000, 10)
    assert set(anonymous) == {"prompt", "multi_modal_data"}  # vLLM hashes the pixels itself


def test_sampling_kwargs_ask_for_exact_ids_and_never_prompt_logprobs():
    kwargs = vllm_requests.yes_no_sampling_kwargs([5, 3, 5], [9])
    assert kwargs == {"max_tokens": 1, "temperature": 0.0, "logprob_token_ids": [3, 5, 9]}
    generation = vllm_requests.generation_sampling_kwargs(40)
    assert generation["max_tokens"] == 40 and generation["temperature"] == 0.0
    for k in (kwargs, generation):
        assert "prompt_logprobs" not in k and "logprobs" not in k


def test_media_limits_merge_user_options_and_options_override_defaults(tiny_vlm_dir):
    spec = BackboneSpec(name="b", model_id="m", engine="vllm", engine_options={
        "limit_mm_per_prompt": {"video": 2}, "max_num_seqs": 8, "enable_prefix_caching": False, "cpu_dtype": "float32",
    })
    kwargs = vllm_requests.llm_kwargs(spec, "/models/m")
    assert kwargs["limit_mm_per_prompt"] == {"image": 1, "video": 2, "audio": 0}
    assert kwargs["max_num_seqs"] == 8 and kwargs["enable_prefix_caching"] is False
    assert "cpu_dtype" not in kwargs  # an hf-engine option never reaches vLLM
    assert vllm_requests.llm_kwargs(BackboneSpec(name="b", model_id="m"), "/m")["limit_mm_per_prompt"] == {"image": 1, "video": 0, "audio": 0}


def test_unknown_llm_kwargs_are_named_with_suggestions():
    valid = {"model", "max_num_seqs", "quantization", "kv_cache_dtype"}
    with pytest.raises(ValueError, match=r"backbone 'b'.*'max_num_seq'.*did you mean 'max_num_seqs'"):
        vllm_requests.check_llm_kwargs({"model": "m", "max_num_seq": 8}, valid, "b")
    vllm_requests.check_llm_kwargs({"model": "m", "quantization": "fp8"}, valid, "b")


# --- the adapter, against the fake vllm ----------------------------------------------------

@pytest.fixture
def fake_vllm(monkeypatch):
    spec = importlib.util.spec_from_file_location("vllm", FAKE_VLLM)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "vllm", module)  # before exec: its dataclasses look themselves up
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def backbone(tiny_vlm_dir):
    return BackboneSpec(
        name="tiny-vllm", model_id=tiny_vlm_dir, engine="vllm", revision="abc123", dtype="bfloat16",
        tensor_parallel_size=2, max_model_len=4096, gpu_memory_utilization=0.7,
        max_image_pixels=100 * 100, min_image_pixels=32 * 32, engine_options={"enforce_eager": True},
    )


@pytest.fixture
def engine(fake_vllm, backbone):
    engine = load_engine(backbone)
    yield engine
    engine.close()


def test_llm_is_built_with_the_backbone_settings(engine, fake_vllm, backbone, tiny_vlm_dir):
    (llm,) = fake_vllm.LLM_INSTANCES
    assert llm.model == tiny_vlm_dir
    assert llm.kwargs == {
        "revision": "abc123", "dtype": "bfloat16", "tensor_parallel_size": 2, "max_model_len": 4096,
        "gpu_memory_utilization": 0.7, "enable_prefix_caching": True,
        "limit_mm_per_prompt": {"image": 1, "video": 0, "audio": 0},
        "trust_remote_code": False, "enforce_eager": True,
        # tensor parallel inside a Ray actor that already holds the GPUs: multiprocessing workers
        "distributed_executor_backend": "mp",
    }
    assert type(engine).__name__ == "VLLMEngine"


def test_an_explicit_executor_backend_is_kept(fake_vllm, backbone):
    backbone.engine_options = {"distributed_executor_backend": "ray"}
    load_engine(backbone).close()
    assert fake_vllm.LLM_INSTANCES[-1].kwargs["distributed_executor_backend"] == "ray"


def test_score_sends_one_grouped_call_and_parses_answers(engine, fake_vllm, backbone):
    scores = engine.score_yes_no(PROMPTS)
    (call,) = fake_vllm.LLM_INSTANCES[0].calls
    # the template's own BOS is kept: vLLM must not add (or, for Gemma-4, drop) special tokens
    assert call.kwargs == {"use_tqdm": False, "tokenization_kwargs": {"add_special_tokens": False}}

    params = call.params.kwargs
    assert params["max_tokens"] == 1 and params["temperature"] == 0.0
    assert params["logprob_token_ids"] == sorted({*engine.yes_ids, *engine.no_ids})
    assert "prompt_logprobs" not in params and "logprobs" not in params

    requests = call.requests
    order = [0, 2, 1, 4, 3, 6, 5]
    for request, i in zip(requests, order, strict=True):
        prompt = PROMPTS[i]
        assert request["prompt"] == render_prompt(engine.processor, prompt)
        if prompt.image is None:
            assert set(request) == {"prompt"}
        else:
            assert request["multi_modal_data"]["image"].size[0] * request["multi_modal_data"]["image"].size[1] <= 10_000
        if prompt.image_id is not None:
            assert request["multi_modal_uuids"] == {"image": [prompt.image_id]}
    assert requests[2]["multi_modal_data"]["image"].size == (122, 81)  # img-b, fitted
    assert "multi_modal_uuids" not in requests[-1]  # the anonymous image

    # Expected answers from the fake's own formula, in input order.
    expected = np.empty((len(PROMPTS), 2))
    vocab = fake_vllm.LLM_INSTANCES[0].vocab_size
    for request, i in zip(requests, order, strict=True):
        row = fake_vllm.fake_logprobs(request, vocab)
        expected[i] = [logsumexp(row[engine.yes_ids]), logsumexp(row[engine.no_ids])]
    assert scores.shape == (len(PROMPTS), 2) and scores.dtype == np.float64
    np.testing.assert_allclose(scores, expected, rtol=0, atol=1e-12)


def test_assistant_prefix_and_template_kwargs_reach_the_prompt(fake_vllm, backbone):
    backbone.assistant_prefix = "<think>\n\n</think>\n\n"
    engine = load_engine(backbone)
    engine.score_yes_no([PROMPTS[0]])
    (request,) = fake_vllm.LLM_INSTANCES[0].calls[0].requests
    assert request["prompt"].endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_parse_rejects_outputs_without_requested_logprobs(fake_vllm):
    completion = fake_vllm.CompletionOutput(0, "Yes", [7], None)
    with pytest.raises(ValueError, match="r1: no logprobs returned"):
        vllm_requests.parse_yes_no(fake_vllm.RequestOutput("r1", "p", [completion]), [1], [2])
    partial = fake_vllm.CompletionOutput(0, "Yes", [7], [{1: fake_vllm.Logprob(-0.1)}])
    with pytest.raises(ValueError, match=r"lack requested ids \[2\]"):
        vllm_requests.parse_yes_no(fake_vllm.RequestOutput("r2", "p", [partial]), [1], [2])
    with pytest.raises(ValueError, match="r3: no completion"):
        vllm_requests.parse_yes_no(fake_vllm.RequestOutput("r3", "p", []), [1], [2])


def test_missing_vllm_gives_install_hint(monkeypatch, backbone):
    monkeypatch.setitem(sys.modules, "vllm", None)  # makes `import vllm` raise ImportError
    with pytest.raises(ImportError, match=r"pip install '\.\[vllm\]'"):
        load_engine(backbone)


def test_an_over_long_caption_is_refused_before_vllm_sees_it(fake_vllm, backbone):
    """A 50 KB caption is far past max_model_len: it becomes a `prompt_too_long` error row and
    the batch's other request is still answered, with no engine call for the long one."""
    import pyarrow as pa

    from operators.answering import answer_batch

    backbone.max_model_len = 64
    engine = load_engine(backbone)
    long_caption = "a red square above a blue circle " * 1500
    batch = pa.table({
        "key": ["short", "long"], "backbone": ["tiny-vllm"] * 2, "kind": ["caption"] * 2, "prompt_id": ["v"] * 2,
        "image_hash": [None, None], "image_uri": [None, None], "caption": ["a red square", long_caption],
        "text": ["Is there a square?"] * 2,
    })
    templates = {"answer_caption": 'Text: "{caption}" Q: {question}'}
    answers, errors = answer_batch(engine, batch, templates, load_image=None)
    assert answers.column("key").to_pylist() == ["short"]
    assert errors.column("reason").to_pylist() == ["prompt_too_long"]
    assert engine.prompt_lengths([]) == []
    sent = [len(call.requests) for call in fake_vllm.LLM_INSTANCES[-1].calls]
    assert sent == [1]
    engine.close()
