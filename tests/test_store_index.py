"""The key index of compacted parts: a key check reads indexes, a keyed read only the row
groups with hits, and no index (missing, corrupt, stale, lying) can change an answer.

Row groups are shrunk to 64 rows here so that small stores have many of them, and a keyed
read decodes 3 of them at a time.
"""
import random
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from operators import schema
from operators.hashing import content_key
from pipeline.store import admin, parts
from pipeline.store.key_index import SUFFIX, BadIndex, KeyIndex, Window, key_prefixes
from pipeline.store.parts import COMPACTED, PartStore

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "jobs"))
GROUP = 64


@pytest.fixture(autouse=True)
def small_row_groups(monkeypatch):
    monkeypatch.setattr(parts, "ROW_GROUP_ROWS", GROUP)
    monkeypatch.setattr(parts, "GROUPS_PER_READ", 3)  # a part's hit groups in several reads


def answers(keys, value=0.0):
    n = len(keys)
    return pa.table({"key": keys, "backbone": ["b"] * n, "kind": ["image"] * n,
                     "logp_yes": [value + i for i in range(n)], "logp_no": [-1.0] * n})


def compacted_store(path, keys, rows_per_part=250, **compact):
    store = PartStore(str(path), schema.ANSWERS)
    for i in range(0, len(keys), rows_per_part):
        store.write(answers(keys[i:i + rows_per_part], value=float(i)))
    store.compact(small_rows=compact.pop("small_rows", 64), **compact)
    return store


def expected(store, probe):
    """The naive answer: every part read whole."""
    stored = {}
    for path in store.part_paths():
        for row in store.read_part(path, ["key", "logp_yes"]).to_pylist():
            stored.setdefault(row["key"], row["logp_yes"])
    return [k not in stored for k in probe], {k: stored[k] for k in probe if k in stored}


def check(store, probe, monkeypatch=None):
    """missing() and read(keys=) against the naive answer; with `monkeypatch`, returns what
    they read (`spy`), the naive reads left out."""
    missing, values = expected(store, probe)
    seen = spy(store, monkeypatch) if monkeypatch else None
    assert store.missing(probe).to_pylist() == missing
    got = store.read(["key", "logp_yes"], keys=probe)
    assert got.num_rows == len(values)
    assert dict(zip(got.column("key").to_pylist(), got.column("logp_yes").to_pylist())) == values
    return seen


def spy(store, monkeypatch):
    """(how, file name) of each file read: whole ('cat'), by row groups ('ranged'), and the
    row groups read ('groups', name, [indices])."""
    seen = []
    cat, open_, read_groups = store.fs.cat_file, store._open, pq.ParquetFile.read_row_groups
    monkeypatch.setattr(store.fs, "cat_file", lambda path, *a, **k: seen.append(("cat", Path(path).name)) or cat(path, *a, **k))
    monkeypatch.setattr(store, "_open", lambda path: seen.append(("ranged", Path(path).name)) or open_(path))
    monkeypatch.setattr(pq.ParquetFile, "read_row_groups", lambda self, groups, **k: seen.append(("groups", list(groups))) or read_groups(self, groups, **k))
    return seen


def indexes(store):
    return sorted(Path(p).name for p in store.fs.glob(f"{store.path}/*{SUFFIX}"))


# -- the index itself ------------------------------------------------------------------------
def test_prefixes_read_hex_keys_as_numbers_and_hash_other_keys():
    keys = [content_key("p", i) for i in range(300)]
    assert key_prefixes(pa.array(keys)).tolist() == [int(k[:16], 16) for k in keys]
    assert key_prefixes(pa.array(keys).slice(5, 7)).tolist() == [int(k[:16], 16) for k in keys[5:12]]
    mixed = ["k1", "ABCDEF0123456789abc", keys[0], "0123456789abcdef-long"]
    got = key_prefixes(pa.array(mixed))
    assert got[2] == int(keys[0][:16], 16) and got[3] == 0x0123456789ABCDEF
    assert len(set(got.tolist())) == 4 and key_prefixes(pa.array(mixed)).tolist() == got.tolist()  # stable


