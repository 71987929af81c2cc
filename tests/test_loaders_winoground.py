"""Winoground loader: examples.jsonl + images, and the Parquet export with embedded images."""

from __future__ import annotations

from pathlib import Path

import pytest

from operators.hashing import image_hash
from operators.schema import ITEMS
from pipeline.benchmarks import winoground
from pipeline.store.folder import FileError
from tests.benchmark_files import (
    WINOGROUND_FAULTS,
    image_bytes,
    winoground_example,
    write_winoground,
    write_winoground_parquet,
)


def _structure(result):
    """example id -> {(image_index, caption_index): (image file name, caption, correct)}."""
    out: dict[str, dict] = {}
    for row in result.items.to_pylist():
        out.setdefault(row["group_id"], {})[(row["image_index"], row["caption_index"])] = (
            Path(row["image_uri"]).name,
            row["caption"],
            row["correct"],
        )
    return out


def test_examples_give_two_images_by_two_captions(tmp_path):
    written = write_winoground(tmp_path / "wino", n_examples=3)
    result = winoground.load(str(written.root))
    assert result.problems == []
    assert result.items.schema == ITEMS
    assert result.items.num_rows == written.items == 12
    ex = winoground_example(1)
    assert _structure(result)["1"] == {
        (0, 0): ("ex_1_img_0.png", ex["caption_0"], True),
        (0, 1): ("ex_1_img_0.png", ex["caption_1"], False),
        (1, 0): ("ex_1_img_1.png", ex["caption_0"], False),
        (1, 1): ("ex_1_img_1.png", ex["caption_1"], True),
    }
    rows = {r["item_id"]: r for r in result.items.to_pylist()}
    assert rows["winoground/1/i1_c0"]["image_uri"] == str((written.root / "data/images/ex_1_img_1.png").resolve())
    assert rows["winoground/1/i1_c0"]["tags"] == ["Object", "Symbolic"]
    assert rows["winoground/0/i0_c0"]["tags"] == ["Relation"]
    assert set(result.items["human"].to_pylist()) == {None}
    assert len(_structure(result)) == written.groups == 3


def test_every_fault_is_reported_and_skipped(tmp_path):
    written = write_winoground(tmp_path / "wino", n_examples=5, bad=WINOGROUND_FAULTS)
    result = winoground.load(str(written.root))
    assert sorted(_structure(result)) == ["0", "4"]
    assert result.items.num_rows == written.items == 8
    assert [(p.record, p.field) for p in result.problems] == [
        ("line 2", None),  # not JSON
        ("line 3 (id 1)", "image_1"),  # missing image
        ("line 4 (id 2)", "image_0"),  # ../../outside
        ("line 5 (id 3)", "caption_1"),  # empty caption
        ("line 7 (id 0)", "id"),  # duplicate
    ]
    assert len(result.problems) == written.problems
    assert "escapes" in result.problems[2].message
    assert _structure(result)["0"][(0, 0)][1] == winoground_example(0)["caption_0"]  # first copy wins


def test_missing_examples_file_raises(tmp_path):
    with pytest.raises(FileError, match="examples.jsonl"):
        winoground.load(str(tmp_path))
    with pytest.raises(ValueError, match="format"):
        winoground.load(str(tmp_path), format="csv")


def test_parquet_export_matches_the_jsonl_release(tmp_path):
    jsonl = winoground.load(str(write_winoground(tmp_path / "a", n_examples=3).root))
    written = write_winoground_parquet(tmp_path / "b", n_examples=3)
    parquet = winoground.load(str(written.root), format="parquet")
    assert parquet.problems == []
    assert parquet.items.num_rows == written.items == 12
    assert parquet.items.drop_columns(["image_uri"]).equals(jsonl.items.drop_columns(["image_uri"]))
    # the same pixels were embedded: each extracted file has the bytes of the original image
    for a, b in zip(jsonl.items["image_uri"].to_pylist(), parquet.items["image_uri"].to_pylist(), strict=True):
        assert Path(a).read_bytes() == Path(b).read_bytes()
        assert Path(b).name == f"{image_hash(Path(b).read_bytes())}.png"


def test_parquet_faults_and_extract_dir(tmp_path):
    written = write_winoground_parquet(tmp_path / "wino", n_examples=3, bad=("missing_image", "duplicate_id"))
    cache = tmp_path / "cache"
    result = winoground.load(str(written.root), format="parquet", extract_dir=str(cache))
    assert result.items.num_rows == written.items == 8
    assert [(p.record, p.field) for p in result.problems] == [("row 1 (id 1)", "image_1"), ("row 3 (id 0)", "id")]
    files = sorted(p for p in cache.rglob("*") if p.is_file())
    # examples 0 and 2, and example 1's first image, extracted before its second was found empty
    assert {f.read_bytes() for f in files} == {image_bytes(i) for i in (0, 1, 2, 4, 5)}
    assert len(files) == 5
    assert not (written.root / "extracted_images").exists()


@pytest.fixture
def s3_bucket(moto_s3):
    moto_s3.mkdir("loader-test")
    return moto_s3


def test_reads_from_s3_and_extracts_images_there(tmp_path, s3_bucket):
    written = write_winoground(tmp_path / "jsonl", n_examples=4, bad=("missing_image",))
    s3_bucket.put(f"{written.root}/", "loader-test/jsonl/", recursive=True)
    result = winoground.load("s3://loader-test/jsonl")
    assert result.items.num_rows == written.items == 12
    assert [(p.file, p.field) for p in result.problems] == [("s3://loader-test/jsonl/data/examples.jsonl", "image_1")]
    assert "s3://loader-test/jsonl/data/images/ex_1_img_1.png" in result.problems[0].message
    assert result.items["image_uri"][0].as_py() == "s3://loader-test/jsonl/data/images/ex_0_img_0.png"

    written = write_winoground_parquet(tmp_path / "parquet", n_examples=2)
    s3_bucket.put(f"{written.root}/", "loader-test/parquet/", recursive=True)
    result = winoground.load("s3://loader-test/parquet", format="parquet")
    uris = result.items["image_uri"].to_pylist()
    assert result.problems == [] and len(set(uris)) == 4
    for uri in set(uris):
        assert uri.startswith("s3://loader-test/parquet/extracted_images/")
        assert uri.rsplit("/", 1)[1] == f"{image_hash(s3_bucket.cat_file(uri))}.png"
