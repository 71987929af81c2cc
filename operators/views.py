"""Masked views for evidence checks: a matched random control box and the five views.

Boxes here are integer pixel boxes (x0, y0, x1, y1), half-open: they cover columns x0..x1-1
and rows y0..y1-1. Detector boxes are rounded outwards to cover every pixel they touch, and
every constraint on a control box is checked on the integer box that is actually masked.

A control box R for an evidence box E (docs/method.md, "Evidence checks"):
- area within +-15% of E's area, aspect ratio (w/h) within +-20% of E's,
- IoU(R, E') < 0.10 for every evidence box E' of the image (and every control already
  drawn for the same claim, so that two controls never cover the same pixels twice),
- inside the image; at most 200 random attempts, else the claim is ineligible.
The random generator is seeded from the image hash, the claim and a config seed, so the same
claim on the same image always gets the same control box.

The five views: I (the image), I\\E (evidence boxes filled), I\\R (controls filled),
I(.)E (everything but the evidence filled), I(.)R (everything but the controls filled).
Filling is a Gaussian blur of the whole image (`blur`) or the mean colour of the pixels
being replaced (`mean`); pixels outside the filled region are never changed.

Pure numpy, scipy and PIL.
"""
from __future__ import annotations

import io
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from operators.hashing import content_key

Box = tuple[int, int, int, int]

VIEWS = ("full", "minus_evidence", "minus_control", "only_evidence", "only_control")
MASKED_VIEWS = VIEWS[1:]
FILLS = ("blur", "mean")
# Bump when masking or encoding changes: old view images are then never reused.
VIEW_RECIPE_VERSION = 1

# The views store: one rendered view per recipe key.
VIEW_IMAGES = pa.schema(
    [
        ("key", pa.string()),
        ("source_hash", pa.string()),
        ("view", pa.string()),
        ("image_hash", pa.string()),  # blake2b-128 of the PNG bytes
        ("image_uri", pa.string()),
        ("width", pa.int32()),
        ("height", pa.int32()),
    ]
)


@dataclass(frozen=True)
class ControlRules:
    area_tolerance: float = 0.15
    aspect_tolerance: float = 0.20
    max_iou: float = 0.10
    max_attempts: int = 200


@dataclass(frozen=True)
class ControlDraw:
    """Controls for one evidence set: boxes when eligible, else None and a reason."""

    boxes: tuple[Box, ...] | None
    attempts: int
    reason: str | None = None

    @property
    def eligible(self) -> bool:
        return self.boxes is not None


# ----------------------------------------------------------------------- geometry


def pixel_box(box: Sequence[float], width: int, height: int) -> Box:
    """Round a float xyxy box outwards to whole pixels, inside the image and non-empty."""
    x0 = min(max(int(math.floor(box[0])), 0), width - 1)
    y0 = min(max(int(math.floor(box[1])), 0), height - 1)
    x1 = max(min(int(math.ceil(box[2])), width), x0 + 1)
    y1 = max(min(int(math.ceil(box[3])), height), y0 + 1)
    return x0, y0, x1, y1


def area(box: Box) -> int:
    return (box[2] - box[0]) * (box[3] - box[1])


def aspect(box: Box) -> float:
    return (box[2] - box[0]) / (box[3] - box[1])


def iou(a: Box, b: Box) -> float:
    w = min(a[2], b[2]) - max(a[0], b[0])
    h = min(a[3], b[3]) - max(a[1], b[1])
    inter = max(w, 0) * max(h, 0)
    return inter / (area(a) + area(b) - inter)


def matches(control: Box, evidence: Box, forbidden: Sequence[Box], width: int, height: int, rules: ControlRules) -> bool:
    """Does `control` satisfy every constraint for `evidence`? (also used by the tests)"""
    inside = 0 <= control[0] < control[2] <= width and 0 <= control[1] < control[3] <= height
    area_ok = abs(area(control) / area(evidence) - 1.0) <= rules.area_tolerance
    aspect_ok = abs(aspect(control) / aspect(evidence) - 1.0) <= rules.aspect_tolerance
    return inside and area_ok and aspect_ok and all(iou(control, other) < rules.max_iou for other in forbidden)


def control_rng(image_hash: str, claim: str, seed: int) -> np.random.Generator:
    """The claim's own random stream: same image, claim and seed -> same control boxes."""
    return np.random.default_rng(int(content_key("control-box", image_hash, claim, seed)[:16], 16))