def test_an_index_round_trips_and_refuses_what_is_not_its_parts():
    keys = sorted(content_key("r", i) for i in range(500))
    index = KeyIndex.build("part-k-n500-x.parquet", pa.array(keys), 64)
    assert index.rows is None  # hex keys in key order: the rows are implicit (8 bytes a key)
    data = index.to_bytes()
    assert len(data) < 500 * 8 + 300
    assert KeyIndex.from_bytes(data, "part-k-n500-x.parquet").same_as(index)
    for bad, why in [(data[:-3], "truncated"), (data + b"\0" * 8, "truncated"), (b"PAR1" + data[4:], "not a key index"),
                     (data[:-8] + bytes(8), "checksum")]:
        with pytest.raises(BadIndex, match=why):
            KeyIndex.from_bytes(bad, "part-k-n500-x.parquet")
    with pytest.raises(BadIndex, match="not of"):
        KeyIndex.from_bytes(data, "part-k-n500-y.parquet")
    odd = KeyIndex.build("p", pa.array(sorted(["k2", "k1", *keys[:5]])), 64)
    assert odd.rows is not None  # hashed keys are out of key order: rows are stored
    window = Window(pa.array(["k2", keys[3], "nope", keys[3]]))
    rows, prefixes = odd.candidates(window.prefixes)
    assert sorted(np.asarray(sorted(["k2", "k1", *keys[:5]]))[rows].tolist()) == sorted(["k2", keys[3]])
    assert sorted(window.keys_with(prefixes).to_pylist()) == sorted(["k2", keys[3]])


# -- reads -------------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", [0, 1])
def test_indexed_reads_agree_with_reading_every_part(tmp_path, seed):
    rng = random.Random(seed)
    keys = [content_key("s", seed, i) for i in range(6000)] + [f"k{i}" for i in range(30)]
    rng.shuffle(keys)
    store = compacted_store(tmp_path / "s", keys)
    assert len(indexes(store)) == len(store.part_paths())
    store.write(answers([content_key("fresh", i) for i in range(40)]))  # a part not compacted yet
    probe = rng.sample(keys, 900) + [content_key("fresh", i) for i in range(0, 80, 3)] + [content_key("never", i) for i in range(400)] + ["k7", "k70"]
    rng.shuffle(probe)
    check(store, probe)
    check(store, keys)  # an all-cached rerun


def test_a_mostly_new_window_reads_indexes_and_nothing_else(tmp_path, monkeypatch):
    store = compacted_store(tmp_path / "s", [content_key("old", i) for i in range(5000)])
    seen = spy(store, monkeypatch)
    window = [content_key("new", i) for i in range(3000)]
    assert all(store.missing(window).to_pylist())
    assert seen and all(name.endswith(SUFFIX) for how, name in seen)  # no part opened at all


def test_a_keyed_read_fetches_only_the_row_groups_that_hold_hits(tmp_path, monkeypatch):
    keys = sorted(content_key("rg", i) for i in range(1000))
    store = compacted_store(tmp_path / "s", keys, small_rows=1000)  # one part, 16 row groups of 64
    (part,) = store.part_paths()
    assert pq.read_metadata(part).num_row_groups == 16
    seen = spy(store, monkeypatch)
    probe = [keys[3], keys[5], keys[64 * 9 + 1]] + [content_key("new", i) for i in range(500)]
    got = store.read(["key", "logp_yes"], keys=probe)
    assert sorted(got.column("key").to_pylist()) == sorted(probe[:3])
    assert ("groups", [0, 9]) in seen
    assert ("cat", Path(part).name) not in seen  # never the whole part


def test_window_after_window_fetches_each_index_once_until_it_changes(tmp_path, monkeypatch):
    keys = [content_key("w", i) for i in range(2000)]
    store = compacted_store(tmp_path / "s", keys, small_rows=2000)
    (part,) = store.part_paths()
    seen = spy(store, monkeypatch)
    check(store, keys[:50] + [content_key("new", 1)])
    assert sum(how == "cat" and name.endswith(SUFFIX) for how, name in seen) == 1
    assert store.missing(keys[50:100]).to_pylist() == [False] * 50  # another window: the same index, not fetched again
    assert sum(how == "cat" and name.endswith(SUFFIX) for how, name in seen) == 1
    corrupt(Path(part + SUFFIX), "rows shifted", keys)  # rewritten: a new version, fetched and found wrong
    check(store, keys[:50] + [content_key("new", 1)])
    assert sum(how == "cat" and name.endswith(SUFFIX) for how, name in seen) == 2 and store.quarantined_indexes


