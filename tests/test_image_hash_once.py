"""Image hashes are computed once: while extracting embedded bytes, from a shard's own hash
column, or from the (uri, size, mtime/ETag) cache; ingest reads only images it has never seen."""
from __future__ import annotations

import os
import tarfile

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from curation_shards import CORRUPT_PNG, image_bytes, pair_rows, write_parquet

from operators import schema
from operators.hashing import image_hash
from pipeline.curation import shards
from pipeline.curation.shards import shard_pairs
from pipeline.stages import ingest
from pipeline.store.folder import Folder


def pairs_of(path, images_dir, **kwargs):
    return shard_pairs("s", str(path), "parquet", image_column="image", caption_column="caption", images=Folder(str(images_dir)), **kwargs).to_pylist()


def items_frame(uris, hashes=None):
    rows = [{"item_id": f"b/{i}", "benchmark": "b", "image_uri": u, "image_hash": (hashes or [None] * len(uris))[i], "caption": f"c{i}", "group_id": str(i)}
            for i, u in enumerate(uris)]
    return pl.from_arrow(schema.conform(pa.Table.from_pylist(rows), schema.ITEMS))


def test_extraction_hashes_checks_and_stores_each_image_once(tmp_path, monkeypatch):
    rows = pair_rows(range(3))
    rows[1]["image"] = CORRUPT_PNG
    path = write_parquet(tmp_path / "a.parquet", rows)
    decoded = []
    real = shards.decode_image
    monkeypatch.setattr(shards, "decode_image", lambda data, uri: decoded.append(uri) or real(data, uri))
    pairs = pairs_of(path, tmp_path / "images")
    assert [p["image_hash"] for p in pairs] == [image_hash(image_bytes(0)), None, image_hash(image_bytes(2))]
    assert (pairs[1]["field"], pairs[1]["reason"]) == ("image", "unreadable_image")
    assert pairs[1]["image_uri"] is None and "row 1" in pairs[1]["detail"]
    (pack,) = [p for p in (tmp_path / "images").rglob("*") if p.is_file()]
    with tarfile.open(pack) as tar:  # the corrupt blob is not stored
        assert sorted(tar.getnames()) == sorted(f"{image_hash(image_bytes(i))}.png" for i in (0, 2))
    assert len(decoded) == 3  # each image decoded once, while its bytes were in memory


def test_items_with_a_known_hash_are_not_read_again(tmp_path):
    items = items_frame([str(tmp_path / "gone.png")], ["abc"])  # the file does not even exist
    out, report = ingest.hash_item_images(items)
    assert out["image_hash"].to_list() == ["abc"] and report.sent == 0 and report.failed == 0


def test_a_shard_hash_column_is_used_for_referenced_images(tmp_path):
    rows = pair_rows([5, 6], image="path", folder=tmp_path)
    table = pa.Table.from_pylist(rows).append_column("sha256", pa.array(["ff00", " "]))
    pq.write_table(table, tmp_path / "a.parquet")
    pairs = pairs_of(tmp_path / "a.parquet", tmp_path / "extracted", hash_column="sha256")
    assert [p["image_hash"] for p in pairs] == ["sha256:ff00", None]  # blank: unknown, hashed by ingest
    assert [p["image_uri"] for p in pairs] == [str(tmp_path / "images" / "5.png"), str(tmp_path / "images" / "6.png")]


def test_benchmark_images_are_hashed_once_per_file_version(tmp_path, ray_session):
    files = []
    for i in range(5):
        f = tmp_path / "img" / f"{i}.png"
        f.parent.mkdir(exist_ok=True)
        f.write_bytes(image_bytes(i))
        files.append(str(f))
    (tmp_path / "img" / "bad.png").write_bytes(CORRUPT_PNG)
    items = items_frame([*files, files[0], str(tmp_path / "img" / "bad.png")])
    cache = str(tmp_path / "store" / "image_hashes")
    first, report = ingest.hash_item_images(items, cache_url=cache)
    assert report.sent == 6 and report.failed == 1
    assert first["image_hash"].to_list() == [image_hash(image_bytes(i)) for i in (0, 1, 2, 3, 4, 0)]
    second, report = ingest.hash_item_images(items, cache_url=cache)
    assert report.sent == 1 and report.cached == 5 and report.failed == 1  # only the unreadable one is read again
    assert second.equals(first)
    # a file rewritten in place (new size and mtime) is hashed again
    os.replace(files[1], tmp_path / "tmp.png")
    (tmp_path / "img" / "1.png").write_bytes(image_bytes(99) + b"\0" * 10)
    third, report = ingest.hash_item_images(items, cache_url=cache)
    assert report.sent == 2
    assert third["image_hash"].to_list()[1] == image_hash(image_bytes(99) + b"\0" * 10)


