"""Transformers engine: any `AutoModelForImageTextToText` checkpoint, one forward pass per batch.

Slower than vLLM but needs nothing beyond transformers, so it runs on a laptop CPU and in
CI (with `builtin:tiny-vlm`). Batches are left-padded so the last position of every row is
the model's next-token prediction for that row.

On a CPU each prompt runs alone by default (`engine_options.batch_invariant`): no row is padded
to a neighbour's length and no computation is split by what else shares the call, so the same
request gives the same bits in any batch (docs/engines.md, "Batch composition").

Weights load in `spec.dtype` on GPU and in float32 on CPU (bfloat16 matmuls on CPU are slow
and coarse); `engine_options: {cpu_dtype: bfloat16}` overrides the CPU choice.
"""
from __future__ import annotations

import gc
import logging
from collections.abc import Iterator, Sequence

import numpy as np
import torch
from transformers import AutoModelForImageTextToText, AutoProcessor

from operators.engines.base import Prompt
from operators.engines.hf_prefix import (
    MIN_SHARED_TOKENS,
    PrefixScorer,
    first_image_only,
    shared_image_groups,
    shared_text_groups,
    supports_reuse,
)
from operators.engines.spec import BackboneSpec
from operators.engines.yesno import multi_token_spellings, render_prompt, yes_no_logprobs, yes_no_token_ids
from operators.images import fit_pixels
from operators.tiny_models import resolve_model_id

log = logging.getLogger(__name__)


