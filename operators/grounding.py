"""Open-vocabulary grounding: GroundingDINO boxes for one text phrase on one image.

Any transformers checkpoint served by `AutoModelForZeroShotObjectDetection` works (e.g.
`IDEA-Research/grounding-dino-base`, or `builtin:tiny-grounding-dino` in tests). Each query
is one (image, phrase) pair, so a phrase's scores never depend on which other phrases were
asked about the same image, and results can be cached per pair.

For every predicted box we read the sigmoid token probabilities over the phrase's own tokens
(not [CLS], [SEP], padding or the closing "."):
- box score: their maximum;
- text score: their mean, so every word of the phrase ("red" as well as "circle") counts.
A box is kept when box score > box threshold and text score > text threshold; then NMS
(torchvision) at the configured IoU, then at most `max_boxes` boxes, best first.

Beside transformers' `post_process_grounded_object_detection`: its score is the maximum
over ALL text positions, [CLS], [SEP] and "." included (they often carry the largest
probability, so a box can pass on punctuation alone); its text threshold is not a filter on
the box but picks which tokens name the label. We take the maximum over the phrase's own
tokens and keep a box only when the phrase as a whole (mean) also clears the text
threshold, so a score is about the phrase asked. With a phrase-only query the two box
scores differ only where a special token outscores every phrase token.

Queries are batched only with queries whose image has the same resized size (`detect`), so
a result never depends on its batch neighbours.

torch and transformers are imported only when a detector is built or boxes are selected,
so the driver can read detections without them.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

# One stored query result (the grounding store's rows): boxes as xyxy lists, best first.
DETECTIONS = pa.schema(
    [
        ("key", pa.string()),
        ("detector", pa.string()),
        ("image_hash", pa.string()),
        ("phrase", pa.string()),
        ("width", pa.int32()),
        ("height", pa.int32()),
        ("boxes", pa.list_(pa.list_(pa.float64()))),  # pixels, [x0, y0, x1, y1]
        ("boxes_norm", pa.list_(pa.list_(pa.float64()))),  # the same boxes in [0, 1]
        ("box_scores", pa.list_(pa.float64())),
        ("text_scores", pa.list_(pa.float64())),
    ]
)


@dataclass(frozen=True)
class Thresholds:
    box: float = 0.30
    text: float = 0.25
    nms_iou: float = 0.5
    max_boxes: int = 32


@dataclass(frozen=True)
class Detections:
    """The kept boxes for one (image, phrase), best box score first."""

    boxes: np.ndarray  # (n, 4) float64 pixel xyxy
    box_scores: np.ndarray  # (n,)
    text_scores: np.ndarray  # (n,)
    width: int
    height: int

    def __post_init__(self):
        n = len(self.box_scores)
        if self.boxes.shape != (n, 4) or self.text_scores.shape != (n,):
            raise ValueError(f"inconsistent detections: boxes {self.boxes.shape}, {n} box scores, {self.text_scores.shape} text scores")

    @classmethod
    def empty(cls, width: int, height: int) -> Detections:
        return cls(np.zeros((0, 4)), np.zeros(0), np.zeros(0), width, height)

    @classmethod
    def from_row(cls, row: dict) -> Detections:
        boxes = np.asarray(row["boxes"], dtype=np.float64).reshape(-1, 4)
        return cls(boxes, np.asarray(row["box_scores"], dtype=np.float64), np.asarray(row["text_scores"], dtype=np.float64), int(row["width"]), int(row["height"]))

    def __len__(self) -> int:
        return len(self.box_scores)

    @property
    def boxes_norm(self) -> np.ndarray:
        return self.boxes / np.array([self.width, self.height, self.width, self.height], dtype=np.float64)

    def row(self, **fields) -> dict:
        """A DETECTIONS row (the caller adds key, detector, image_hash, phrase)."""
        return fields | {
            "width": self.width,
            "height": self.height,
            "boxes": self.boxes.tolist(),
            "boxes_norm": self.boxes_norm.tolist(),
            "box_scores": self.box_scores.tolist(),
            "text_scores": self.text_scores.tolist(),
        }


def normalise_phrase(phrase: str) -> str:
    """GroundingDINO reads lower-case phrases that end with a full stop."""
    text = " ".join(phrase.lower().split()).strip(" .")
    if not text:
        raise ValueError("empty grounding phrase")
    return text + "."


def select_boxes(boxes_norm, box_scores, text_scores, thresholds: Thresholds):
    """Indices of the kept boxes, best first: thresholds, then NMS, then the box cap.

    Inputs are torch tensors (n, 4) xyxy in [0, 1], (n,), (n,).
    """
    import torch
    from torchvision.ops import nms

    candidates = torch.nonzero((box_scores > thresholds.box) & (text_scores > thresholds.text)).flatten()
    if candidates.numel() == 0:
        return candidates
    kept = nms(boxes_norm[candidates].float(), box_scores[candidates].float(), thresholds.nms_iou)  # sorted by score
    return candidates[kept[: thresholds.max_boxes]].to(torch.long)


class GroundingDetector:
    """A loaded GroundingDINO; `detect` runs batched forward passes under no_grad."""

    def __init__(
        self,
        model_id: str,
        *,
        revision: str | None = None,
        thresholds: Thresholds = Thresholds(),
        batch_size: int = 16,
        image_size: dict | None = None,
        dtype: str = "float32",
        device: str | None = None,
    ):
        import torch
        from transformers import AutoModelForZeroShotObjectDetection, AutoProcessor

        from operators.tiny_models import resolve_model_id

        self.thresholds = thresholds
        self.batch_size = batch_size
        # Processor resize override, e.g. {shortest_edge: 800, longest_edge: 1333}.
        self.processor_kwargs = {"size": dict(image_size)} if image_size else {}
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        path = resolve_model_id(model_id)
        self.processor = AutoProcessor.from_pretrained(path, revision=revision)
        dtype = dtype if self.device.type == "cuda" else "float32"
        self.model = AutoModelForZeroShotObjectDetection.from_pretrained(path, revision=revision, dtype=getattr(torch, dtype)).to(self.device).eval()
        tokenizer = self.processor.tokenizer
        self.not_phrase_ids = sorted({*tokenizer.all_special_ids, tokenizer.convert_tokens_to_ids(".")})

    def detect(self, images: Sequence, phrases: Sequence[str]) -> list[Detections]:
        """One `Detections` per (image, phrase) pair; images are RGB PIL images.

        Each result depends on its own (image, phrase) only: queries are batched only with
        queries whose image resizes to the same pixel size, so no image is ever padded to a
        neighbour's size (padding moved box scores by up to 0.37 on the tiny model), and each
        phrase is padded only with [PAD] tokens that the attention mask hides.
        """
        if len(images) != len(phrases):
            raise ValueError(f"{len(images)} images for {len(phrases)} phrases")
        pixels = [self._pixels(image) for image in images]
        groups: dict[tuple, list[int]] = {}
        for i, (values, _) in enumerate(pixels):
            groups.setdefault(tuple(values.shape), []).append(i)
        out: list[Detections | None] = [None] * len(images)
        for indices in groups.values():
            for start in range(0, len(indices), self.batch_size):
                chunk = indices[start:start + self.batch_size]
                found = self._detect_batch([images[i] for i in chunk], [phrases[i] for i in chunk], [pixels[i] for i in chunk])
                for i, detections in zip(chunk, found, strict=True):
                    out[i] = detections
        return out

    def _pixels(self, image):
        """(pixel_values, pixel_mask) of one image, resized alone (never padded to a neighbour)."""
        encoded = self.processor.image_processor(images=[image], return_tensors="pt", **self.processor_kwargs)
        return encoded["pixel_values"][0], encoded["pixel_mask"][0]

    def _detect_batch(self, images: Sequence, phrases: Sequence[str], pixels: Sequence) -> list[Detections]:
        import torch

        # One text per image. The trailing "." matters: a list of dot-free strings would be
        # merged by the processor into one multi-label query for every image.
        texts = [normalise_phrase(p) for p in phrases]
        inputs = dict(self.processor.tokenizer(texts, padding=True, return_tensors="pt"))
        inputs["pixel_values"] = torch.stack([values for values, _ in pixels])
        inputs["pixel_mask"] = torch.stack([mask for _, mask in pixels])
        inputs = {k: (v.to(self.device, dtype=self.model.dtype) if v.is_floating_point() else v.to(self.device)) for k, v in inputs.items()}
        with torch.no_grad():
            outputs = self.model(**inputs)
        probs = torch.sigmoid(outputs.logits.float())  # (batch, queries, max_text_len)
        ids = inputs["input_ids"][:, : probs.shape[-1]]
        phrase_tokens = inputs["attention_mask"][:, : probs.shape[-1]].bool() & ~torch.isin(ids, torch.tensor(self.not_phrase_ids, device=ids.device))
        mask = torch.zeros(probs.shape[0], probs.shape[-1], dtype=torch.bool, device=probs.device)
        mask[:, : phrase_tokens.shape[1]] = phrase_tokens
        mask = mask[:, None, :]
        box_scores = probs.masked_fill(~mask, 0.0).amax(-1)
        text_scores = probs.masked_fill(~mask, 0.0).sum(-1) / mask.sum(-1).clamp(min=1)
        cx, cy, w, h = outputs.pred_boxes.float().unbind(-1)
        boxes_norm = torch.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], dim=-1).clamp(0.0, 1.0)
        results = []
        for i, image in enumerate(images):
            keep = select_boxes(boxes_norm[i], box_scores[i], text_scores[i], self.thresholds)
            width, height = image.size
            scale = np.array([width, height, width, height], dtype=np.float64)
            results.append(
                Detections(
                    boxes=boxes_norm[i][keep].cpu().double().numpy().reshape(-1, 4) * scale,
                    box_scores=box_scores[i][keep].cpu().double().numpy(),
                    text_scores=text_scores[i][keep].cpu().double().numpy(),
                    width=width,
                    height=height,
                )
            )
        return results

    def close(self) -> None:
        self.model = None
