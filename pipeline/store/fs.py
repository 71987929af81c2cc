"""Whole-file reads and writes on any fsspec path (local folder or s3:// prefix).

Every writer in the pipeline goes through `write_bytes_atomic`: locally a file is written under
a temporary name (`TMP_PREFIX`, which `jobs/store.py gc` removes once old) and renamed; on
object stores a single PUT is atomic. Reads fetch the whole file again on transient errors
(`pipeline.store.settings.retrying`), and existence checks drop fsspec's cached listings first,
since other processes add files behind this process's back.
"""
from __future__ import annotations

import json
import posixpath
import uuid

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.store.settings import retrying

TMP_PREFIX = ".tmp-"


def join_url(base: str, *parts: str) -> str:
    """`base/part/...` for local paths and URLs alike, with no doubled or trailing slash."""
    return "/".join([base.rstrip("/"), *[p.strip("/") for p in parts]])


def filesystem(url: str) -> tuple[fsspec.AbstractFileSystem, str]:
    """The filesystem and the path inside it of a local path or any fsspec URL."""
    fs, path = fsspec.core.url_to_fs(url)
    return fs, path


def is_local(fs: fsspec.AbstractFileSystem) -> bool:
    """Whether `fs` is the local disk, where a write needs a temporary name and a rename."""
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    return protocol in ("file", "local")


def write_bytes_atomic(url: str, data: bytes) -> None:
    """Write a whole file so that readers never see it half-written."""
    fs, path = filesystem(url)
    if is_local(fs):
        retrying(f"write {url}", lambda: _write_local(fs, path, data))
    else:
        # One PUT (a multipart upload above s3fs's threshold): the object appears only
        # complete. No makedirs: s3fs would create a missing bucket instead of failing.
        retrying(f"write {url}", lambda: fs.pipe_file(path, data))


def _write_local(fs: fsspec.AbstractFileSystem, path: str, data: bytes) -> None:
    parent = posixpath.dirname(path)
    fs.makedirs(parent, exist_ok=True)
    tmp = posixpath.join(parent, f"{TMP_PREFIX}{uuid.uuid4().hex}-{posixpath.basename(path)}")
    try:
        with fs.open(tmp, "wb") as f:
            f.write(data)
        fs.mv(tmp, path)
    finally:
        if fs.exists(tmp):
            fs.rm(tmp)


def table_to_parquet_bytes(table: pa.Table, row_group_rows: int | None = None) -> bytes:
    """Parquet bytes; with `row_group_rows` (compacted parts: many small row groups) without
    column statistics, which readers never use and which would bloat the footer."""
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="zstd", row_group_size=row_group_rows, write_statistics=row_group_rows is None)
    return sink.getvalue().to_pybytes()


def write_table(url: str, table: pa.Table, row_group_rows: int | None = None) -> None:
    write_bytes_atomic(url, table_to_parquet_bytes(table, row_group_rows))


def read_bytes(url: str) -> bytes:
    """The whole file, fetched again on transient errors.

    Files are read whole and parsed from memory rather than opened through pyarrow's
    fsspec bridge, which turns any error of its existence check into FileNotFoundError.
    """
    fs, path = filesystem(url)
    fs.invalidate_cache(path)
    return retrying(f"read {url}", lambda: fs.cat_file(path))


def read_table(url: str, columns: list[str] | None = None) -> pa.Table:
    return pq.ParquetFile(pa.BufferReader(read_bytes(url))).read(columns=columns)


def write_json(url: str, obj) -> None:
    write_bytes_atomic(url, json.dumps(obj, indent=2, sort_keys=True, default=str).encode())


def read_json(url: str):
    return json.loads(read_bytes(url))


def exists(url: str) -> bool:
    """Whether the file exists now (not as of a listing cached earlier)."""
    fs, path = filesystem(url)
    fs.invalidate_cache(path)
    return retrying(f"check {url}", lambda: fs.exists(path))
