"""Input shards of image-caption pairs: finding them, telling versions apart, reading them.

A shard is one file, local or on any fsspec store (s3://...):
- Parquet: a caption column plus an image column that holds the image bytes (binary), a
  path or URI (string; a relative path is relative to the shard's folder), or a Hugging
  Face `Image` struct {bytes, path};
- WebDataset tar (`.tar`, `.tar.gz`, `.tgz`): members `<key>.<ext>` grouped by key; the
  image is the first of `.jpg .jpeg .png .webp`, the caption is `.txt` (stripped) or the
  caption field of `.json`. Read whole into memory and its members sliced out by a walker
  of tar headers (pipeline.curation.tar_walk); a tar that walker cannot read exactly is read with
  the standard library's tarfile, streaming, which reads every kind of tar.

`read_shard` returns the shard's ORIGINAL rows as an Arrow table (what filtered outputs
copy: `pipeline.curation.publish`), and `shard_pairs` turns them into one (image_uri, caption) row per input row, with
a shard's embedded images written as one pack so that every pair points at its image's bytes. A row that
cannot be used keeps its place with an error (field, reason, detail); a shard that cannot
be read at all raises `ShardError` naming the file.
"""
from __future__ import annotations

import hashlib
import io
import json
import posixpath
import tarfile
from collections.abc import Iterable
from dataclasses import dataclass

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
from fsspec.core import url_to_fs

from operators.hashing import digest
from operators.images import ImageError, decode_image, unreachable
from pipeline.curation.tar_walk import FileBlocks, Unsupported, regular_members, tar_bytes
from pipeline.store.folder import BadRecord, Folder
from pipeline.store.fs import is_local
from pipeline.store.image_packs import ImagePack

FORMATS = {".parquet": "parquet", ".tar": "webdataset", ".tar.gz": "webdataset", ".tgz": "webdataset"}
IMAGE_EXTENSIONS = ("jpg", "jpeg", "png", "webp")
CHANGE_DETECTION = ("stat", "content")
_GLOB_CHARS = "*?["

# One row per input row: where its image is, its caption, or why it cannot be scored.
PAIRS = pa.schema(
    [
        ("shard_id", pa.string()),
        ("row", pa.int64()),  # null for a shard-level error
        ("image_uri", pa.string()),
        # Known without reading the image again: the hash of embedded bytes (computed while
        # extracting them) or the shard's own hash column (columns.image_hash); else null.
        ("image_hash", pa.string()),
        ("caption", pa.string()),
        ("field", pa.string()),
        ("reason", pa.string()),
        ("detail", pa.string()),
    ]
)


class ShardError(RuntimeError):
    """A whole shard is missing, unreadable or lacks a required column; the message names it."""


@dataclass(frozen=True)
class Shard:
    """One input file as found tonight: (uri, size, version) identify what was scored."""

    uri: str
    size: int
    version: str  # "etag:<ETag>", "mtime:<seconds>" or "blake2b:<hex of the bytes>"
    format: str  # parquet | webdataset

    @property
    def shard_id(self) -> str:
        """Stable name of the shard's outputs: the file stem plus a hash of the full URI, since
        daily folders often reuse file names (incoming/<day>/part-0000.parquet)."""
        return f"{shard_stem(self.uri)}-{digest(self.uri.encode())[:8]}"


def shard_stem(uri: str) -> str:
    name = posixpath.basename(uri.rstrip("/"))
    for ext in sorted(FORMATS, key=len, reverse=True):
        if name.lower().endswith(ext):
            return name[: -len(ext)]
    return name


def shard_format(uri: str) -> str | None:
    name = uri.lower()
    for ext in sorted(FORMATS, key=len, reverse=True):
        if name.endswith(ext):
            return FORMATS[ext]
    return None


# -- discovery --------------------------------------------------------------------------------