def test_the_ranged_read_path_of_object_stores(monkeypatch):
    """memory:// stands in for S3: not local, so compacted parts are read through fs.open."""
    import fsspec

    root = f"memory://idx-{random.Random().getrandbits(40):x}"
    keys = [content_key("mem", i) for i in range(900)]
    store = PartStore(root + "/s", schema.ANSWERS)
    for i in range(0, 900, 150):
        store.write(answers(keys[i:i + 150]))
    store.compact(small_rows=64)
    seen = check(store, keys[:40] + [content_key("x", i) for i in range(40)], monkeypatch)
    assert any(how == "ranged" for how, _ in seen)
    assert not any(how == "cat" and name.endswith(".parquet") for how, name in seen)
    fsspec.filesystem("memory").rm(root.removeprefix("memory://"), recursive=True)


# -- compaction and broken indexes -----------------------------------------------------------
def test_a_compaction_killed_between_a_part_and_its_index_loses_nothing(tmp_path, monkeypatch):
    keys = [content_key("kill", i) for i in range(1200)]
    store = PartStore(str(tmp_path / "s"), schema.ANSWERS)
    for i in range(0, 1200, 100):
        store.write(answers(keys[i:i + 100]))
    write = parts.write_bytes_atomic

    def dying(url, data):
        if url.endswith(SUFFIX):
            raise KeyboardInterrupt("killed")
        write(url, data)

    monkeypatch.setattr(parts, "write_bytes_atomic", dying)
    with pytest.raises(KeyboardInterrupt):
        store.compact(small_rows=64)
    monkeypatch.undo()
    assert any(COMPACTED.match(Path(p).name) for p in store.part_paths()) and not indexes(store)
    check(store, keys[::7] + [content_key("no", i) for i in range(50)])  # the unindexed part is read whole
    store.compact(small_rows=64)  # folds the duplicates and indexes every compacted part
    assert len(indexes(store)) == len(store.part_paths())
    assert sorted(k for p in store.part_paths() for k in pq.read_table(p, columns=["key"]).column("key").to_pylist()) == sorted(keys)
    check(store, keys)


def test_a_missing_index_means_reading_the_part_and_compact_writes_it_again(tmp_path):
    keys = [content_key("gone", i) for i in range(700)]
    store = compacted_store(tmp_path / "s", keys)
    for name in indexes(store):
        (tmp_path / "s" / name).unlink()
    check(store, keys[:100] + [content_key("no", i) for i in range(100)])
    summary = store.compact(small_rows=64)
    assert summary["indexes_written"] == len(store.part_paths()) and summary["parts_in"] == 0
    assert len(indexes(store)) == len(store.part_paths())
    check(store, keys)


def test_parts_compacted_by_older_code_are_indexed_with_their_own_row_groups(tmp_path):
    keys = sorted(content_key("old-code", i) for i in range(300))
    store = PartStore(str(tmp_path / "s"), schema.ANSWERS)
    name = f"part-k-n300-{'ab' * 12}.parquet"
    (tmp_path / "s").mkdir()
    pq.write_table(answers(keys), tmp_path / "s" / name)  # no row_group_size, no index
    assert store.compact(small_rows=64)["indexes_written"] == 1  # one row group of 300 rows
    assert KeyIndex.from_bytes((tmp_path / "s" / (name + SUFFIX)).read_bytes(), name).row_group_rows == 300
    check(store, keys[::5] + [content_key("no", 1)])


def corrupt(path: Path, how: str, keys: list[str]):
    name = path.name.removesuffix(SUFFIX)
    if how == "garbage":
        path.write_bytes(b"not an index at all")
    elif how == "truncated":
        path.write_bytes(path.read_bytes()[:-100])
    elif how == "another part's":
        path.write_bytes(KeyIndex.build("part-k-n3-other.parquet", pa.array(sorted(keys[:3])), GROUP).to_bytes())
    elif how == "rows shifted":  # well formed, its part's name, every prefix one row off
        good = KeyIndex.from_bytes(path.read_bytes(), name)
        path.write_bytes(KeyIndex(name, good.prefixes, np.roll(np.arange(good.num_rows), 1).astype(np.uint32), GROUP).to_bytes())
    elif how == "lists absent keys":  # well formed, but its prefixes are of keys the part does not hold
        good = KeyIndex.from_bytes(path.read_bytes(), name)
        path.write_bytes(KeyIndex(name, np.sort(key_prefixes(pa.array([content_key("absent", i) for i in range(good.num_rows)]))), None, GROUP).to_bytes())
    elif how == "omits keys":  # well formed, each key of keys[::9] replaced by a key never asked for
        good = KeyIndex.from_bytes(path.read_bytes(), name)
        prefixes = good.prefixes.copy()
        omitted = np.isin(prefixes, key_prefixes(pa.array(keys[::9])))
        prefixes[omitted] = key_prefixes(pa.array([content_key("phantom", i) for i in range(int(omitted.sum()))]))
        order = np.argsort(prefixes, kind="stable")
        path.write_bytes(KeyIndex(name, prefixes[order], order.astype(np.uint32), GROUP).to_bytes())


