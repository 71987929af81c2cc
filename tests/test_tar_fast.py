"""The tar header walker reads WebDataset shards exactly as tarfile did, and is really used.

The oracle is the reader and row counter as they were before the walker (tarfile, streaming),
copied here verbatim: for random tars written by tarfile in USTAR, GNU and PAX formats, plain
or gzip-compressed, `read_webdataset` and `count_rows` must give equal tables, equal counts and
equal ShardError texts. The fast path must be the one taken for every plain tar (a walker that
gives up too often would pass the equality checks through its fallback).
"""
from __future__ import annotations

import gzip
import io
import json
import posixpath
import tarfile

import fsspec
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.curation import shards
from pipeline.curation.shards import IMAGE_EXTENSIONS, TAR_MIN_BYTES_PER_SAMPLE, Shard, ShardError, count_rows, read_webdataset
from pipeline.curation.tar_walk import BLOCK, Unsupported, regular_members, tar_bytes
from tests.curation_shards import tar_samples, write_tar

# -- the oracle: today's code before the walker ---------------------------------------------------


def oracle_read(uri: str) -> pa.Table:
    samples: dict[str, dict[str, bytes]] = {}
    problems: dict[str, str] = {}
    try:
        with fsspec.open(uri, "rb") as f, tarfile.open(fileobj=f, mode="r|*") as tar:
            for member in tar:
                if not member.isfile():
                    continue
                folder, name = posixpath.split(member.name)
                stem, dot, ext = name.partition(".")
                if not dot or not stem or name.startswith("."):
                    continue
                key = posixpath.join(folder, stem)
                sample = samples.setdefault(key, {})
                ext = ext.lower()
                data = tar.extractfile(member).read()
                if ext in sample:
                    problems.setdefault(key, f"member {ext!r} appears twice; the first is used")
                    continue
                sample[ext] = data
    except FileNotFoundError:
        raise ShardError(f"{uri}: input shard not found") from None
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise ShardError(f"{uri}: not a readable tar file ({exc})") from exc
    extensions = list(dict.fromkeys(ext for sample in samples.values() for ext in sample))
    columns: dict[str, list] = {"__key__": list(samples)}
    for ext in extensions:
        values = []
        for key, sample in samples.items():
            data = sample.get(ext)
            if data is None or ext in IMAGE_EXTENSIONS:
                values.append(data)
                continue
            try:
                values.append(data.decode("utf-8"))
            except UnicodeDecodeError:
                problems.setdefault(key, f"member {ext!r} is not UTF-8 text")
                values.append(None)
        columns[ext] = values
    fields = [pa.field("__key__", pa.string())] + [
        pa.field(ext, pa.binary() if ext in IMAGE_EXTENSIONS else pa.string()) for ext in extensions
    ]
    table = pa.table(columns, schema=pa.schema(fields))
    if problems:
        table = table.append_column("__error__", pa.array([problems.get(k) for k in samples], type=pa.string()))
    return table


