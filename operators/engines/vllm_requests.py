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


def strip_duplicate_bos(text: str, tokenizer: Any) -> str:
    """Drop a BOS the chat template wrote when the tokenizer adds its own.

    vLLM tokenizes a text prompt with special tokens; without this, templates that start
    with BOS (Gemma, Llama) would feed the model two of them.
    """
    bos = getattr(tokenizer, "bos_token", None)
    if not bos or not text.startswith(bos):
        return text
    adds_bos = tokenizer.encode("x", add_special_tokens=True)[:1] == [tokenizer.bos_token_id]
    return text[len(bos):] if adds_bos else text


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
