"""A stand-in for the `vllm` package (tests only): records how it is called, answers deterministically.

It checks what it is given against the real names (vLLM's `TextPrompt` keys and
`SamplingParams` fields), so a misspelt field fails here as it would on a GPU.
Log-probabilities and texts are pure functions of the request (`fake_logprob`,
`fake_text`), so tests can compute the expected answers independently.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

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
SAMPLED_TOKEN = 7  # vLLM also reports the sampled token; parsers must ignore extras


def _unit(*parts) -> float:
    digest = hashlib.blake2b("\x1f".join(map(str, parts)).encode(), digest_size=8).hexdigest()
    return int(digest, 16) / 16**16


def _uuid(request: dict) -> str | None:
    uuids = request.get("multi_modal_uuids", {}).get("image")
    return uuids[0] if uuids else None


def fake_logprob(request: dict, token_id: int) -> float:
    return -0.5 - 8.0 * _unit(request["prompt"], _uuid(request), token_id)


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
        self.calls: list[GenerateCall] = []
        LLM_INSTANCES.append(self)

    def generate(self, prompts, sampling_params=None, **kwargs):
        for request in prompts:
            _check_request(request)
        self.calls.append(GenerateCall(list(prompts), sampling_params, kwargs))
        ids = sampling_params.logprob_token_ids
        outputs = []
        for k, request in enumerate(prompts):
            logprobs = None
            if ids:
                row = {t: Logprob(fake_logprob(request, t)) for t in ids}
                row.setdefault(SAMPLED_TOKEN, Logprob(-0.01, rank=1))
                logprobs = [row]
            completion = CompletionOutput(0, fake_text(request), [SAMPLED_TOKEN], logprobs)
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
