"""Reading and decoding images: real PNG/JPEG bytes, corrupt and truncated files, sizing."""
from __future__ import annotations

import io

import fsspec
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from operators.images import ImageError, decode_image, fit_pixels, read_image_bytes


def _encode(img: Image.Image, fmt: str, **kwargs) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format=fmt, **kwargs)
    return buf.getvalue()


def _gradient(width: int, height: int) -> Image.Image:
    x = np.linspace(0, 255, width, dtype=np.uint8)[None, :].repeat(height, axis=0)
    return Image.fromarray(np.stack([x, x[::-1], np.full_like(x, 90)], axis=-1), "RGB")


def test_png_roundtrip_from_local_path(tmp_path):
    original = _gradient(40, 30)
    path = tmp_path / "a.png"
    path.write_bytes(_encode(original, "PNG"))
    data = read_image_bytes(str(path))
    assert data == path.read_bytes()
    img = decode_image(data, str(path))
    assert img.mode == "RGB" and img.size == (40, 30)
    assert np.array_equal(np.asarray(img), np.asarray(original))  # PNG is lossless


def test_jpeg_decodes_close_to_original(tmp_path):
    original = _gradient(64, 48)
    img = decode_image(_encode(original, "JPEG", quality=95), "x.jpg")
    assert img.size == (64, 48)
    assert np.abs(np.asarray(img, dtype=int) - np.asarray(original, dtype=int)).mean() < 3


def test_reads_fsspec_urls():
    data = _encode(_gradient(8, 8), "PNG")
    with fsspec.open("memory://bucket/img.png", "wb") as f:
        f.write(data)
    assert read_image_bytes("memory://bucket/img.png") == data


def test_reads_file_urls(tmp_path):
    path = tmp_path / "b.png"
    path.write_bytes(b"\x89PNG fake")
    assert read_image_bytes(path.as_uri()) == b"\x89PNG fake"


def test_missing_file_names_uri_and_cause(tmp_path):
    uri = str(tmp_path / "nope.png")
    with pytest.raises(ImageError) as info:
        read_image_bytes(uri)
    assert uri in str(info.value) and "not found" in str(info.value)
    assert info.value.uri == uri


def test_garbage_bytes_are_reported():
    with pytest.raises(ImageError, match=r"s3://b/k\.png: not a decodable image"):
        decode_image(b"this is not an image at all", "s3://b/k.png")


@pytest.mark.parametrize("fmt", ["PNG", "JPEG"])
def test_truncated_file_is_reported(fmt):
    data = _encode(_gradient(200, 150), fmt)
    with pytest.raises(ImageError, match="truncated"):
        decode_image(data[: len(data) // 2], f"half.{fmt.lower()}")


def test_exif_orientation_is_applied():
    # Stored 60 wide x 20 tall with the left third red; orientation 6 means "rotate 90 CW to view".
    stored = np.zeros((20, 60, 3), np.uint8)
    stored[:, :20] = (255, 0, 0)
    exif = Image.Exif()
    exif[0x0112] = 6
    data = _encode(Image.fromarray(stored), "JPEG", quality=95, exif=exif.tobytes())
    img = decode_image(data, "phone.jpg")
    assert img.size == (20, 60)
    top = np.asarray(img)[:10].mean(axis=(0, 1))
    assert top[0] > 200 and top[1] < 60  # the red band is now at the top


@pytest.mark.parametrize("mode", ["RGBA", "L", "P", "CMYK"])
def test_any_mode_becomes_rgb(mode):
    img = _gradient(16, 16).convert(mode)
    assert decode_image(_encode(img, "TIFF" if mode == "CMYK" else "PNG"), "m").mode == "RGB"


def test_fit_pixels_within_bounds_is_a_no_op():
    img = _gradient(100, 50)
    assert fit_pixels(img, max_pixels=5000, min_pixels=5000) is img


def test_fit_pixels_hand_computed():
    assert fit_pixels(_gradient(400, 100), max_pixels=10_000, min_pixels=1).size == (200, 50)
    assert fit_pixels(_gradient(10, 10), max_pixels=10_000, min_pixels=400).size == (20, 20)
    assert fit_pixels(_gradient(10_000, 1), max_pixels=100, min_pixels=1).size == (100, 1)


def test_fit_pixels_rejects_bad_bounds():
    with pytest.raises(ValueError, match="min_pixels"):
        fit_pixels(_gradient(4, 4), max_pixels=10, min_pixels=20)


@settings(max_examples=60, deadline=None)
@given(
    width=st.integers(1, 1200),
    height=st.integers(1, 1200),
    max_pixels=st.integers(64, 2_000_000),
    min_ratio=st.floats(0.0, 1.0),
)
def test_fit_pixels_bounds_and_aspect(width, height, max_pixels, min_ratio):
    min_pixels = max(1, int(max_pixels * min_ratio))
    img = Image.new("RGB", (width, height))
    w, h = fit_pixels(img, max_pixels, min_pixels).size
    if min_pixels <= width * height <= max_pixels:
        assert (w, h) == (width, height)
        return
    assert w * h <= max_pixels
    if width * height < min_pixels and max_pixels >= 4 * min_pixels:
        assert w * h >= min_pixels  # reachable: rounding up at most quadruples the area
    if min(w, h) > 1:  # slivers may lose their aspect; anything else keeps it up to rounding
        # Some single scale s gives both sides within one pixel: |w - width*s| <= 1, |h - height*s| <= 1.
        low = max((w - 1) / width, (h - 1) / height)
        high = min((w + 1) / width, (h + 1) / height)
        assert low <= high + 1e-12
