"""`store gc gone_shards=true`: the pairs-cache entries of input shards that are gone or
changed, and the image packs only they pointed into, are removed; everything a live shard
still uses is kept, and a shard that comes back is read and packed again."""
from __future__ import annotations

import importlib
import os
import shutil
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from curation_shards import image_bytes, pair_rows, tar_samples, write_parquet, write_tar

from operators.images import read_image_bytes, split_byte_range
from pipeline.curation import prune, run
from pipeline.curation.curation_config import load_curation_config
from pipeline.curation.pairs_cache import PAIRS, PairsCache, recorded
from pipeline.curation.prune import prune_gone_shards
from pipeline.curation.rows import pairs_cache, read_pairs
from pipeline.curation.shards import discover
from pipeline.store.folder import Folder
from pipeline.store.image_packs import ImagePack

HOUR = 3600.0


def _config(root):
    return load_curation_config(["curation=smoke", "compute.progress_bars=false", f"root={root}", f"inputs=[{root}/in/]"])


def _pack(pairs, shard_id: str) -> str:
    (uri,) = {u.split("#bytes=")[0] for u, s in zip(pairs["image_uri"], pairs["shard_id"], strict=True) if s == shard_id}
    return uri


def _age(paths, seconds: float) -> None:
    then = time.time() - seconds
    for path in paths:
        os.utime(path, (then, then))


def test_entries_of_gone_or_changed_shards_and_the_packs_only_they_used_are_removed(tmp_path, ray_session, capsys):
    store_job = importlib.import_module("jobs.store")
    inputs = tmp_path / "in"
    a = write_parquet(inputs / "a.parquet", pair_rows(range(3)))
    b = write_tar(inputs / "b.tar", tar_samples([3, 4]))
    write_parquet(inputs / "c.parquet", pair_rows(range(5, 7)))
    d = inputs / "d.parquet"
    shutil.copy(a, d)  # the same images as a: one pack for both
    cfg = _config(tmp_path)
    cache = pairs_cache(cfg.sweep)
    store = str(tmp_path / "store")
    shards = {os.path.basename(s.uri): s for s in discover([str(inputs)])}
    first = read_pairs(list(shards.values()), cfg)
    packs = {name: _pack(first, s.shard_id) for name, s in shards.items()}
    assert packs["a.parquet"] == packs["d.parquet"] and len(set(packs.values())) == 3
    entry = {name: tmp_path / "store" / "shard_pairs" / cache.key(s)[:2] / f"{cache.key(s)}.parquet" for name, s in shards.items()}
    import fsspec

    local = fsspec.filesystem("file")
    assert recorded(local, str(entry["b.tar"])) == (shards["b.tar"], {packs["b.tar"]})

    # c's entry as an older version wrote it: no record of its shard (kept, and so is its pack)
    table = pq.read_table(entry["c.parquet"])
    pq.write_table(table.replace_schema_metadata(None), entry["c.parquet"])
    assert recorded(local, str(entry["c.parquet"]))[0] is None
    # a damaged entry: runs never use it
    damaged = tmp_path / "store" / "shard_pairs" / "ff" / ("f" * 32 + ".parquet")
    damaged.parent.mkdir(parents=True, exist_ok=True)
    damaged.write_bytes(b"PAR1 not really")

    os.remove(a)  # gone; its pack is still d's
    write_tar(b, tar_samples([3, 4, 8]))  # changed: its old pack is nobody's now
    os.utime(b, ns=(time.time_ns(), time.time_ns() + 10**9))
    young = ImagePack()  # an orphan written just now, as a running curation's window would
    young.add(image_bytes(99))
    young_uri = young.write(Folder(f"{store}/images"))
    _age([p for p in packs.values()], 2 * HOUR)

    dry = prune_gone_shards(store, min_age_s=HOUR, dry_run=True)
    assert (dry.entries, dry.packs, dry.unrecorded, dry.young) == (5, 4, 1, 1)
    assert sorted(os.path.basename(x["path"]) for x in dry.dead) == sorted([entry["a.parquet"].name, entry["b.tar"].name, damaged.name])
    reasons = " | ".join(x["reason"] for x in dry.dead)
    assert f"{shards['a.parquet'].uri} is gone" in reasons and f"{shards['b.tar'].uri} changed" in reasons and "unreadable" in reasons
    assert [x["path"] for x in dry.orphans] == [packs["b.tar"]] and dry.freed_bytes == os.path.getsize(packs["b.tar"])
    assert entry["a.parquet"].exists() and os.path.exists(packs["b.tar"])  # a dry run removes nothing

    assert store_job.main(["gc", f"store={store}", f"min_age_s={HOUR}", "gone_shards=true"]) == 0
    out = capsys.readouterr().out
    assert f"removed {packs['b.tar']} (image pack no live entry points into" in out
    assert f"(pairs-cache entry: its shard {shards['a.parquet'].uri} is gone)" in out
    assert "3 dead (shard gone or changed, or unreadable) removed, 1 written before entries recorded their shard (kept)" in out
    assert not entry["a.parquet"].exists() and not entry["b.tar"].exists() and not damaged.exists()
    assert not os.path.exists(packs["b.tar"])
    for kept in (packs["a.parquet"], packs["c.parquet"], young_uri):
        assert os.path.exists(kept)
    assert cache.get(shards["d.parquet"]) is not None and cache.get(shards["c.parquet"]) is not None

    now = {os.path.basename(s.uri): s for s in discover([str(inputs)])}
    again = read_pairs(list(now.values()), cfg)  # b read again; c and d from the cache
    assert again.height == 3 + 2 + 3
    assert [read_image_bytes(u) for u in again["image_uri"]] == [image_bytes(i) for i in [3, 4, 8, 5, 6, 0, 1, 2]]
    after = prune_gone_shards(store, min_age_s=0)
    assert after.dead == [] and [os.path.basename(x["path"]) for x in after.orphans] == [os.path.basename(young_uri)]
    assert after.unrecorded == 0  # c's entry, used again, now records its shard
    assert recorded(local, str(entry["c.parquet"])) == (now["c.parquet"], {packs["c.parquet"]})


