"""`builtin:micro-vlm`: a Qwen3-VL trained from scratch on the demo world, to be shipped in the package.

A real transformers `Qwen3VLForConditionalGeneration` (text head_dim 32, so vLLM's CPU build runs
it as well), with a byte-level BPE tokenizer trained on the demo's vocabulary and the project's
prompts ("Yes" and "No" are single tokens) and the tiny builtins' ChatML template with a BOS. It
is trained on exactly the three yes/no request kinds the pipeline sends — image + question,
caption alone + question, holistic "does this figure show <caption>" — rendered by the
project's own templates (conf/prompts) and chat template, with the loss on the answer token.

What makes the image path learn (the feasibility probes' notes): one merged visual token per
grid cell (96 px images: 6x6 patches of 16 px, merged 2x2 -> 3x3 tokens), an auxiliary loss
that asks each merged token what is in its cell (shape and colour; the auxiliary head is
dropped at save time, so the saved model is a plain Qwen3-VL), image questions first, and
balanced answers per fact type with hard negatives (`operators.demo_world.WorldSampler`).

Training images go through a table of each cell's pixel patches, built once through the real
path (PNG bytes -> `operators.images.decode_image` -> `fit_pixels` -> the processor): a cell's
patches depend only on what is in that cell (the resampling filter never reaches across a cell
border, where the demo's shapes leave background), and `PixelTable.check` compares whole scenes
against the real path.

Once saved under operators/weights/micro_vlm, `operators.tiny_models` resolves `builtin:micro-vlm` to
that folder and keys its answers by the files' hash. How the shipped weights were trained and what they
reach: jobs/micro_vlm.py.

Pure: torch and transformers, no Ray, no pipeline. `jobs/micro_vlm.py train` runs `train` (with
the prompt templates from conf/prompts); `jobs/micro_vlm.py evaluate` (pipeline/micro_vlm_training.py)
measures the result through an engine.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import statistics
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from operators import demo_views, demo_world, micro_vlm_writing
from operators.engines.base import Prompt
from operators.micro_vlm_writing import ImagePlaceholder
from operators.prompts import fill
from operators.run_folders import CHECKPOINT, TRAINER_STATE, check_writable, save_checkpoint
from operators.views import MASKED_VIEWS

IMAGE_SIDE = 96  # 6x6 patches of 16 px, merged 2x2: one visual token per grid cell
MAX_IMAGE_PIXELS = IMAGE_SIDE * IMAGE_SIDE  # conf/backbones/micro.yaml: what the pipeline sends
MIN_IMAGE_PIXELS = 32 * 32
PATCH, MERGE = 16, 2
CELL_CLASSES = len(demo_world.SHAPES) + 1  # per cell: one of the shapes or empty (and one of the colours or none)
TEMPLATE_OF_KIND = {"image": "answer_image", "caption": "answer_caption", "holistic": "holistic", "claim": "claim"}
# What a training step can draw: the world's request kinds, claims on the scene, claims on a masked view
TRAINED_KINDS = (*demo_world.REQUEST_KINDS, "claim", "view")
YES, NO = "Yes", "No"
# Warm-up prompts: the question alone, so that the answer position sits next to the words it binds.
SHORT_TEMPLATES = {"answer_image": "{question}", "holistic": "{caption}?"}


# ---------------------------------------------------------------------------- building


def tokenizer_corpus(templates: Mapping[str, str], seed: int = 0, n: int = 1500, writing: bool = False) -> list[str]:
    """Prompts of every kind, filled with sampled demo captions and questions, plus the answers;
    with `writing`, the writing lessons too (so that every template and answer word is one token)."""
    from operators.tiny_models import ANSWER_WORDS, _training_corpus

    sampler = demo_world.WorldSampler(seed, "train")
    lines = []
    for _ in range(n):
        for kind in demo_world.REQUEST_KINDS:
            lines.append(request_text(sampler.request(kind), templates))
    for _ in range(n // 3 if writing else 0):  # the writing lessons' prompts and answers, every kind
        for kind in micro_vlm_writing.WRITE_KINDS:
            lesson = micro_vlm_writing.draw_lesson(sampler, kind, open_share=0.25, refusal_share=0.05)
            lines += [fill(templates[micro_vlm_writing.TEMPLATES[kind]], caption=lesson.caption), lesson.answer]
    # Yes and No must stay single tokens however much text the corpus holds
    lines += [f"{word} {word}" for word in ANSWER_WORDS for _ in range(20 if not writing else len(lines) // 4)]
    lines += [f"{t} " * 3 for t in templates.values()]  # every template word, also the unused kinds'
    lines += ["<|im_start|>user\n", "<|im_start|>assistant\n", "<|im_start|>system\n"] * 50  # the chat roles
    return lines + _training_corpus()


def request_text(request: demo_world.WorldRequest, templates: Mapping[str, str]) -> str:
    """The user text of a request, filled exactly as operators.answering fills it."""
    template = templates[TEMPLATE_OF_KIND[request.kind]]
    if request.kind == "image":
        return fill(template, question=request.question)
    if request.kind == "caption":
        return fill(template, question=request.question, caption=request.caption)
    if request.kind == "claim":
        return fill(template, claim=request.question)
    return fill(template, caption=request.caption)


def build_processor(templates: Mapping[str, str], seed: int = 0, writing: bool = False):
    from transformers import Qwen2VLImageProcessor, Qwen3VLProcessor, Qwen3VLVideoProcessor

    from operators.tiny_models import BOS_CHAT_TEMPLATE, _train_tokenizer

    tokenizer = _train_tokenizer(tokenizer_corpus(templates, seed, writing=writing), vocab_size=2048 if writing else 512)
    tokenizer.bos_token = "<|endoftext|>"
    return Qwen3VLProcessor(
        image_processor=Qwen2VLImageProcessor(
            patch_size=PATCH, merge_size=MERGE,
            # never shrinks what the pipeline sends (fit_pixels already did, to MAX_IMAGE_PIXELS)
            size={"shortest_edge": MIN_IMAGE_PIXELS, "longest_edge": 65536},
        ),
        tokenizer=tokenizer,
        video_processor=Qwen3VLVideoProcessor(),
        chat_template=BOS_CHAT_TEMPLATE,
    )


def build_model(processor, seed: int = 0, hidden: int = 128, layers: int = 4, vision_hidden: int = 64, vision_depth: int = 2):
    import torch
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    tokenizer = processor.tokenizer
    token_id = tokenizer.convert_tokens_to_ids
    head_dim = 32  # vLLM's CPU attention needs >= 32
    text = {
        "vocab_size": (len(tokenizer) + 63) // 64 * 64,
        "hidden_size": hidden,
        "intermediate_size": 3 * hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": hidden // head_dim,
        "num_key_value_heads": max(1, hidden // head_dim // 2),
        "head_dim": head_dim,
        "max_position_embeddings": 2048,
        "tie_word_embeddings": True,
        # mrope_section sums to head_dim / 2
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [6, 5, 5], "mrope_interleaved": True},
        "bos_token_id": token_id("<|endoftext|>"),
        "eos_token_id": token_id("<|im_end|>"),
        "pad_token_id": token_id("<|endoftext|>"),
    }
    vision = {
        "depth": vision_depth, "hidden_size": vision_hidden, "intermediate_size": 2 * vision_hidden, "num_heads": vision_hidden // 32,
        "patch_size": PATCH, "spatial_merge_size": MERGE, "temporal_patch_size": 2, "out_hidden_size": hidden,
        "num_position_embeddings": 36, "deepstack_visual_indexes": [0],
    }
    config = Qwen3VLConfig(
        text_config=text, vision_config=vision, tie_word_embeddings=True,
        image_token_id=token_id("<|image_pad|>"), video_token_id=token_id("<|video_pad|>"),
        vision_start_token_id=token_id("<|vision_start|>"), vision_end_token_id=token_id("<|vision_end|>"),
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3VLForConditionalGeneration(config)
    model.generation_config.eos_token_id = token_id("<|im_end|>")
    model.generation_config.pad_token_id = token_id("<|endoftext|>")
    return model


def deepen(model, layers: int) -> None:
    """Give a trained model `layers` text layers without changing what it computes: each new layer
    is a copy of the last with its output projections (attention's o_proj, the MLP's down_proj)
    zeroed, so it adds nothing to the residual stream until training moves them. More depth for a
    model at its capacity (micro-writer on captions that name one shape twice) without starting
    over; appended after the existing layers, so the vision tower's deepstack inputs stay where they are."""
    import copy

    import torch

    stack = model.model.language_model.layers
    have = len(stack)
    if layers < have:
        raise ValueError(f"layers={layers} would remove layers of a model that has {have}")
    text_config = model.config.text_config
    for index in range(have, layers):
        layer = copy.deepcopy(stack[have - 1])
        layer.self_attn.layer_idx = index  # its own slot in the key-value cache
        for projection in (layer.self_attn.o_proj, layer.mlp.down_proj):
            torch.nn.init.zeros_(projection.weight)
            if projection.bias is not None:
                torch.nn.init.zeros_(projection.bias)
        stack.append(layer)
    text_config.num_hidden_layers = layers
    if getattr(text_config, "layer_types", None):
        text_config.layer_types = list(text_config.layer_types) + [text_config.layer_types[-1]] * (layers - have)


