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


# -- pixel modes: 16-bit and other modes decode to the right colours, or are refused -----------


def _png(img: Image.Image) -> bytes:
    return _encode(img, "PNG")


def test_16_bit_grayscale_png_is_a_gradient_not_solid_white():
    ramp = np.linspace(0, 65535, 256)[None, :].repeat(4, axis=0).astype(np.uint16)
    data = _png(Image.fromarray(ramp))  # mode I;16 (a 16-bit grayscale PNG, as scanners and medical images write)
    pixels = np.asarray(decode_image(data, "ramp16.png")).astype(int)
    # Pillow's plain convert("RGB") clipped at 255: 98% of this image came out white.
    assert (pixels == 255).mean() < 0.01
    assert np.array_equal(pixels[0, :, 0], np.round(np.linspace(0, 255, 256)).astype(int))  # 65535/257 = 255, linearly
    assert (pixels[..., 0] == pixels[..., 1]).all() and (pixels[..., 1] == pixels[..., 2]).all()


def test_dark_16_bit_image_stays_dark():
    dark = np.full((8, 8), 1000, dtype=np.uint16)  # 1.5% of full scale: must not be stretched to white
    assert np.asarray(decode_image(_png(Image.fromarray(dark)), "dark16.png"))[0, 0, 0] == round(1000 / 257)


def test_32_bit_and_float_grayscale():
    as_i = Image.fromarray(np.array([[0, 32768, 65535]] * 2, dtype=np.int32), "I")
    assert np.asarray(decode_image(_encode(as_i, "TIFF"), "i.tif"))[0, :, 0].tolist() == [0, 128, 255]
    unit = Image.fromarray(np.array([[0.0, 0.5, 1.0]] * 2, dtype=np.float32), "F")
    assert np.asarray(decode_image(_encode(unit, "TIFF"), "f.tif"))[0, :, 0].tolist() == [0, 128, 255]
    wild = Image.fromarray(np.array([[-3.0, 1e6]] * 2, dtype=np.float32), "F")
    with pytest.raises(ImageError, match=r"f2.tif: float pixels span -3..1e\+06"):
        decode_image(_encode(wild, "TIFF"), "f2.tif")
    huge = Image.fromarray(np.array([[0, 10_000_000]] * 2, dtype=np.int32), "I")
    with pytest.raises(ImageError, match="outside 0..65535"):
        decode_image(_encode(huge, "TIFF"), "i2.tif")


def test_transparency_is_shown_on_white():
    rgba = Image.new("RGBA", (4, 4), (10, 20, 30, 0))  # fully transparent dark pixels
    rgba.putpixel((0, 0), (200, 0, 0, 255))
    pixels = np.asarray(decode_image(_png(rgba), "rgba.png"))
    assert pixels[0, 0].tolist() == [200, 0, 0] and pixels[3, 3].tolist() == [255, 255, 255]
    la = Image.fromarray(np.stack([np.full((2, 2), 40, np.uint8), np.array([[255, 0], [128, 0]], np.uint8)], -1), "LA")
    gray = np.asarray(decode_image(_png(la), "la.png"))[:, :, 0].astype(int)
    assert gray[0].tolist() == [40, 255] and gray[1, 1] == 255 and abs(gray[1, 0] - (40 + 255) / 2) <= 1  # half-transparent: halfway
    palette = Image.new("P", (2, 1))
    palette.putpalette([0, 0, 0, 0, 255, 0] + [0] * 762)
    palette.putpixel((1, 0), 1)
    palette.info["transparency"] = 0  # palette entry 0 (black) is transparent
    assert np.asarray(decode_image(_encode(palette, "PNG", transparency=0), "p.png"))[0].tolist() == [[255, 255, 255], [0, 255, 0]]


def test_cmyk_decodes_to_its_colours():
    cmyk = Image.new("CMYK", (2, 2), (0, 255, 255, 0))  # no black, full magenta + yellow: red
    assert np.asarray(decode_image(_encode(cmyk, "TIFF"), "c.tif"))[0, 0].tolist() == [255, 0, 0]
    assert np.asarray(decode_image(_encode(cmyk, "JPEG", quality=100), "c.jpg"))[0, 0, 0] > 240