def oracle_count(path: str, size: int) -> tuple[int, bool]:
    if path.lower().endswith(".tar"):
        keys = set()
        try:
            with tarfile.open(path, mode="r:") as tar:
                for member in tar:
                    folder, name = posixpath.split(member.name)
                    stem, dot, _ = name.partition(".")
                    if member.isfile() and dot and stem and not name.startswith("."):
                        keys.add(posixpath.join(folder, stem))
            return len(keys), True
        except (tarfile.TarError, EOFError, OSError):
            return 0, False
    return max(1, size // TAR_MIN_BYTES_PER_SAMPLE), False


def outcome(read, uri):
    """What a reader gives: its table, or the type and text of what it raised."""
    try:
        return ("table", read(uri))
    except Exception as exc:  # noqa: BLE001 - the comparison covers every failure
        return ("raised", type(exc).__name__, str(exc))


def same(a, b) -> bool:
    if a[0] == "table" and b[0] == "table":
        return a[1].schema == b[1].schema and a[1].equals(b[1])
    return a == b


def shard_of(path) -> Shard:
    return Shard(uri=str(path), size=path.stat().st_size, version="mtime:0", format="webdataset")


@pytest.fixture
def fallbacks(monkeypatch):
    """Calls into the tarfile path, by kind ("read", "count")."""
    calls = []
    read, count = shards._members_with_tarfile, shards._count_with_tarfile

    def counted_read(raw):
        calls.append("read")
        return read(raw)

    def counted_count(path):
        calls.append("count")
        return count(path)

    monkeypatch.setattr(shards, "_members_with_tarfile", counted_read)
    monkeypatch.setattr(shards, "_count_with_tarfile", counted_count)
    return calls


# -- random tars ----------------------------------------------------------------------------------

FORMATS = {"ustar": tarfile.USTAR_FORMAT, "gnu": tarfile.GNU_FORMAT, "pax": tarfile.PAX_FORMAT}
FOLDERS = ["", "d", "sub.dir", "ü", "f" * 70, ".git", "a b"]
STEMS = ["k1", "k2", "K1", "s.v2", ".hidden", "._res", "ü-key", "日本", "\udcff", "x" * 60, "y" * 120, "", "README", "k1.png"]
EXTENSIONS = ["png", "jpg", "JPEG", "webp", "txt", "TXT", "json", "cls", "tar.gz", "", "txt."]
PATTERN = bytes(range(256)) * 5
DATA = st.one_of(
    st.binary(max_size=40),
    st.sampled_from([0, 1, 511, 512, 513, 1023, 1024, 1025]).map(lambda n: PATTERN[:n]),  # block boundaries
    st.sampled_from([b"a caption\n", "ünïcode".encode(), b"\xff\xfe not utf-8", json.dumps({"caption": "c"}).encode()]),
)


@st.composite
def member_names(draw):
    folders = draw(st.lists(st.sampled_from(FOLDERS), max_size=2))
    stem = draw(st.sampled_from(STEMS) | st.text(alphabet="ab.-_ü/", max_size=8))
    ext = draw(st.sampled_from(EXTENSIONS))
    return "/".join([*folders, stem]) + (f".{ext}" if ext else "")


MEMBERS = st.lists(
    st.tuples(st.sampled_from(["file"] * 6 + ["dir", "symlink", "hardlink"]), member_names(), DATA, member_names()),
    max_size=14,
)


def build_tar(fmt: str, members, mtime, ending: str) -> tuple[bytes, bool]:
    """The tar's bytes and whether it needs no extended headers (pax 'x', GNU 'L'/'K'), i.e.
    whether the walker should read it itself. Members tarfile refuses to write are left out."""
    out = io.BytesIO()
    plain = True
    with tarfile.open(fileobj=out, mode="w", format=FORMATS[fmt]) as tar:
        for kind, name, data, target in members:
            info = tarfile.TarInfo(name)
            info.mtime = mtime
            info.type = {"file": tarfile.REGTYPE, "dir": tarfile.DIRTYPE, "symlink": tarfile.SYMTYPE, "hardlink": tarfile.LNKTYPE}[kind]
            if kind == "file":
                info.size = len(data)
            else:
                info.linkname = target if kind != "dir" else ""
            try:
                tar.addfile(info, io.BytesIO(data) if kind == "file" else None)
            except ValueError:  # e.g. a name too long for USTAR
                continue
            written = name + "/" if kind == "dir" and not name.endswith("/") else name
            for text in (written, info.linkname):
                raw = text.encode("utf-8", "surrogateescape")
                if fmt == "gnu" and len(raw) > 100:
                    plain = False
                if fmt == "pax" and (not text.isascii() or len(text) > 100):
                    plain = False
            if fmt == "pax" and isinstance(mtime, float):
                plain = False
        end = tar.offset  # after the last member, before the end-of-archive blocks
    data = out.getvalue()
    if ending == "bare":  # no end-of-archive blocks at all (some writers stop there)
        data = data[:end]
    elif ending == "one":
        data = data[: end + BLOCK]
    return data, plain and len(data) > 0


def compress(data: bytes, how: str) -> bytes:
    if how == "gzip":
        return gzip.compress(data, mtime=0)
    if how == "gzip-named":  # FNAME in the gzip header, as tarfile's w:gz and the gzip tool write
        out = io.BytesIO()
        with gzip.GzipFile(filename="shard.tar", mode="wb", fileobj=out, mtime=0) as f:
            f.write(data)
        return out.getvalue()
    return data


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(
    fmt=st.sampled_from(sorted(FORMATS)),
    members=MEMBERS,
    mtime=st.sampled_from([0, 1_700_000_000, 1.5]),
    ending=st.sampled_from(["full", "bare", "one"]),
    compression=st.sampled_from(["none", "none", "gzip", "gzip-named"]),
    suffix=st.sampled_from([".tar", ".tar.gz", ".tgz"]),
)
def test_random_tars_read_and_count_as_tarfile_does(tmp_path, fallbacks, fmt, members, mtime, ending, compression, suffix):
    data, plain = build_tar(fmt, members, mtime, ending)
    path = tmp_path / f"shard{suffix}"
    path.write_bytes(compress(data, compression))
    fallbacks.clear()

    fast, slow = outcome(read_webdataset, str(path)), outcome(oracle_read, str(path))
    assert same(fast, slow), (fast, slow)
    assert ("read" not in fallbacks) == plain, f"fast path expected: {plain}; tarfile calls: {fallbacks}"

    assert count_rows(shard_of(path)) == oracle_count(str(path), path.stat().st_size)
    if suffix == ".tar":
        assert ("count" not in fallbacks) == (plain and compression == "none")


# -- the fast path on the shards the pipeline writes ---------------------------------------------


def test_pipeline_tars_take_the_fast_path(tmp_path, fallbacks):
    path = write_tar(tmp_path / "part.tar", tar_samples(range(40)) + tar_samples(range(40, 60), caption_in="json"))
    table = read_webdataset(str(path))
    assert table.equals(oracle_read(str(path))) and table.num_rows == 60
    assert count_rows(shard_of(path)) == (60, True)
    zipped = tmp_path / "part.tar.gz"
    zipped.write_bytes(compress(path.read_bytes(), "gzip-named"))
    assert read_webdataset(str(zipped)).equals(table)
    assert fallbacks == []


def test_remote_tars_take_the_fast_path(tmp_path, fallbacks):
    path = write_tar(tmp_path / "part.tar", tar_samples(range(5)))
    with fsspec.open("memory://bucket/part.tar", "wb") as f:
        f.write(path.read_bytes())
    assert read_webdataset("memory://bucket/part.tar").equals(read_webdataset(str(path)))
    assert fallbacks == []


def test_ustar_long_names_folders_and_links_are_walked(tmp_path, fallbacks):
    """Names over 100 bytes split into the USTAR prefix field, directories (also the v7 kind, a
    regular file named with a trailing slash), symlinks and hard links, empty members."""
    folder = "deep/" + "n" * 90 + "/ü"
    members = [(tarfile.DIRTYPE, "deep", b""), (tarfile.AREGTYPE, "v7dir/", b""), (tarfile.REGTYPE, f"{folder}/s1.png", b"\x89PNG"),
               (tarfile.SYMTYPE, f"{folder}/s1.txt", b""), (tarfile.REGTYPE, f"{folder}/s1.txt", b""), (tarfile.LNKTYPE, "s2.png", b""),
               (tarfile.REGTYPE, "s2.txt", b"x" * 512)]
    path = tmp_path / "links.tar"
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for kind, name, data in members:
            info = tarfile.TarInfo(name)
            info.type, info.size = kind, len(data)
            if kind in (tarfile.SYMTYPE, tarfile.LNKTYPE):
                info.linkname = "elsewhere"
            tar.addfile(info, io.BytesIO(data))
    table = read_webdataset(str(path))
    assert table.equals(oracle_read(str(path)))
    assert table.column("__key__").to_pylist() == [f"{folder}/s1", "s2"]
    assert table.column("txt").to_pylist() == ["", "x" * 512]
    assert count_rows(shard_of(path)) == (2, True)
    assert fallbacks == []


# -- odd tars go to tarfile, and behave exactly as tarfile reads them ------------------------------


def plain_tar(tmp_path) -> bytes:
    return write_tar(tmp_path / "source.tar", tar_samples(range(3))).read_bytes()


def test_odd_headers_are_left_to_tarfile(tmp_path, fallbacks):
    """Base-256 numbers, a signed checksum, a pax global header, GNU sparse files, devices,
    bz2 and odd gzip headers are not the walker's to read; the results equal tarfile's."""
    cases = {}
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.GNU_FORMAT) as tar:
        info = tarfile.TarInfo("big.txt")
        info.uid, info.size = 8**8, 2  # base-256 uid
        tar.addfile(info, io.BytesIO(b"hi"))
    cases["base256.tar"] = out.getvalue()
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT, pax_headers={"comment": "global"}) as tar:
        info = tarfile.TarInfo("g.txt")
        info.size = 2
        tar.addfile(info, io.BytesIO(b"hi"))
    cases["global.tar"] = out.getvalue()
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        info = tarfile.TarInfo("fifo.txt")
        info.type = tarfile.FIFOTYPE
        tar.addfile(info)
        info = tarfile.TarInfo("after.txt")
        info.size = 2
        tar.addfile(info, io.BytesIO(b"ok"))
    cases["fifo.tar"] = out.getvalue()
    raw = plain_tar(tmp_path)
    cases["signed.tar"] = _signed_checksum(raw)
    cases["bz2.tar"] = _bz2(raw)
    extra = bytearray(gzip.compress(raw, mtime=0))
    extra[3] |= 4  # FEXTRA, with a 2-byte field
    cases["extra.tar.gz"] = bytes(extra[:10]) + b"\x02\x00ab" + bytes(extra[10:])
    cases["twomembers.tar.gz"] = gzip.compress(raw[:1024], mtime=0) + gzip.compress(raw[1024:], mtime=0)
    cases["trailing.tar.gz"] = gzip.compress(raw, mtime=0) + b"\x00" * 16
    cases["tab-in-size.tar"] = _with_field(raw, 124, b"\t0000000003\x00")
    cases["inner-space-first.tar"] = _with_field(raw, 100, b"00 0644\x00")  # tarfile: "invalid header"
    cases["inner-space-later.tar"] = _with_field(raw, 100, b"00 0644\x00", header=2)  # tarfile: the archive ends there
    cases["plus-sign.tar"] = _with_field(raw, 136, b"+0000000000\x00", header=4)
    for name, data in cases.items():
        path = tmp_path / name
        path.write_bytes(data)
        fallbacks.clear()
        fast, slow = outcome(read_webdataset, str(path)), outcome(oracle_read, str(path))
        assert same(fast, slow), (name, fast, slow)
        assert fallbacks == ["read"], name
        assert count_rows(shard_of(path)) == oracle_count(str(path), len(data)), name


