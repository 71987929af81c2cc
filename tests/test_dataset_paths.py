"""A path in the data cannot leave the dataset folder, not even through a symbolic link
(a check of the path text alone would follow a link inside the folder that points
outside). The record is reported with file, record and field, and skipped; the
other records load (what is lost: only the record that pointed outside)."""
from __future__ import annotations

import os

import pytest
from benchmark_files import negbench_image_name, write_negbench

from pipeline.benchmarks import negbench
from pipeline.benchmarks.io import require_image
from pipeline.store.folder import BadRecord, Folder


@pytest.fixture
def dataset(tmp_path):
    root = tmp_path / "data"
    (root / "images").mkdir(parents=True)
    (root / "images" / "inside.png").write_bytes(b"png")
    (tmp_path / "secret.png").write_bytes(b"not yours")
    os.symlink(tmp_path / "secret.png", root / "images" / "link_out.png")
    os.symlink(root / "images" / "inside.png", root / "images" / "link_in.png")
    os.symlink(tmp_path, root / "up")  # a linked folder on the way
    return root


def test_a_symlink_out_of_the_folder_is_refused_naming_the_field(dataset, tmp_path):
    folder = Folder(str(dataset))
    with pytest.raises(BadRecord, match="escapes the dataset folder .* symbolic link .*secret.png") as info:
        require_image(folder, "images/link_out.png", "image_path")
    assert info.value.field == "image_path"
    with pytest.raises(BadRecord, match="symbolic link"):
        folder.join("up/secret.png")


def test_links_that_stay_inside_and_a_linked_root_are_fine(dataset, tmp_path):
    folder = Folder(str(dataset))
    assert require_image(folder, "images/link_in.png", "image_path").endswith("images/link_in.png")
    os.symlink(dataset, tmp_path / "data_link")  # data_root itself reached through a link
    assert require_image(Folder(str(tmp_path / "data_link")), "images/inside.png", "image_path")


def test_a_loader_reports_the_linked_record_and_loads_the_rest(tmp_path):
    written = write_negbench(tmp_path / "negbench", n_rows=6, relative_paths=True)
    images = written.root / "val2017"
    victim = images / negbench_image_name(2)  # the image of rows 2 and 3 (two questions per image)
    outside = tmp_path / "elsewhere.jpg"
    outside.write_bytes(victim.read_bytes())
    victim.unlink()
    os.symlink(outside, victim)  # same name, now a link to a file outside the release
    result = negbench.load(str(written.root), **written.options)
    csv = str((written.root / "images" / "COCO_val_mcq_llama3.1_rephrased.csv").resolve())
    assert [(p.file, p.record, p.field) for p in result.problems] == [(csv, "line 4", "image_path"), (csv, "line 5", "image_path")]
    assert "symbolic link" in result.problems[0].message and str(outside) in result.problems[0].message
    assert result.items.num_rows == written.items - 2 * 4  # those two MCQ rows (4 captions each) are skipped, the rest load
