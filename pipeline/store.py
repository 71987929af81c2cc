"""Content-addressed Parquet storage on any fsspec path (local folder or s3:// prefix).

A `PartStore` is one folder of Parquet parts that all have a `key` column (answers of one
backbone, generations of one generator, ...). Parts are immutable and named by a digest of
the keys they hold, so the same work always lands under the same name. A part becomes
visible only when complete: locally it is written under a temporary name and renamed; on
object stores a single PUT (or a completed multipart upload) is atomic. A run that is
killed therefore leaves only whole parts, and the next run computes just the keys that are
missing (anti-join).

Every read and write is retried on transient errors (`pipeline.storage.retrying`): writes
can be repeated safely because a file's bytes are fixed by its name. Listings and existence
checks drop fsspec's cached directory listings first, since other processes (answer
actors, a concurrent run) add parts behind this process's back.
"""
from __future__ import annotations

import json
import posixpath
import uuid
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq

from operators.hashing import keys_digest
from pipeline.storage import retrying

PART_GLOB = "part-*.parquet"
READ_THREADS = 16


def filesystem(url: str) -> tuple[fsspec.AbstractFileSystem, str]:
    fs, path = fsspec.core.url_to_fs(url)
    return fs, path


def _is_local(fs: fsspec.AbstractFileSystem) -> bool:
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    return protocol in ("file", "local")


def write_bytes_atomic(url: str, data: bytes) -> None:
    """Write a whole file so that readers never see it half-written."""
    fs, path = filesystem(url)
    if _is_local(fs):
        retrying(f"write {url}", lambda: _write_local(fs, path, data))
    else:
        # One PUT (a multipart upload above s3fs's threshold): the object appears only
        # complete. No makedirs: s3fs would create a missing bucket instead of failing.
        retrying(f"write {url}", lambda: fs.pipe_file(path, data))


def _write_local(fs: fsspec.AbstractFileSystem, path: str, data: bytes) -> None:
    parent = posixpath.dirname(path)
    fs.makedirs(parent, exist_ok=True)
    tmp = posixpath.join(parent, f".tmp-{uuid.uuid4().hex}-{posixpath.basename(path)}")
    try:
        with fs.open(tmp, "wb") as f:
            f.write(data)
        fs.mv(tmp, path)
    finally:
        if fs.exists(tmp):
            fs.rm(tmp)


def table_to_parquet_bytes(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="zstd")
    return sink.getvalue().to_pybytes()


def write_table(url: str, table: pa.Table) -> None:
    write_bytes_atomic(url, table_to_parquet_bytes(table))


def read_bytes(url: str) -> bytes:
    """The whole file, fetched again on transient errors.

    Files are read whole and parsed from memory rather than opened through pyarrow's
    fsspec bridge, which turns any error of its existence check into FileNotFoundError.
    """
    fs, path = filesystem(url)
    fs.invalidate_cache(path)
    return retrying(f"read {url}", lambda: fs.cat_file(path))


def read_table(url: str, columns: list[str] | None = None) -> pa.Table:
    return pq.read_table(pa.BufferReader(read_bytes(url)), columns=columns)


def write_json(url: str, obj) -> None:
    write_bytes_atomic(url, json.dumps(obj, indent=2, sort_keys=True, default=str).encode())


def read_json(url: str):
    return json.loads(read_bytes(url))


def exists(url: str) -> bool:
    """Whether the file exists now (not as of a listing cached earlier)."""
    fs, path = filesystem(url)
    fs.invalidate_cache(path)
    return retrying(f"check {url}", lambda: fs.exists(path))