def discover(patterns: Iterable[str], detect_changes: str = "stat") -> list[Shard]:
    """Every shard the patterns name, sorted by URI.

    A pattern is a glob (`s3://bucket/incoming/*.parquet`), a folder (searched recursively
    for .parquet and .tar files) or one file. An empty folder or a glob matching nothing is a
    quiet night, not an error; a named file that does not exist is a mistake and raises.
    """
    if detect_changes not in CHANGE_DETECTION:
        raise ValueError(f"detect_changes must be one of {CHANGE_DETECTION}, got {detect_changes!r}")
    found: dict[str, Shard] = {}
    for pattern in patterns:
        fs, path = url_to_fs(pattern)
        for file_path, info in _expand(fs, path, pattern).items():
            uri = file_path if is_local(fs) else fs.unstrip_protocol(file_path)
            fmt = shard_format(uri)
            if fmt is None:
                raise ShardError(f"{uri}: not a shard (expected one of {', '.join(FORMATS)}); matched by {pattern!r}")
            found[uri] = Shard(uri=uri, size=int(info["size"]), version=_version(fs, file_path, info, detect_changes), format=fmt)
    return [found[u] for u in sorted(found)]


def _expand(fs, path: str, pattern: str) -> dict[str, dict]:
    fs.invalidate_cache()  # a long-lived process must see tonight's uploads, not a cached listing
    if any(c in path for c in _GLOB_CHARS):
        matches = fs.glob(path, detail=True)
        fixed = posixpath.dirname(path[: min(path.index(c) for c in _GLOB_CHARS if c in path)])
        return {p: i for p, i in sorted(matches.items()) if i.get("type") == "file" and not _hidden(p, fixed)}
    if pattern.endswith("/") or fs.isdir(path):
        if not fs.exists(path):
            return {}
        listing = fs.find(path, detail=True)
        return {p: i for p, i in sorted(listing.items()) if i.get("type") == "file" and shard_format(p) and not _hidden(p, path)}
    try:
        return {path: fs.info(path)}
    except FileNotFoundError as exc:
        raise ShardError(f"{pattern}: {_not_found(pattern, exc)}") from None


def _not_found(uri: str, exc: FileNotFoundError) -> str:
    """Why a shard cannot be read that fsspec reports as not found. Its HTTP file system says
    "not found" for a host that does not resolve, a refused connection or a 403 too: those
    are named (`operators.images.unreachable`) rather than called a missing shard."""
    why = unreachable(uri, exc)
    if why is None:
        return "input shard not found"
    return f"input shard not found ({why.split(' (')[0]})" if why.startswith(("HTTP 404", "HTTP 410")) else why


def _hidden(file_path: str, root: str) -> bool:
    """Files a folder scan or glob skips: names starting with "." or "_" below `root`, and
    anything under such a folder (partial uploads, `_temporary/`, `_SUCCESS`)."""
    relative = posixpath.relpath(file_path, root)
    return any(part.startswith((".", "_")) for part in relative.split("/"))


def _version(fs, path: str, info: dict, detect_changes: str) -> str:
    """What tells two versions of one file apart: the object store's ETag, else the
    modification time; or, with detect_changes=content, a hash of the bytes (one full read)."""
    if detect_changes == "content":
        h = hashlib.blake2b(digest_size=16)
        with fs.open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 22), b""):
                h.update(block)
        return f"blake2b:{h.hexdigest()}"
    etag = info.get("ETag") or info.get("etag")
    if etag:
        return f"etag:{str(etag).strip(chr(34))}"
    for key in ("mtime", "LastModified", "updated", "last_modified"):
        if info.get(key) is not None:
            value = info[key]
            return f"mtime:{value.isoformat() if hasattr(value, 'isoformat') else repr(value)}"
    raise ShardError(f"{path}: the file system reports neither an ETag nor a modification time; use detect_changes=content")


def current_version(shard: Shard, detect_changes: str = "stat") -> tuple[int, str]:
    """(size, version) of the shard's file now; raises ShardError if it is gone."""
    fs, path = url_to_fs(shard.uri)
    try:
        info = fs.info(path)
    except FileNotFoundError as exc:
        raise ShardError(f"{shard.uri}: {_not_found(shard.uri, exc)}") from None
    return int(info["size"]), _version(fs, path, info, detect_changes)


# -- row counts (window planning) ------------------------------------------------------------

# A tar member takes at least 1,024 bytes (a 512-byte header and one 512-byte data block), so a
# plain tar of size S holds at most S // 1024 samples: an estimate that errs on the side of
# smaller windows. Compressed tars can hold more (their headers compress well).
TAR_MIN_BYTES_PER_SAMPLE = 1024


