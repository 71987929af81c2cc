"""Finding keys without reading the whole store, and compaction that keeps each key once.

`missing` and `read(keys=...)` must agree with the naive anti-join over every part, while
opening only the parts that can hold the keys asked for; `compact` must keep every key
readable throughout (also when killed midway) and each key stored exactly once after it.
"""
import random
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from operators import schema
from operators.hashing import content_key
from pipeline.store import admin
from pipeline.store.lease import Lease, LeaseHeld
from pipeline.store.parts import COMPACTED, PartStore, key_buckets

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "jobs"))


def answers(keys, value=0.0):
    n = len(keys)
    return pa.table({"key": keys, "backbone": ["b"] * n, "kind": ["image"] * n,
                     "logp_yes": [value + i for i in range(n)], "logp_no": [-1.0] * n})


def fill(store, keys, rows_per_part, value=0.0):
    for i in range(0, len(keys), rows_per_part):
        store.write(answers(keys[i:i + rows_per_part], value=value))


def raw_keys(store) -> list[str]:
    """Every key of every part file, duplicates included (what the files hold, not what a reader sees)."""
    return [k for p in store.part_paths() for k in pq.read_table(p, columns=["key"]).column("key").to_pylist()]


def naive_missing(store, keys) -> list[bool]:
    stored = set(raw_keys(store))
    return [k not in stored for k in keys]


def by_key(table: pa.Table) -> list[dict]:
    return sorted(table.to_pylist(), key=lambda r: r["key"])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_missing_and_keyed_reads_agree_with_the_naive_anti_join(tmp_path, seed):
    rng = random.Random(seed)
    store = PartStore(str(tmp_path / "s"), schema.ANSWERS)
    old = [content_key("old", seed, i) for i in range(3000)] + [f"k{i}" for i in range(40)]  # non-hex keys too
    rng.shuffle(old)
    fill(store, old, 97)
    store.compact(small_rows=64)  # compacted, bucketed parts ...
    fill(store, [content_key("new", seed, i) for i in range(500)], 61)  # ... next to fresh small ones
    probe = rng.sample(old, 700) + [content_key("new", seed, i) for i in range(0, 1000, 3)] + [content_key("never", i) for i in range(300)] + ["k3", "k99"]
    rng.shuffle(probe)
    assert store.missing(probe).to_pylist() == naive_missing(store, probe)
    wanted = set(probe) - {k for k, m in zip(probe, naive_missing(store, probe)) if m}
    got = store.read(["key", "logp_yes"], keys=probe)
    assert sorted(got.column("key").to_pylist()) == sorted(wanted)
    full = {r["key"]: r["logp_yes"] for r in store.read(["key", "logp_yes"]).to_pylist()}
    assert {r["key"]: r["logp_yes"] for r in got.to_pylist()} == {k: full[k] for k in wanted}


def spy_on_reads(store, monkeypatch) -> list[tuple[str, str]]:
    """(how, file name) of every file the store reads: whole ('cat') or by row groups ('ranged')."""
    seen = []
    cat, open_ = store.fs.cat_file, store._open
    monkeypatch.setattr(store.fs, "cat_file", lambda path, *a, **k: seen.append(("cat", Path(path).name)) or cat(path, *a, **k))
    monkeypatch.setattr(store, "_open", lambda path: seen.append(("ranged", Path(path).name)) or open_(path))
    return seen


def test_a_key_check_opens_only_the_buckets_that_can_hold_the_keys(tmp_path, monkeypatch):
    store = PartStore(str(tmp_path / "s"), schema.ANSWERS)
    keys = [content_key("k", i) for i in range(4000)]
    fill(store, keys, 100)
    store.compact(small_rows=100)  # 4,000 rows: 16 buckets of one hex character
    compacted = [p for p in store.part_paths() if COMPACTED.match(Path(p).name)]
    assert len(compacted) == len(store.part_paths()) == 16
    fresh = store.write(answers([content_key("fresh", 0)])).removeprefix("file://")
    seen = spy_on_reads(store, monkeypatch)
    window = [k for k in keys if k.startswith("a")][:50] + [content_key("fresh", 0)]
    assert not any(store.missing(window).to_pylist())
    names = {name for _, name in seen}
    buckets = {COMPACTED.match(n.removesuffix(".keyidx"))["bucket"] for n in names if COMPACTED.match(n.removesuffix(".keyidx"))}
    assert buckets == {"a", content_key("fresh", 0)[0]} - {""}  # the window's buckets only
    assert ("cat", Path(fresh).name) in seen  # a part not compacted yet is always read (whole)
    assert len(names) < len(store.part_paths())


