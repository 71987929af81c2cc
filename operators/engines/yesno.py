"""Putting a question to a VLM and reading its yes/no answer, shared by every engine.

Both sides live here so that the HF and vLLM engines cannot drift apart: the chat text a
`Prompt` becomes (`render_prompt`), and the answer read from the first generated token's
log-probabilities (`answer_token_ids`, `yes_no_logprobs`). Pure: no torch import.
"""
from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from scipy.special import logsumexp

from operators.engines.base import Prompt

log = logging.getLogger(__name__)


def chat_messages(prompt: Prompt) -> list[dict]:
    """Chat messages for a prompt: optional system turn, then the image (if any) and the text.

    The image goes first so that every question about one image shares the longest possible
    prefix (vLLM's prefix cache reuses the image's KV across them).
    """
    messages = []
    if prompt.system:
        messages.append({"role": "system", "content": [{"type": "text", "text": prompt.system}]})
    content: list[dict] = [{"type": "image"}] if prompt.image is not None else []
    content.append({"type": "text", "text": prompt.user})
    messages.append({"role": "user", "content": content})
    return messages


def render_prompt(
    processor: Any, prompt: Prompt, chat_template_kwargs: Mapping | None = None, assistant_prefix: str = ""
) -> str:
    """The exact text the model reads, up to where its answer starts.

    `processor` is anything with a Hugging Face `apply_chat_template` (processor or tokenizer).
    `assistant_prefix` is appended after the generation prompt (e.g. an empty think block).
    """
    text = processor.apply_chat_template(
        chat_messages(prompt), tokenize=False, add_generation_prompt=True, **dict(chat_template_kwargs or {})
    )
    return text + assistant_prefix


def answer_token_ids(tokenizer: Any, spellings: Sequence[str]) -> list[int]:
    """Token id of each single-token spelling (encoded without special tokens), deduplicated, in order.

    The answer is read from ONE generated token, so only a spelling that is one token can be
    counted exactly; a spelling that encodes to several tokens is left out (its first piece
    may start unrelated words: counting it would add foreign mass to the answer). Which
    spellings were left out: `multi_token_spellings`. Raises when no spelling is one token.
    """
    if not spellings:
        raise ValueError("no answer spellings given")
    ids: list[int] = []
    for spelling in spellings:
        encoded = _encode(tokenizer, spelling)
        if len(encoded) == 1:
            ids.append(int(encoded[0]))
    if not ids:
        pieces = {s: _pieces(tokenizer, s) for s in spellings}
        raise ValueError(
            f"none of the answer spellings {list(spellings)} is a single token for this tokenizer "
            f"(pieces: {pieces}); give spellings the model can answer in one token"
        )
    return list(dict.fromkeys(ids))


def multi_token_spellings(tokenizer: Any, spellings: Sequence[str]) -> dict[str, list[str]]:
    """The spellings `answer_token_ids` leaves out, each with the tokens it encodes to."""
    return {s: _pieces(tokenizer, s) for s in spellings if len(_encode(tokenizer, s)) > 1}


def _encode(tokenizer: Any, spelling: str) -> list[int]:
    encoded = tokenizer.encode(spelling, add_special_tokens=False)
    if not encoded:
        raise ValueError(f"answer spelling {spelling!r} encodes to no tokens")
    return list(encoded)


def _pieces(tokenizer: Any, spelling: str) -> list[str]:
    return [str(t) for t in tokenizer.convert_ids_to_tokens(_encode(tokenizer, spelling))]


def yes_no_token_ids(
    tokenizer: Any, yes_spellings: Sequence[str], no_spellings: Sequence[str]
) -> tuple[list[int], list[int]]:
    """Token ids for each answer; refuses spellings whose tokens collide across answers.

    Multi-token spellings are left out with a warning (see `answer_token_ids`).
    """
    yes_ids = answer_token_ids(tokenizer, yes_spellings)
    no_ids = answer_token_ids(tokenizer, no_spellings)
    dropped = multi_token_spellings(tokenizer, [*yes_spellings, *no_spellings])
    if dropped:
        log.warning("answer spellings that are several tokens are not counted: %s", dropped)
    shared = set(yes_ids) & set(no_ids)
    if shared:
        names = {i: tokenizer.convert_ids_to_tokens(i) for i in sorted(shared)}
        raise ValueError(f"yes and no spellings share first tokens {names}: answers would be indistinguishable")
    return yes_ids, no_ids


def answer_mass(logp_yes: Any, logp_no: Any) -> np.ndarray:
    """P(yes spellings) + P(no spellings): how much of the next-token distribution the answers got.

    Both inputs are raw log-probabilities over the whole vocabulary, so the mass is at most
    1; the rest went to other tokens. A low mass means the model was not about to answer
    yes or no (wrong template, missing BOS, a thought prefix), and the normalised answer
    is then read from noise.
    """
    return np.exp(np.logaddexp(np.asarray(logp_yes, dtype=np.float64), np.asarray(logp_no, dtype=np.float64)))


def yes_no_logprobs(
    logprobs_row: Any, yes_ids: Sequence[int], no_ids: Sequence[int]
) -> tuple[float, float]:
    """(logp_yes, logp_no): log-sum-exp of the row's log-probabilities over each answer's ids.

    `logprobs_row` is either a full vocabulary row (numpy array, torch tensor, list) or a
    dict {token_id: logprob} as vLLM returns. In a dict a missing id contributes nothing
    (probability 0), so an answer none of whose ids are present gets -inf.
    """
    if isinstance(logprobs_row, Mapping):
        def lse(ids: Sequence[int]) -> float:
            values = [float(logprobs_row[i]) for i in ids if i in logprobs_row]
            return float(logsumexp(values)) if values else -np.inf
        return lse(yes_ids), lse(no_ids)
    if hasattr(logprobs_row, "detach"):  # torch tensor, without importing torch
        logprobs_row = logprobs_row.detach().float().cpu().numpy()
    row = np.asarray(logprobs_row, dtype=np.float64)
    if row.ndim != 1:
        raise ValueError(f"expected one vocabulary row, got shape {row.shape}")
    return float(logsumexp(row[list(yes_ids)])), float(logsumexp(row[list(no_ids)]))
