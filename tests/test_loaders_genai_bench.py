"""GenAI-Bench loader on small copies of the official files; plus the shared io helpers."""

from __future__ import annotations

import os
import posixpath
from pathlib import Path

import fsspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from operators.hashing import image_hash
from operators.schema import ITEMS
from pipeline.benchmarks import genai_bench
from pipeline.store.folder import BadRecord, FileError, Folder
from tests.benchmark_files import GENAI_FAULTS, genai_ratings, write_genai_bench, write_genai_bench_parquet


def _by_id(result):
    return {row["item_id"]: row for row in result.items.to_pylist()}


def test_clean_release(tmp_path):
    written = write_genai_bench(tmp_path / "bench", n_prompts=4, models=("DALLE_3", "SDXL_Base"))
    result = genai_bench.load(str(written.root))
    assert result.problems == []
    assert result.items.schema == ITEMS
    assert result.items.num_rows == written.items == 8
    items = _by_id(result)
    # image (prompt 1, SDXL_Base = model 1) is rated [1+(1+1+r)%5 for r in 0..2] = [3, 4, 5]
    item = items["genai_bench/00001/SDXL_Base"]
    assert item["human"] == 4.0
    assert item["caption"] == "prompt number 1"
    assert item["group_id"] == "00001"
    assert item["benchmark"] == "genai_bench"
    assert item["image_uri"] == str((written.root / "SDXL_Base" / "00001.jpeg").resolve())
    assert item["image_hash"] is None
    assert item["tags"] == ["advanced", "counting"]
    assert items["genai_bench/00000/DALLE_3"]["tags"] == ["attribute", "basic"]
    assert items["genai_bench/00003/DALLE_3"]["tags"] == ["advanced"]
    assert {r["image_index"] for r in items.values()} == {None}
    for p, k, model in [(p, k, m) for p in range(4) for k, m in enumerate(("DALLE_3", "SDXL_Base"))]:
        assert items[f"genai_bench/{p:05d}/{model}"]["human"] == pytest.approx(sum(genai_ratings(p, k)) / 3)
    groups = {}
    for row in items.values():
        groups.setdefault(row["group_id"], set()).add(row["caption"])
    assert len(groups) == written.groups == 4 and all(len(c) == 1 for c in groups.values())


def test_527_release_has_its_own_ids_and_benchmark_name(tmp_path):
    written = write_genai_bench(tmp_path / "bench527", release="527", n_prompts=3)
    result = genai_bench.load(str(written.root), release="527")
    assert result.problems == []
    assert sorted(set(result.items["group_id"].to_pylist())) == ["00001", "00002", "00003"]
    assert set(result.items["benchmark"].to_pylist()) == {"genai_bench_527"}
    assert _by_id(result)["genai_bench_527/00001/DALLE_3"]["tags"] == ["attribute", "basic"]


def test_every_fault_is_reported_and_skipped(tmp_path):
    written = write_genai_bench(tmp_path / "bench", n_prompts=4, bad=GENAI_FAULTS)
    result = genai_bench.load(str(written.root))
    assert result.items.num_rows == written.items == 5
    assert len(result.problems) == written.problems == 5
    found = {(p.record, p.field): p.message for p in result.problems}
    annotations = str((written.root / "genai_image.json").resolve())
    assert {p.file for p in result.problems} == {annotations}
    assert "outside 1..5" in found[("00000", "models.DALLE_3")]
    assert "not a number" in found[("00001", "models.DALLE_3")]
    assert "not found" in found[("00003", "models.SDXL_Base")]
    assert "duplicate prompt id" in found[("00002", None)]
    assert "escapes" in found[("../../outside", "models.DALLE_3")]
    items = _by_id(result)
    assert "genai_bench/00000/DALLE_3" not in items and "genai_bench/00000/SDXL_Base" in items
    assert items["genai_bench/00002/DALLE_3"]["caption"] == "prompt number 2"  # the first copy wins
    assert not any("outside" in uri for uri in result.items["image_uri"].to_pylist())


def test_without_skills_file_tags_are_empty(tmp_path):
    written = write_genai_bench(tmp_path / "bench", n_prompts=2)
    (written.root / "genai_skills.json").unlink()
    with pytest.raises(FileError, match="genai_skills.json"):
        genai_bench.load(str(written.root))
    result = genai_bench.load(str(written.root), skills=None)
    assert result.items["tags"].to_pylist() == [[]] * 4