def probe_of(keys):
    return keys[::9] + [content_key("absent", i) for i in range(0, 800, 9)]


@pytest.mark.parametrize("how", ["garbage", "truncated", "another part's", "rows shifted", "lists absent keys"])
def test_an_index_that_disagrees_with_its_part_is_set_aside_and_the_part_read_whole(tmp_path, how):
    keys = [content_key("lie", i) for i in range(800)]
    store = compacted_store(tmp_path / "s", keys, small_rows=800)
    (part,) = store.part_paths()
    corrupt(Path(part + SUFFIX), how, keys)
    check(store, probe_of(keys))
    assert [q["reason"] for q in store.quarantined_indexes] and not indexes(store)  # moved aside
    assert not store.quarantined  # the part itself is fine
    assert store.compact(small_rows=800)["indexes_written"] == 1  # the next compaction indexes it again
    check(store, probe_of(keys))
    assert admin.verify(str(tmp_path))[0].ok


def test_an_index_that_omits_keys_only_ever_errs_towards_computing_them_again(tmp_path):
    keys = [content_key("lie", i) for i in range(800)]
    store = compacted_store(tmp_path / "s", keys, small_rows=800)
    (part,) = store.part_paths()
    corrupt(Path(part + SUFFIX), "omits keys", keys)
    probe = probe_of(keys)
    assert all(store.missing(probe).to_pylist())  # never "stored" for a key that is not: the safe side
    assert store.read(["key"], keys=probe).num_rows == 0
    (report,) = admin.verify(str(tmp_path))
    assert not report.ok and report.bad_indexes  # verify finds the lie ...
    admin.verify(str(tmp_path), repair=True)  # ... and repair writes the index again
    check(store, probe)
    assert admin.verify(str(tmp_path))[0].ok


def test_a_bad_compacted_part_is_quarantined_with_its_index_and_its_keys_read_as_missing(tmp_path):
    keys = [content_key("bad", i) for i in range(500)]
    store = compacted_store(tmp_path / "s", keys, small_rows=500)
    (part,) = store.part_paths()
    Path(part).write_bytes(Path(part).read_bytes()[: 3000])  # truncated; its index is fine
    assert store.missing(keys[:20] + [content_key("new", 0)]).to_pylist() == [True] * 21
    assert [Path(q["path"]).name for q in store.quarantined] == [Path(part).name]
    assert not store.part_paths() and not indexes(store)  # both moved aside, nothing deleted
    assert len(list((tmp_path / "s" / "_quarantine").iterdir())) == 2


def test_verify_checks_indexes_and_repair_rewrites_them(tmp_path):
    import jobs.store

    keys = [content_key("v", i) for i in range(600)]
    store = compacted_store(tmp_path / "answers" / "b", keys, small_rows=600)
    (part,) = store.part_paths()
    (report,) = admin.verify(str(tmp_path))
    assert report.ok and report.indexes == 1 and not report.unindexed
    corrupt(Path(part + SUFFIX), "rows shifted", keys)
    (report,) = admin.verify(str(tmp_path))
    assert not report.ok and "other keys or rows" in report.bad_indexes[0]["reason"]
    assert jobs.store.main(["verify", f"store={tmp_path}"]) == 1
    admin.verify(str(tmp_path), repair=True)
    (report,) = admin.verify(str(tmp_path))
    assert report.ok and report.indexes == 1
    Path(part + SUFFIX).unlink()
    (report,) = admin.verify(str(tmp_path))
    assert report.ok and report.unindexed == 1  # no index is slower, never wrong
    assert jobs.store.main(["verify", f"store={tmp_path}", "repair=true"]) == 0
    assert Path(part + SUFFIX).exists()


def test_gc_removes_indexes_whose_part_is_gone(tmp_path):
    store = compacted_store(tmp_path / "s", [content_key("gc", i) for i in range(300)], small_rows=300)
    (part,) = store.part_paths()
    Path(part).unlink()  # e.g. a compaction killed between removing a part and its index
    removed = admin.gc(str(tmp_path))
    assert [Path(p).name for p in removed] == [Path(part).name + SUFFIX]
    assert not indexes(store)
