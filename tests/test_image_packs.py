"""Image packs (a shard's embedded images as one tar, each image a byte range of it) and the
pairs cache (a shard read once, whatever the output it is curated into)."""
from __future__ import annotations

import importlib
import os
import tarfile
import time

import polars as pl
import pytest
from curation_shards import image_bytes, pair_rows, tar_samples, write_parquet, write_tar
from hypothesis import given, settings
from hypothesis import strategies as hst

from operators.images import ImageError, byte_range_uri, read_image_bytes, split_byte_range
from pipeline.curation import rows, windows
from pipeline.curation.curation_config import load_curation_config
from pipeline.curation.rows import pairs_cache, read_pairs
from pipeline.curation.shards import discover
from pipeline.store.folder import Folder
from pipeline.store.image_packs import ImagePack, ustar_header

# -- the pack format ---------------------------------------------------------------------------


@settings(max_examples=30, deadline=None)
@given(name=hst.text(alphabet="abcdef0123456789._-", min_size=1, max_size=100), size=hst.integers(0, 8**11 - 1))
def test_ustar_headers_are_the_bytes_tarfile_writes(name, size):
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = size, 0, 0o644
    assert ustar_header(name, size) == info.tobuf(tarfile.USTAR_FORMAT, "utf-8", "surrogateescape")


def test_a_pack_is_a_tar_whose_images_read_back_by_range(tmp_path):
    images = [image_bytes(i) for i in range(4)] + [b"\xff\xd8\xff" + os.urandom(700)]  # PNGs and a JPEG-signed blob
    pack = ImagePack()
    hashes = [pack.add(data) for data in [*images, images[0]]]  # a repeated image is stored once
    assert len(pack) == 5 and hashes[5] == hashes[0]
    uri = pack.write(Folder(str(tmp_path)))
    assert uri.startswith(str(tmp_path / "packs")) and uri.endswith(".tar")
    with tarfile.open(uri) as tar:  # standard tools read it
        members = tar.getmembers()
        assert [m.name for m in members] == [f"{h}.png" for h in hashes[:4]] + [f"{hashes[4]}.jpg"]
        assert [tar.extractfile(m).read() for m in members] == images
    for h, data in zip(hashes, [*images, images[0]], strict=True):
        assert read_image_bytes(pack.image_uri(uri, h)) == data


def test_the_same_images_in_another_order_make_another_pack(tmp_path):
    """A pack's name is the hash of its bytes: one written earlier under the same name has the
    same offsets, so skipping the write is safe (a name from the set of images would not be)."""
    first, second = ImagePack(), ImagePack()
    a, b = image_bytes(1), image_bytes(2) + b"longer"
    ha, hb = first.add(a), first.add(b)
    second.add(b), second.add(a)
    uri1, uri2 = first.write(Folder(str(tmp_path))), second.write(Folder(str(tmp_path)))
    assert uri1 != uri2
    assert read_image_bytes(second.image_uri(uri2, ha)) == a and read_image_bytes(second.image_uri(uri2, hb)) == b


PACK = "packs/ab/" + "ab" * 16 + ".tar"


def test_byte_ranges_are_read_only_in_the_exact_form_of_a_pack():
    assert split_byte_range(byte_range_uri(f"s3://b/store/images/{PACK}", 512, 100)) == (f"s3://b/store/images/{PACK}", 512, 100)
    assert split_byte_range(f"/x/{PACK}#bytes=0-0") == (f"/x/{PACK}", 0, 1)
    for whole in (
        "/x/a.png", "/x/a.png#bytes=0-3", f"/x/{PACK}#bytes=9-5", f"/x/{PACK}#bytes=1-", f"/x/{PACK}#bytes=-3", f"/x/{PACK}#bytes=a-b",
        f"/x/{PACK}#bytes=\u00b2-3", f"/x/{PACK}#bytes=1-2x", f"/x/{PACK}#bytes=0-{'9' * 16}", "/x/packs/ab/short.tar#bytes=0-3",
    ):
        assert split_byte_range(whole) == (whole, None, None)


def test_a_users_file_whose_name_looks_like_a_range_is_read_whole(tmp_path):
    """Ranges are only the pipeline's own pack URIs: a file in the data whose name happens to
    end in "#bytes=0-3" is the file it names, never 4 bytes of another file."""
    (tmp_path / "a.png").write_bytes(image_bytes(1))
    odd = tmp_path / "a.png#bytes=0-3"
    odd.write_bytes(image_bytes(2))
    assert read_image_bytes(str(odd)) == image_bytes(2)


def test_a_huge_range_is_an_image_error_not_an_allocation(tmp_path):
    pack = ImagePack()
    pack.add(image_bytes(1))
    uri = pack.write(Folder(str(tmp_path)))
    with pytest.raises(ImageError, match="larger than any image"):
        read_image_bytes(byte_range_uri(uri, 0, 10**14))