def test_skills_naming_unknown_or_bad_prompt_ids_are_reported(tmp_path):
    written = write_genai_bench(tmp_path / "bench", n_prompts=2)
    (written.root / "genai_skills.json").write_text('{"negation": [0, 7, "1"], "scene": 3}')
    result = genai_bench.load(str(written.root))
    assert sorted((p.record, p.message.split(" ")[0]) for p in result.problems) == [
        ("negation", "prompt"),
        ("negation", "prompt"),
        ("scene", "expected"),
    ]
    assert _by_id(result)["genai_bench/00000/DALLE_3"]["tags"] == ["negation"]


@pytest.mark.parametrize("content", [None, "{not json", "[1, 2]"])
def test_missing_or_unreadable_annotations_raise_naming_the_file(tmp_path, content):
    written = write_genai_bench(tmp_path / "bench", n_prompts=2)
    path = written.root / "genai_image.json"
    if content is None:
        path.unlink()
    else:
        path.write_text(content)
    with pytest.raises(FileError, match=r"genai_image\.json"):
        genai_bench.load(str(written.root))


def test_bad_options_are_refused(tmp_path):
    with pytest.raises(ValueError, match="release"):
        genai_bench.load(str(tmp_path), release="800")
    with pytest.raises(ValueError, match="format"):
        genai_bench.load(str(tmp_path), format="csv")


def test_parquet_export_extracts_images_once_by_content(tmp_path):
    written = write_genai_bench_parquet(
        tmp_path / "bench", n_prompts=3, bad=("rating_out_of_range", "missing_image", "duplicate_id")
    )
    result = genai_bench.load(str(written.root), format="parquet")
    assert result.items.num_rows == written.items == 4
    assert [(p.record, p.field) for p in result.problems] == [
        ("row 0 (Index 0)", "HumanRatings.DALLE_3"),
        ("row 2 (Index 2)", "SDXL_Base"),
        ("row 3 (Index 1)", "Index"),
    ]
    items = _by_id(result)
    item = items["genai_bench/00001/DALLE_3"]
    assert item["human"] == pytest.approx(sum(genai_ratings(1, 0)) / 3)
    assert item["tags"] == ["advanced", "counting"]
    assert items["genai_bench/00000/SDXL_Base"]["tags"] == ["attribute", "basic", "scene"]
    for uri in result.items["image_uri"].to_pylist():
        data = Path(uri).read_bytes()
        assert Path(uri).name == f"{image_hash(data)}.jpg"
        assert Path(uri).parent.parent == (written.root / "extracted_images").resolve()
    before = {uri: os.stat(uri).st_mtime_ns for uri in result.items["image_uri"].to_pylist()}
    again = genai_bench.load(str(written.root), format="parquet")
    assert again.items.equals(result.items)
    assert {uri: os.stat(uri).st_mtime_ns for uri in before} == before  # not rewritten


def test_reads_from_an_fsspec_url_and_reports_urls(tmp_path):
    written = write_genai_bench(tmp_path / "bench", n_prompts=3, bad=("missing_image",))
    memory = fsspec.filesystem("memory")
    for path in written.root.rglob("*"):
        if path.is_file():
            memory.pipe(f"/gb-test/{path.relative_to(written.root).as_posix()}", path.read_bytes())
    try:
        result = genai_bench.load("memory://gb-test")
    finally:
        memory.rm("/gb-test", recursive=True)
    assert result.items.num_rows == written.items
    assert all(uri.startswith("memory:///gb-test/") for uri in result.items["image_uri"].to_pylist())
    assert [p.file for p in result.problems] == ["memory:///gb-test/genai_image.json"]


# --- shared io helpers (pipeline/benchmarks/io.py) ------------------------------------------

segments = st.lists(st.sampled_from(["..", ".", "a", "b", "c.png", ""]), min_size=1, max_size=6)


@settings(max_examples=200, deadline=None)
@given(segments)
def test_join_never_leaves_the_folder(parts):
    folder = Folder("/data/root")
    relative = "/".join(parts)
    try:
        path = folder.join(relative)
    except BadRecord:
        normal = posixpath.normpath(relative) if relative.strip() else ""
        assert relative.startswith("/") or normal in ("", "..") or normal.startswith("../")
    else:
        assert path == "/data/root" or path.startswith("/data/root/")


@pytest.mark.parametrize(
    "bad", ["", "/etc/passwd", "s3://bucket/x.png", "..\\x.png", "a/../../x.png", "../root2/x.png"]
)
def test_join_refuses_absolute_urls_backslashes_and_escapes(bad):
    with pytest.raises(BadRecord):
        Folder("/data/root").join(bad)


def test_join_accepts_paths_that_stay_inside():
    assert Folder("/data/root").join("a/../b/./c.png") == "/data/root/b/c.png"