def test_no_pack_is_removed_while_a_curation_runs_on_the_store(tmp_path, ray_session, capsys):
    """A running curation may be writing packs it records later (a pack stored before keeps its
    old mtime) or scoring rows of a shard deleted meanwhile: while its reader's lease is live, gc
    removes dead entries but no pack."""
    store_job = importlib.import_module("jobs.store")
    path = write_parquet(tmp_path / "in" / "a.parquet", pair_rows(range(2)))
    cfg = _config(tmp_path)
    store = str(tmp_path / "store")
    (shard,) = discover([str(path)])
    pack = read_pairs([shard], cfg)["image_uri"][0].split("#bytes=")[0]
    os.remove(path)
    _age([pack], 2 * HOUR)
    with prune.reading_packs(store, "curation nightly (out/nightly)"):
        report = prune_gone_shards(store)
        assert len(report.dead) == 1 and report.orphans == [] and os.path.exists(pack)
        assert len(report.readers) == 1 and "curation nightly (out/nightly)" in report.readers[0]
        assert "packs kept: 1 curation(s) running on this store" in report.line()
    assert not (tmp_path / "store" / "shard_pairs" / "_readers").exists() or not any((tmp_path / "store" / "shard_pairs" / "_readers").iterdir())
    assert [x["path"] for x in prune_gone_shards(store).orphans] == [pack] and not os.path.exists(pack)

    # a reader killed without releasing its lease stops counting once the lease expires
    stale = prune.Lease(f"{store}/shard_pairs/_readers/killed", what="curation killed", clock=lambda: time.time() - 2 * HOUR)
    stale.acquire()
    assert prune.readers(store) == ([], [stale.path])
    dry = prune_gone_shards(store, dry_run=True)
    assert "1 reader lease(s) of curations that ended without releasing them to remove" in dry.line() and os.path.exists(stale.path)
    prune_gone_shards(store)
    assert prune.readers(store) == ([], []) and not os.path.exists(os.path.dirname(stale.path))
    assert store_job.main(["gc", f"store={tmp_path}", "gone_shards=true"]) == 0  # the root, not its store
    assert "nothing was curated into this store (is store= the store folder" in capsys.readouterr().out
    assert store_job.main(["gc", f"store={store}", "gone_shards=true", "min_age_s=nan"]) == 2


