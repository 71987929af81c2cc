"""Prefix reuse for the transformers engine: questions about one image share everything up to
the question (the chat header, the image's tokens), and caption-only questions about one caption
share the header, the instruction and the quoted caption; that prefix is run through the model
once and only each question's suffix runs against the cached state, batched.

vLLM does this with its prefix cache; the hf engine did the image's (or caption's) work again for
every question (the demo asks 5-10 per image). The cached state is whatever the model's cache holds:
attention keys and values, and for Qwen3.5's linear-attention layers their convolution and
recurrent states, which continue exactly from the prefix (transformers' chunked gated-delta
rule takes an initial state). Suffixes are right-padded: a causal model's last real token
never sees the padding after it (left padding between prefix and suffix would decay the
recurrent state). Positions continue from the prefix's multimodal rope offsets.

Families checked to give the no-reuse answers (within 1e-6 in float32; tests/test_hf_prefix_reuse.py):
Qwen3.5, Qwen3-VL, Qwen2-VL, Qwen2.5-VL. Other families take the plain path.
"""
from __future__ import annotations

import copy
import inspect
from collections.abc import Sequence

import torch

from operators.engines.base import Prompt

REUSE_FAMILIES = frozenset({"qwen3_5", "qwen3_vl", "qwen2_vl", "qwen2_5_vl"})
# Per-token inputs a processor returns beside input_ids: cut to the prefix with it.
TOKEN_ALIGNED = ("input_ids", "attention_mask", "mm_token_type_ids", "token_type_ids")
# Caption-only prompts share a prefix only when it skips at least this many tokens per prompt:
# below it, the extra forward pass for the prefix costs about what it saves.
MIN_SHARED_TOKENS = 16


def supports_reuse(model) -> bool:
    return getattr(model.config, "model_type", None) in REUSE_FAMILIES and getattr(model.config, "image_token_id", None) is not None


def shared_image_groups(prompts: Sequence[Prompt]) -> tuple[list[list[int]], list[int]]:
    """Indices of image prompts grouped by (image, system turn), groups of two or more; and the rest."""
    groups: dict[tuple, list[int]] = {}
    rest: list[int] = []
    for i, p in enumerate(prompts):
        if p.image is None:
            rest.append(i)
        else:
            groups.setdefault((p.image_id or id(p.image), p.system), []).append(i)
    shared = [g for g in groups.values() if len(g) > 1]
    rest += [g[0] for g in groups.values() if len(g) == 1]
    return shared, sorted(rest)


def shared_text_groups(rows: Sequence[Sequence[int]], min_shared: int) -> list[list[int]]:
    """Text-only prompts (their token ids) grouped so that sharing prefixes saves the most tokens.

    Sorted rows sit next to the rows they share most with; a run of them shares the smallest
    adjacent common prefix. A run is kept whole or cut where its adjacent prefix is smallest
    (every caption shares the chat header, one caption's questions share much more), whichever
    skips more tokens; groups of one, or sharing fewer than `min_shared` tokens, are left out.
    """
    order = sorted(range(len(rows)), key=lambda i: tuple(rows[i]))
    lcp = [common_prefix_length([torch.as_tensor(rows[a]), torch.as_tensor(rows[b])]) for a, b in zip(order, order[1:])]

    def best(lo: int, hi: int) -> tuple[int, list[list[int]]]:  # rows order[lo..hi]; lcp[lo..hi-1]
        if lo == hi:
            return 0, []
        shared = min(lcp[lo:hi])
        whole = (hi - lo) * shared if shared >= min_shared else 0
        cuts = [lo - 1] + [k for k in range(lo, hi) if lcp[k] == shared] + [hi]
        parts = [best(a + 1, b) for a, b in zip(cuts, cuts[1:])]
        if sum(saved for saved, _ in parts) > whole:
            return sum(saved for saved, _ in parts), [g for _, groups in parts for g in groups]
        return whole, ([sorted(order[lo:hi + 1])] if whole else [])

    return best(0, len(rows) - 1)[1] if rows else []


def common_prefix_length(rows: Sequence[torch.Tensor]) -> int:
    """Tokens every row starts with, leaving at least the last token of each row as its suffix."""
    limit = min(len(r) for r in rows) - 1
    first = rows[0]
    for other in rows[1:]:
        same = (other[:limit] == first[:limit]).long()
        limit = int(same.cumprod(0).sum()) if len(same) else 0
    return limit