def test_a_damaged_pack_is_written_again_when_its_shard_is_read(tmp_path, caplog):
    images = [image_bytes(i) for i in range(3)]
    pack = ImagePack()
    hashes = [pack.add(data) for data in images]
    uri = pack.write(Folder(str(tmp_path)))
    with open(uri, "r+b") as f:
        f.truncate(700)  # e.g. a disk that filled up, or a copy that stopped half way
    again = ImagePack()
    for data in images:
        again.add(data)
    assert again.write(Folder(str(tmp_path))) == uri
    assert "damaged" in caplog.text
    assert [read_image_bytes(pack.image_uri(uri, h)) for h in hashes] == images
    assert not [p for p in (tmp_path / "packs").rglob(".tmp-*")]  # no temporary file left


def test_a_range_past_the_end_of_a_pack_is_an_error_naming_it(tmp_path):
    pack = ImagePack()
    h = pack.add(image_bytes(3))
    uri = pack.write(Folder(str(tmp_path)))
    good = pack.image_uri(uri, h)
    _, offset, length = split_byte_range(good)
    bad = byte_range_uri(uri, offset + 2000, length)
    with pytest.raises(ImageError, match="truncated") as err:
        read_image_bytes(bad)
    assert err.value.uri == bad
    with pytest.raises(ImageError, match="file not found"):
        read_image_bytes(byte_range_uri(str(tmp_path / "gone.tar"), 0, 10))


def test_packs_on_s3_are_read_by_range(moto_s3):
    moto_s3.mkdir("store")
    pack = ImagePack()
    hashes = [pack.add(image_bytes(i)) for i in range(3)]
    uri = pack.write(Folder("s3://store/images"))
    assert uri.startswith("s3://store/images/packs/")
    assert [read_image_bytes(pack.image_uri(uri, h)) for h in hashes] == [image_bytes(i) for i in range(3)]

    # store verify on S3: the pack hashes to its name; an altered one is found and moved aside
    from pipeline.store.admin import verify_images

    assert (verify_images("s3://store").packs, verify_images("s3://store").bad) == (1, [])
    data = bytearray(moto_s3.cat_file(uri))
    data[600] ^= 0xFF
    moto_s3.pipe_file(uri, bytes(data))
    report = verify_images("s3://store", repair=True)
    assert [b["path"] for b in report.bad] == [uri] and report.bad[0]["moved_to"].startswith("s3://store/images/packs/")
    assert not moto_s3.exists(uri) and verify_images("s3://store").quarantined == 1


# -- the pairs cache ---------------------------------------------------------------------------


def _config(root):
    return load_curation_config(["curation=smoke", "compute.progress_bars=false", f"root={root}", f"inputs=[{root}/in/]"])


def _refuse(*args, **kwargs):
    raise AssertionError("a cached shard was read again")


def test_a_shard_is_read_once_whatever_output_it_is_curated_into(tmp_path, ray_session, monkeypatch):
    write_parquet(tmp_path / "in" / "a.parquet", pair_rows(range(4)))
    write_tar(tmp_path / "in" / "b.tar", tar_samples([5, 6]))
    shards = discover([str(tmp_path / "in")])
    cfg = _config(tmp_path)
    first = read_pairs(shards, cfg)
    assert first.height == 6 and first["reason"].null_count() == 6
    monkeypatch.setattr(rows, "read_pairs_task", _refuse)
    other = load_curation_config(["curation=smoke", "compute.progress_bars=false", f"root={tmp_path}", f"inputs=[{tmp_path}/in/]", "name=other", "min_score=0.9"])
    again = read_pairs(shards, other)  # another output and rule, the same store: nothing read
    assert again.equals(first)
    assert windows.shard_row_counts(shards, pairs_cache(other.sweep)) == {s.uri: n for s, n in zip(shards, (4, 2), strict=True)}


def test_a_changed_shard_or_a_lost_pack_or_entry_reads_the_shard_again(tmp_path, ray_session, monkeypatch, caplog):
    path = write_parquet(tmp_path / "in" / "a.parquet", pair_rows(range(3)))
    cfg = _config(tmp_path)
    (shard,) = discover([str(path)])
    first = read_pairs([shard], cfg)
    cache = pairs_cache(cfg.sweep)
    assert cache.get(shard) is not None

    time.sleep(0.01)
    write_parquet(path, pair_rows(range(5)))
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 10**9))
    (changed,) = discover([str(path)])
    assert changed.version != shard.version and cache.get(changed) is None
    assert read_pairs([changed], cfg).height == 5

    pack = first["image_uri"][0].split("#bytes=")[0]
    with open(pack, "r+b") as f:
        f.truncate(600)  # damaged: its rows' ranges reach past its end
    assert cache.get(shard) is None and "reading" in caplog.text
    os.remove(pack)  # e.g. an operator cleared the store's images
    assert cache.get(shard) is None

    entry = next((tmp_path / "store" / "shard_pairs").rglob(f"{cache.key(changed)}.parquet"))
    entry.write_bytes(b"PAR1 not really")
    assert cache.get(changed) is None and "unreadable" in caplog.text
    again = read_pairs([changed], cfg)  # read again, and cached again
    assert again.height == 5 and cache.get(changed) is not None
    assert [read_image_bytes(u) for u in again["image_uri"]] == [image_bytes(i) for i in range(5)]