def count_rows(shard: Shard) -> tuple[int, bool]:
    """(rows, exact) of a shard without reading its images: a Parquet file's footer; a local
    uncompressed tar's member headers (seeking over the data); else an estimate from the size."""
    fs, path = url_to_fs(shard.uri)
    if shard.format == "parquet":
        try:
            with fs.open(path, "rb") as f:
                return pq.ParquetFile(f).metadata.num_rows, True
        except (pa.ArrowInvalid, OSError):
            return 0, False  # unreadable: reading it records the error; it counts as nothing here
    if is_local(fs) and shard.uri.lower().endswith(".tar"):
        try:
            with open(path, "rb") as f:
                names = [name for name, _, _ in regular_members(FileBlocks(f))]
            return len({m[0] for m in map(sample_member, names) if m}), True
        except (Unsupported, OSError):
            return _count_with_tarfile(path)
    return max(1, shard.size // TAR_MIN_BYTES_PER_SAMPLE), False


def _count_with_tarfile(path: str) -> tuple[int, bool]:
    """count_rows of a tar the header walker does not read (pax headers, long names, ...)."""
    try:
        with tarfile.open(path, mode="r:") as tar:
            keys = {m[0] for m in (sample_member(t.name) for t in tar if t.isfile()) if m}
        return len(keys), True
    except (tarfile.TarError, EOFError, OSError):
        return 0, False


# -- reading ----------------------------------------------------------------------------------


def read_shard(uri: str, fmt: str) -> pa.Table:
    """The shard's original rows: the Parquet table, or for a tar one row per sample with
    `__key__` and one column per member extension (images as binary, the rest as text)."""
    if fmt == "parquet":
        try:
            with fsspec.open(uri, "rb") as f:
                return pq.read_table(f)
        except FileNotFoundError as exc:
            raise ShardError(f"{uri}: {_not_found(uri, exc)}") from None
        except (pa.ArrowInvalid, OSError) as exc:
            raise ShardError(f"{uri}: not a readable Parquet file ({exc})") from exc
    if fmt == "webdataset":
        return read_webdataset(uri)
    raise ShardError(f"{uri}: unknown shard format {fmt!r}")


def read_webdataset(uri: str) -> pa.Table:
    """A WebDataset tar as a table. Members are grouped by key (path up to the first dot of
    the file name); a repeated member or non-UTF-8 text is recorded in `__error__`.

    The file is read in one request; its members are sliced out of memory by the header
    walker, or, for a tar that walker leaves to tarfile, read by tarfile from those bytes."""
    try:
        with fsspec.open(uri, "rb") as f:
            raw = f.read()
        try:
            tar = tar_bytes(raw)
            view = memoryview(tar)
            members = [(name, view[start : start + size]) for name, start, size in regular_members(tar)]
        except Unsupported:
            members = _members_with_tarfile(raw)
    except FileNotFoundError as exc:
        raise ShardError(f"{uri}: {_not_found(uri, exc)}") from None
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise ShardError(f"{uri}: not a readable tar file ({exc})") from exc
    return webdataset_table(members)


def _members_with_tarfile(raw: bytes) -> list[tuple[str, bytes]]:
    """(name, bytes) of every regular-file member, read by tarfile as a stream."""
    with tarfile.open(fileobj=io.BytesIO(raw), mode="r|*") as tar:
        return [(member.name, tar.extractfile(member).read()) for member in tar if member.isfile()]


def sample_member(name: str) -> tuple[str, str] | None:
    """(sample key, extension) of a tar member's name, or None for a file that is not part of
    a sample (no extension, or hidden, e.g. a README or a macOS ._ resource file)."""
    if "/" not in name:  # the usual WebDataset member, spared posixpath's calls
        stem, dot, ext = name.partition(".")
        return (stem, ext) if dot and stem else None
    folder, base = posixpath.split(name)
    stem, dot, ext = base.partition(".")
    if not dot or not stem or base.startswith("."):
        return None
    return posixpath.join(folder, stem), ext


def webdataset_table(members: Iterable[tuple[str, bytes | memoryview]]) -> pa.Table:
    """One row per sample from a tar's regular-file members (name, bytes) in archive order:
    `__key__`, one column per lower-cased extension (images binary, the rest UTF-8 text)
    and, when a sample has a problem, `__error__`."""
    samples: dict[str, dict[str, bytes | memoryview]] = {}
    problems: dict[str, str] = {}
    for name, data in members:
        found = sample_member(name)
        if found is None:
            continue
        key, ext = found
        sample = samples.setdefault(key, {})
        ext = ext.lower()
        if ext in sample:
            problems.setdefault(key, f"member {ext!r} appears twice; the first is used")
            continue
        sample[ext] = data
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
                values.append(str(data, "utf-8"))
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


def shard_pairs(
    shard_id: str,
    uri: str,
    fmt: str,
    *,
    image_column: str,
    caption_column: str,
    images: Folder,
    reserved: Iterable[str] = (),
    hash_column: str | None = None,
) -> pa.Table:
    """One PAIRS row per input row; embedded image bytes are written under `images`, as one
    pack per shard (pipeline.store.image_packs).

    `reserved` names output columns the shard must not already have (score columns), so
    the filtered output can keep every original column unchanged. Embedded images are hashed
    and decoded here, while their bytes are in memory, so ingest never reads them again;
    `hash_column` (Parquet) names a column holding each referenced image's content hash.
    """
    table = read_shard(uri, fmt)
    clash = sorted(set(reserved) & set(table.column_names))
    if clash:
        raise ShardError(f"{uri}: has column(s) {clash}, which the curation output adds; rename them")
    if fmt == "webdataset":
        rows = _webdataset_pairs(table, caption_column)
        hashes = [None] * len(rows)
    else:
        rows = _parquet_pairs(table, uri, image_column, caption_column)
        hashes = _hash_column(table, uri, hash_column) if hash_column else [None] * len(rows)
    pack = ImagePack()
    out = []
    for row, ((image, caption, problem), known) in enumerate(zip(rows, hashes, strict=True)):
        record = {"shard_id": shard_id, "row": row, "caption": caption, "image_uri": None, "image_hash": None, "field": None, "reason": None, "detail": None}
        if problem is None:
            try:
                if isinstance(image, bytes):
                    if not image:
                        raise BadRecord(None, "embedded image has no bytes")
                    decode_image(image, f"{uri} row {row}")  # an undecodable blob is an error here, not in the model
                    record["image_hash"] = pack.add(image)
                else:
                    record["image_uri"], record["image_hash"] = image, known
            except BadRecord as exc:
                problem = ("image", "missing_image", exc.message)
            except ImageError as exc:
                problem = ("image", "unreadable_image", exc.cause)
        if problem is not None:
            record["field"], record["reason"], record["detail"] = problem
            record["detail"] = f"{uri} row {row}: {record['detail']}"
        out.append(record)
    if len(pack):
        pack_uri = pack.write(images)
        for record in out:
            if record["image_uri"] is None and record["reason"] is None:
                record["image_uri"] = pack.image_uri(pack_uri, record["image_hash"])
    return pa.Table.from_pylist(out, schema=PAIRS) if out else PAIRS.empty_table()


Problem = tuple[str, str, str]  # (field, reason, detail)


def _hash_column(table: pa.Table, uri: str, column: str) -> list[str | None]:
    """The shard's own content hashes, as `<column>:<value>` (never equal to this pipeline's
    blake2b hex, so two hash schemes cannot collide); an empty value means unknown."""
    if column not in table.column_names:
        raise ShardError(f"{uri}: missing column {column!r} named by columns.image_hash; found {table.column_names}")
    values = table.column(column)
    if not (pa.types.is_string(values.type) or pa.types.is_large_string(values.type)):
        raise ShardError(f"{uri}: hash column {column!r} has type {values.type}; expected text (e.g. hex digests)")
    return [f"{column}:{v.strip()}" if v and v.strip() else None for v in values.to_pylist()]


def _parquet_pairs(table: pa.Table, uri: str, image_column: str, caption_column: str) -> list[tuple[object, str | None, Problem | None]]:
    for column in (image_column, caption_column):
        if column not in table.column_names:
            raise ShardError(f"{uri}: missing column {column!r}; found {table.column_names} (set columns.image / columns.caption)")
    caption_type = table.schema.field(caption_column).type
    if not (pa.types.is_string(caption_type) or pa.types.is_large_string(caption_type)):
        raise ShardError(f"{uri}: caption column {caption_column!r} has type {caption_type}; expected text")
    image_kind = _image_kind(table.schema.field(image_column).type, uri, image_column)
    folder = posixpath.dirname(uri)
    rows = []
    for value, caption in zip(table.column(image_column).to_pylist(), table.column(caption_column).to_pylist(), strict=True):
        if image_kind == "struct":  # Hugging Face datasets' Image feature
            value = (value or {}).get("bytes") or (value or {}).get("path")
        if isinstance(value, bytes) and value:
            rows.append((value, caption, None))
        elif isinstance(value, str) and value.strip():
            rows.append((_resolve(folder, value), caption, None))
        else:
            rows.append((None, caption, (image_column, "missing_image", f"no image in column {image_column!r}")))
    return rows


def _image_kind(image_type: pa.DataType, uri: str, column: str) -> str:
    if pa.types.is_binary(image_type) or pa.types.is_large_binary(image_type):
        return "bytes"
    if pa.types.is_string(image_type) or pa.types.is_large_string(image_type):
        return "path"
    if pa.types.is_struct(image_type) and {"bytes", "path"} & {image_type.field(i).name for i in range(image_type.num_fields)}:
        return "struct"
    raise ShardError(f"{uri}: image column {column!r} has type {image_type}; expected binary (image bytes), string (path or URI) or struct<bytes, path>")


def _resolve(folder: str, path: str) -> str:
    """An image path from the data: URLs and absolute paths as they are, relative paths
    against the shard's folder (so a shard and its images can move together)."""
    if "://" in path or path.startswith("/"):
        return path
    return posixpath.normpath(posixpath.join(folder, path)) if "://" not in folder else f"{folder}/{path}"


def _webdataset_pairs(table: pa.Table, caption_field: str) -> list[tuple[object, str | None, Problem | None]]:
    records = table.to_pylist()
    rows = []
    for record in records:
        if record.get("__error__"):
            rows.append((None, None, ("__key__", "bad_record", f"sample {record['__key__']!r}: {record['__error__']}")))
            continue
        image = next((record[ext] for ext in IMAGE_EXTENSIONS if record.get(ext)), None)
        try:
            caption = _webdataset_caption(record, caption_field)
        except BadRecord as exc:
            rows.append((None, None, (exc.field, "bad_record", f"sample {record['__key__']!r}: {exc.message}")))
            continue
        if image is None:
            problem = ("image", "missing_image", f"sample {record['__key__']!r} has no {'/'.join(IMAGE_EXTENSIONS)} member")
            rows.append((None, caption, problem))
        else:
            rows.append((image, caption, None))
    return rows


def _webdataset_caption(record: dict, caption_field: str) -> str | None:
    if record.get("txt") is not None:
        return record["txt"].strip()
    if record.get("json") is None:
        raise BadRecord("txt", "sample has neither a .txt nor a .json member")
    try:
        meta = json.loads(record["json"])
    except json.JSONDecodeError as exc:
        raise BadRecord("json", f"not valid JSON ({exc})") from None
    caption = meta.get(caption_field) if isinstance(meta, dict) else None
    if caption is not None and not isinstance(caption, str):
        raise BadRecord(f"json.{caption_field}", f"caption is not text: {caption!r}")
    if caption is None:
        raise BadRecord(f"json.{caption_field}", f"the .json member has no {caption_field!r} field")
    return caption


# -- Ray Data tasks -------------------------------------------------------------------------------
# They live here, not in pipeline.curation.run, so that a worker imports only what reading
# shards needs (worker start-up dominates small nights); publishing's task is in
# pipeline.curation.publish.


def read_pairs_task(batch: pa.Table, image_column: str, caption_column: str, images_url: str, reserved: list[str], hash_column: str | None = None) -> pa.Table:
    """PAIRS rows of the batch's shards (columns shard_id, uri, format). A shard that cannot
    be read becomes one error row with a null row, so one bad upload never sinks the night."""
    images = Folder(images_url)
    out = []
    for r in batch.to_pylist():
        try:
            out.append(shard_pairs(r["shard_id"], r["uri"], r["format"], image_column=image_column, caption_column=caption_column, images=images, reserved=reserved, hash_column=hash_column))
        except Exception as exc:  # noqa: BLE001 - any failure to read a shard is reported, not fatal
            detail = str(exc) if isinstance(exc, ShardError) else f"{r['uri']}: {type(exc).__name__}: {exc}"
            out.append(pa.Table.from_pylist([{"shard_id": r["shard_id"], "reason": "unreadable_shard", "detail": detail}], schema=PAIRS))
    return pa.concat_tables(out)
