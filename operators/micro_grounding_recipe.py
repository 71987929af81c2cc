"""The recipe of `builtin:micro-grounding-dino`: a transformers `GroundingDinoForObjectDetection`
trained from scratch to ground demo-world phrases ("red circle", "circle", "red circles").

Each training query is one (scene, phrase) pair, as the grounding stage sends them
(`operators.grounding.normalise_phrase`); its targets are the exact tight boxes of every
object the phrase names (`demo_world.object_box`, in the detector's normalised cx, cy, w, h),
and none when the phrase names nothing in the scene (an absent phrase: the focal loss then
pushes every query's score on the phrase down, which is what keeps absent phrases box-free).
Scenes come from `demo_world.WorldSampler(seed, "train")`; `evaluate` measures the model
through the unchanged detector (`operators.grounding.GroundingDetector`) on held-out scenes,
whose content slots the training split never draws.

A run trains for `seconds` of wall time and saves out/checkpoint every `checkpoint_minutes`
(model, processor, optimizer, step, clock and generators), measuring the checkpoint on
held-out scenes each time, so a long run can be watched and `resume=out/checkpoint` goes on
with the same run.

Pure: torch, transformers, numpy, PIL; no Ray, no pipeline.
"""
from __future__ import annotations

import json
import math
import os
import random
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from operators import demo_world
from operators.grounding import Thresholds, normalise_phrase
from operators.run_folders import CHECKPOINT, TRAINER_STATE, check_writable, save_checkpoint

# Floors on held-out scenes, measured through operators/grounding.py at the thresholds `calibrate` chose on training scenes.
FLOORS = {"recall_colour_shape": 0.95, "recall_shape": 0.95, "recall_several": 0.95, "absent_clean": 0.95}
THRESHOLD_GRID = (0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4)  # box (= text) thresholds `calibrate` tries

DEFAULTS = {
    "seed": 0, "threads": 1, "lr": 2e-4, "batch": 16, "absent_share": 0.3, "plural_share": 0.15,
    "class_weight": 2.0, "presence_weight": 0.0, "bbox_weight": 5.0, "giou_weight": 2.0, "warmup_steps": 300, "curriculum_seconds": 0.0,
    "d_model": 32, "queries": 16, "swin_embed": 8, "text_hidden": 32, "text_layers": 1, "encoder_layers": 1,
    "decoder_layers": 2, "image_size": 128, "aux_loss": True, "two_stage": True, "checkpoint_minutes": 10.0,
    "eval_scenes": 150,
}


# ------------------------------------------------------------------------ processor and model


def _vocab() -> list[str]:
    """BERT-style vocab with [CLS]=101, [SEP]=102, '.'=1012, '?'=1029 where GroundingDINO expects
    them; every demo colour and shape (and plural) is one token, other words spell out."""
    fixed = {0: "[PAD]", 100: "[UNK]", 101: "[CLS]", 102: "[SEP]", 103: "[MASK]", 1012: ".", 1029: "?"}
    words = [*demo_world.COLOURS, *demo_world.SHAPES, *(s + "s" for s in demo_world.SHAPES), "a", "an", "the", "and"]
    chars = [chr(c) for c in range(ord("a"), ord("z") + 1)] + [str(d) for d in range(10)]
    fillers = iter(dict.fromkeys(words + chars + ["##" + c for c in chars]))
    return [fixed.get(i) or next(fillers, f"[unused{i}]") for i in range(1100)]


def build_processor(image_size: int = 128):
    """A GroundingDinoProcessor: the vocab above, demo scenes resized to image_size square."""
    from transformers import BertTokenizer, GroundingDinoImageProcessor, GroundingDinoProcessor

    vocab = _vocab()
    tokenizer = BertTokenizer(vocab={token: i for i, token in enumerate(vocab)}, do_lower_case=True)
    image_processor = GroundingDinoImageProcessor(size={"shortest_edge": image_size, "longest_edge": image_size})
    return GroundingDinoProcessor(image_processor=image_processor, tokenizer=tokenizer)


