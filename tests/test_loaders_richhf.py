"""RichHF-18K loader: test.tfrecord joined with a Pick-a-Pic captions table and image folder."""

from __future__ import annotations

import pytest

from operators.schema import ITEMS
from pipeline.benchmarks import richhf
from pipeline.store.folder import FileError
from tests.benchmark_files import richhf_score, richhf_uid, write_richhf


def _by_id(result):
    return {row["item_id"]: row for row in result.items.to_pylist()}


def test_clean_split(tmp_path):
    written = write_richhf(tmp_path / "richhf", n_images=6, n_captions=3)
    result = richhf.load(str(written.root))
    assert result.problems == []
    assert result.items.schema == ITEMS
    assert result.items.num_rows == written.items == 6
    items = _by_id(result)
    uid = richhf_uid(5)
    item = items[f"richhf/{uid}"]
    assert item["human"] == 0.625  # richhf_score(5) = 5/8, stored unchanged (higher = better aligned)
    assert item["caption"] == "pick-a-pic prompt 2"
    assert item["group_id"] == "pick-a-pic prompt 2"
    assert item["image_uri"] == str((written.root / "images" / f"{uid}.jpg").resolve())
    assert [items[f"richhf/{richhf_uid(i)}"]["human"] for i in range(6)] == [richhf_score(i) for i in range(6)]
    assert len(set(result.items["group_id"].to_pylist())) == written.groups == 3


@pytest.mark.parametrize(
    "fault, record, field, message, items",
    [
        ("missing_image", "record 1", "filename", "image file not found", 6),
        ("missing_caption", "record 3", "filename", "has no caption", 6),
        ("non_finite", "record 4", "misalignment_score", "not a finite number", 6),
        ("duplicate_id", "record 6", "filename", "duplicate image uid", 7),  # an extra record
        ("truncated", "record 6", None, "truncated record", 6),
    ],
)
def test_each_fault(tmp_path, fault, record, field, message, items):
    written = write_richhf(tmp_path / "richhf", n_images=7, bad=(fault,))
    result = richhf.load(str(written.root))
    assert result.items.num_rows == written.items == items
    assert len(result.problems) == written.problems == 1
    problem = result.problems[0]
    assert problem.file == str((written.root / "test.tfrecord").resolve())
    assert problem.record.split(" (")[0] == record
    assert problem.field == field
    assert message in problem.message


def test_corrupt_record_stops_reading_but_keeps_what_was_read(tmp_path):
    written = write_richhf(tmp_path / "richhf", n_images=6, bad=("corrupt_crc", "missing_image", "non_finite"))
    result = richhf.load(str(written.root))
    assert sorted(result.items["item_id"].to_pylist()) == [f"richhf/{richhf_uid(0)}"]
    assert written.items == 1
    assert [(p.record.split(" (")[0], p.field) for p in result.problems] == [
        ("record 1", "filename"),
        ("record 2", None),
    ]
    assert "data CRC mismatch" in result.problems[1].message and "not read" in result.problems[1].message
    assert len(result.problems) == written.problems


def test_all_faults_together(tmp_path):
    faults = ("missing_image", "missing_caption", "non_finite", "duplicate_id", "truncated")
    written = write_richhf(tmp_path / "richhf", n_images=8, bad=faults)
    result = richhf.load(str(written.root))
    assert result.items.num_rows == written.items == 4  # images 0, 2, 5, 6
    assert len(result.problems) == written.problems == 5


def test_csv_captions_and_pickapic_layout(tmp_path):
    csv = write_richhf(tmp_path / "csv", n_images=4, captions_format="csv")
    assert richhf.load(str(csv.root), **csv.options).items.num_rows == 4
    raw = write_richhf(tmp_path / "raw", n_images=4, pickapic_columns=True)
    result = richhf.load(str(raw.root))
    assert result.problems == []
    assert _by_id(result)[f"richhf/{richhf_uid(0)}"]["caption"] == "pick-a-pic prompt 0"


def test_conflicting_captions_skip_the_image(tmp_path):
    written = write_richhf(tmp_path / "richhf", n_images=4, captions_format="csv")
    path = written.root / "pickapic_captions.csv"
    path.write_text(path.read_text() + f'"{richhf_uid(2)}","another prompt"\n')
    result = richhf.load(str(written.root), **written.options)
    assert result.items.num_rows == 3
    assert [(p.file.rsplit("/", 1)[1], p.field) for p in result.problems] == [
        ("pickapic_captions.csv", "caption"),
        ("test.tfrecord", "filename"),
    ]


def test_missing_files_and_columns_raise(tmp_path):
    written = write_richhf(tmp_path / "richhf", n_images=2, captions_format="csv")
    path = written.root / "pickapic_captions.csv"
    path.write_text(path.read_text().replace('"caption"', '"prompt"', 1))
    with pytest.raises(FileError, match="pickapic_captions.csv.*caption"):
        richhf.load(str(written.root), **written.options)
    path.write_text(path.read_text().replace('"prompt"', '"caption"', 1))
    with pytest.raises(FileError, match="nope.parquet"):
        richhf.load(str(written.root), captions="nope.parquet")
    (written.root / "test.tfrecord").unlink()
    with pytest.raises(FileError, match="test.tfrecord"):
        richhf.load(str(written.root), captions="pickapic_captions.csv")
