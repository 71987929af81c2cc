"""Everything the vLLM engine does except calling vLLM: requests, ordering, sampling, parsing.

Kept free of `vllm` imports so it is fully tested on machines without a GPU. Field names
follow vLLM's `TextPrompt` (`prompt`, `multi_modal_data`, `multi_modal_uuids`) and
`SamplingParams` (`logprob_token_ids`: raw log-probabilities of exactly the listed ids).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from operators.engines.base import Prompt
from operators.engines.yesno import yes_no_logprobs
from operators.images import fit_pixels

# How vLLM must tokenize our rendered prompts: exactly like the hf engine, which tokenizes
# the template's text with add_special_tokens=False (the template writes BOS itself).
# vLLM's default adds special tokens (a second BOS for Llama/Gemma-3-style templates) except
# for models it special-cases (Gemma-4 with a chat template: none added), so we say it.
TOKENIZATION_KWARGS = {"add_special_tokens": False}

# Media we never send: vLLM budgets (and profiles memory for) every modality a model accepts
# unless told its limit is 0.
MEDIA_LIMITS = {"image": 1, "video": 0, "audio": 0}


def llm_kwargs(spec: Any, model_path: str) -> dict:
    """Keyword arguments for `vllm.LLM`: the backbone's settings, then its `engine_options`.

    A user's `limit_mm_per_prompt` is merged into ours (not a duplicate keyword), and an
    explicit option overrides our default of the same name.
    """
    options = dict(spec.engine_options)
    limits = dict(MEDIA_LIMITS)
    limits.update(dict(options.pop("limit_mm_per_prompt", None) or {}))
    options.pop("cpu_dtype", None)  # hf engine only
    kwargs = {
        "model": model_path,
        "revision": spec.revision,
        "dtype": spec.dtype,
        "tensor_parallel_size": spec.tensor_parallel_size,
        "max_model_len": spec.max_model_len,
        "gpu_memory_utilization": spec.gpu_memory_utilization,
        "enable_prefix_caching": True,
        "limit_mm_per_prompt": limits,
        "trust_remote_code": spec.trust_remote_code,
    }
    if spec.tensor_parallel_size > 1:
        # The Ray actor holding this engine already reserved tensor_parallel_size GPUs on one
        # node; vLLM's own Ray executor would ask the cluster for them a second time and wait.
        kwargs["distributed_executor_backend"] = "mp"
    kwargs.update(options)
    return kwargs


def check_llm_kwargs(kwargs: dict, valid: set[str], backbone: str) -> None:
    """Refuse `vllm.LLM` keywords vLLM does not know (a misspelt engine option), naming them."""
    import difflib

    unknown = sorted(set(kwargs) - set(valid))
    if unknown:
        hints = []
        for name in unknown:
            close = difflib.get_close_matches(name, sorted(valid), n=1)
            hints.append(f"{name!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
        raise ValueError(
            f"backbone {backbone!r}: vLLM does not know the engine option(s) {', '.join(hints)}; "
            "see vllm.engine.arg_utils.EngineArgs for the valid names"
        )


def build_request(prompt: Prompt, text: str, max_pixels: int, min_pixels: int) -> dict:
    """A vLLM `TextPrompt` dict; the image's content hash becomes its multimodal uuid.

    The uuid lets vLLM's prefix cache recognise the same image across requests without
    re-hashing its pixels. Without an `image_id`, vLLM hashes the pixels itself.
    """
    request: dict[str, Any] = {"prompt": text}
    if prompt.image is not None:
        request["multi_modal_data"] = {"image": fit_pixels(prompt.image, max_pixels, min_pixels)}
        if prompt.image_id is not None:
            request["multi_modal_uuids"] = {"image": [prompt.image_id]}
    return request


def image_grouped_order(prompts: Sequence[Prompt]) -> np.ndarray:
    """A permutation that puts prompts about the same image next to each other.

    Groups appear in order of first appearance, prompts keep their order within a group;
    caption-only prompts form one group, and an image without an id is its own group.
    """
    group_of: dict[Any, int] = {}
    keys = []
    for i, prompt in enumerate(prompts):
        if prompt.image is None:
            key: Any = ("caption-only",)
        elif prompt.image_id is None:
            key = ("anonymous", i)
        else:
            key = ("image", prompt.image_id)
        keys.append(group_of.setdefault(key, len(group_of)))
    return np.argsort(np.asarray(keys, dtype=np.int64), kind="stable")


def restore_order(values: Sequence | np.ndarray, order: np.ndarray) -> list:
    """Undo `image_grouped_order`: values[k] answered prompts[order[k]]."""
    if len(values) != len(order):
        raise ValueError(f"{len(values)} results for {len(order)} requests")
    out: list = [None] * len(order)
    for value, i in zip(values, order, strict=True):
        out[i] = value
    return out


def yes_no_sampling_kwargs(yes_ids: Sequence[int], no_ids: Sequence[int]) -> dict:
    """One greedy token, with raw log-probabilities of exactly the answer ids.

    Not `logprobs=k` (top-k can miss an answer) and never `prompt_logprobs`, which makes
    vLLM skip the prefix cache and so re-encode every image.
    """
    return {"max_tokens": 1, "temperature": 0.0, "logprob_token_ids": sorted({*yes_ids, *no_ids})}


def generation_sampling_kwargs(max_new_tokens: int) -> dict:
    return {"max_tokens": max_new_tokens, "temperature": 0.0, "skip_special_tokens": True}


def parse_yes_no(output: Any, yes_ids: Sequence[int], no_ids: Sequence[int]) -> tuple[float, float]:
    """(logp_yes, logp_no) from a `RequestOutput`: its first generated position's logprobs."""
    completions = getattr(output, "outputs", None)
    if not completions:
        raise ValueError(f"request {getattr(output, 'request_id', '?')}: no completion returned")
    positions = completions[0].logprobs
    if not positions:
        raise ValueError(
            f"request {getattr(output, 'request_id', '?')}: no logprobs returned "
            "(does this vLLM support SamplingParams.logprob_token_ids?)"
        )
    row = {int(token_id): getattr(lp, "logprob", lp) for token_id, lp in positions[0].items()}
    missing = [i for i in (*yes_ids, *no_ids) if i not in row]
    if missing:
        raise ValueError(f"request {getattr(output, 'request_id', '?')}: logprobs lack requested ids {missing}")
    return yes_no_logprobs(row, yes_ids, no_ids)


def parse_text(output: Any) -> str:
    completions = getattr(output, "outputs", None)
    if not completions:
        raise ValueError(f"request {getattr(output, 'request_id', '?')}: no completion returned")
    return completions[0].text


def prepare(
    prompts: Sequence[Prompt], render: Callable[[Prompt], str], max_pixels: int, min_pixels: int
) -> tuple[list[dict], np.ndarray]:
    """Requests in image-grouped order, and the order to undo it with."""
    order = image_grouped_order(prompts)
    requests = [build_request(prompts[i], render(prompts[i]), max_pixels, min_pixels) for i in order]
    return requests, order