# ---------------------------------------------------------------------------- pixels


def real_pixel_values(scene: demo_world.Scene, image_processor):
    """What an engine feeds the model for a demo scene: PNG bytes, decoded, fitted, processed."""
    return _processed(demo_world.png_bytes(demo_world.render(scene)), image_processor)


def view_pixel_values(view: demo_views.SceneView, image_processor):
    """What an engine feeds the model for a masked view: the view stage's PNG, decoded, fitted, processed."""
    from operators.views import png_bytes

    return _processed(png_bytes(view.pixels()), image_processor)


def _processed(png: bytes, image_processor):
    from operators.images import decode_image, fit_pixels

    image = fit_pixels(decode_image(png, "scene.png"), MAX_IMAGE_PIXELS, MIN_IMAGE_PIXELS)
    out = image_processor(images=[image], return_tensors="pt")
    return out["pixel_values"], out["image_grid_thw"]


class PixelTable:
    """Each grid cell's patch rows for each thing that can be in it (or nothing), so that a
    scene's pixel values are a gather instead of a render + resize + processor call."""

    def __init__(self, image_processor):
        import torch

        self.image_processor = image_processor
        empty, grid = real_pixel_values((), image_processor)
        if grid.tolist() != [[1, IMAGE_SIDE // PATCH, IMAGE_SIDE // PATCH]]:
            raise RuntimeError(f"micro VLM images must be {IMAGE_SIDE} px squares; the processor made grid {grid.tolist()}")
        per_cell = MERGE * MERGE  # patch rows per merged token; merged tokens run over cells in row-major order
        self.things = [(s, c) for s in demo_world.SHAPES for c in demo_world.COLOURS]
        table = torch.empty(9, len(self.things) + 1, per_cell, empty.shape[1])
        for cell in range(9):
            table[cell, 0] = empty[cell * per_cell:(cell + 1) * per_cell]
        for t, (shape, colour) in enumerate(self.things, start=1):
            full, _ = real_pixel_values(tuple(demo_world.SceneObject(shape, colour, cell // 3, cell % 3) for cell in range(9)), image_processor)
            for cell in range(9):
                table[cell, t] = full[cell * per_cell:(cell + 1) * per_cell]
        self.table = table
        self.index = {thing: t for t, thing in enumerate(self.things, start=1)}

    def cells(self, scene: demo_world.Scene) -> list[int]:
        """Per cell (row-major): 0 for empty, else 1 + the thing's index."""
        out = [0] * 9
        for obj in scene:
            out[obj.row * 3 + obj.col] = self.index[obj.shape, obj.colour]
        return out

    def pixel_values(self, scenes: Sequence[demo_world.Scene]):
        import torch

        cells = torch.tensor([self.cells(s) for s in scenes])  # (n, 9)
        rows = self.table[torch.arange(9)[None, :], cells]  # (n, 9, per_cell, dim)
        grid = torch.tensor([[1, IMAGE_SIDE // PATCH, IMAGE_SIDE // PATCH]] * len(scenes))
        return rows.reshape(-1, rows.shape[-1]), grid

    def check(self, scenes: Sequence[demo_world.Scene]) -> float:
        """Largest difference between the table's pixel values and the real path's."""
        worst = 0.0
        for scene in scenes:
            real, _ = real_pixel_values(scene, self.image_processor)
            mine, _ = self.pixel_values([scene])
            worst = max(worst, float((real - mine).abs().max()))
        return worst


# ---------------------------------------------------------------------------- batches


def focus_cells(request: demo_world.WorldRequest) -> list[float]:
    """Training-only targets for the answer position: which cells hold the asked thing (9), and
    which hold a spatial question's other thing (9). Holistic requests: the caption's things."""
    subject, other = [0.0] * 9, [0.0] * 9
    if request.scene is None:
        return subject + other
    for fact in request.facts:
        for obj in demo_world._matching(request.scene, fact.shape, fact.colour):
            subject[obj.row * 3 + obj.col] = 1.0
        if fact.other is not None:
            for obj in demo_world._matching(request.scene, *fact.other):
                other[obj.row * 3 + obj.col] = 1.0
    return subject + other


class Encoder:
    """Requests -> the model's inputs, the same ids the processor makes from the rendered chat."""

    def __init__(self, processor, templates: Mapping[str, str], pixels: PixelTable):
        self.processor, self.templates, self.pixels = processor, dict(templates), pixels
        tok = processor.tokenizer
        self.pad = tok.convert_tokens_to_ids("<|endoftext|>")
        self.image_token = tok.convert_tokens_to_ids("<|image_pad|>")
        self.yes, self.no = tok.convert_tokens_to_ids(YES), tok.convert_tokens_to_ids(NO)
        if tok.encode(YES, add_special_tokens=False) != [self.yes] or tok.encode(NO, add_special_tokens=False) != [self.no]:
            raise RuntimeError("Yes/No must be single tokens")
        self._ids: dict[tuple[str, bool], list[int]] = {}
        one = {}
        for word in (*demo_world.SHAPES, *demo_world.COLOURS):
            for form in {word, word + "s"} if word in demo_world.SHAPES else {word}:
                ids = tok.encode(" " + form, add_special_tokens=False)
                if len(ids) == 1:
                    one[ids[0]] = word
        self.shape_of_token = {i: w for i, w in one.items() if w in demo_world.SHAPES}
        self.colour_of_token = {i: w for i, w in one.items() if w in demo_world.COLOURS}

    def text(self, request: demo_world.WorldRequest) -> str:
        from operators.engines.yesno import render_prompt

        image = ImagePlaceholder() if request.kind != "caption" else None
        return render_prompt(self.processor, Prompt(user=request_text(request, self.templates), image=image))

    def ids(self, request: demo_world.WorldRequest) -> list[int]:
        text = self.text(request)
        key = (text, request.kind != "caption")
        if key not in self._ids:
            ids = self.processor.tokenizer(text, add_special_tokens=False)["input_ids"]
            per_image = (IMAGE_SIDE // PATCH // MERGE) ** 2
            self._ids[key] = [j for i in ids for j in ([i] * per_image if i == self.image_token else [i])]
        return self._ids[key]

    def batch(self, requests: Sequence[demo_world.WorldRequest]) -> dict:
        """Left-padded inputs (as the hf engine pads), the answer targets and the cell labels."""
        import torch

        ids = [self.ids(r) for r in requests]
        width = max(map(len, ids))
        input_ids = torch.tensor([[self.pad] * (width - len(i)) + i for i in ids])
        mask = torch.tensor([[0] * (width - len(i)) + [1] * len(i) for i in ids])
        out = {"input_ids": input_ids, "attention_mask": mask, "mm_token_type_ids": (input_ids == self.image_token).int()}
        scenes = [r.scene for r in requests if r.kind != "caption"]
        if scenes:
            out["pixel_values"], out["image_grid_thw"] = self.pixel_values([r for r in requests if r.kind != "caption"])
        # the probability of Yes each answer should put: 1, 0, or 0.5 where the caption leaves it open
        targets = torch.tensor([0.5 if r.answer is None else float(r.answer) for r in requests])
        cells = torch.tensor([self.pixels.cells(s) for s in scenes]).reshape(-1) if scenes else None
        focus = torch.tensor([focus_cells(r) for r in requests], dtype=torch.float32) if scenes else None
        ground_at, ground = [], []  # each shape word of an image request: the cells holding that (coloured) shape
        for row, (r, tokens) in enumerate(zip(requests, input_ids.tolist())):
            if r.scene is None:
                continue
            for pos, token in enumerate(tokens):
                shape = self.shape_of_token.get(token)
                if shape is not None:
                    colour = self.colour_of_token.get(tokens[pos - 1])
                    target = [0.0] * 9
                    for obj in demo_world._matching(r.scene, shape, colour):
                        target[obj.row * 3 + obj.col] = 1.0
                    ground_at.append((row, pos))
                    ground.append(target)
        grounding = (torch.tensor(ground_at), torch.tensor(ground)) if ground else None
        return {"inputs": out, "targets": targets, "cells": cells, "focus": focus, "grounding": grounding}

    def pixel_values(self, requests: Sequence[demo_world.WorldRequest]):
        """Pixel rows of requests with an image: the cell table for whole scenes, the real path for
        masked views (a fill reaches across cells, so their patches are not the table's)."""
        import torch

        if all(r.view is None for r in requests):
            return self.pixels.pixel_values([r.scene for r in requests])
        image_processor = self.processor.image_processor
        rows = [view_pixel_values(r.view, image_processor)[0] if r.view is not None else self.pixels.pixel_values([r.scene])[0]
                for r in requests]
        return torch.cat(rows), torch.tensor([[1, IMAGE_SIDE // PATCH, IMAGE_SIDE // PATCH]] * len(requests))

    def check(self, requests: Sequence[demo_world.WorldRequest]) -> None:
        """The batch's ids equal what the processor makes from the rendered text and the real images."""
        import torch

        from operators.images import decode_image, fit_pixels
        from operators.views import png_bytes

        mine = self.batch(requests)["inputs"]
        images = any(r.kind != "caption" for r in requests)

        def png(r: demo_world.WorldRequest) -> bytes:
            return png_bytes(r.view.pixels()) if r.view is not None else demo_world.png_bytes(demo_world.render(r.scene))

        pil = [[fit_pixels(decode_image(png(r), "s.png"), MAX_IMAGE_PIXELS, MIN_IMAGE_PIXELS)] for r in requests if r.kind != "caption"]
        self.processor.tokenizer.padding_side = "left"
        real = self.processor(text=[self.text(r) for r in requests], images=pil or None, padding=True,
                              add_special_tokens=False, return_tensors="pt")
        for name in ("input_ids", "attention_mask", "mm_token_type_ids"):
            if name in real and not torch.equal(real[name].long(), mine[name].long()):
                raise RuntimeError(f"micro VLM training inputs differ from the processor's in {name}")
        if images and float((real["pixel_values"] - mine["pixel_values"]).abs().max()) > 1e-6:
            raise RuntimeError("micro VLM training pixels differ from the processor's")


# ---------------------------------------------------------------------------- training


@dataclass
class TrainReport:
    seconds: float
    steps: int
    examples: int
    parameters: int
    history: list[dict]


def _accuracy(model, encoder: Encoder, requests: Sequence[demo_world.WorldRequest], batch_size: int = 128) -> dict:
    import torch

    by_kind: dict[str, list[bool]] = {}
    gaps: list[float] = []
    with torch.inference_mode():
        for kind in TRAINED_KINDS:
            group = [r for r in requests if _trained_kind(r) == kind]
            for start in range(0, len(group), batch_size):
                part = group[start:start + batch_size]
                b = encoder.batch(part)
                logits = model(**b["inputs"], logits_to_keep=1).logits[:, -1, :]
                p_yes = torch.softmax(logits[:, [encoder.yes, encoder.no]].float(), dim=-1)[:, 0]
                for r, p, target in zip(part, p_yes.tolist(), b["targets"].tolist()):
                    if r.answer is None:
                        gaps.append(abs(p - 0.5))
                        continue
                    ok = (p > 0.5) == (target > 0.5)
                    by_kind.setdefault(kind, []).append(ok)
                    if kind == "image":
                        by_kind.setdefault(r.fact_type[:4], []).append(ok)
    out = {k: round(sum(v) / len(v), 3) for k, v in by_kind.items()}
    if gaps:  # open caption-only questions: how far from undecided the answers sit (median |p - 0.5|)
        out["open_gap"] = round(statistics.median(gaps), 3)
    return out


def _trained_kind(request: demo_world.WorldRequest) -> str:
    return "view" if request.view is not None else request.kind


def answer_loss(logits, yes: int, no: int, target_yes):
    """Cross-entropy of the answer position against the wanted Yes/No mass: all on one word for
    a decided question, half on each for one the caption leaves open."""
    log_p = logits.float().log_softmax(dim=-1)
    return -(target_yes * log_p[:, yes] + (1.0 - target_yes) * log_p[:, no]).mean()


# ---------------------------------------------------------------------------- arguments and saving



def check_train_options(
    seconds: float = 2400,
    threads: int = 2,
    lr: float = 2e-3,
    position_weight: float = 0.0,
    type_weights: Mapping[str, float] | None = None,
    per_step: Mapping[str, int] | None = None,
    hybrid_share: float = 0.0,
    negbench_share: float = 0.0,
    open_share: float = 0.0,
    warmup_seconds: float | None = None,
    init: str | Path | None = None,
    checkpoint_minutes: float = 10.0,
    write_per_step: Mapping[str, int] | None = None,
    write_weight: float = 1.0,
    refusal_share: float = 0.05,
    write_open_share: float = 0.25,
    write_eval_every: float = 1200,
    write_clause_weights: Sequence[float] | None = None,
    write_repeat_share: float = 0.0,
    hidden: int | None = None,
    layers: int | None = None,
    **_other,
) -> None:
    """Refuse, before any work, an argument that would crash training later or train nothing
    (seconds=0 once saved an untrained model): ValueError naming the argument and the value."""

    def positive(name: str, value: float) -> None:
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
            raise ValueError(f"{name} must be a finite number above 0, got {value}")

    def not_negative(name: str, value: float) -> None:
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
            raise ValueError(f"{name} must be a finite number of 0 or more, got {value}")

    positive("seconds", seconds)
    positive("lr", lr)
    positive("checkpoint_minutes", checkpoint_minutes)
    not_negative("position_weight", position_weight)
    if warmup_seconds is not None:
        not_negative("warmup_seconds", warmup_seconds)
    if not isinstance(threads, int) or threads < 1:
        raise ValueError(f"threads must be a whole number of 1 or more, got {threads}")
    positive("write_eval_every", write_eval_every)
    not_negative("write_weight", write_weight)
    if not (isinstance(write_open_share, (int, float)) and 0.0 <= write_open_share <= 0.5):
        raise ValueError(f"write_open_share is the open share of the written question sets, between 0 and 0.5; got {write_open_share}")
    for kind, n in (write_per_step or {}).items():
        if kind not in micro_vlm_writing.WRITE_KINDS:
            raise ValueError(f"write_per_step: unknown lesson kind {kind!r}; valid: {', '.join(micro_vlm_writing.WRITE_KINDS)}")
        if not isinstance(n, int) or n < 0:
            raise ValueError(f"write_per_step {kind} must be a whole number of 0 or more, got {n}")
    for name, share, of in (("hybrid_share", hybrid_share, "caption requests"), ("negbench_share", negbench_share, "hybrid requests"),
                            ("open_share", open_share, "caption requests"), ("refusal_share", refusal_share, "writing lessons"),
                            ("write_repeat_share", write_repeat_share, "writing lessons (those whose caption names one shape twice)")):
        if not (isinstance(share, (int, float)) and math.isfinite(share) and 0.0 <= share <= 1.0):
            raise ValueError(f"{name} is a share of {of}, between 0 and 1; got {share}")
    for fact_type, weight in (type_weights or {}).items():
        if fact_type not in demo_world.FACT_TYPES.values():
            raise ValueError(f"type_weights: unknown fact type {fact_type!r}; valid: {', '.join(demo_world.FACT_TYPES.values())}")
        not_negative(f"type_weights {fact_type}", weight)
    if type_weights and not any(type_weights.get(t, 1.0) > 0 for t in demo_world.FACT_TYPES.values()):
        raise ValueError("type_weights: at least one fact type needs a weight above 0")
    if per_step is not None:
        counts = steps_per_kind(per_step)
        if not any(counts.values()):
            raise ValueError(f"per_step must draw at least one request per step, got {dict(per_step)}")
        if not counts["image"] and (warmup_seconds is None or warmup_seconds > 0):
            raise ValueError("per_step draws no image requests, which the warm-up trains on alone: give image:N above 0, or warmup_seconds=0")
    if write_clause_weights is not None and (
            len(write_clause_weights) != len(demo_world.CLAUSE_WEIGHTS)
            or not all(isinstance(w, (int, float)) and math.isfinite(w) and w >= 0 for w in write_clause_weights)
            or not sum(write_clause_weights) > 0):
        raise ValueError("write_clause_weights are how often writing lessons' captions have 1, 2 and 3 clauses: "
                         f"three numbers of 0 or more, not all 0; got {write_clause_weights}")
    if hidden is not None and (not isinstance(hidden, int) or hidden < 64 or hidden % 64):
        raise ValueError(f"hidden is the text model's width, a multiple of 64 (heads of 32, half as many key-value heads), got {hidden}")
    if layers is not None and (not isinstance(layers, int) or layers < 1):
        raise ValueError(f"layers must be a whole number of 1 or more, got {layers}")
    if init is not None and hidden is not None:
        raise ValueError("hidden sizes a model trained from scratch; init= continues a saved model at its own width")
    if init is not None:
        folder = Path(init)
        if not folder.is_dir():
            raise ValueError(f"init must be a folder holding a saved model (config.json, *.safetensors), got {str(init)!r}: no such folder")
        missing = [name for name, there in (("config.json", (folder / "config.json").is_file()),
                                            ("*.safetensors", any(folder.glob("*.safetensors")))) if not there]
        if missing:
            raise ValueError(f"init folder {str(init)!r} holds no saved model (no {' and no '.join(missing)})")
        saved_layers = json.loads((folder / "config.json").read_text()).get("text_config", {}).get("num_hidden_layers")
        if layers is not None and saved_layers is not None and layers < saved_layers:
            raise ValueError(f"layers={layers} with init= deepens a saved model; {str(init)!r} already has {saved_layers} layers")


def steps_per_kind(per_step: Mapping[str, int]) -> dict[str, int]:
    """Requests of each kind per step; a kind not named draws none. ValueError for a bad count."""
    counts = {kind: 0 for kind in TRAINED_KINDS}
    for kind, n in per_step.items():
        if kind not in counts:
            raise ValueError(f"per_step: unknown request kind {kind!r}; valid: {', '.join(TRAINED_KINDS)}")
        if not isinstance(n, int) or n < 0:
            raise ValueError(f"per_step {kind} must be a whole number of 0 or more, got {n}")
        counts[kind] = n
    return counts




def train(
    out: str | Path,
    templates: Mapping[str, str],
    seconds: float = 2400,
    seed: int = 0,
    threads: int = 2,
    lr: float = 2e-3,
    aux_weight: float = 1.0,
    focus_weight: float = 1.0,
    position_weight: float = 0.0,
    type_weights: Mapping[str, float] | None = None,
    per_step: Mapping[str, int] | None = None,
    hybrid_share: float = 0.0,
    negbench_share: float = 0.0,
    open_share: float = 0.0,
    warmup_seconds: float | None = None,
    log: Callable[[str], None] = print,
    init: str | Path | None = None,
    eval_every: float = 120,
    checkpoint_minutes: float = 10.0,
    write_per_step: Mapping[str, int] | None = None,
    write_weight: float = 1.0,
    refusal_share: float = 0.05,
    write_open_share: float = 0.25,
    write_eval_every: float = 1200,
    write_clause_weights: Sequence[float] | None = None,
    write_repeat_share: float = 0.0,
    resume: bool = False,
    **model_options,
) -> TrainReport:
    """Train from scratch (or from `init`) for `seconds` of wall time; save to `out` in float16.

    Each step draws fresh requests from the demo world's train split; the first
    `warmup_seconds` (default: a quarter of the time) ask image questions only, in short prompts
    (the question alone: `SHORT_TEMPLATES`); then all three kinds in the real templates.
    `position_weight` adds a training-only head asking each merged visual token for its cell's
    row and column (what spatial questions compare); `type_weights` draws the fact types image
    questions ask about unevenly (default: evenly); `hybrid_share` of caption-only requests come
    from hybrid captions (a thing stated beside a thing denied: "a star and no circle"), and
    `negbench_share` of those in the multiple-choice part's short form (one thing, one denial); `open_share` of them ask what the caption leaves open
    (`WorldSampler.open_request`), trained towards half the mass on Yes and half on No.

    `write_per_step` adds writing lessons after the warm-up (operators/micro_vlm_writing.py): per
    step, that many of each kind (depict, dsg, claims, judge_holistic, judge_decomposed), their
    question sets holding `write_open_share` open questions, `refusal_share` of them on captions
    with an unseen word, their captions of 1, 2 and 3 clauses as often as `write_clause_weights`
    say (default: the world's own mix, `demo_world.CLAUSE_WEIGHTS`; held-out checks keep it) and at
    least `write_repeat_share` of them naming one shape twice (default 0, the world's own draws);
    their token loss is weighted by `write_weight`. A model that writes
    needs its tokenizer trained on the lessons too, so writing starts from scratch (or from an
    `init` that wrote). Every `write_eval_every` seconds a few held-out lessons are written
    greedily and compared exactly.

    Every argument is checked and `out` written to before any work (`check_train_options`,
    `check_writable`). Every `checkpoint_minutes` the model goes to out/checkpoint (float32, with
    training.json), so a kill or a failed final save loses minutes: `init=out/checkpoint`
    continues from it. The final save is staged beside `out` and moved in file by file, so a
    failure while writing leaves the folder's previous model whole; the checkpoint is removed
    once the final model is saved. `resume=True` with `init` = such a checkpoint goes on where it
    stopped: the same step, clock, learning-rate schedule, optimizer and draws (pass the options
    its training.json records: `resume_options`).
    """
    check_train_options(seconds=seconds, threads=threads, lr=lr, position_weight=position_weight, type_weights=type_weights,
                        per_step=per_step, hybrid_share=hybrid_share, negbench_share=negbench_share,
                        open_share=open_share, warmup_seconds=warmup_seconds, init=init, checkpoint_minutes=checkpoint_minutes,
                        write_per_step=write_per_step, write_weight=write_weight, refusal_share=refusal_share,
                        write_open_share=write_open_share, write_eval_every=write_eval_every,
                        write_clause_weights=write_clause_weights, write_repeat_share=write_repeat_share,
                        **{k: v for k, v in model_options.items() if k in ("hidden", "layers")})
    check_writable(out)
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    if init is not None:  # its own tokenizer: one trained again (another seed or corpus) numbers words differently
        from transformers import AutoProcessor

        processor = AutoProcessor.from_pretrained(init)
    else:
        processor = build_processor(templates, seed, writing=bool(write_per_step))
    pixels = PixelTable(processor.image_processor)
    encoder = Encoder(processor, templates, pixels)
    writing = {k: n for k, n in (write_per_step or {}).items() if n}
    lessons = micro_vlm_writing.LessonEncoder(processor, templates, pixels, (IMAGE_SIDE // PATCH // MERGE) ** 2)
    sampler = demo_world.WorldSampler(seed, "train")
    check = [sampler.request(k) for k in ("image", "caption", "holistic", "image")]
    encoder.check(check[:1]), encoder.check(check[1:2]), encoder.check(check[2:3])
    gap = pixels.check([sampler.scene() for _ in range(20)])
    log(f"pixel table vs real path: max abs difference {gap:.2e}")
    if gap > 1e-5:
        raise RuntimeError(f"pixel table differs from the real image path by {gap}")

    if init is not None:
        from transformers import AutoModelForImageTextToText

        model = AutoModelForImageTextToText.from_pretrained(init, dtype=torch.float32)
        if model_options.get("layers"):  # more depth for a trained model, what it computes unchanged
            deepen(model, model_options["layers"])
    else:
        model = build_model(processor, seed, **model_options)
    model.train()
    hidden = model.config.text_config.hidden_size
    aux = torch.nn.Linear(hidden, 2 * CELL_CLASSES)
    captured: dict[str, torch.Tensor] = {}
    hooks = [
        model.model.visual.merger.register_forward_hook(lambda _m, _i, output: captured.__setitem__("merged", output)),
        model.model.language_model.norm.register_forward_hook(lambda _m, _i, output: captured.__setitem__("hidden", output)),
    ]
    focus_head = torch.nn.Linear(hidden, 18)
    ground_head = torch.nn.Linear(hidden, 9)
    position_head = torch.nn.Linear(hidden, 6)  # the cell's row (3) and column (3)
    types = list(demo_world.FACT_TYPES.values())
    weights = [float((type_weights or {}).get(t, 1.0)) for t in types]

    def draw(kind: str) -> demo_world.WorldRequest:
        if kind in ("claim", "view"):  # claims on the scene, or on one of the evidence checks' masked views
            return demo_views.claim_request(sampler, "full" if kind == "claim" else sampler.rng.choice(MASKED_VIEWS))
        if kind == "image" and type_weights:
            return sampler.request(kind, sampler.rng.choices(types, weights)[0])
        if kind == "caption" and open_share and sampler.rng.random() < open_share:
            return sampler.open_request()
        if kind == "caption" and hybrid_share and sampler.rng.random() < hybrid_share:
            short = bool(negbench_share) and sampler.rng.random() < negbench_share
            return sampler.request(kind, template="hybrid", negbench_form=short)
        return sampler.request(kind)

    parameters = sum(p.numel() for p in model.parameters())
    log(f"parameters: {parameters:,} (text hidden {hidden}, head_dim {model.config.text_config.head_dim})")

    per_step = {k: n for k, n in steps_per_kind(per_step or {"image": 64, "caption": 16, "holistic": 32}).items() if n}
    warmup_seconds = seconds / 4 if warmup_seconds is None else warmup_seconds
    params = list(model.parameters()) + list(aux.parameters()) + list(focus_head.parameters()) + list(ground_head.parameters())
    params += list(position_head.parameters())
    short = Encoder(processor, {**dict(templates), **SHORT_TEMPLATES}, pixels)
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.01, betas=(0.9, 0.98))
    held = demo_world.WorldSampler(seed, "heldout")
    val = [held.request(kind) for kind in demo_world.REQUEST_KINDS for _ in range(200)]
    val += [held.open_request() for _ in range(200)] if open_share else []
    val += [demo_views.claim_request(held) for _ in range(200)] if "claim" in per_step else []
    val += [demo_views.claim_request(held, view) for view in MASKED_VIEWS for _ in range(50)] if "view" in per_step else []
    val_lessons = [micro_vlm_writing.draw_lesson(held, kind, write_open_share) for kind in writing for _ in range(8)]
    next_write_eval = warmup_seconds
    clauses = tuple(write_clause_weights or demo_world.CLAUSE_WEIGHTS)  # training lessons only: val_lessons keep the world's mix
    colour_of = torch.tensor([0] + [1 + list(demo_world.COLOURS).index(c) for _, c in pixels.things])
    shape_of = torch.tensor([0] + [1 + list(demo_world.SHAPES).index(s) for s, _ in pixels.things])
    history: list[dict] = []
    start = time.monotonic()
    step = examples = 0
    next_eval = 0.0
    next_checkpoint = checkpoint_minutes * 60
    heads = {"aux": aux, "focus": focus_head, "ground": ground_head, "position": position_head}
    if resume:
        saved = json.loads((Path(init) / "training.json").read_text())
        trainer = torch.load(Path(init) / TRAINER_STATE, weights_only=False)
        opt.load_state_dict(trainer["optimizer"])
        for name, head in heads.items():
            head.load_state_dict(trainer["heads"][name])
        sampler.rng.setstate(trainer["sampler"])
        torch.set_rng_state(trainer["torch"])
        step, examples = saved["step"], saved["examples"]
        start -= saved["seconds_trained"]
        next_eval = next_write_eval = saved["seconds_trained"]
        next_checkpoint = saved["seconds_trained"] + checkpoint_minutes * 60
        log(f"resumed at step {step} after {saved['seconds_trained']} s")
    options = {"seed": seed, "threads": threads, "lr": lr, "position_weight": position_weight, "type_weights": type_weights,
               "per_step": per_step, "hybrid_share": hybrid_share, "negbench_share": negbench_share,
               "open_share": open_share, "warmup_seconds": warmup_seconds, "init": init, "seconds": seconds,
               "write_per_step": writing, "write_weight": write_weight, "refusal_share": refusal_share,
               "write_open_share": write_open_share, "write_clause_weights": write_clause_weights,
               "write_repeat_share": write_repeat_share, **model_options}
    while (elapsed := time.monotonic() - start) < seconds:
        warm = elapsed < warmup_seconds
        progress = elapsed / seconds
        rate = lr * min(1.0, (step + 1) / 100) * (0.03 + 0.97 * 0.5 * (1 + math.cos(math.pi * progress)))
        for group in opt.param_groups:
            group["lr"] = rate
        loss_total = aux_total = 0.0
        opt.zero_grad()
        kinds = {"image": per_step["image"] * 2} if warm else per_step  # check_train_options: image > 0 when there is a warm-up
        size = sum(kinds.values())
        for kind, n in kinds.items():
            requests = [draw(kind) for _ in range(n)]
            b = (short if warm else encoder).batch(requests)
            logits = model(**b["inputs"], logits_to_keep=1).logits[:, -1, :]
            loss = answer_loss(logits, encoder.yes, encoder.no, b["targets"]) * n / size
            loss_total += float(loss.detach())
            if b["cells"] is not None and aux_weight:
                merged = captured.pop("merged")
                cell_logits = aux(merged)
                cells = b["cells"]
                cell_loss = aux_weight * n / size * (
                    F.cross_entropy(cell_logits[:, :CELL_CLASSES], shape_of[cells])
                    + F.cross_entropy(cell_logits[:, CELL_CLASSES:], colour_of[cells])
                )
                if position_weight:
                    where = position_head(merged)
                    cell = torch.arange(len(cells)) % 9  # merged tokens run over each image's cells row by row
                    cell_loss = cell_loss + position_weight * n / size * (
                        F.cross_entropy(where[:, :3], cell // 3) + F.cross_entropy(where[:, 3:], cell % 3))
                states = captured.pop("hidden")
                focus_loss = focus_weight * n / size * F.binary_cross_entropy_with_logits(focus_head(states[:, -1]), b["focus"])
                if b["grounding"] is not None:
                    at, target = b["grounding"]
                    focus_loss = focus_loss + focus_weight * n / size * F.binary_cross_entropy_with_logits(
                        ground_head(states[at[:, 0], at[:, 1]]), target)
                aux_total += float(cell_loss.detach()) + float(focus_loss.detach())
                loss = loss + cell_loss + focus_loss
            loss.backward()
            examples += n
        write_total = 0.0
        for kind, n in ({} if warm else writing).items():  # one backward per kind: long sequences, bounded memory
            batch = [micro_vlm_writing.draw_lesson(sampler, kind, write_open_share, refusal_share, clauses, write_repeat_share) for _ in range(n)]
            loss = write_weight * n / sum(writing.values()) * micro_vlm_writing.lesson_loss(model, lessons, batch)
            captured.clear()
            loss.backward()
            write_total += float(loss.detach())
            examples += n
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        step += 1
        if elapsed >= next_eval:
            model.eval()
            acc = _accuracy(model, encoder, val)
            if warm:
                acc["image_short"] = _accuracy(model, short, [r for r in val if r.kind == "image"])["image"]
            if val_lessons and not warm and elapsed >= next_write_eval:
                acc |= micro_vlm_writing.exact_share(model, lessons, val_lessons)
                next_write_eval = elapsed + write_eval_every
            model.train()
            row = {"t": round(elapsed), "step": step, "examples": examples, "lr": round(rate, 6), "loss": round(loss_total, 4),
                   "aux": round(aux_total, 4), **({"write_loss": round(write_total, 4)} if writing else {}), **acc}
            history.append(row)
            log(json.dumps(row))
            next_eval += eval_every
        if time.monotonic() - start >= next_checkpoint:
            trainer = {"optimizer": opt.state_dict(), "heads": {k: h.state_dict() for k, h in heads.items()},
                       "sampler": sampler.rng.getstate(), "torch": torch.get_rng_state()}
            where = save_checkpoint(model, processor, out, {"step": step, "examples": examples,
                                                            "seconds_trained": round(time.monotonic() - start, 1), "options": options},
                                    trainer)
            log(f"checkpoint: step {step} in {where} (resume={where} goes on from it)")
            next_checkpoint += checkpoint_minutes * 60
    for hook in hooks:
        hook.remove()
    model.eval()
    acc = _accuracy(model, encoder, val)
    if val_lessons:
        acc |= micro_vlm_writing.exact_share(model, lessons, val_lessons)
    row = {"t": round(time.monotonic() - start), "step": step, "examples": examples, "final": True, **acc}
    history.append(row)
    log(json.dumps(row))
    save(model, processor, out)
    # what made these weights, beside them (options as the run ended: a resume may have changed them)
    (Path(out) / "training.json").write_text(json.dumps({"options": options, "final": row}, indent=1, default=str))
    shutil.rmtree(Path(out) / CHECKPOINT, ignore_errors=True)
    return TrainReport(time.monotonic() - start, step, examples, parameters, history)


def resume_options(checkpoint: str | Path) -> dict:
    """The options a checkpoint's run was started with (its training.json), to resume it."""
    folder = Path(checkpoint)
    if not (folder / TRAINER_STATE).is_file():
        raise ValueError(f"resume: {str(folder)!r} is not a checkpoint this recipe wrote (no {TRAINER_STATE})")
    options = dict(json.loads((folder / "training.json").read_text())["options"])
    for name in ("init", "hidden", "layers"):  # the checkpoint is the model: its size comes with it
        options.pop(name, None)
    return options


def save(model, processor, out: str | Path, dtype: str = "float16") -> Path:
    """save_pretrained in `dtype` (the auxiliary head is not part of the model: a plain Qwen3-VL).

    Written into a staging folder inside `out` first and moved in file by file, so a save that
    fails (no space, a kill) leaves `out`'s previous files as they were."""
    import torch

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    staging = out / f".saving-{uuid.uuid4().hex}"
    try:
        staging.mkdir()
        model.to(getattr(torch, dtype)).save_pretrained(staging)
        processor.save_pretrained(staging)
        for path in sorted(staging.iterdir()):
            os.replace(path, out / path.name)
    finally:
        model.float()
        shutil.rmtree(staging, ignore_errors=True)
    return out