def _bz2(data: bytes) -> bytes:
    import bz2

    return bz2.compress(data)


def _with_field(raw: bytes, start: int, value: bytes, header: int = 0) -> bytes:
    """The tar with a field of its `header`-th member's header (counted in whole members of
    write_tar's small shards: header, one data block) replaced and its checksum redone."""
    at = header * 2 * BLOCK
    block = bytearray(raw[at : at + BLOCK])
    block[start : start + len(value)] = value
    block[148:156] = b" " * 8
    block[148:156] = b"%06o\x00 " % sum(block)
    return raw[:at] + bytes(block) + raw[at + BLOCK :]


def _signed_checksum(raw: bytes) -> bytes:
    """The tar with a byte >= 0x80 after the first name's NUL (ignored by readers) and the
    checksum tarfile also accepts: bytes summed as signed."""
    header = bytearray(raw[:BLOCK])
    header[50] = 0xE9
    header[148:156] = b" " * 8
    signed = sum(b - 256 if b >= 128 else b for b in header)
    header[148:156] = b"%06o\x00 " % signed
    return bytes(header) + raw[BLOCK:]


def test_signed_checksum_is_left_to_tarfile(tmp_path):
    signed = _signed_checksum(plain_tar(tmp_path))
    with pytest.raises(Unsupported, match="checksum"):
        regular_members(signed)
    with tarfile.open(fileobj=io.BytesIO(signed)) as tar:  # tarfile reads it all
        assert len(tar.getmembers()) == 6


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cut=st.integers(0, 6000), flips=st.lists(st.tuples(st.integers(0, 6000), st.integers(1, 255)), max_size=2), zipped=st.booleans())
def test_truncated_and_garbled_tars_fail_as_tarfile_does(tmp_path, cut, flips, zipped):
    """A tar cut short anywhere (mid-header, mid-data, in the padding, in the end blocks) or
    with bytes changed gives the same table or the same ShardError text as the tarfile reader."""
    raw = bytearray(write_tar(tmp_path / "whole.tar", tar_samples(range(4))).read_bytes())
    for at, xor in flips:
        if at < len(raw):
            raw[at] ^= xor
    data = gzip.compress(bytes(raw), mtime=0) if zipped else bytes(raw)
    path = tmp_path / "cut.tar"
    path.write_bytes(data[: cut % (len(data) + 1)])
    fast, slow = outcome(read_webdataset, str(path)), outcome(oracle_read, str(path))
    assert same(fast, slow), (fast, slow)
    assert count_rows(shard_of(path)) == oracle_count(str(path), path.stat().st_size)