class PartStore:
    """Immutable, key-addressed Parquet parts under one folder."""

    def __init__(self, url: str, schema: pa.Schema):
        if "key" not in schema.names:
            raise ValueError("a PartStore schema needs a 'key' column")
        self.url = url.rstrip("/")
        self.schema = schema
        self.fs, self.path = filesystem(self.url)

    def __repr__(self) -> str:
        return f"PartStore({self.url!r})"

    # -- reading ---------------------------------------------------------------------------
    def part_paths(self) -> list[str]:
        """The complete parts stored now (temporary files of local writers never match)."""
        self.fs.invalidate_cache(self.path)
        pattern = posixpath.join(self.path, PART_GLOB)
        return sorted(retrying(f"list {self.url}", lambda: self.fs.glob(pattern)))

    def read(self, columns: list[str] | None = None) -> pa.Table:
        """All stored rows (one per key: a key written twice by racing runs is kept once)."""
        paths = self.part_paths()
        wanted = list(columns) if columns else self.schema.names
        if "key" not in wanted:
            wanted = ["key", *wanted]
        if not paths:
            return self.schema.empty_table().select(wanted)
        with ThreadPoolExecutor(READ_THREADS) as pool:  # object stores: many GETs in flight
            tables = list(pool.map(lambda path: self._read_part(path, wanted), paths))
        return _first_per_key(pa.concat_tables(tables))

    def _read_part(self, path: str, columns: list[str]) -> pa.Table:
        data = retrying(f"read {path}", lambda: self.fs.cat_file(path))
        # A part written before a nullable column existed reads with that column null.
        present = set(pq.read_schema(pa.BufferReader(data)).names)
        table = pq.read_table(pa.BufferReader(data), columns=[c for c in columns if c in present])
        for name in (c for c in columns if c not in present):
            table = table.append_column(name, pa.nulls(table.num_rows, self.schema.field(name).type))
        return table.select(columns).cast(pa.schema([self.schema.field(c) for c in columns]))

    def keys(self) -> pa.Array:
        return self.read(["key"]).column("key").combine_chunks()

    def missing(self, keys: pa.Array | Iterable[str]) -> pa.Array:
        """Boolean mask: True where a key is not stored yet (the anti-join)."""
        import pyarrow.compute as pc

        keys = pa.array(keys, type=pa.string()) if not isinstance(keys, (pa.Array, pa.ChunkedArray)) else keys
        return pc.invert(pc.is_in(keys, value_set=self.keys()))

    # -- writing ---------------------------------------------------------------------------
    def part_url(self, keys: Iterable[str]) -> str:
        return f"{self.url}/part-{keys_digest(keys)}.parquet"

    def write(self, table: pa.Table) -> str | None:
        """Store `table` as one part; returns its URL (None for an empty table).

        Writing the same keys again is a no-op: the part's name is the digest of its keys.
        """
        if table.num_rows == 0:
            return None
        for field in self.schema:  # a column added to the schema later may be missing: stored null
            if field.name not in table.column_names and field.name != "key":
                table = table.append_column(field.name, pa.nulls(table.num_rows, field.type))
        table = table.select(self.schema.names).cast(self.schema)
        keys = table.column("key").to_pylist()
        url = self.part_url(keys)
        if not exists(url):
            write_table(url, table)
        return url


def _first_per_key(table: pa.Table) -> pa.Table:
    """Drop repeated keys, keeping each key's first row in read order."""
    if table.num_rows == 0:
        return table
    import numpy as np

    indices = pa.array(np.arange(table.num_rows, dtype=np.int64))
    firsts = pa.table({"key": table.column("key"), "i": indices}).group_by("key", use_threads=False).aggregate([("i", "min")])
    if firsts.num_rows == table.num_rows:
        return table
    return table.take(np.sort(firsts.column("i_min").to_numpy())).combine_chunks()


class Markers:
    """Success markers: a unit of work (e.g. one backbone's answers for one request set) is done."""

    def __init__(self, url: str):
        self.url = url.rstrip("/")

    def _url(self, name: str) -> str:
        return f"{self.url}/{name}.json"

    def done(self, name: str) -> bool:
        return exists(self._url(name))

    def mark(self, name: str, info: dict) -> None:
        write_json(self._url(name), info)

    def info(self, name: str) -> dict:
        return read_json(self._url(name))