def build_model(processor, seed: int = 0, d_model: int = 32, queries: int = 16, swin_embed: int = 8, text_hidden: int = 32,
                text_layers: int = 1, encoder_layers: int = 1, decoder_layers: int = 2, aux_loss: bool = True,
                two_stage: bool = True):
    """A small GroundingDINO (Swin + BERT) with random weights, seeded."""
    import torch
    from transformers import BertConfig, GroundingDinoConfig, GroundingDinoForObjectDetection, SwinConfig

    heads = max(2, d_model // 16)  # the text enhancer uses half of them
    config = GroundingDinoConfig(
        backbone_config=SwinConfig(
            image_size=processor.image_processor.size["shortest_edge"], patch_size=4, embed_dim=swin_embed,
            depths=[1, 1, 1, 1], num_heads=[1, 1, 2, 2], window_size=4, out_indices=[2, 3, 4],
        ),
        text_config=BertConfig(
            vocab_size=len(processor.tokenizer.vocab), hidden_size=text_hidden, num_hidden_layers=text_layers,
            num_attention_heads=max(1, text_hidden // 16), intermediate_size=2 * text_hidden, max_position_embeddings=64,
        ),
        d_model=d_model, encoder_layers=encoder_layers, decoder_layers=decoder_layers, encoder_ffn_dim=2 * d_model,
        decoder_ffn_dim=2 * d_model, encoder_attention_heads=heads, decoder_attention_heads=heads, num_queries=queries,
        num_feature_levels=4, encoder_n_points=2, decoder_n_points=2, max_text_len=32, auxiliary_loss=aux_loss,
        two_stage=two_stage,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return GroundingDinoForObjectDetection(config)


# ------------------------------------------------------------------------ queries


@dataclass(frozen=True)
class Query:
    """One (scene, phrase) pair and the pixel boxes [x0, y0, x1, y1) of what the phrase names."""

    scene: demo_world.Scene
    phrase: str
    boxes: tuple[tuple[int, int, int, int], ...]
    kind: str  # colour_shape, shape, plural or absent


def phrase_text(shape: str, colour: str | None, plural: bool = False) -> str:
    return " ".join(filter(None, (colour, shape + ("s" if plural else ""))))


def phrase_boxes(scene: demo_world.Scene, shape: str, colour: str | None) -> tuple[tuple[int, int, int, int], ...]:
    """The tight boxes of every object of `shape` (and `colour`, when named) in the scene."""
    return tuple(demo_world.object_box(o.shape, o.row, o.col) for o in demo_world._matching(scene, shape, colour))


def draw_query(rng: random.Random, scene: demo_world.Scene, absent_share: float, plural_share: float) -> Query:
    """A present phrase (an object's colour and shape, or its shape alone; plural now and then)
    or, with probability `absent_share`, an absent one: most often a near miss of an object in
    the scene (another colour, or another shape), so colour and shape must both be read."""
    if rng.random() >= absent_share:
        obj = rng.choice(scene)
        colour = obj.colour if rng.random() < 0.6 else None
        plural = rng.random() < plural_share
        kind = "plural" if plural else ("colour_shape" if colour else "shape")
        return Query(scene, phrase_text(obj.shape, colour, plural), phrase_boxes(scene, obj.shape, colour), kind)
    for _ in range(100):
        if rng.random() < 0.6:
            obj = rng.choice(scene)
            shape, colour = obj.shape, obj.colour
            if rng.random() < 0.5:
                colour = rng.choice([c for c in demo_world.COLOURS if c != obj.colour])
            else:
                shape = rng.choice([s for s in demo_world.SHAPES if s != obj.shape])
                colour = colour if rng.random() < 0.6 else None
        else:
            shape, colour = rng.choice(demo_world.SHAPES), rng.choice([None, *demo_world.COLOURS])
        if not demo_world._matching(scene, shape, colour):
            return Query(scene, phrase_text(shape, colour, rng.random() < plural_share), (), "absent")
    raise ValueError(f"no absent phrase found for scene {scene}")  # a scene of every shape in every colour: impossible in 9 cells


def scene_image(scene: demo_world.Scene):
    """The RGB PIL image of a scene, pixel for pixel `demo_world.render` and the demo's PNG."""
    from PIL import Image

    pixels = np.zeros((demo_world.SIZE, demo_world.SIZE), dtype=np.uint8)
    for obj in scene:
        pixels[demo_world.object_mask(obj.shape, obj.row, obj.col)] = demo_world._PALETTE_INDEX[obj.colour]
    return Image.fromarray(demo_world.RGB_PALETTE[pixels])


def targets(query: Query) -> dict:
    """The detector's labels for one query: class 0 (the phrase) per box, boxes as normalised
    cx, cy, w, h of the tight pixel boxes; no rows for an absent phrase."""
    import torch

    boxes = torch.tensor(query.boxes, dtype=torch.float32).reshape(-1, 4) / demo_world.SIZE
    cxcywh = torch.stack([(boxes[:, 0] + boxes[:, 2]) / 2, (boxes[:, 1] + boxes[:, 3]) / 2,
                          boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]], dim=-1)
    return {"class_labels": torch.zeros(len(boxes), dtype=torch.long), "boxes": cxcywh}


def encode(processor, queries: Sequence[Query]) -> dict:
    """Model inputs for queries: each phrase as the detector sends it, each image alone-sized."""
    import torch

    inputs = dict(processor.tokenizer([normalise_phrase(q.phrase) for q in queries], padding=True, return_tensors="pt"))
    pixels = processor.image_processor(images=[scene_image(q.scene) for q in queries], return_tensors="pt")
    inputs["pixel_values"], inputs["pixel_mask"] = pixels["pixel_values"], pixels["pixel_mask"]
    return {k: v if isinstance(v, torch.Tensor) else torch.as_tensor(v) for k, v in inputs.items()}


def weighted_loss(loss_dict: dict, class_weight: float, bbox_weight: float, giou_weight: float):
    """The detector's loss terms (final, auxiliary `_0..`, encoder `_enc`) with our weights."""
    weights = {"loss_ce": class_weight, "loss_bbox": bbox_weight, "loss_giou": giou_weight}
    total = 0.0
    for key, value in loss_dict.items():
        for name, weight in weights.items():
            if key == name or key.startswith(name + "_"):
                total = total + weight * value
    return total


def presence_loss(logits, input_ids, attention_mask, not_phrase_ids: Sequence[int], present):
    """Plain BCE on each query's best box: the mean logit over the phrase's own tokens (as the
    detector's text score reads them), maximised over the detector's queries, against whether the
    phrase names something in the scene. The focal loss barely pushes a negative at p = 0.35
    (its gamma = 2 term), yet the detector keeps boxes above 0.3: this term separates present
    and absent phrases at the operator's own decision."""
    import torch

    length = logits.shape[-1]
    ids = input_ids[:, :length]
    mask = attention_mask[:, :length].bool() & ~torch.isin(ids, torch.tensor(list(not_phrase_ids), device=ids.device))
    tokens = torch.zeros(logits.shape[0], length, dtype=torch.bool, device=logits.device)
    tokens[:, : mask.shape[1]] = mask
    tokens = tokens[:, None, :].expand_as(logits)
    phrase = torch.where(tokens, logits, torch.zeros_like(logits)).sum(-1) / tokens.sum(-1).clamp(min=1)
    return torch.nn.functional.binary_cross_entropy_with_logits(phrase.amax(-1), present.to(phrase.dtype))


# ------------------------------------------------------------------------ evaluation


def heldout_queries(seed: int, scenes: int, split: str = "heldout") -> list[Query]:
    """Per held-out scene: an object's colour + shape, its shape alone, an absent phrase (a near
    miss or anything else that names nothing there), and a plural ("red circles", "stars").
    `split="train"`: the same mix on training scenes (what thresholds are chosen on)."""
    sampler = demo_world.WorldSampler(seed, split)
    rng = random.Random(f"micro-grounding/{split}/{seed}")
    plurals = random.Random(f"micro-grounding/{split}-plural/{seed}")
    out = []
    for _ in range(scenes):
        scene = sampler.scene()
        obj = rng.choice(scene)
        out.append(Query(scene, phrase_text(obj.shape, obj.colour), phrase_boxes(scene, obj.shape, obj.colour), "colour_shape"))
        obj = rng.choice(scene)
        out.append(Query(scene, obj.shape, phrase_boxes(scene, obj.shape, None), "shape"))
        out.append(draw_query(rng, scene, absent_share=1.0, plural_share=0.0))
        obj = plurals.choice(scene)
        colour = obj.colour if plurals.random() < 0.5 else None
        out.append(Query(scene, phrase_text(obj.shape, colour, plural=True), phrase_boxes(scene, obj.shape, colour), "plural"))
    return out


def box_iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU of every box in a (n, 4) with every box in b (m, 4), xyxy."""
    a, b = np.asarray(a, dtype=np.float64).reshape(-1, 4), np.asarray(b, dtype=np.float64).reshape(-1, 4)
    x0, y0 = np.maximum(a[:, None, 0], b[None, :, 0]), np.maximum(a[:, None, 1], b[None, :, 1])
    x1, y1 = np.minimum(a[:, None, 2], b[None, :, 2]), np.minimum(a[:, None, 3], b[None, :, 3])
    inter = np.clip(x1 - x0, 0, None) * np.clip(y1 - y0, 0, None)
    area = lambda z: (z[:, 2] - z[:, 0]) * (z[:, 3] - z[:, 1])  # noqa: E731
    return inter / (area(a)[:, None] + area(b)[None, :] - inter)


def score_detections(queries: Sequence[Query], found: Sequence) -> dict:
    """Recall@IoU0.5 per phrase kind (a target box counts when some kept box overlaps it by
    IoU >= 0.5), for phrases naming several objects too (and the share of those with every
    object found), the share of absent phrases with no kept box, and kept boxes that match no
    target, per present query."""
    hits: dict[str, list[int]] = {}
    whole: list[bool] = []  # several-object phrases: every named object found
    spare = present = clean = absent = 0
    for query, detections in zip(queries, found, strict=True):
        if not query.boxes:
            absent += 1
            clean += len(detections) == 0
            continue
        present += 1
        iou = box_iou(np.array(query.boxes), detections.boxes)
        matched = (iou >= 0.5).any(axis=1) if len(detections) else np.zeros(len(query.boxes), dtype=bool)
        spare += int((~(iou >= 0.5).any(axis=0)).sum()) if len(detections) else 0
        for kind in (query.kind, "several") if len(query.boxes) > 1 else (query.kind,):
            hits.setdefault(kind, []).extend(matched.tolist())
        if len(query.boxes) > 1:
            whole.append(bool(matched.all()))
    report = {f"recall_{kind}": round(float(np.mean(v)), 4) for kind, v in sorted(hits.items())}
    report |= {f"n_{kind}": len(v) for kind, v in sorted(hits.items())}
    report["all_found_several"] = round(float(np.mean(whole)), 4) if whole else None
    report |= {"absent_clean": round(clean / max(absent, 1), 4), "n_absent": absent,
               "spare_boxes_per_present": round(spare / max(present, 1), 4)}
    return report


def separation(present: np.ndarray, absent: np.ndarray) -> dict:
    """AUC of scores of present phrases over absent ones (ties count half), and both medians."""
    if not len(present) or not len(absent):
        return {}
    above = (present[:, None] > absent[None, :]).mean() + 0.5 * (present[:, None] == absent[None, :]).mean()
    return {"auc_present_absent": round(float(above), 4), "median_present": round(float(np.median(present)), 4),
            "median_absent": round(float(np.median(absent)), 4)}


def calibrate(model_path: str | os.PathLike, seed: int = 2, scenes: int = 150, grid: Sequence[float] = THRESHOLD_GRID,
              batch_size: int = 16) -> dict:
    """The box threshold (text threshold the same) to run this detector at, chosen on TRAINING
    scenes, never on the held-out ones its floors are measured on: the one whose worst floor
    quantity (recall per phrase kind, absent phrases left clean) is highest, the higher
    threshold on a tie. Returns the choice and the table over `grid`."""
    from operators.grounding import GroundingDetector

    detector = GroundingDetector(str(model_path), thresholds=Thresholds(), batch_size=batch_size, device="cpu")
    queries = heldout_queries(seed, scenes, split="train")
    images = [scene_image(q.scene) for q in queries]
    rows = []
    for t in grid:
        detector.thresholds = Thresholds(box=t, text=t)
        report = score_detections(queries, detector.detect(images, [q.phrase for q in queries]))
        rows.append({"threshold": t, **{k: report.get(k) for k in FLOORS}, "worst": min(report.get(k) or 0.0 for k in FLOORS)})
    detector.close()
    best = max(rows, key=lambda r: (r["worst"], r["threshold"]))
    return {"threshold": best["threshold"], "table": rows}


def evaluate(model_path: str | os.PathLike, seed: int = 1, scenes: int = 150, thresholds: Thresholds | None = None,
             batch_size: int = 16) -> dict:
    """Held-out floors measured through the unchanged detector (`GroundingDetector`), and
    whether a few queries asked alone give the boxes they get in a batch."""
    from operators.grounding import GroundingDetector

    detector = GroundingDetector(str(model_path), thresholds=thresholds or Thresholds(), batch_size=batch_size, device="cpu")
    queries = heldout_queries(seed, scenes)
    images = [scene_image(q.scene) for q in queries]
    found = detector.detect(images, [q.phrase for q in queries])
    report = score_detections(queries, found)
    alone = [detector.detect([images[i]], [queries[i].phrase])[0] for i in range(min(8, len(queries)))]
    report["batch_invariant"] = all(
        len(a) == len(b) and np.allclose(a.boxes, b.boxes, atol=1e-3) and np.allclose(a.box_scores, b.box_scores, atol=1e-5)
        for a, b in zip(alone, found, strict=False))
    # Threshold-free: how well the best box's phrase score (text score: every word counts)
    # ranks present phrases over absent ones, to follow a run before scores cross thresholds.
    detector.thresholds = Thresholds(box=0.0, text=0.0, max_boxes=1)
    best = np.array([d.text_scores[0] if len(d) else 0.0 for d in detector.detect(images, [q.phrase for q in queries])])
    present = np.array([bool(q.boxes) for q in queries])
    report |= separation(best[present], best[~present])
    report["passes"] = all(report.get(k, 0.0) >= v for k, v in FLOORS.items()) and report["batch_invariant"]
    detector.close()
    return report


# ------------------------------------------------------------------------ training


# Options a resumed run may change: loss terms and bookkeeping, never the model or the data.
RESUME_OVERRIDES = {"presence_weight", "class_weight", "checkpoint_minutes", "eval_scenes", "threads"}


def check_options(options: dict) -> dict:
    """Every training option known and in range (ValueError naming the option), defaults filled."""
    unknown = set(options) - set(DEFAULTS)
    if unknown:
        raise ValueError(f"unknown training option(s) {sorted(unknown)}; valid: {sorted(DEFAULTS)}")
    merged = DEFAULTS | options
    for name in ("lr", "checkpoint_minutes", "bbox_weight", "giou_weight", "class_weight"):
        if not merged[name] > 0:
            raise ValueError(f"{name} must be above 0, got {merged[name]}")
    if not merged["presence_weight"] >= 0:
        raise ValueError(f"presence_weight must be 0 or more, got {merged['presence_weight']}")
    for name in ("absent_share", "plural_share"):
        if not 0.0 <= merged[name] < 1.0:
            raise ValueError(f"{name} must be in [0, 1), got {merged[name]}")
    for name in ("threads", "batch", "d_model", "queries", "swin_embed", "text_hidden", "text_layers", "encoder_layers",
                 "decoder_layers", "eval_scenes"):
        if int(merged[name]) != merged[name] or merged[name] < 1:
            raise ValueError(f"{name} must be a whole number of 1 or more, got {merged[name]}")
    if merged["image_size"] < 96:
        raise ValueError(f"image_size must be 96 or more (smaller leaves a 1x1 feature map), got {merged['image_size']}")
    if merged["warmup_steps"] < 0 or merged["curriculum_seconds"] < 0:
        raise ValueError("warmup_steps and curriculum_seconds must not be negative")
    return merged


def resume_options(checkpoint: str | Path) -> dict:
    """The options a checkpoint's run was started with (its training.json)."""
    folder = Path(checkpoint)
    if not (folder / TRAINER_STATE).is_file() or not (folder / "training.json").is_file():
        raise ValueError(f"resume: {str(folder)!r} is not a checkpoint this recipe wrote (no {TRAINER_STATE} or training.json)")
    return dict(json.loads((folder / "training.json").read_text())["options"])


def _learning_rate(lr: float, step: int, warmup_steps: int, progress: float) -> float:
    """Linear warm-up over `warmup_steps`, then cosine decay to 5% over the run's wall time."""
    warm = min(1.0, (step + 1) / warmup_steps) if warmup_steps else 1.0
    return lr * warm * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0))))