def draw_control(evidence: Box, forbidden: Sequence[Box], width: int, height: int, rng: np.random.Generator, rules: ControlRules = ControlRules()) -> tuple[Box | None, int]:
    """One control box for `evidence` by rejection sampling; (box or None, attempts used).

    Each attempt draws an area and an aspect ratio inside the tolerances, a position that
    keeps the box in the image, rounds to whole pixels and keeps the box only if it still
    meets every constraint.
    """
    e_area, e_aspect = area(evidence), aspect(evidence)
    for attempt in range(1, rules.max_attempts + 1):
        target_area = e_area * rng.uniform(1 - rules.area_tolerance, 1 + rules.area_tolerance)
        target_aspect = e_aspect * rng.uniform(1 - rules.aspect_tolerance, 1 + rules.aspect_tolerance)
        w = max(1, round(math.sqrt(target_area * target_aspect)))
        h = max(1, round(math.sqrt(target_area / target_aspect)))
        if w > width or h > height:
            continue
        x0 = int(rng.integers(0, width - w + 1))
        y0 = int(rng.integers(0, height - h + 1))
        box = (x0, y0, x0 + w, y0 + h)
        if matches(box, evidence, forbidden, width, height, rules):
            return box, attempt
    return None, rules.max_attempts


def draw_controls(evidence: Sequence[Box], image_evidence: Sequence[Box], width: int, height: int, rng: np.random.Generator, rules: ControlRules = ControlRules()) -> ControlDraw:
    """One control per evidence box; ineligible as soon as one cannot be placed."""
    if not evidence:
        return ControlDraw(None, 0, "no_evidence")
    forbidden = list(dict.fromkeys([*image_evidence, *evidence]))
    controls: list[Box] = []
    attempts = 0
    for box in evidence:
        control, used = draw_control(box, forbidden + controls, width, height, rng, rules)
        attempts += used
        if control is None:
            return ControlDraw(None, attempts, f"no_control_box: none of {rules.max_attempts} attempts met the constraints")
        controls.append(control)
    return ControlDraw(tuple(controls), attempts)


# ------------------------------------------------------------------------ masking


def box_mask(boxes: Sequence[Box], height: int, width: int) -> np.ndarray:
    """(height, width) booleans: True inside any of the boxes."""
    mask = np.zeros((height, width), dtype=bool)
    for x0, y0, x1, y1 in boxes:
        mask[y0:y1, x0:x1] = True
    return mask


def blurred(pixels: np.ndarray, sigma_fraction: float) -> np.ndarray:
    """Gaussian blur with sigma = sigma_fraction * the shorter side (strong enough to erase
    object detail, so a filled box keeps only its broad colour).

    Separable (scipy): torchvision's gaussian_blur convolves with the full 2-D kernel, which
    at this width is ~50x slower; the two agree to one grey level (mirrored edges, 3 sigma).
    """
    from scipy.ndimage import gaussian_filter

    height, width = pixels.shape[:2]
    sigma = sigma_fraction * min(height, width)
    out = gaussian_filter(pixels.astype(np.float32), sigma=(sigma, sigma, 0), mode="mirror", truncate=3.0)
    return np.clip(np.round(out), 0, 255).astype(np.uint8)


def fill(pixels: np.ndarray, mask: np.ndarray, how: str, sigma_fraction: float = 0.1, blur_cache: dict | None = None) -> np.ndarray:
    """A copy of `pixels` (H, W, 3 uint8) with the masked pixels replaced; the rest untouched."""
    if how not in FILLS:
        raise ValueError(f"unknown fill {how!r}; valid: {FILLS}")
    out = pixels.copy()
    if not mask.any():
        return out
    if how == "mean":
        out[mask] = np.round(pixels[mask].reshape(-1, pixels.shape[2]).mean(axis=0)).astype(np.uint8)
    else:
        if blur_cache is None:
            blur_cache = {}
        if "blurred" not in blur_cache:
            blur_cache["blurred"] = blurred(pixels, sigma_fraction)
        out[mask] = blur_cache["blurred"][mask]
    return out


def render_view(pixels: np.ndarray, view: str, boxes: Sequence[Box], how: str, sigma_fraction: float = 0.1, blur_cache: dict | None = None) -> np.ndarray:
    """One view of the image: `minus_*` fills the boxes, `only_*` fills everything else.

    `boxes` are the evidence boxes for *_evidence views and the control boxes for *_control.
    """
    height, width = pixels.shape[:2]
    if view == "full":
        return pixels.copy()
    inside = box_mask(boxes, height, width)
    if view.startswith("minus_"):
        return fill(pixels, inside, how, sigma_fraction, blur_cache)
    if view.startswith("only_"):
        return fill(pixels, ~inside, how, sigma_fraction, blur_cache)
    raise ValueError(f"unknown view {view!r}; valid: {VIEWS}")


def view_key(source_hash: str, view: str, boxes: Sequence[Box], how: str, sigma_fraction: float) -> str:
    """Recipe key of a view: everything that determines its pixels."""
    spec = ";".join(",".join(str(v) for v in b) for b in boxes)
    return content_key("view", VIEW_RECIPE_VERSION, source_hash, view, spec, how, sigma_fraction if how == "blur" else None)


def png_bytes(pixels: np.ndarray) -> bytes:
    """Lossless PNG of an RGB array (what view image hashes are taken of)."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(pixels, dtype=np.uint8)).save(buffer, format="PNG", compress_level=1)
    return buffer.getvalue()
