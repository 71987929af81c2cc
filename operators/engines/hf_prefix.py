"""Prefix reuse for the transformers engine: questions about one image share everything up to
the question (the chat header, the image's tokens), and caption-only questions about one caption
share the header, the instruction and the quoted caption; that prefix is run through the model
once and only each question's suffix runs against the cached state. Within a group, prompts
that share more (an image's questions share their instruction, which its holistic prompt words
otherwise) run that part once more from a copy of the state. Every pass batches the rows of up
to `batch_size` groups that are equally far in: on a CPU a pass pays for reading the weights
(~0.3 s for a 0.8B model) however few its rows.

vLLM does this with its prefix cache; the hf engine did the image's (or caption's) work again for
every question (the demo asks 5-10 per image). The cached state is whatever the model's cache holds:
attention keys and values, and for Qwen3.5's linear-attention layers their convolution and
recurrent states, which continue exactly from the prefix (transformers' chunked gated-delta
rule takes an initial state). Suffixes are right-padded: a causal model's last real token
never sees the padding after it (left padding between prefix and suffix would decay the
recurrent state). Positions continue from the prefix's multimodal rope offsets.

Batch-invariant mode (`row_alone`, the hf engine's default on a CPU) keeps the reuse but cuts
it per prompt: the prefix ends where the image does and every pass runs one row.

Families checked to give the no-reuse answers (within 1e-6 in float32; tests/test_hf_prefix_reuse.py):
Qwen3.5, Qwen3-VL, Qwen2-VL, Qwen2.5-VL. Other families take the plain path.
"""
from __future__ import annotations

import copy
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import torch

from operators.engines.base import Prompt

T = TypeVar("T")

REUSE_FAMILIES = frozenset({"qwen3_5", "qwen3_vl", "qwen2_vl", "qwen2_5_vl"})
# Per-token inputs a processor returns beside input_ids: cut to the prefix with it.
TOKEN_ALIGNED = ("input_ids", "attention_mask", "mm_token_type_ids", "token_type_ids")
# Caption-only prompts share a prefix only when it skips at least this many tokens per prompt:
# below it, the extra forward pass for the prefix costs about what it saves.
MIN_SHARED_TOKENS = 16
# Within a group, rows whose rests share this many more tokens extend a copy of the prefix's
# cache by them (one more row in a pass) instead of each running them: a row costs about 8
# tokens' work beyond its tokens (its state's copy, the linear-attention chunk it fills).
MIN_EXTENSION_TOKENS = 8


def supports_reuse(model) -> bool:
    return getattr(model.config, "model_type", None) in REUSE_FAMILIES and getattr(model.config, "image_token_id", None) is not None


def shared_image_groups(prompts: Sequence[Prompt], min_size: int = 2) -> tuple[list[list[int]], list[int]]:
    """Indices of image prompts grouped by (image, system turn), groups of `min_size` or more; and the rest."""
    groups: dict[tuple, list[int]] = {}
    rest: list[int] = []
    for i, p in enumerate(prompts):
        if p.image is None:
            rest.append(i)
        else:
            groups.setdefault((p.image_id or id(p.image), p.system), []).append(i)
    shared = [g for g in groups.values() if len(g) >= min_size]
    rest += [i for g in groups.values() if len(g) < min_size for i in g]
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


def first_image_only(inputs):
    """A group's processor output keeping only its first prompt's image patches (Qwen-VL layout:
    every prompt's patches in one tensor): the group's prompts share the image, and the prefix
    pass needs it once (the others' copies would only hold memory while the other groups are
    encoded). Keeping them already trimmed changes nothing."""
    if "image_grid_thw" in inputs and len(inputs["image_grid_thw"]) > 1:
        inputs["pixel_values"] = inputs["pixel_values"][: int(inputs["image_grid_thw"][0].prod())].clone()
        inputs["image_grid_thw"] = inputs["image_grid_thw"][:1]
    return inputs


def gather_cache(rows: Sequence[tuple[Bank, int]]):
    """A new cache whose i-th row is row `rows[i][1]` of bank `rows[i][0]` (banks of one model,
    the same length). Works on the cache layers' own tensors: the key and value tensors of
    attention layers, the conv/recurrent state dicts of linear-attention ones; the banks stay
    intact for the next rows that go on from them."""

    def gather(values: list[tuple[object, int, int]]):  # (a bank's value, the bank's rows, the row wanted)
        first, size, _ = values[0]
        if isinstance(first, torch.Tensor) and first.dim() > 0 and first.shape[0] == size:
            return torch.cat([value[row:row + 1] for value, _, row in values])
        if isinstance(first, dict):
            return {k: gather([(value[k], n, row) for value, n, row in values]) for k in first}
        return first

    template = rows[0][0].cache
    gathered = copy.copy(template)
    gathered.layers = []
    for index, layer in enumerate(template.layers):
        twin = copy.copy(layer)
        for name in vars(layer):
            setattr(twin, name, gather([(vars(bank.cache.layers[index])[name], bank.rows, row) for bank, row in rows]))
        gathered.layers.append(twin)
    return gathered