def train(out: str | Path, seconds: float, resume: str | Path | None = None, log: Callable[[str], None] = print,
          **options) -> dict:
    """Train for `seconds` of wall time (counted over resumed runs too); the final model goes
    to `out` (float32 save_pretrained), out/checkpoint is removed after it. With `resume` (a
    checkpoint folder), the run goes on from its model, optimizer, step, clock and generators,
    with its own options (`options` must then be empty)."""
    import torch

    if resume is not None:
        if set(options) - RESUME_OVERRIDES:
            raise ValueError(f"resume takes the checkpoint's own options (only {', '.join(sorted(RESUME_OVERRIDES))} "
                             f"may change); got {sorted(set(options) - RESUME_OVERRIDES)}")
        options = resume_options(resume) | options
    opts = check_options(options)
    out = check_writable(out)
    torch.set_num_threads(int(opts["threads"]))
    if resume is not None:
        from transformers import GroundingDinoForObjectDetection, GroundingDinoProcessor

        processor = GroundingDinoProcessor.from_pretrained(resume)
        model = GroundingDinoForObjectDetection.from_pretrained(resume)
    else:
        processor = build_processor(opts["image_size"])
        model = build_model(processor, opts["seed"], **{k: opts[k] for k in (
            "d_model", "queries", "swin_embed", "text_hidden", "text_layers", "encoder_layers", "decoder_layers")},
            aux_loss=opts["aux_loss"], two_stage=opts["two_stage"])
    model.train()
    not_phrase = sorted({*processor.tokenizer.all_special_ids, processor.tokenizer.convert_tokens_to_ids(".")})
    opt = torch.optim.AdamW(model.parameters(), lr=opts["lr"], weight_decay=1e-4)
    sampler = demo_world.WorldSampler(opts["seed"], "train")
    rng = random.Random(f"micro-grounding/train/{opts['seed']}")
    torch.manual_seed(opts["seed"])
    step, trained, history = 0, 0.0, []
    if resume is not None:
        saved = json.loads((Path(resume) / "training.json").read_text())
        trainer = torch.load(Path(resume) / TRAINER_STATE, weights_only=False)
        opt.load_state_dict(trainer["optimizer"])
        sampler.rng.setstate(trainer["sampler"])
        rng.setstate(trainer["rng"])
        torch.set_rng_state(trainer["torch"])
        step, trained, history = saved["step"], saved["seconds_trained"], saved["history"]
        log(f"resumed at step {step} after {trained} s")
    log(json.dumps({"parameters": sum(p.numel() for p in model.parameters()), "options": opts}))
    start = time.monotonic() - trained
    next_checkpoint = trained + opts["checkpoint_minutes"] * 60
    losses: list[float] = []
    while (elapsed := time.monotonic() - start) < seconds:
        rate = _learning_rate(opts["lr"], step, opts["warmup_steps"], elapsed / seconds)
        for group in opt.param_groups:
            group["lr"] = rate
        simple = elapsed < opts["curriculum_seconds"]  # one- and two-object scenes first
        queries = []
        while len(queries) < opts["batch"]:
            scene = sampler.scene()
            if not simple or len(scene) <= 2:
                queries.append(draw_query(rng, scene, opts["absent_share"], opts["plural_share"]))
        inputs = encode(processor, queries)
        outputs = model(**inputs, labels=[targets(q) for q in queries])
        loss = weighted_loss(outputs.loss_dict, opts["class_weight"], opts["bbox_weight"], opts["giou_weight"])
        if opts["presence_weight"]:
            present = torch.tensor([bool(q.boxes) for q in queries])
            loss = loss + opts["presence_weight"] * presence_loss(
                outputs.logits, inputs["input_ids"], inputs["attention_mask"], not_phrase, present)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        losses.append(float(loss.detach()))
        if time.monotonic() - start >= next_checkpoint:
            state = {"step": step, "seconds_trained": round(time.monotonic() - start, 1), "options": opts, "history": history}
            trainer = {"optimizer": opt.state_dict(), "sampler": sampler.rng.getstate(), "rng": rng.getstate(),
                       "torch": torch.get_rng_state()}
            where = save_checkpoint(model, processor, out, state, trainer)
            row = {"t": state["seconds_trained"], "step": step, "lr": round(rate, 7), "loss": round(float(np.mean(losses)), 4),
                   **evaluate(where, scenes=opts["eval_scenes"])}
            losses.clear()
            history.append(row)
            (where / "training.json").write_text(json.dumps(state | {"history": history}, indent=1))
            (out / "history.json").write_text(json.dumps(history, indent=1))
            log(json.dumps(row))
            next_checkpoint += opts["checkpoint_minutes"] * 60
    model.eval()
    model.save_pretrained(out)
    processor.save_pretrained(out)
    final = {"t": round(time.monotonic() - start, 1), "step": step, "final": True, **evaluate(out, scenes=opts["eval_scenes"])}
    history.append(final)
    (out / "training.json").write_text(json.dumps({"options": opts, "history": history}, indent=1))
    log(json.dumps(final))
    shutil.rmtree(out / CHECKPOINT, ignore_errors=True)
    return final
