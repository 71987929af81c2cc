import os

import pyarrow as pa
import pytest

from operators import schema
from pipeline.store import Markers, PartStore, read_table, write_table


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
    second = store.write(answers(["a", "b"], value=5.0))
    assert first == second
    assert len(store.part_paths()) == 1
    assert store.read().column("logp_yes").to_pylist() == [0.0, 0.0]


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
