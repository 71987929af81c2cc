"""Reading, decoding and sizing images, with errors that say which image and why.

A bad image must become an error row naming its URI, never a crash of the whole batch
and never a silent blank image, so every failure here raises `ImageError`.
"""
from __future__ import annotations

import io
import math

import fsspec
from PIL import Image, ImageOps

from operators.retry import retrying


class ImageError(Exception):
    """An image could not be read or decoded; the message names the URI and the cause."""

    def __init__(self, uri: str, cause: str):
        super().__init__(f"{uri}: {cause}")
        self.uri = uri
        self.cause = cause


def _read(uri: str) -> bytes:
    with fsspec.open(uri, "rb") as f:
        return f.read()


def read_image_bytes(uri: str) -> bytes:
    """The file's bytes, from a local path or any fsspec URL (s3://, gs://, file://, ...).

    Transient storage errors (throttling, 5xx, dropped connections) are retried with backoff;
    a missing or unreadable file is not.
    """
    try:
        return retrying(f"read image {uri}", lambda: _read(uri))
    except FileNotFoundError as e:
        raise ImageError(uri, "file not found") from e
    except (OSError, ValueError) as e:
        raise ImageError(uri, f"cannot read: {e}") from e


def decode_image(data: bytes, uri: str) -> Image.Image:
    """Decode to RGB, applying the EXIF orientation (phones store rotated pixels plus a tag)."""
    try:
        with Image.open(io.BytesIO(data)) as img:
            img.load()  # decode now, so truncation is caught here and not in the model
            img = ImageOps.exif_transpose(img)
            return img.convert("RGB")
    except Image.UnidentifiedImageError as e:
        raise ImageError(uri, "not a decodable image") from e
    except Exception as e:  # PIL's decoders raise OSError, SyntaxError, ValueError, EOFError...
        reason = "truncated file" if "truncated" in str(e) else f"cannot decode: {e}"
        raise ImageError(uri, reason) from e


def fit_pixels(img: Image.Image, max_pixels: int, min_pixels: int) -> Image.Image:
    """Rescale, keeping the aspect ratio, so that min_pixels <= width*height <= max_pixels.

    Done before the processor so that every engine (HF, vLLM) sees the same pixels for
    the same backbone. An image already within bounds is returned unchanged.
    """
    if not 0 < min_pixels <= max_pixels:
        raise ValueError(f"need 0 < min_pixels <= max_pixels, got {min_pixels}, {max_pixels}")
    width, height = img.size
    area = width * height
    if area > max_pixels:
        scale = math.sqrt(max_pixels / area)
        new_w, new_h = max(1, math.floor(width * scale)), max(1, math.floor(height * scale))
        # A sliver (e.g. 10000 x 1) cannot keep its aspect: shorten the long side instead.
        if new_w * new_h > max_pixels:
            new_w, new_h = (max_pixels // new_h, new_h) if new_w > new_h else (new_w, max_pixels // new_w)
        size = (new_w, new_h)
    elif area < min_pixels:
        scale = math.sqrt(min_pixels / area)
        # Rounding both sides up reaches min_pixels but may pass max_pixels when the bounds
        # are close: take the largest rounding that stays within max_pixels (rounding both
        # down never passes it, so there always is one).
        candidates = [(round_w(width * scale), round_h(height * scale))
                      for round_w in (math.ceil, math.floor) for round_h in (math.ceil, math.floor)]
        size = max((c for c in candidates if c[0] * c[1] <= max_pixels), key=lambda c: c[0] * c[1])
    else:
        return img
    return img.resize(size, Image.Resampling.BICUBIC)