def test_broken_shards_raise_the_same_shard_errors(tmp_path):
    raw = plain_tar(tmp_path)
    cases = {"empty.tar": b"", "junk.tar": bytes(range(256)) * 12, "cut-data.tar": raw[: BLOCK + 100],
             "cut-padding.tar": raw[: 2 * BLOCK - 1]}
    for name, data in cases.items():
        path = tmp_path / name
        path.write_bytes(data)
        with pytest.raises(ShardError) as fast:
            read_webdataset(str(path))
        with pytest.raises(ShardError) as slow:
            oracle_read(str(path))
        assert str(fast.value) == str(slow.value), name
        assert "not a readable tar file" in str(fast.value)
    with pytest.raises(ShardError, match="input shard not found"):
        read_webdataset(str(tmp_path / "missing.tar"))
    # tarfile's quirk, kept: a gzip stream cut short in a header reads as the samples before it
    cut = tmp_path / "cut.tar.gz"
    cut.write_bytes(gzip.compress(raw, mtime=0)[:300])
    assert read_webdataset(str(cut)).equals(oracle_read(str(cut)))
    assert read_webdataset(str(cut)).num_rows == 2


# -- the walker itself ----------------------------------------------------------------------------


def test_walker_locates_members_at_block_boundaries(tmp_path):
    """Sizes around a block (0, 511, 512, 513, 1024): data offsets step over whole blocks."""
    sizes = [0, 511, 512, 513, 1024, 1]
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for i, size in enumerate(sizes):
            info = tarfile.TarInfo(f"m{i}.bin")
            info.size = size
            tar.addfile(info, io.BytesIO(PATTERN[:size]))
    raw = out.getvalue()
    found = regular_members(raw)
    assert [(name, size) for name, _, size in found] == [(f"m{i}.bin", s) for i, s in enumerate(sizes)]
    offsets = [start for _, start, _ in found]
    assert offsets == [512, 1024, 2048, 3072, 4608, 6144]
    assert all(raw[start : start + size] == PATTERN[:size] for _, start, size in found)


