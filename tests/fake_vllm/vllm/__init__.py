"""A stand-in for the `vllm` package (tests only): records how it is called, answers deterministically.

Only what truly needs a GPU is faked (running the model); tests/test_engine_vllm_real.py
checks the adapter against the real vllm package for everything else. The fake checks what
it is given against the real names (vLLM's `TextPrompt` keys, `SamplingParams` fields and
`LLM.generate` keywords), so a misspelt field fails here as it would on a GPU.

Its "model" is a fixed next-token distribution over the whole vocabulary (size read from
the model's config.json), a pure function of the request (`fake_logprobs`): probabilities
sum to 1, the sampled token is the most likely one, and `Logprob.rank` is filled the way
vLLM 0.33 fills it for `logprob_token_ids` (see `LLM.generate`).
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import numpy as np

LLM_INSTANCES: list[LLM] = []

PROMPT_KEYS = {"prompt", "multi_modal_data", "multi_modal_uuids", "mm_processor_kwargs", "cache_salt"}
SAMPLING_FIELDS = {
    "n", "presence_penalty", "frequency_penalty", "repetition_penalty", "temperature", "top_p", "top_k",
    "min_p", "seed", "stop", "stop_token_ids", "ignore_eos", "max_tokens", "min_tokens", "logprobs",
    "prompt_logprobs", "prompt_logprob_token_ids", "prompt_logprob_start", "logprob_token_ids",
    "flat_logprobs", "detokenize", "skip_special_tokens", "spaces_between_special_tokens",
    "include_stop_str_in_output", "output_kind", "structured_outputs", "logit_bias", "allowed_token_ids",
    "extra_args", "bad_words", "skip_reading_prefix_cache", "thinking_token_budget",
}
GENERATE_KEYWORDS = {"use_tqdm", "lora_request", "priority", "tokenization_kwargs", "mm_processor_kwargs"}
DEFAULT_VOCAB = 1024


def _unit(*parts) -> float:
    digest = hashlib.blake2b("\x1f".join(map(str, parts)).encode(), digest_size=8).hexdigest()
    return int(digest, 16) / 16**16


def _uuid(request: dict) -> str | None:
    uuids = request.get("multi_modal_uuids", {}).get("image")
    return uuids[0] if uuids else None


def fake_logprobs(request: dict, vocab_size: int) -> np.ndarray:
    """The fake model's log-probabilities over the whole vocabulary for one request."""
    return _logprobs(request["prompt"], _uuid(request), vocab_size)


@lru_cache(maxsize=256)
def _logprobs(prompt: str, uuid: str | None, vocab_size: int) -> np.ndarray:
    seed = int(hashlib.blake2b(f"{prompt}\x1f{uuid}".encode(), digest_size=8).hexdigest(), 16)
    logits = 6.0 * np.random.default_rng(seed).random(vocab_size)
    return logits - np.logaddexp.reduce(logits)


def _vocab_size(model: str) -> int:
    config = Path(model) / "config.json"
    if not config.exists():
        return DEFAULT_VOCAB
    data = json.loads(config.read_text())
    return int(data.get("vocab_size") or data.get("text_config", {}).get("vocab_size") or DEFAULT_VOCAB)


def fake_text(request: dict) -> str:
    return f"answer {_unit(request['prompt'], _uuid(request)):.6f}"


def reset() -> None:
    LLM_INSTANCES.clear()


class SamplingParams:
    def __init__(self, **kwargs):
        unknown = set(kwargs) - SAMPLING_FIELDS
        if unknown:
            raise TypeError(f"SamplingParams got unexpected fields {sorted(unknown)}")
        self.kwargs = kwargs

    def __getattr__(self, name):
        if name in SAMPLING_FIELDS:
            return self.__dict__["kwargs"].get(name)
        raise AttributeError(name)


@dataclass
class Logprob:
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    logprobs: list[dict[int, Logprob]] | None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str
    outputs: list[CompletionOutput]


@dataclass
class GenerateCall:
    requests: list[dict]
    params: SamplingParams
    kwargs: dict = field(default_factory=dict)


class LLM:
    def __init__(self, model: str, **kwargs):
        self.model = model
        self.kwargs = kwargs
        self.vocab_size = _vocab_size(model)
        self.calls: list[GenerateCall] = []
        LLM_INSTANCES.append(self)

    def generate(self, prompts, sampling_params=None, **kwargs):
        unknown = set(kwargs) - GENERATE_KEYWORDS
        if unknown:
            raise TypeError(f"LLM.generate() got unexpected keyword arguments {sorted(unknown)}")
        for request in prompts:
            _check_request(request)
        self.calls.append(GenerateCall(list(prompts), sampling_params, kwargs))
        ids = sampling_params.logprob_token_ids
        outputs = []
        for k, request in enumerate(prompts):
            row = fake_logprobs(request, self.vocab_size)
            sampled = int(np.argmax(row))
            logprobs = None
            if ids:
                # As vLLM 0.33 fills the dict (logprobs.append_logprobs_for_next_position): the
                # sampled token first with its true rank, then the requested ids with ranks
                # 1..n in request order (a requested sampled token ends with the latter).
                position = {sampled: Logprob(float(row[sampled]), rank=1 + int(np.sum(row > row[sampled])))}
                position |= {t: Logprob(float(row[t]), rank=k) for k, t in enumerate(ids, start=1)}
                logprobs = [position]
            completion = CompletionOutput(0, fake_text(request), [sampled], logprobs)
            outputs.append(RequestOutput(str(k), request["prompt"], [completion]))
        return outputs


def _check_request(request: dict) -> None:
    if not isinstance(request, dict) or not isinstance(request.get("prompt"), str):
        raise TypeError(f"expected a TextPrompt dict, got {request!r}")
    unknown = set(request) - PROMPT_KEYS
    if unknown:
        raise TypeError(f"TextPrompt got unexpected keys {sorted(unknown)}")
    images = request.get("multi_modal_data", {}).get("image")
    uuids = request.get("multi_modal_uuids", {}).get("image")
    if uuids is not None:
        n_images = len(images) if isinstance(images, list) else int(images is not None)
        if len(uuids) != n_images:
            raise ValueError(f"{len(uuids)} uuids for {n_images} images")
