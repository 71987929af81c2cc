import os

import pyarrow as pa
import pytest

from operators import schema
from pipeline.store.fs import read_table, write_table
from pipeline.store.parts import Markers, PartStore


def answers(keys, value=0.0):
    return pa.table(
        {
            "key": keys,
            "backbone": ["b"] * len(keys),
            "kind": ["image"] * len(keys),
            "logp_yes": [value] * len(keys),
            "logp_no": [-1.0] * len(keys),
        }
    )


def test_write_read_and_anti_join(tmp_path):
    store = PartStore(str(tmp_path / "answers" / "b"), schema.ANSWERS)
    assert store.read().num_rows == 0
    assert store.missing(["a"]).to_pylist() == [True]
    store.write(answers(["a", "b"]))
    store.write(answers(["c"]))
    assert sorted(store.keys().to_pylist()) == ["a", "b", "c"]
    assert store.missing(["a", "x", "c"]).to_pylist() == [False, True, False]
    assert len(store.part_paths()) == 2


def test_part_names_are_deterministic_and_rewrites_are_noops(tmp_path):
    store = PartStore(str(tmp_path), schema.ANSWERS)
    first = store.write(answers(["b", "a"]))
    second = store.write(answers(["a", "b"]))
    assert first == second
    assert len(store.part_paths()) == 1
    assert store.read().column("logp_yes").to_pylist() == [0.0, 0.0]


def test_the_same_keys_with_other_values_land_beside_and_are_read_once(tmp_path):
    """The name carries the content digest: other bytes for the same keys (an engine whose
    numbers vary between runs) get a part of their own, and readers keep one row per key."""
    store = PartStore(str(tmp_path), schema.ANSWERS)
    first = store.write(answers(["b", "a"]))
    second = store.write(answers(["a", "b"], value=5.0))
    assert first != second and first.split("-h")[0] == second.split("-h")[0]  # same keys digest
    table = store.read()
    assert sorted(table.column("key").to_pylist()) == ["a", "b"]
    assert len(set(table.column("logp_yes").to_pylist())) == 1  # both rows from one of the two parts
    store.compact(small_rows=10)
    assert len(store.part_paths()) == 1 and store.read().num_rows == 2


def test_duplicate_keys_across_parts_are_read_once(tmp_path):
    store = PartStore(str(tmp_path), schema.ANSWERS)
    store.write(answers(["a", "b"]))
    store.write(answers(["b", "c"]))
    table = store.read()
    assert sorted(table.column("key").to_pylist()) == ["a", "b", "c"]


def test_temporary_files_are_never_read(tmp_path):
    store = PartStore(str(tmp_path), schema.ANSWERS)
    store.write(answers(["a"]))
    # a writer killed mid-write leaves only a temporary file behind
    (tmp_path / ".tmp-123-part-deadbeef.parquet").write_bytes(b"PAR1 half a file")
    assert store.keys().to_pylist() == ["a"]


def test_atomic_single_files_and_markers(tmp_path):
    url = str(tmp_path / "run" / "items.parquet")
    write_table(url, pa.table({"x": [1, 2]}))
    assert read_table(url).column("x").to_pylist() == [1, 2]
    assert not [f for f in os.listdir(tmp_path / "run") if f.startswith(".tmp")]
    markers = Markers(str(tmp_path / "markers"))
    assert not markers.done("u")
    markers.mark("u", {"n": 3})
    assert markers.done("u") and markers.info("u") == {"n": 3}


def test_schema_needs_key():
    with pytest.raises(ValueError):
        PartStore("/tmp/x", pa.schema([("a", pa.int64())]))


# -- the store checks itself: accidents a user has, and what they cost: nothing -------------------


def test_a_truncated_part_is_quarantined_named_and_its_keys_read_as_missing(tmp_path, caplog):
    store = PartStore(str(tmp_path), schema.ANSWERS)
    good = store.write(answers(["a", "b"]))
    bad = store.write(answers(["c", "d"]))
    path = bad.removeprefix("file://")
    data = open(path, "rb").read()
    open(path, "wb").write(data[: len(data) // 2])  # a copy cut short by a full disk
    with caplog.at_level("WARNING"):
        assert store.missing(["a", "b", "c", "d"]).to_pylist() == [False, False, True, True]
    assert path in caplog.text  # the message names the file
    assert [q["path"] for q in store.quarantined] == [path]
    # moved aside, not deleted, and no longer read
    moved = list((tmp_path / "_quarantine").iterdir())
    assert len(moved) == 1 and moved[0].read_bytes() == data[: len(data) // 2]
    assert store.part_paths() == [good.removeprefix("file://")]
    # what is lost: nothing. the keys are written again under the same name
    assert store.write(answers(["c", "d"])) == bad
    assert sorted(store.keys().to_pylist()) == ["a", "b", "c", "d"]


def test_a_part_with_the_wrong_columns_is_bad_too(tmp_path):
    store = PartStore(str(tmp_path), schema.ANSWERS)
    write_table(str(tmp_path / "part-0000.parquet"), pa.table({"key": ["x"], "other": [1]}))
    store.write(answers(["a"]))
    assert store.read().column("key").to_pylist() == ["a"]
    assert "logp_yes" in store.quarantined[0]["reason"] or "backbone" in store.quarantined[0]["reason"]


def test_writing_over_a_bad_part_of_the_same_name_replaces_it(tmp_path):
    store = PartStore(str(tmp_path), schema.ANSWERS)
    url = store.write(answers(["a", "b"], value=2.0))
    (tmp_path / url.rsplit("/", 1)[1]).write_bytes(b"PAR1 not really")  # a hand copy gone wrong
    assert store.write(answers(["a", "b"], value=2.0)) == url
    assert store.read().column("logp_yes").to_pylist() == [2.0, 2.0]
    assert not store.quarantined  # replaced in place, nothing moved


def test_a_part_that_vanishes_while_reading_counts_as_missing(tmp_path, monkeypatch):
    store = PartStore(str(tmp_path), schema.ANSWERS)
    store.write(answers(["a"]))
    gone = store.write(answers(["b"]))
    paths = store.part_paths()
    monkeypatch.setattr(store, "part_paths", lambda: paths)  # listed, then collected by another process
    os.remove(gone.removeprefix("file://"))
    assert store.missing(["a", "b"]).to_pylist() == [False, True]
    assert not store.quarantined


def test_markers_can_be_cleared(tmp_path):
    markers = Markers(str(tmp_path))
    markers.mark("u", {})
    markers.clear("u")
    markers.clear("u")  # twice: harmless
    assert not markers.done("u")


def test_on_s3_a_truncated_part_is_quarantined_and_verify_sees_it(moto_s3):
    from pipeline.store.admin import gc, verify

    moto_s3.mkdir("cache")
    store = PartStore("s3://cache/store/answers/b", schema.ANSWERS)
    store.write(answers(["a"]))
    bad = store.write(answers(["b", "c"]))
    moto_s3.pipe_file(bad, b"PAR1 cut short")
    (report,) = verify("s3://cache/store")
    assert [b["path"] for b in report.bad_parts] == [bad] and report.keys == 1
    assert store.missing(["a", "b", "c"]).to_pylist() == [False, True, True]
    assert store.quarantined[0]["moved_to"].startswith("s3://cache/store/answers/b/_quarantine/")
    store.write(answers(["b", "c"]))
    (report,) = verify("s3://cache/store")
    assert report.ok and report.keys == 3 and len(report.quarantined) == 1
    assert len(gc("s3://cache/store")) == 1
    (report,) = verify("s3://cache/store")
    assert not report.quarantined