def test_members_without_data_are_stepped_over_as_tarfile_does(tmp_path, fallbacks):
    """tarfile skips no data after a directory (also a v7 one: a regular file named with a
    trailing slash) or a link, whatever their size field says; the next header follows."""
    raw = plain_tar(tmp_path)
    for kind, name in ((tarfile.AREGTYPE, "v7dir/"), (tarfile.DIRTYPE, "dir"), (tarfile.SYMTYPE, "link.txt")):
        out = io.BytesIO()
        with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as tar:
            info = tarfile.TarInfo(name)
            info.type = kind
            tar.addfile(info)
        header = _with_field(out.getvalue()[:BLOCK], 124, b"00000001000\x00")  # size 512, and no data
        path = tmp_path / "nodata.tar"
        path.write_bytes(header + raw)
        assert read_webdataset(str(path)).equals(oracle_read(str(path)))
        assert read_webdataset(str(path)).num_rows == 3
        assert count_rows(shard_of(path)) == (3, True)
    assert fallbacks == []


def test_nothing_after_the_end_of_archive_is_read(tmp_path, fallbacks):
    """Two tars concatenated read as the first (tarfile stops at the first zero block)."""
    first = plain_tar(tmp_path)
    second = write_tar(tmp_path / "second.tar", tar_samples(range(10, 12))).read_bytes()
    path = tmp_path / "both.tar"
    for tail in (second, second[-1024:] + second):  # right after the end blocks, or after more zeros
        path.write_bytes(first + tail)
        assert read_webdataset(str(path)).equals(oracle_read(str(path)))
        assert read_webdataset(str(path)).column("__key__").to_pylist() == ["sample000000", "sample000001", "sample000002"]
        assert count_rows(shard_of(path)) == (3, True)
    assert fallbacks == []


def test_gzip_header_fields_are_skipped_as_tarfile_does(tmp_path, fallbacks):
    """Optional gzip header fields (file name, comment, header CRC) before the deflate data."""
    raw = plain_tar(tmp_path)
    body = gzip.compress(raw, mtime=0)
    path = tmp_path / "fields.tar.gz"
    for flags, fields in ((8, b"shard.tar\x00"), (16, b"a comment\x00"), (2, b"\xab\xcd"), (26, b"n\x00c\x00\xab\xcd")):
        path.write_bytes(body[:3] + bytes([flags]) + body[4:10] + fields + body[10:])
        assert read_webdataset(str(path)).equals(oracle_read(str(path)))
        assert read_webdataset(str(path)).num_rows == 3
    assert fallbacks == []


def test_gzip_is_inflated_and_other_compression_left_to_tarfile():
    data = bytes(BLOCK * 2)
    assert tar_bytes(gzip.compress(data)) == data
    assert tar_bytes(data) is data
    with pytest.raises(Unsupported):
        tar_bytes(_bz2(data))
    with pytest.raises(Unsupported):
        tar_bytes(gzip.compress(data)[:-3])  # trailer cut short