@dataclass
class Bank:
    """A cache computed for `rows` rows at once (the prefixes of several groups, or their extensions)."""

    cache: object
    rows: int


@dataclass
class Prefix:
    """What group `group`'s prompts (`rows`, unpadded) share: `length` tokens, as model inputs."""

    group: int
    length: int
    rows: list[torch.Tensor]
    inputs: dict


@dataclass
class Node:
    """Prompts that go on from one cached state: row `row` of `bank`, `length` tokens in; each
    rest goes to `targets` (group, prompt in the group)."""

    bank: Bank
    row: int
    length: int
    delta: torch.Tensor | None  # the row's multimodal rope offset (None: the model keeps none)
    rests: list[torch.Tensor]
    targets: list[tuple[int, int]]


def buckets(items: Sequence[T], key: Callable[[T], object], size: int) -> list[list[T]]:
    """`items` cut into lists of at most `size` that agree on `key`, in first-seen order."""
    by_key: dict[object, list[T]] = {}
    for item in items:
        by_key.setdefault(key(item), []).append(item)
    return [same[start:start + size] for same in by_key.values() for start in range(0, len(same), size)]


class PrefixScorer:
    """Runs the groups' shared prefixes once each, then what follows them, level by level: rows
    of a group whose rests share a start again (an image's questions, beside its holistic prompt
    worded otherwise) extend a copy of the cache by that start; the last level runs each
    prompt's own suffix. Up to `batch_size` groups whose prefixes are equally long go together,
    and each level's passes batch their rows that are equally far in (on a CPU a forward pass
    costs ~0.3 s for the weights it reads, whatever its rows).

    `row_alone`: every pass runs one row, and an image group's prefix ends where its image
    does: where a prompt's computation splits and what shapes it runs in then follow from the
    prompt alone, never from which other prompts share its call (batch-invariant answers)."""

    def __init__(self, model, pad_token_id: int, batch_size: int, row_alone: bool = False):
        self.model, self.pad_token_id, self.row_alone = model, pad_token_id, row_alone
        self.batch_size = 1 if row_alone else batch_size
        self.image_token_id = model.config.image_token_id
        params = inspect.signature(model.forward).parameters
        self.cache_arg = "cache" if "cache" in params else "past_key_values"  # transformers >= 5.24 renamed it

    def last_logits(self, groups: Sequence) -> list[list[torch.Tensor] | None]:
        """`groups`: the processor's output for each group's full prompts (left-padded). Returns
        per group the next-token logits at each prompt's last token, or None where the group
        cannot share (its image is not entirely inside the common prefix)."""
        out: list[list[torch.Tensor] | None] = [None] * len(groups)
        starts = [start for start in (self._prefix(g, inputs) for g, inputs in enumerate(groups)) if start is not None]
        for start in starts:
            out[start.group] = [None] * len(start.rows)
        # `batch_size` groups of one prefix length at a time, each run to its end: the cached
        # states alive at once are theirs (a row of Qwen3.5-0.8B's is ~20 MB)
        for chunk in buckets(starts, lambda s: (s.length, "pixel_values" in s.inputs), self.batch_size):
            batch = {k: torch.cat([start.inputs[k] for start in chunk]) for k in chunk[0].inputs}
            with torch.inference_mode():
                result = self.model(**batch, use_cache=True, logits_to_keep=1)
            bank = Bank(getattr(result, self.cache_arg), len(chunk))  # result.past_key_values warns on transformers >= 5.24
            deltas = [None] * len(chunk)
            if hasattr(self.model.model, "rope_deltas"):  # text only: no offset (the model keeps the last image's)
                deltas = self.model.model.rope_deltas.reshape(-1) if "pixel_values" in batch else torch.zeros(len(chunk), dtype=torch.long)
            nodes = [Node(bank, i, s.length, deltas[i], [r[s.length:] for r in s.rows], [(s.group, k) for k in range(len(s.rows))])
                     for i, s in enumerate(chunk)]
            while nodes:
                nodes = self._level(nodes, out)
        return out

    def _prefix(self, group: int, inputs) -> Prefix | None:
        """A group's shared prefix; None when the image is not all inside it."""
        mask = inputs["attention_mask"].bool()
        rows = [inputs["input_ids"][r][mask[r]] for r in range(len(mask))]
        length = common_prefix_length(rows)
        image_at = (rows[0] == self.image_token_id).nonzero()
        if self.row_alone:  # the prefix is the prompt's own: through its image, nothing of its neighbours'
            if not len(image_at) or int(image_at.max()) >= length:
                return None
            length = int(image_at.max()) + 1
        pad = mask.shape[1] - len(rows[0])  # the first row's left padding
        prefix = {k: inputs[k][:1, pad:pad + length] for k in TOKEN_ALIGNED if k in inputs}
        prefix["attention_mask"] = torch.ones_like(prefix["input_ids"])
        if len(image_at):  # an image prompt: the image must lie inside the prefix
            if int(image_at.max()) >= length or "image_grid_thw" not in inputs:  # Qwen-VL layouts: all patches in one tensor
                return None
            first = first_image_only(inputs)
            prefix["image_grid_thw"], prefix["pixel_values"] = first["image_grid_thw"], first["pixel_values"]
        return Prefix(group, length, rows, prefix)

    def _level(self, nodes: list[Node], out: list) -> list[Node]:
        """One level: the extensions of every node's subgroups (returned as the next level's
        nodes) and every lone rest's suffix (its logits written to `out`)."""
        extensions, suffixes = [], []
        for node in nodes:
            extend = len(node.rests) > 2 and not self.row_alone  # how its rests split would depend on its neighbours
            subgroups = shared_text_groups([r.tolist() for r in node.rests], MIN_EXTENSION_TOKENS) if extend else []
            for group in subgroups:
                shared = common_prefix_length([node.rests[k] for k in group])
                extensions.append((node, node.rests[group[0]][:shared], [node.rests[k][shared:] for k in group], [node.targets[k] for k in group]))
            taken = {k for group in subgroups for k in group}
            suffixes += [(node, rest, target) for k, (rest, target) in enumerate(zip(node.rests, node.targets)) if k not in taken]
        children = []
        for chunk in buckets(extensions, lambda e: (e[0].length, len(e[1])), self.batch_size):
            cache, _ = self._run([node for node, *_ in chunk], [tokens for _, tokens, *_ in chunk])
            bank = Bank(cache, len(chunk))
            children += [Node(bank, i, node.length + len(tokens), node.delta, rests, targets) for i, (node, tokens, rests, targets) in enumerate(chunk)]
        for chunk in buckets(suffixes, lambda s: s[0].length, self.batch_size):
            _, logits = self._run([node for node, _, _ in chunk], [rest for _, rest, _ in chunk])
            for (_, _, (g, k)), row_logits in zip(chunk, logits, strict=True):
                out[g][k] = row_logits
        return children

    def _run(self, parents: list[Node], segments: list[torch.Tensor]) -> tuple[object, list[torch.Tensor]]:
        """Each segment run on from its parent's state (all `length` tokens in), right-padded:
        a causal model's last real token never sees the padding after it (left padding between
        prefix and segment would decay the recurrent state). Returns the extended cache (whole
        only where no row was padded) and the next-token logits at each segment's last token."""
        n, longest, length = len(segments), max(len(s) for s in segments), parents[0].length
        ids = torch.full((n, longest), self.pad_token_id, dtype=segments[0].dtype, device=segments[0].device)
        mask = torch.zeros((n, length + longest), dtype=torch.long, device=ids.device)
        mask[:, :length] = 1
        for row, segment in enumerate(segments):
            ids[row, : len(segment)] = segment
            mask[row, length: length + len(segment)] = 1
        positions = torch.arange(length, length + longest, device=ids.device)
        rope = {}
        if parents[0].delta is not None:  # multimodal rope: text after the image continues from each row's offset
            deltas = torch.stack([p.delta for p in parents]).to(ids.device)
            rope["position_ids"] = positions.view(1, 1, -1).expand(3, n, -1) + deltas.view(1, -1, 1)
        last = torch.tensor([len(s) - 1 for s in segments], device=ids.device)
        keep, where = torch.unique(last, return_inverse=True)  # logits only where some row ends
        cache = gather_cache([(p.bank, p.row) for p in parents])
        with torch.inference_mode():
            result = self.model(input_ids=ids, attention_mask=mask, cache_position=positions, use_cache=True, logits_to_keep=keep,
                                **{self.cache_arg: cache}, **rope)
        picked = result.logits[torch.arange(n, device=ids.device), where]
        return getattr(result, self.cache_arg), list(picked.float())