class HFEngine:
    def __init__(self, spec: BackboneSpec, device: str | None = None):
        self.spec = spec
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        dtype = spec.dtype if self.device.type == "cuda" else spec.engine_options.get("cpu_dtype", "float32")
        path = resolve_model_id(spec.model_id)
        self.processor = AutoProcessor.from_pretrained(
            path, revision=spec.revision, trust_remote_code=spec.trust_remote_code
        )
        self.tokenizer = self.processor.tokenizer
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.model = AutoModelForImageTextToText.from_pretrained(
            path, revision=spec.revision, dtype=getattr(torch, dtype), trust_remote_code=spec.trust_remote_code
        ).to(self.device).eval()
        self.yes_ids, self.no_ids = yes_no_token_ids(self.tokenizer, spec.yes_spellings, spec.no_spellings)
        self.multi_token_spellings = multi_token_spellings(self.tokenizer, [*spec.yes_spellings, *spec.no_spellings])
        self.prompt_tokens = 0  # prompt tokens scored so far (image tokens included): for throughput reports
        text_config = self.model.config.get_text_config()
        self.max_prompt_tokens = spec.max_prompt_tokens or getattr(text_config, "max_position_embeddings", None)
        # Questions about one image, or about one caption without the image, run their shared prefix
        # once (operators/engines/hf_prefix.py), where the family is known to give the same answers;
        # engine_options: {prefix_reuse: false} turns it off.
        self.prefix_reuse = bool(spec.engine_options.get("prefix_reuse", True)) and supports_reuse(self.model)
        # Each prompt computed in shapes that follow from it alone (a batch of one, no padding, its
        # own prefix split): the same request gives the same bits whatever else shares its call.
        # On by default on a CPU, where it costs ~1.3x for a 0.8B model and ~2x for the tiny ones
        # (docs/engines.md); a GPU lives on batching.
        self.batch_invariant = bool(spec.engine_options.get("batch_invariant", self.device.type == "cpu"))
        self.prefix_scorer = (PrefixScorer(self.model, self.tokenizer.pad_token_id, spec.batch_size, row_alone=self.batch_invariant)
                              if self.prefix_reuse else None)
        if spec.engine_options.get("prefix_reuse", True) and not self.prefix_reuse:
            log.info("%s: no image-prefix reuse for model type %s (each question runs its image again)",
                     spec.name, getattr(self.model.config, "model_type", "?"))

    def prompt_lengths(self, prompts: Sequence[Prompt]) -> list[int]:
        """Input tokens per prompt: the rendered text's tokens plus each image's expansion
        (measured once per distinct image), without running the model."""
        texts = [render_prompt(self.processor, p, self.spec.chat_template_kwargs, self.spec.assistant_prefix) for p in prompts]
        lengths = [len(ids) for ids in self.tokenizer(texts, add_special_tokens=False)["input_ids"]]
        expansion: dict = {}
        for i, p in enumerate(prompts):
            if p.image is not None:
                key = p.image_id or id(p.image)
                if key not in expansion:
                    expansion[key] = self._image_tokens(p.image)
                lengths[i] += expansion[key]
        return lengths

    def _image_tokens(self, image) -> int:
        """How many tokens an image adds beyond its placeholder in the chat text."""
        text = render_prompt(self.processor, Prompt(user="", image=image), self.spec.chat_template_kwargs, self.spec.assistant_prefix)
        fitted = fit_pixels(image, self.spec.max_image_pixels, self.spec.min_image_pixels)
        with_image = self.processor(text=[text], images=[fitted], add_special_tokens=False)["input_ids"][0]
        return len(with_image) - len(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def score_yes_no(self, prompts: Sequence[Prompt]) -> np.ndarray:
        out = np.empty((len(prompts), 2), dtype=np.float64)
        plain = list(range(len(prompts)))
        if self.prefix_reuse:
            # batch-invariant: every image prompt goes through its image's prefix, even alone in
            # its call; caption-only prompts, whose shared start depends on their neighbours, run whole
            groups, plain = shared_image_groups(prompts, min_size=1 if self.batch_invariant else 2)
            caption_only = [] if self.batch_invariant else [i for i in plain if prompts[i].image is None]
            text_groups = self._shared_caption_groups(prompts, caption_only)
            plain = sorted(set(plain) - {i for g in text_groups for i in g})
            plain += self._score_shared(prompts, groups + text_groups, out)
        for batch in self._batches([prompts[i] for i in plain], invariant=self.batch_invariant):
            indices = [plain[b] for b in batch]
            inputs = self._encode([prompts[i] for i in indices])
            self.prompt_tokens += int(inputs["attention_mask"].sum())
            with torch.inference_mode():
                logits = self.model(**inputs, logits_to_keep=1).logits[:, -1, :]
            self._read(logits, indices, out)
        return out

    def _shared_caption_groups(self, prompts: Sequence[Prompt], text_only: list[int]) -> list[list[int]]:
        """Caption-only prompts that share a long start (one caption's questions), as indices."""
        texts = [render_prompt(self.processor, prompts[i], self.spec.chat_template_kwargs, self.spec.assistant_prefix) for i in text_only]
        rows = self.tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else []
        return [[text_only[k] for k in group] for group in shared_text_groups(rows, MIN_SHARED_TOKENS)]

    def _score_shared(self, prompts: Sequence[Prompt], groups: list[list[int]], out: np.ndarray) -> list[int]:
        """Each image's (or caption's) questions through their shared prefix, all groups' passes
        batched together; returns the prompts of groups that cannot share it."""
        encoded = [first_image_only(self._encode([prompts[i] for i in group])) for group in groups]
        unshared: list[int] = []
        for group, inputs, logits in zip(groups, encoded, self.prefix_scorer.last_logits(encoded), strict=True):
            if logits is None:
                unshared += group
                continue
            self.prompt_tokens += int(inputs["attention_mask"].sum())  # tokens answered for, as without reuse
            self._read(torch.stack(logits), group, out)
        return unshared

    def _read(self, logits: torch.Tensor, indices: Sequence[int], out: np.ndarray) -> None:
        logprobs = torch.log_softmax(logits.float(), dim=-1).cpu().numpy()
        for row, i in zip(logprobs, indices, strict=True):
            out[i] = yes_no_logprobs(row, self.yes_ids, self.no_ids)

    def generate(self, prompts: Sequence[Prompt], max_new_tokens: int) -> list[str]:
        texts: list[str] = [""] * len(prompts)
        for indices in self._batches(prompts):
            inputs = self._encode([prompts[i] for i in indices])
            with torch.inference_mode():
                tokens = self.model.generate(
                    **inputs, max_new_tokens=max_new_tokens, do_sample=False,
                    temperature=None, top_p=None, top_k=None,
                )
            new_tokens = tokens[:, inputs["input_ids"].shape[1]:]
            for text, i in zip(self.tokenizer.batch_decode(new_tokens, skip_special_tokens=True), indices, strict=True):
                texts[i] = text
        return texts

    def close(self) -> None:
        self.model = None
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def _batches(self, prompts: Sequence[Prompt], invariant: bool = False) -> Iterator[list[int]]:
        """Indices in batches of `batch_size` (of one when `invariant`: no row padded to a
        neighbour's length); caption-only and image prompts never share one.

        Within each kind, prompts are ordered by length so that a long prompt is padded
        against prompts of its own length, not the other way round.
        """
        size = 1 if invariant else self.spec.batch_size
        for with_image in (False, True):
            group = [i for i, p in enumerate(prompts) if (p.image is not None) == with_image]
            group.sort(key=lambda i: (len(prompts[i].user) + len(prompts[i].system or ""), i))
            for start in range(0, len(group), size):
                yield group[start:start + size]

    def _encode(self, prompts: Sequence[Prompt]):
        texts = [
            render_prompt(self.processor, p, self.spec.chat_template_kwargs, self.spec.assistant_prefix)
            for p in prompts
        ]
        # One list of images per prompt: processors that batch several images per prompt
        # (Gemma-4) read a flat list as ONE prompt's images and reject any batch above 1.
        images = [
            [fit_pixels(p.image, self.spec.max_image_pixels, self.spec.min_image_pixels)]
            for p in prompts if p.image is not None
        ]
        # The chat template already wrote any BOS; the tokenizer must not add a second one.
        inputs = self.processor(
            text=texts, images=images or None, padding=True, add_special_tokens=False, return_tensors="pt"
        )
        return inputs.to(self.device, dtype=self.model.dtype)
