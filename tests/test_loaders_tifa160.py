"""TIFA160 loader on small copies of human_annotations.json, the images and DSG's Likert CSV."""

from __future__ import annotations

import pytest

from operators.schema import ITEMS
from pipeline.benchmarks import tifa160
from pipeline.store.folder import FileError
from tests.benchmark_files import TIFA_FAULTS, likert_scores, tifa_scores, write_tifa160


def _by_id(result):
    return {row["item_id"]: row for row in result.items.to_pylist()}


def test_tifa_ratings(tmp_path):
    written = write_tifa160(tmp_path / "tifa", n_prompts=2)
    result = tifa160.load(str(written.root))
    assert result.problems == []
    assert result.items.schema == ITEMS
    assert result.items.num_rows == written.items == 10
    items = _by_id(result)
    # image 1 (prompt 0, vq_diffusion) has ratings [1 + 1 % 5, 1 + 3 % 5] = [2, 4]
    item = items["tifa160/coco_1000_vq_diffusion"]
    assert item["human"] == 3.0
    assert item["group_id"] == "coco_1000"
    assert item["caption"] == "caption of prompt 0"
    assert item["image_uri"] == str((written.root / "annotated_images" / "coco_1000_vq_diffusion.jpg").resolve())
    assert items["tifa160/coco_1001_mini_dalle"]["human"] == sum(tifa_scores(5)) / 2
    assert sorted(result.items["group_id"].to_pylist()) == ["coco_1000"] * 5 + ["coco_1001"] * 5
    assert result.items["tags"].to_pylist() == [[]] * 10


def test_likert_ratings_replace_tifa_ratings(tmp_path):
    written = write_tifa160(tmp_path / "tifa", n_prompts=2)
    result = tifa160.load(str(written.root), human="likert")
    assert result.problems == []
    items = _by_id(result)
    # image 0 is rated [1, 2, 3, 4, 5] by DSG's five workers
    assert items["tifa160/coco_1000_mini_dalle"]["human"] == 3.0
    assert items["tifa160/coco_1001_stable_diffusion_v2_1"]["human"] == sum(likert_scores(9)) / 5


def test_likert_csv_with_t2v_metrics_column_names(tmp_path):
    written = write_tifa160(tmp_path / "tifa", n_prompts=1)
    path = written.root / "tifa160-likert-anns.csv"
    path.write_text(path.read_text().replace("t2i_model", "model_type", 1))
    assert tifa160.load(str(written.root), human="likert").items.num_rows == 5


def test_faults_with_tifa_ratings(tmp_path):
    written = write_tifa160(tmp_path / "tifa", n_prompts=3, bad=TIFA_FAULTS)
    result = tifa160.load(str(written.root))
    assert result.items.num_rows == written.items == 11
    found = {(p.record, p.field): p.message for p in result.problems}
    assert len(result.problems) == written.problems == 5
    assert "outside 1..5" in found[("coco_1000_mini_dalle", "human_scores")]
    assert "not the mean" in found[("coco_1000_stable_diffusion_v1_5", "human_avg")]
    assert "escapes" in found[("coco_1000_stable_diffusion_v1_1", "image_path")]
    assert "not found" in found[("coco_1002_stable_diffusion_v2_1", "image_path")]
    assert "duplicate image key" in found[("coco_1000_vq_diffusion", None)]
    assert _by_id(result)["tifa160/coco_1000_vq_diffusion"]["caption"] == "caption of prompt 0"


def test_faults_with_likert_ratings(tmp_path):
    written = write_tifa160(tmp_path / "tifa", n_prompts=1, bad=TIFA_FAULTS)
    path = written.root / "tifa160-likert-anns.csv"
    path.write_text(path.read_text() + "tifa160_0,dalle-9,coco_1000,4001,3\ntifa160_0,sd1dot1,coco_9999,4001,3\n")
    result = tifa160.load(str(written.root), human="likert")
    csv_problems = sorted((p.record, p.field) for p in result.problems if p.file.endswith(".csv"))
    # CSV line 2 is row 0: rows 5 and 6 (image 1, workers 0 and 1) are lines 7 and 8; 25 rows
    # end at line 26, so the two appended rows are lines 27 and 28
    assert csv_problems == [
        ("line 27", "t2i_model"),
        ("line 28", "source_id"),
        ("line 7", "answer"),
        ("line 8", "answer"),
    ]
    json_fields = sorted(p.field or "" for p in result.problems if p.file.endswith(".json"))
    assert json_fields == ["", "image_path", "image_path"]  # duplicate key, escape, missing image
    items = _by_id(result)
    assert len(items) == 3  # 5 images, minus the escaping and the missing one
    assert items["tifa160/coco_1000_vq_diffusion"]["human"] == pytest.approx(sum(likert_scores(1)[2:]) / 3)
    assert items["tifa160/coco_1000_mini_dalle"]["human"] == 3.0  # its TIFA ratings were bad: unused here


def test_image_without_likert_ratings_is_reported_and_skipped(tmp_path):
    written = write_tifa160(tmp_path / "tifa", n_prompts=1)
    path = written.root / "tifa160-likert-anns.csv"
    lines = path.read_text().splitlines()
    path.write_text("\n".join(line for line in lines if "sd2dot1" not in line) + "\n")
    result = tifa160.load(str(written.root), human="likert")
    assert result.items.num_rows == 4
    assert [(p.record, p.message.split(":")[0]) for p in result.problems] == [
        ("coco_1000_stable_diffusion_v2_1", "no valid Likert rating for this image")
    ]


def test_duplicate_worker_rating_is_reported(tmp_path):
    written = write_tifa160(tmp_path / "tifa", n_prompts=1)
    path = written.root / "tifa160-likert-anns.csv"
    path.write_text(path.read_text() + "tifa160_0,mini-dalle,coco_1000,4000,5\n")
    result = tifa160.load(str(written.root), human="likert")
    assert [(p.record, p.field) for p in result.problems] == [("line 27", "worker_id")]
    assert _by_id(result)["tifa160/coco_1000_mini_dalle"]["human"] == 3.0


def test_missing_files_and_columns_raise(tmp_path):
    written = write_tifa160(tmp_path / "tifa", n_prompts=1)
    path = written.root / "tifa160-likert-anns.csv"
    path.write_text(path.read_text().replace("t2i_model", "generator", 1))
    with pytest.raises(FileError, match="t2i_model"):
        tifa160.load(str(written.root), human="likert")
    path.unlink()
    with pytest.raises(FileError, match="tifa160-likert-anns.csv"):
        tifa160.load(str(written.root), human="likert")
    (written.root / "human_annotations.json").unlink()
    with pytest.raises(FileError, match="human_annotations.json"):
        tifa160.load(str(written.root))
    with pytest.raises(ValueError, match="human"):
        tifa160.load(str(written.root), human="mos")