def test_an_unreadable_shard_is_not_cached(tmp_path, ray_session):
    broken = tmp_path / "in" / "z.parquet"
    broken.parent.mkdir(parents=True)
    broken.write_bytes(b"PAR1 but truncated")
    cfg = _config(tmp_path)
    (shard,) = discover([str(broken)])
    pairs = read_pairs([shard], cfg)
    assert pairs["reason"].to_list() == ["unreadable_shard"]
    assert pairs_cache(cfg.sweep).get(shard) is None
    assert not (tmp_path / "store" / "shard_pairs").exists() or not any((tmp_path / "store" / "shard_pairs").rglob("*.parquet"))
    assert isinstance(pairs, pl.DataFrame)


def test_an_empty_shard_is_cached_too(tmp_path, ray_session, monkeypatch):
    path = write_parquet(tmp_path / "in" / "empty.parquet", pair_rows([]))
    cfg = _config(tmp_path)
    (shard,) = discover([str(path)])
    assert read_pairs([shard], cfg).height == 0
    assert pairs_cache(cfg.sweep).get(shard).num_rows == 0
    monkeypatch.setattr(rows, "read_pairs_task", _refuse)
    assert read_pairs([shard], cfg).height == 0


def test_a_pack_altered_in_place_is_refused_then_found_by_verify_and_healed(tmp_path, ray_session, capsys):
    """Same size, other bytes: the pairs cache cannot tell (it checks sizes), so the workers
    refuse the image, `store verify` names the pack, and repair makes the next read heal it."""
    from operators.images import load_image
    from pipeline.store.admin import gc, verify, verify_images

    store_job = importlib.import_module("jobs.store")

    path = write_parquet(tmp_path / "in" / "a.parquet", pair_rows(range(3)))
    cfg = _config(tmp_path)
    store = str(tmp_path / "store")
    (shard,) = discover([str(path)])
    first = read_pairs([shard], cfg)
    uri, h = first["image_uri"][1], first["image_hash"][1]
    pack = uri.split("#bytes=")[0]
    _, offset, length = split_byte_range(uri)
    with open(pack, "r+b") as f:
        f.seek(offset + length // 2)
        f.write(b"\xff\x00\xff")  # bit rot inside the second image
    assert pairs_cache(cfg.sweep).get(shard) is not None  # the cache still points into it
    with pytest.raises(ImageError, match="changed since it was hashed"):
        load_image(uri, h)

    single = tmp_path / "store" / "images" / h[:2] / f"{h}.png"  # as a rendered view or API image is stored
    single.parent.mkdir(parents=True)
    single.write_bytes(image_bytes(1))
    report = verify_images(store)
    assert (report.packs, report.images, len(report.bad)) == (1, 1, 1) and "not to its name" in report.bad[0]["reason"]
    assert report.bad[0]["path"].endswith(os.path.basename(pack)) and "moved_to" not in report.bad[0]
    assert store_job.main(["verify", f"store={store}"]) == 1
    assert "bad image file" in capsys.readouterr().out

    single.write_bytes(image_bytes(1)[:-1] + b"!")  # altered too: found, and moved aside with the pack
    report = verify_images(store, repair=True)
    assert sorted(os.path.basename(b["path"]) for b in report.bad) == sorted([os.path.basename(pack), single.name])
    assert all("_quarantine" in b["moved_to"] for b in report.bad) and not os.path.exists(pack) and not single.exists()
    assert pairs_cache(cfg.sweep).get(shard) is None  # the pack is gone: the shard is read again
    again = read_pairs([shard], cfg)
    assert again["image_uri"].to_list() == first["image_uri"].to_list()  # the same pack, written anew
    assert load_image(uri, h) is not None
    after = verify_images(store)
    assert (after.packs, after.images, after.bad, after.quarantined) == (1, 0, [], 2)
    assert store_job.main(["verify", f"store={store}"]) == 0
    out = capsys.readouterr().out
    assert "1 image packs, 0 single images" in out and "2 quarantined" in out and "total: 0 folders" in out
    assert not [r for r in verify(store) if "/images" in r.url]  # images are not folders of parts
    assert sorted("_quarantine" in p for p in gc(store)) == [True, True]  # the damaged copies are collected
    assert verify_images(store).quarantined == 0