def test_a_curation_holds_a_readers_lease_while_it_runs(tmp_path, ray_session, monkeypatch):
    from pipeline.curation.run import run_curation

    write_parquet(tmp_path / "in" / "a.parquet", pair_rows(range(2)))
    cfg = load_curation_config(["curation=smoke", "compute.progress_bars=false", f"root={tmp_path}", f"inputs=[{tmp_path}/in/]", "backbones=[zero-cost]"])
    seen, real = [], run.read_pairs

    def spy(shards, cfg):
        seen.append(prune.readers(str(tmp_path / "store"))[0])
        return real(shards, cfg)

    monkeypatch.setattr(run, "read_pairs", spy)
    run_curation(cfg)
    assert len(seen) == 1 and len(seen[0]) == 1 and "curation" in seen[0][0]
    assert prune.readers(str(tmp_path / "store")) == ([], [])


def test_a_shard_versioned_by_content_is_judged_by_size(tmp_path, ray_session):
    """detect_changes=content (the cure for file systems without an ETag or mtime): the bytes
    are not read again here, so a shard still there with its size is live."""
    path = write_parquet(tmp_path / "in" / "a.parquet", pair_rows(range(2)))
    cfg = _config(tmp_path)
    (shard,) = discover([str(path)], "content")
    read_pairs([shard], cfg)
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 10**9))  # a new mtime does not matter
    assert prune.shard_state(shard) is None
    assert prune_gone_shards(str(tmp_path / "store"), min_age_s=0).dead == []
    write_parquet(path, pair_rows(range(3)))
    assert "changed" in prune.shard_state(shard)


def test_a_shard_that_cannot_be_checked_removes_nothing(tmp_path, ray_session, monkeypatch):
    write_parquet(tmp_path / "in" / "a.parquet", pair_rows(range(2)))
    cfg = _config(tmp_path)
    (shard,) = discover([str(tmp_path / "in")])
    pairs = read_pairs([shard], cfg)
    os.remove(shard.uri)
    pack = pairs["image_uri"][0].split("#bytes=")[0]

    def unreachable(shard):
        raise PermissionError(f"{shard.uri}: access denied")

    monkeypatch.setattr(prune, "shard_state", unreachable)
    with pytest.raises(prune.PruneError, match="access denied.*nothing was removed"):
        prune_gone_shards(str(tmp_path / "store"), min_age_s=0)
    assert pairs_cache(cfg.sweep).get(shard) is not None and os.path.exists(pack)


def test_gone_shards_on_s3(moto_s3):
    """Entries and packs on S3, shards versioned by ETag. (moto keeps buckets for the whole
    process, so these are named for this test.)"""
    moto_s3.mkdir("prune-store")
    moto_s3.mkdir("prune-incoming")
    cache = PairsCache("s3://prune-store/shard_pairs", {})
    uris = {}
    for name, indices in (("kept", [0, 1]), ("gone", [2, 3])):
        pack = ImagePack()
        hashes = [pack.add(image_bytes(i)) for i in indices]
        pack_uri = pack.write(Folder("s3://prune-store/images"))
        moto_s3.pipe_file(f"prune-incoming/{name}.parquet", name.encode())
        (shard,) = discover([f"s3://prune-incoming/{name}.parquet"])
        assert shard.version.startswith("etag:")
        rows = pa.table({
            "shard_id": [shard.shard_id] * 2, "row": [0, 1],
            "image_uri": [pack.image_uri(pack_uri, h) for h in hashes], "image_hash": hashes,
            "caption": ["a", "b"], "field": [None, None], "reason": [None, None], "detail": [None, None],
        })
        cache.put(shard, rows.select(PAIRS.names).cast(PAIRS))
        uris[name] = (shard, pack_uri)
    moto_s3.rm("prune-incoming/gone.parquet")
    with prune.reading_packs("s3://prune-store", "curation on s3"):  # a lease by conditional PUT
        (reader,), _ = prune.readers("s3://prune-store")
        assert "curation on s3" in reader and prune_gone_shards("s3://prune-store", min_age_s=0, dry_run=True).orphans == []
    assert prune.readers("s3://prune-store") == ([], [])
    report = prune_gone_shards("s3://prune-store", min_age_s=0)
    assert [x["reason"] for x in report.dead] == [f"its shard {uris['gone'][0].uri} is gone"]
    assert [x["path"] for x in report.orphans] == [uris["gone"][1]]
    assert not moto_s3.exists(uris["gone"][1]) and moto_s3.exists(uris["kept"][1])
    assert cache.get(uris["kept"][0]) is not None and cache.get(uris["gone"][0]) is None
    assert split_byte_range(cache.get(uris["kept"][0]).column("image_uri")[0].as_py())[0] == uris["kept"][1]