def expand_cache(cache, n: int):
    """A copy of a batch-of-one cache repeated `n` times along the batch (the original stays
    intact for the next chunk of suffixes). Works on the cache layers' own tensors: the key and
    value tensors of attention layers, the conv/recurrent state dicts of linear-attention ones."""

    def repeat(value):
        if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape[0] == 1:
            return value.repeat_interleave(n, dim=0)
        if isinstance(value, dict):
            return {k: repeat(v) for k, v in value.items()}
        return value

    expanded = copy.copy(cache)
    expanded.layers = []
    for layer in cache.layers:
        twin = copy.copy(layer)
        for name, value in vars(layer).items():
            setattr(twin, name, repeat(value))
        expanded.layers.append(twin)
    return expanded


class PrefixScorer:
    """Runs a group's shared prefix once, then its questions' suffixes in batches; returns the
    next-token logits at each prompt's last token, or None when this group cannot share (its
    image is not entirely inside the common prefix)."""

    def __init__(self, model, pad_token_id: int, batch_size: int):
        self.model, self.pad_token_id, self.batch_size = model, pad_token_id, batch_size
        self.image_token_id = model.config.image_token_id
        params = inspect.signature(model.forward).parameters
        self.cache_arg = "cache" if "cache" in params else "past_key_values"  # transformers >= 5.24 renamed it

    def last_logits(self, inputs) -> list[torch.Tensor] | None:
        """`inputs`: the processor's output for the group's full prompts (left-padded)."""
        mask = inputs["attention_mask"].bool()
        rows = [inputs["input_ids"][r][mask[r]] for r in range(len(mask))]
        length = common_prefix_length(rows)
        pad = mask.shape[1] - len(rows[0])  # the first row's left padding
        prefix = {k: inputs[k][:1, pad:pad + length] for k in TOKEN_ALIGNED if k in inputs}
        prefix["attention_mask"] = torch.ones_like(prefix["input_ids"])
        image_at = (rows[0] == self.image_token_id).nonzero()
        if len(image_at):  # an image prompt: the image must lie inside the prefix
            if int(image_at.max()) >= length or "image_grid_thw" not in inputs:  # Qwen-VL layouts: all patches in one tensor
                return None
            prefix["image_grid_thw"] = inputs["image_grid_thw"][:1]
            prefix["pixel_values"] = inputs["pixel_values"][: int(inputs["image_grid_thw"][0].prod())]  # the first prompt's patches
        with torch.inference_mode():
            out = self.model(**prefix, use_cache=True, logits_to_keep=1)
        cache = getattr(out, self.cache_arg)  # out.past_key_values warns on transformers >= 5.24
        deltas = getattr(self.model.model, "rope_deltas", None)
        if deltas is not None and not len(image_at):  # text only: no offset (the model keeps the last image's)
            deltas = torch.zeros_like(deltas[:1])
        logits: list[torch.Tensor] = []
        for start in range(0, len(rows), self.batch_size):
            logits += self._suffixes([r[length:] for r in rows[start:start + self.batch_size]], cache, deltas, length)
        return logits

    def _suffixes(self, suffixes: list[torch.Tensor], cache, deltas, length: int) -> list[torch.Tensor]:
        n, longest = len(suffixes), max(len(s) for s in suffixes)
        ids = torch.full((n, longest), self.pad_token_id, dtype=suffixes[0].dtype, device=suffixes[0].device)
        mask = torch.zeros((n, length + longest), dtype=torch.long, device=ids.device)
        mask[:, :length] = 1
        for row, suffix in enumerate(suffixes):
            ids[row, : len(suffix)] = suffix
            mask[row, length: length + len(suffix)] = 1
        positions = torch.arange(length, length + longest, device=ids.device)
        kwargs = {}
        if deltas is not None:  # multimodal rope: text after the image continues from the prefix's offset
            kwargs["position_ids"] = positions.view(1, 1, -1).expand(3, n, -1) + deltas.reshape(1, -1, 1)[:, :1].to(ids.device)
        last = torch.tensor([len(s) - 1 for s in suffixes], device=ids.device)
        keep, where = torch.unique(last, return_inverse=True)  # logits only where some row ends
        with torch.inference_mode():
            out = self.model(input_ids=ids, attention_mask=mask, cache_position=positions, use_cache=True, logits_to_keep=keep,
                             **{self.cache_arg: expand_cache(cache, n)}, **kwargs)
        picked = out.logits[torch.arange(n, device=ids.device), where]
        return list(picked.float())
