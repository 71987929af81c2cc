"""NegBench MCQ loader on a small copy of the released CSV and COCO-style images."""

from __future__ import annotations

import pytest

from operators.schema import ITEMS
from pipeline.benchmarks import negbench
from pipeline.store.folder import FileError
from tests.benchmark_files import NEGBENCH_FAULTS, negbench_image_name, write_negbench


def test_rows_with_the_authors_absolute_paths(tmp_path):
    written = write_negbench(tmp_path / "negbench", n_rows=6)
    result = negbench.load(str(written.root))
    assert result.problems == []
    assert result.items.schema == ITEMS
    assert result.items.num_rows == written.items == 24
    rows = result.items.to_pylist()
    group = [r for r in rows if r["group_id"] == "5"]
    # row 5: correct_answer 5 % 4 = 1, template NEGBENCH_TEMPLATES[5 % 3] = "hybrid"
    assert [(r["item_id"], r["caption_index"], r["correct"], r["template"]) for r in group] == [
        ("negbench/5/0", 0, False, "hybrid"),
        ("negbench/5/1", 1, True, "hybrid"),
        ("negbench/5/2", 2, False, "hybrid"),
        ("negbench/5/3", 3, False, "hybrid"),
    ]
    assert [r["caption"] for r in group] == [f"This image features object 5-{k}." for k in range(4)]
    assert {r["image_uri"] for r in group} == {str((written.root / "val2017" / negbench_image_name(5)).resolve())}
    templates = {r["group_id"]: r["template"] for r in rows}
    assert [templates[str(g)] for g in range(3)] == ["affirmative", "negation", "hybrid"]
    assert all(sum(r["correct"] for r in rows if r["group_id"] == g) == 1 for g in templates)
    assert {r["human"] for r in rows} == {None} and {r["image_index"] for r in rows} == {None}
    assert len(templates) == written.groups == 6


def test_every_fault_is_reported_and_skipped(tmp_path):
    written = write_negbench(tmp_path / "negbench", n_rows=7, relative_paths=True, bad=NEGBENCH_FAULTS)
    result = negbench.load(str(written.root), **written.options)
    assert sorted(set(result.items["group_id"].to_pylist())) == ["3", "6"]
    assert result.items.num_rows == written.items == 8
    csv = str((written.root / "images" / "COCO_val_mcq_llama3.1_rephrased.csv").resolve())
    assert [(p.file, p.record, p.field) for p in result.problems] == [
        (csv, "line 2", "correct_answer_template"),
        (csv, "line 3", "correct_answer"),
        (csv, "line 4", "correct_answer"),
        (csv, "line 6", "image_path"),
        (csv, "line 7", "image_path"),
    ]
    assert len(result.problems) == written.problems
    assert "unknown template 'double-negative'" in result.problems[0].message
    assert "not an option index" in result.problems[1].message
    assert "not found" in result.problems[3].message
    assert "escapes" in result.problems[4].message


def test_relative_mode_refuses_the_authors_absolute_paths(tmp_path):
    written = write_negbench(tmp_path / "negbench", n_rows=2)
    result = negbench.load(str(written.root), image_path_mode="relative")
    assert result.items.num_rows == 0
    assert [p.field for p in result.problems] == ["image_path", "image_path"]
    assert "must be relative" in result.problems[0].message


def test_missing_file_or_column_raises(tmp_path):
    written = write_negbench(tmp_path / "negbench", n_rows=2)
    path = written.root / "images" / "COCO_val_mcq_llama3.1_rephrased.csv"
    path.write_text(path.read_text().replace("correct_answer_template", "template", 1))
    with pytest.raises(FileError, match="correct_answer_template"):
        negbench.load(str(written.root))
    with pytest.raises(FileError, match="VOC2007_mcq"):
        negbench.load(str(written.root), csv="images/VOC2007_mcq_llama3.1_rephrased.csv")
    with pytest.raises(ValueError, match="image_path_mode"):
        negbench.load(str(written.root), image_path_mode="guess")