def test_compaction_keeps_each_key_exactly_once_and_every_value(tmp_path):
    store = PartStore(str(tmp_path / "s"), schema.ANSWERS)
    keys = [content_key("k", i) for i in range(2000)] + ["x1", "x2"]
    fill(store, keys, 50)
    fill(store, keys[100:300], 37)  # the same keys written twice by racing runs: duplicates in the files
    before = by_key(store.read())
    assert len(raw_keys(store)) > len(keys)
    summary = store.compact(small_rows=16)
    assert summary["parts_out"] > 1 and summary["dropped_duplicates"] == 200
    assert sorted(raw_keys(store)) == sorted(keys)  # each key once in the files
    assert by_key(store.read()) == before
    for path in store.part_paths():  # sorted within a part, bucket as named
        part = pq.read_table(path, columns=["key"]).column("key")
        assert part.to_pylist() == sorted(part.to_pylist())
        bucket = COMPACTED.match(Path(path).name)["bucket"]
        assert set(key_buckets(part, len(bucket)).to_pylist()) == {bucket}
    # a second night and a second compaction: small compacted parts are merged again, still once each
    more = [content_key("night2", i) for i in range(700)]
    fill(store, more + keys[:10], 64)
    store.compact(small_rows=16)
    assert sorted(raw_keys(store)) == sorted(keys + more)
    assert store.compact(small_rows=16)["parts_in"] == 0  # nothing left to merge


@pytest.mark.parametrize("removed_before_kill", [1, 37])  # 38 small parts: killed early, or with one left
def test_a_compaction_killed_midway_loses_nothing_and_the_next_one_folds_duplicates(tmp_path, monkeypatch, removed_before_kill):
    store = PartStore(str(tmp_path / "s"), schema.ANSWERS)
    keys = [content_key("k", i) for i in range(1500)]
    fill(store, keys, 40)
    before = by_key(store.read())
    removed = []

    def dying_rm(path, *a, **k):  # killed after the merged parts are written and some small parts removed
        if len(removed) == removed_before_kill:
            raise KeyboardInterrupt("killed")
        removed.append(path)
        Path(path).unlink()

    monkeypatch.setattr(store.fs, "rm", dying_rm)
    with pytest.raises(KeyboardInterrupt):
        store.compact(small_rows=16)
    monkeypatch.undo()
    assert len(raw_keys(store)) > len(keys)  # keys twice in the files ...
    assert by_key(store.read()) == before  # ... but each read once, none lost
    assert not any(store.missing(keys).to_pylist())
    store.compact(small_rows=16)  # the next compaction folds everything back to once per key
    assert sorted(raw_keys(store)) == sorted(keys)
    assert by_key(store.read()) == before
    # a run adds a part while nothing else is left to merge: still compacted, still once per key
    store.write(answers([content_key("late", 0)]))
    store.compact(small_rows=16)
    assert sorted(raw_keys(store)) == sorted(keys + [content_key("late", 0)])


def test_compacting_a_store_root_takes_each_folders_lease(tmp_path):
    root = tmp_path / "store"
    a = PartStore(str(root / "answers" / "b1"), schema.ANSWERS)
    g = PartStore(str(root / "answers" / "b2"), schema.ANSWERS)
    fill(a, [content_key("a", i) for i in range(300)], 30)
    fill(g, [content_key("g", i) for i in range(300)], 30)
    with Lease(g.url, what="a curation writing here"), pytest.raises(LeaseHeld):
        admin.compact(str(root), small_rows=16)
    import jobs.store

    assert jobs.store.main(["compact", f"store={root}", "small_rows=16"]) == 0
    for s in (a, g):
        assert len(raw_keys(s)) == 300 and all(COMPACTED.match(Path(p).name) for p in s.part_paths())
    reports = admin.verify(str(root))
    assert all(r.ok and r.keys == r.rows == 300 for r in reports)
    with pytest.raises(ValueError, match="target_rows"):
        jobs.store.parse_args(["compact", f"store={root}", "target_rows=0"])