def test_the_hash_cache_is_read_only_for_this_inputs_files(tmp_path, ray_session, monkeypatch):
    """A night reads the cache entries of its own files, not every file any past night hashed."""
    from pipeline.store.parts import PartStore

    old = []
    for i in range(6):
        f = tmp_path / "old" / f"{i}.png"
        f.parent.mkdir(exist_ok=True)
        f.write_bytes(image_bytes(i))
        old.append(str(f))
    cache = str(tmp_path / "store" / "image_hashes")
    ingest.hash_item_images(items_frame(old), cache_url=cache)  # a past night: six cache entries
    reads = []
    real_read = PartStore.read

    def spy(self, columns=None, *, keys=None):
        out = real_read(self, columns, keys=keys)
        if self.url == cache:
            reads.append((None if keys is None else len(keys), out.num_rows))
        return out

    monkeypatch.setattr(PartStore, "read", spy)
    tonight, report = ingest.hash_item_images(items_frame(old[:2]), cache_url=cache)
    assert report.cached == 2 and report.sent == 0
    assert reads == [(2, 2)]  # two keys asked, two rows read: the other four entries stay unread
    assert tonight["image_hash"].to_list() == [image_hash(image_bytes(i)) for i in (0, 1)]


def test_write_once_writes_each_image_once_and_survives_a_removed_folder(tmp_path):
    """Extraction writes images with os calls (fsspec's exists and makedirs cost more than the
    write), making a folder only when it is missing, also one removed since (a cleanup)."""
    import shutil

    from pipeline.store.folder import content_address

    folder = Folder(str(tmp_path / "images"))
    data = [bytes([i]) * 40 for i in range(3)]
    paths = [content_address(folder, d)[0] for d in data]
    folder.write_once(paths[0], data[0])
    assert open(paths[0], "rb").read() == data[0] and folder.exists_now(paths[0])
    folder.write_once(paths[0], b"other bytes")  # already there: not rewritten
    assert open(paths[0], "rb").read() == data[0]
    for path in paths:
        if os.path.isdir(os.path.dirname(path)):
            shutil.rmtree(os.path.dirname(path))  # removed behind the folder's back
    for path, d in zip(paths, data, strict=True):
        folder.write_once(path, d)
        assert open(path, "rb").read() == d
    assert not [n for n in os.listdir(os.path.dirname(paths[0])) if n.startswith(".tmp-")]  # no temp file left


@pytest.fixture(params=[0o022, 0o027], ids=["umask-022", "umask-027"])
def umask(request):
    old = os.umask(request.param)
    yield request.param
    os.umask(old)


def test_extracted_images_and_demo_files_get_an_ordinary_files_mode_and_a_failed_write_leaves_nothing(tmp_path, monkeypatch, umask):
    """mkstemp makes its files 0600, which would leave extracted images unreadable to every other
    user of a shared store, unlike the store's parts. They get what `open` gives under the umask."""
    import stat

    from pipeline.benchmarks.demo import write_demo
    from pipeline.store.folder import content_address

    with open(tmp_path / "plain", "wb"):
        pass
    assert stat.S_IMODE(os.stat(tmp_path / "plain").st_mode) == 0o666 & ~umask
    ordinary = stat.S_IMODE(os.stat(tmp_path / "plain").st_mode)
    folder = Folder(str(tmp_path / "images"))
    path, _ = content_address(folder, image_bytes(0))
    folder.write_once(path, image_bytes(0))
    assert stat.S_IMODE(os.stat(path).st_mode) == ordinary
    write_demo(str(tmp_path / "demo"))
    modes = {stat.S_IMODE(os.stat(os.path.join(d, n)).st_mode) for d, _, names in os.walk(tmp_path / "demo") for n in names}
    assert modes == {ordinary}

    def full_disk(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("pipeline.store.folder.os.replace", full_disk)
    other, _ = content_address(folder, image_bytes(1))
    with pytest.raises(OSError, match="No space"):
        folder.write_once(other, image_bytes(1))
    assert not os.path.exists(other)
    assert not [n for n in os.listdir(os.path.dirname(other)) if n.startswith(".tmp-")]  # the temporary file is gone too
