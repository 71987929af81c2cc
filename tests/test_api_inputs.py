"""API inputs decode exactly as files do.

A phone photo stores its pixels sideways plus an EXIF orientation tag; a PIL image of it
must be the same upright picture as its path or bytes, and a CMYK, float or LAB image
must be accepted as a PIL image whenever it is accepted as a file. Every form of one photo
must give the model the same pixels, hence the same scores.
"""
from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from PIL import Image, ImageOps

from operators.hashing import image_hash
from operators.images import ImageError, decode_image
from pipeline import Scorer
from pipeline.api import to_pairs

STORED = (200, 100)  # the phone's stored pixels: 200 wide, 100 high
UPRIGHT = (100, 200)  # orientation 6: shown rotated a quarter turn, 100 wide, 200 high
QUESTIONS = {"a photo": ["Is there a photo?", "Is it sunny?"]}


def _pixels(size=STORED, seed=0) -> np.ndarray:
    """Smooth colours with a corner mark, so a rotation or a channel swap changes them."""
    w, h = size
    y, x = np.mgrid[0:h, 0:w]
    rgb = np.stack([x * 255 // w, y * 255 // h, (x + y) * 255 // (w + h)], axis=-1).astype(np.uint8)
    rgb[: h // 4, : w // 4] = np.random.default_rng(seed).integers(0, 255, (h // 4, w // 4, 3), dtype=np.uint8)
    return rgb


@pytest.fixture(scope="module")
def photos(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("photos")
    rgb = Image.fromarray(_pixels())
    exif = Image.Exif()
    exif[0x0112] = 6
    rgb.save(folder / "phone.jpg", "JPEG", quality=90, exif=exif)
    rgb.convert("CMYK").save(folder / "cmyk.jpg", "JPEG", quality=90)
    Image.fromarray(_pixels()[..., 0].astype(np.float32) / 255.0, "F").save(folder / "float.tif")
    rgb.convert("LAB").save(folder / "lab.tif")
    return {p.stem: p for p in folder.iterdir()}


def _forms(path: Path) -> dict[str, object]:
    """Every way the API takes this photo (a fresh PIL image for each: the caller's own)."""
    data = path.read_bytes()
    return {
        "path": str(path),
        "Path": path,
        "file URI": path.as_uri(),
        "bytes": data,
        "bytearray": bytearray(data),
        "PIL opened": Image.open(path),
        "PIL from bytes": Image.open(io.BytesIO(data)),
        "PIL loaded": _loaded(path),
    }


def _loaded(path: Path) -> Image.Image:
    with Image.open(path) as img:
        img.load()
        return img.copy()


def _pairs(images, url):
    return to_pairs(images, "a photo", cross=False, image_column="image", caption_column="caption", images_url=url)


@pytest.mark.parametrize("name", ["phone", "cmyk", "float", "lab"])
def test_every_input_form_stores_the_pixels_the_file_decodes_to(photos, name, tmp_path):
    path = photos[name]
    expected = decode_image(path.read_bytes(), str(path))
    if name == "phone":
        assert expected.size == UPRIGHT  # the file path applies the orientation
    forms = _forms(path)
    pairs = _pairs(list(forms.values()), str(tmp_path / "images"))
    assert pairs.errors == []
    uris = dict(zip(forms, pairs.frame["image_uri"].to_list(), strict=True))
    stored = {form: Path(uri.removeprefix("file://")).read_bytes() for form, uri in uris.items()}
    for form, data in stored.items():
        got = decode_image(data, uris[form])
        assert got.size == expected.size, f"{name} as {form}: {got.size}, the file decodes to {expected.size}"
        assert np.array_equal(np.asarray(got), np.asarray(expected)), f"{name} as {form}: other pixels than the file"
    # the file's own bytes: one content key for path, URI and bytes
    assert {image_hash(stored[f]) for f in ("path", "Path", "file URI", "bytes", "bytearray")} == {image_hash(path.read_bytes())}
    # a PIL image is stored as the PNG of those pixels: one file whatever PIL image was passed
    assert len({stored[f] for f in ("PIL opened", "PIL from bytes", "PIL loaded")}) == 1


def test_a_pil_image_rotated_by_its_caller_is_the_same_picture(photos, tmp_path):
    """Upright already (ImageOps.exif_transpose drops the tag): stored as the raw photo is."""
    url = str(tmp_path / "images")
    raw, upright = Image.open(photos["phone"]), ImageOps.exif_transpose(Image.open(photos["phone"]))
    uris = _pairs([raw, upright], url).frame["image_uri"].to_list()
    assert uris[0] == uris[1]


def test_frames_of_pil_images_or_bytes_are_read_like_lists(photos, tmp_path):
    pd = pytest.importorskip("pandas")
    url = str(tmp_path / "images")
    path = photos["phone"]
    listed = _pairs([Image.open(path), path.read_bytes()], url).frame["image_uri"].to_list()
    from_pandas = to_pairs(pd.DataFrame({"image": [Image.open(path)], "caption": ["a photo"], "id": ["k"]}), None, cross=False,
                           image_column="image", caption_column="caption", images_url=url)
    from_polars = to_pairs(pl.DataFrame({"image": [path.read_bytes()], "caption": ["a photo"]}), None, cross=False,
                           image_column="image", caption_column="caption", images_url=url)
    assert from_pandas.frame["image_uri"].to_list() == listed[:1] and from_pandas.extra["id"].to_list() == ["k"]
    assert from_polars.frame["image_uri"].to_list() == listed[1:]


def test_a_pil_image_the_file_path_refuses_is_an_error_row_naming_row_and_field(tmp_path):
    """The file path's own reason (here: floats with no display range), never a guess."""
    hot = Image.fromarray(np.linspace(-1, 2, 64, dtype=np.float32).reshape(8, 8), "F")
    buffer = io.BytesIO()
    hot.save(buffer, "TIFF")
    with pytest.raises(ImageError, match="float pixels span -1..2") as as_file:
        decode_image(buffer.getvalue(), "hot.tif")
    pairs = _pairs([Image.new("RGB", (8, 8), "red"), hot], str(tmp_path / "images"))
    assert pairs.frame["image_uri"][0] is not None and pairs.frame["image_uri"][1] is None
    [error] = pairs.errors
    assert (error["item_id"], error["field"], error["reason"]) == ("1", "image", "unreadable_image")
    assert error["detail"].startswith("row 1: ") and as_file.value.cause in error["detail"], error["detail"]
    assert "F" in error["source"]  # the row's image is named with its mode


# -------------------------------------------------------------------------- scores


@pytest.fixture(scope="module")
def scorer(tmp_path_factory, tiny_vlm_dir):
    return Scorer("smoke", metrics=["depict", "vqascore"], root=tmp_path_factory.mktemp("inputs-root"), executor="local")


def test_every_input_form_gets_the_same_scores(scorer, photos):
    """One call, every form of the phone and the CMYK photos: no error, one score per photo."""
    names, images = [], []
    for name in ("phone", "cmyk"):
        for form, value in _forms(photos[name]).items():
            names.append((name, form))
            images.append(value)
    scores, records = scorer.score(images, "a photo", questions=QUESTIONS, records=True)
    assert scores["error"].to_list() == [None] * len(images), scores.select("image", "error", "error_detail").rows()
    for name in ("phone", "cmyk"):
        rows = [i for i, (n, _) in enumerate(names) if n == name]
        got = scores[rows].select("depict", "vqascore").rows()
        assert len(set(got)) == 1, f"{name}: {dict(zip([names[i][1] for i in rows], got, strict=True))}"
        p_v = records.filter(pl.col("row").is_in(rows)).group_by("row").agg(pl.col("p_v").sort_by("question_set", "question_id"))
        assert len({tuple(v) for v in p_v["p_v"].to_list()}) == 1
