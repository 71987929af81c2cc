"""Whole-file reads and writes on any fsspec path (local folder or s3:// prefix).

Every writer in the pipeline goes through `write_bytes_atomic` (or, for a file written in
pieces, `local_atomic_file`): locally a file is written under a temporary name (`TMP_PREFIX`,
which `jobs/store.py gc` removes once old) and renamed; on object stores a single PUT is atomic. Reads fetch the whole file again on transient errors
(`pipeline.store.settings.retrying`), and existence checks drop fsspec's cached listings first,
since other processes add files behind this process's back.
"""
from __future__ import annotations

import json
import os
import posixpath
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.store.settings import retrying

TMP_PREFIX = ".tmp-"


def join_url(base: str, *parts: str) -> str:
    """`base/part/...` for local paths and URLs alike, with no doubled or trailing slash."""
    return "/".join([base.rstrip("/"), *[p.strip("/") for p in parts]])


def absolute_path(path: str) -> str:
    """URLs as they are; a local path made absolute (`~` expanded), so that it names the same
    file from Ray workers and submitted jobs, whatever their working folder."""
    if "://" in path:
        return path
    return str(Path(os.path.expanduser(path)).resolve())


def filesystem(url: str) -> tuple[fsspec.AbstractFileSystem, str]:
    """The filesystem and the path inside it of a local path or any fsspec URL."""
    fs, path = fsspec.core.url_to_fs(url)
    return fs, path


def protocols(fs: fsspec.AbstractFileSystem) -> tuple[str, ...]:
    """The protocol names of an fsspec filesystem (one string or a tuple of them)."""
    return (fs.protocol,) if isinstance(fs.protocol, str) else tuple(fs.protocol)


def is_local(fs: fsspec.AbstractFileSystem) -> bool:
    """Whether `fs` is this machine's disk, where a write needs a temporary name and a rename."""
    return bool({"file", "local"} & set(protocols(fs)))


def is_local_path(path: str) -> bool:
    """Whether `path` names this machine's filesystem (a plain path or file://), not a remote store."""
    return "://" not in path or path.startswith("file://")


def write_bytes_atomic(url: str, data: bytes) -> None:
    """Write a whole file so that readers never see it half-written."""
    fs, path = filesystem(url)
    if is_local(fs):
        retrying(f"write {url}", lambda: write_local_atomically(path, data))
    else:
        # One PUT (a multipart upload above s3fs's threshold): the object appears only
        # complete. No makedirs: s3fs would create a missing bucket instead of failing.
        retrying(f"write {url}", lambda: fs.pipe_file(path, data))


def write_local_atomically(path: str, data: bytes) -> None:
    """Write a local file (a new one, or over an old one) so that readers see the old bytes or
    all of the new, never a part (`local_atomic_file`)."""
    with local_atomic_file(path) as f:
        f.write(data)


@contextmanager
def local_atomic_file(path: str) -> Iterator[BinaryIO]:
    """A file to write `path` through: a temporary file beside it, renamed into place when the
    block ends without an error and removed otherwise, so readers never see a partial file.
    The folder is made only when the temporary file cannot be created in it.

    Plain os calls, not fsspec's: an extraction writes 100k images into 256 folders, and
    fsspec's exists + makedirs per file cost more than the write itself. The temporary file is
    opened with mode 0666 and the umask applied, as `open()` does, not with mkstemp (its files
    are 0600: an image extracted by a service account was unreadable to every other user of a
    shared store)."""
    folder = posixpath.dirname(path)
    tmp = posixpath.join(folder, f"{TMP_PREFIX}{uuid.uuid4().hex}-{posixpath.basename(path)}")  # what `store gc` removes once old
    flags = os.O_CREAT | os.O_EXCL | os.O_WRONLY
    try:
        try:
            fd = os.open(tmp, flags, 0o666)
        except FileNotFoundError:
            os.makedirs(folder, exist_ok=True)
            fd = os.open(tmp, flags, 0o666)
    except OSError as exc:
        _name_target(exc, path, tmp)
        raise
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
        os.replace(tmp, path)
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        if isinstance(exc, OSError):
            _name_target(exc, path, tmp)
        raise


def _name_target(exc: OSError, path: str, tmp: str) -> None:
    """Let `exc` name the file being written: a failed write (no space left, a read-only file
    system) names no file, or the temporary one, which no user knows of."""
    if exc.errno is not None and exc.filename in (None, tmp):
        exc.filename = path


def table_to_parquet_bytes(table: pa.Table, row_group_rows: int | None = None) -> bytes:
    """Parquet bytes with a CRC-32 in every page header (checked by ranged reads of store parts);
    with `row_group_rows` (compacted parts: many small row groups) without column statistics,
    which readers never use and which would bloat the footer."""
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="zstd", row_group_size=row_group_rows, write_statistics=row_group_rows is None,
                   write_page_checksum=True)
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