def test_a_curation_that_starts_while_gc_runs_keeps_its_packs(tmp_path, ray_session, monkeypatch):
    """One that ran from start to end while gc checked the shards (its new entry points into an
    old pack: a renamed shard), and one that starts while gc removes packs."""
    inputs = tmp_path / "in"
    for name, indices in (("a", range(2)), ("b", range(2, 4))):
        write_parquet(inputs / f"{name}.parquet", pair_rows(indices))
    cfg = _config(tmp_path)
    store = str(tmp_path / "store")
    shards = discover([str(inputs)])
    first = read_pairs(shards, cfg)
    renamed, removed = (_pack(first, s.shard_id) for s in shards)
    _age([renamed, removed], 2 * HOUR)
    os.rename(inputs / "a.parquet", inputs / "renamed.parquet")
    os.remove(inputs / "b.parquet")
    real_state, calls = prune.shard_state, []

    def slow_state(shard):  # meanwhile a whole curation reads the renamed shard: its pack exists already
        if not calls:
            read_pairs(discover([str(inputs / "renamed.parquet")]), cfg)
        calls.append(shard)
        return real_state(shard)

    monkeypatch.setattr(prune, "shard_state", slow_state)
    report = prune_gone_shards(store)
    assert len(report.dead) == 2 and [x["path"] for x in report.orphans] == [removed]
    assert os.path.exists(renamed) and not os.path.exists(removed)
    monkeypatch.setattr(prune, "shard_state", real_state)

    for name, indices in (("c", range(4, 6)), ("d", range(6, 8))):
        write_parquet(inputs / f"{name}.parquet", pair_rows(indices))
    late = discover([str(inputs / "c.parquet"), str(inputs / "d.parquet")])
    packs = [_pack(read_pairs(late, cfg), s.shard_id) for s in late]
    _age(packs, 2 * HOUR)
    for s in late:
        os.remove(s.uri)
    monkeypatch.setattr(prune, "REMOVE_CHUNK", 1)
    real_remove, started = prune._remove, []

    def remove(fs, doomed):  # a curation starts right after the first pack is removed
        real_remove(fs, doomed)
        if doomed["_path"].endswith(".tar") and not started:
            started.append(prune.Lease(f"{store}/shard_pairs/_readers/late", what="curation late").acquire())

    monkeypatch.setattr(prune, "_remove", remove)
    report = prune_gone_shards(store)
    assert len(report.dead) == 2 and len(report.orphans) == 1 and "curation late" in report.readers[0]
    assert sum(os.path.exists(p) for p in packs) == 1 and os.path.exists(renamed)  # removal stopped when it started
    assert "pack removal stopped: 1 curation(s) running" in report.line()


def test_only_a_404_means_an_http_shard_is_gone(tmp_path, ray_session):
    """fsspec's HTTP file system says "not found" for any failure: a server that is down must
    stop gc, not count every shard behind it as gone."""
    import functools
    import http.server
    import threading

    served = tmp_path / "served"
    path = write_parquet(served / "a.parquet", pair_rows(range(2)))
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(served))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/a.parquet"
    try:
        (shard,) = discover([url], "content")  # no ETag or mtime over HTTP: versioned by content
        assert prune.shard_state(shard) is None
        os.remove(path)
        assert prune.shard_state(shard) == f"its shard {url} is gone"
        write_parquet(path, pair_rows(range(2)))
    finally:
        server.shutdown()
        server.server_close()
    with pytest.raises(OSError, match="cannot be reached"):
        prune.shard_state(shard)


def test_an_old_entry_that_cannot_be_recorded_is_still_used(tmp_path, ray_session, monkeypatch, caplog):
    path = write_parquet(tmp_path / "in" / "a.parquet", pair_rows(range(2)))
    cfg = _config(tmp_path)
    (shard,) = discover([str(path)])
    read_pairs([shard], cfg)
    cache = pairs_cache(cfg.sweep)
    entry = next((tmp_path / "store" / "shard_pairs").rglob(f"{cache.key(shard)}.parquet"))
    pq.write_table(pq.read_table(entry).replace_schema_metadata(None), entry)

    def read_only(*args, **kwargs):
        raise PermissionError("read-only store")

    monkeypatch.setattr("pipeline.curation.pairs_cache.write_table", read_only)
    assert cache.get(shard).num_rows == 2 and "could not record" in caplog.text
