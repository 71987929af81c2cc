"""What every loader needs to read an official release safely, locally or on an object store.

- `Folder`: a local directory or `s3://` (any fsspec) prefix. Paths written *in the data*
  (image names, CSV columns) are joined with `Folder.join`, which refuses anything that
  would leave the folder ("../", absolute paths, URLs, and locally a symbolic link that
  resolves outside it), so a bad release cannot point the job at arbitrary files. Paths written *in the config* are trusted (`Folder.sub`).
- Existence checks list each directory once instead of one request per image: 9,600
  HEAD requests against S3 would take minutes, one listing takes a second.
- `BadRecord` is what a record parser raises; the loader turns it into a `Problem` and
  skips the record. `BenchmarkFileError` is for a whole file missing or unreadable.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import math
import os
import posixpath
import uuid
from collections.abc import Iterable, Iterator
from typing import Any, BinaryIO

import pyarrow as pa
import pyarrow.parquet as pq
from fsspec.core import url_to_fs

from operators.hashing import image_hash
from operators.schema import ITEMS, conform
from pipeline.benchmarks.common import Problem
from pipeline.store import TMP_PREFIX

log = logging.getLogger(__name__)


class BenchmarkFileError(RuntimeError):
    """A whole file is missing or unreadable; the message names it."""


class BadRecord(ValueError):
    """One record is unusable: which field, and why. The loader reports it and moves on."""

    def __init__(self, field: str | None, message: str):
        super().__init__(message)
        self.field = field
        self.message = message


# Loaders that write their own files under root on first use (the built-in demo).
SELF_WRITING_LOADERS = ("demo",)


def missing_release_folder(root: str, loader: str) -> str | None:
    """Why `root` cannot hold the release (None if it can): checked before any work, so a
    mistyped data_root fails in one line naming the folder instead of deep in a loader."""
    if loader in SELF_WRITING_LOADERS:
        return None
    from pipeline.storage import retrying

    try:
        fs, path = url_to_fs(root)
        fs.invalidate_cache(path)
        if retrying(f"list {root}", lambda: fs.isdir(path)):
            return None
        return f"{root} is a file, not a folder" if retrying(f"check {root}", lambda: fs.exists(path)) else f"folder {root} does not exist"
    except (OSError, ValueError) as exc:
        return f"cannot read folder {root}: {' '.join(str(exc).split())}"


class Folder:
    """A dataset folder: a local directory or an fsspec URL prefix such as `s3://bucket/x`."""

    def __init__(self, uri: str):
        self.fs, path = url_to_fs(uri)
        self.path = path.rstrip("/") or "/"
        self._listings: dict[str, frozenset[str]] = {}

    @property
    def is_local(self) -> bool:
        return "file" in _protocols(self.fs)

    def uri(self, path: str | None = None) -> str:
        """What `items.image_uri` holds: an absolute local path, or a URL with its scheme."""
        path = self.path if path is None else path
        return path if self.is_local else self.fs.unstrip_protocol(path)

    def sub(self, path: str) -> Folder:
        """A folder named in the config (trusted): a URL or absolute path, else relative to this one."""
        if "://" in path or path.startswith("/"):
            return Folder(path)
        return Folder(self.uri(posixpath.normpath(posixpath.join(self.path, path))))

    def locate(self, path: str) -> tuple[Folder, str]:
        """A file named in the config: the folder that holds it, and its path there."""
        parent, name = posixpath.split(path)
        folder = self.sub(parent or ".")
        return folder, posixpath.join(folder.path, name)

    def glob(self, pattern: str) -> tuple[Folder, list[str]]:
        """Files matching a pattern named in the config; none matching raises."""
        folder, path = self.locate(pattern)
        paths = sorted(p for p in folder.fs.glob(path) if folder.fs.isfile(p))
        if not paths:
            raise BenchmarkFileError(f"{folder.uri(path)}: no file matches")
        return folder, paths

    def join(self, relative: str) -> str:
        """The fs path of a path found in the data, refusing any that would leave the folder."""
        if not isinstance(relative, str) or not relative.strip():
            raise BadRecord(None, f"empty path {relative!r}")
        if "://" in relative or relative.startswith(("/", "\\")) or "\\" in relative or "\x00" in relative:
            raise BadRecord(None, f"path {relative!r} must be relative to {self.uri()}")
        normal = posixpath.normpath(relative)
        if normal == ".." or normal.startswith("../"):
            raise BadRecord(None, f"path {relative!r} escapes the dataset folder {self.uri()}")
        joined = posixpath.join(self.path, normal)
        if self.is_local:  # the text stays inside; a symbolic link on the way may not
            real = os.path.realpath(joined)
            if real != self._real_root and not real.startswith(self._real_root.rstrip("/") + "/"):
                raise BadRecord(None, f"path {relative!r} escapes the dataset folder {self.uri()} through a symbolic link (it resolves to {real})")
        return joined

    @property
    def _real_root(self) -> str:
        """The folder with its own symbolic links resolved (a dataset root may itself be a link)."""
        if not hasattr(self, "_real_root_cache"):
            self._real_root_cache = os.path.realpath(self.path)
        return self._real_root_cache

    def exists(self, path: str) -> bool:
        """Whether the file exists, from one cached listing of its directory."""
        parent = posixpath.dirname(path)
        if parent not in self._listings:
            try:
                names = self.fs.ls(parent, detail=False)
            except (FileNotFoundError, NotADirectoryError):
                names = []
            self._listings[parent] = frozenset(name.rstrip("/") for name in names)
        return path in self._listings[parent]

    def exists_now(self, path: str) -> bool:
        """Whether the file exists, asked now (no cached listing; os.stat for a local folder)."""
        return os.path.exists(path) if self.is_local else self.fs.exists(path)

    def open(self, path: str, mode: str = "rb") -> BinaryIO:
        """Open a whole file of the release; a missing one raises an error naming it."""
        if not self.fs.isfile(path):
            raise BenchmarkFileError(f"{self.uri(path)}: file not found")
        return self.fs.open(path, mode)

    def read_text(self, path: str) -> str:
        with self.open(path) as f:
            data = f.read()
        try:
            return data.decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            raise BenchmarkFileError(f"{self.uri(path)}: not UTF-8 text ({exc})") from exc

    def read_json(self, path: str) -> Any:
        """Parse a JSON file; objects come back as `JsonObject`, which remembers duplicate keys."""
        try:
            return json.loads(self.read_text(path), object_pairs_hook=JsonObject.from_pairs)
        except json.JSONDecodeError as exc:
            raise BenchmarkFileError(f"{self.uri(path)}: not valid JSON ({exc})") from exc

    def write_once(self, path: str, data: bytes) -> None:
        """Write `data` unless the file exists; readers never see a partial file."""
        if not self.exists_now(path):
            self.write(path, data)

    def write_content(self, path: str, data: bytes) -> None:
        """Write content-named `data` (an image, an image pack) unless the file already holds
        exactly these bytes. A copy damaged on disk (the name, other bytes: truncated or altered)
        is written again: a name whose bytes changed would be hashed anew downstream and scored
        as other pixels, or point readers at the wrong offsets."""
        from pipeline.storage import retrying

        try:
            found = retrying(f"read {self.uri(path)}", lambda: self.fs.cat_file(path))
        except FileNotFoundError:
            found = None
        if found == data:
            return
        if found is not None:
            log.warning("%s is damaged (%d bytes that are not the content it is named after); writing it again", self.uri(path), len(found))
        self.write(path, data)

    def write(self, path: str, data: bytes) -> None:
        """Write `data` (replacing the file if there is one); readers never see a partial file."""
        if not self.is_local:
            self.fs.pipe_file(path, data)  # one PUT on object stores: atomic
            return
        # local: os calls, not fsspec's (an extraction writes 100k images into 256 folders, and
        # fsspec's exists + makedirs per image cost more than the file's own write)
        write_local_atomically(path, data)


def write_local_atomically(path: str, data: bytes) -> None:
    """Write a local file (a new one, or over an old one) so that readers see the old bytes or
    all of the new, never a part: a temporary file beside it, renamed into place. The folder is
    made only when the temporary file cannot be created in it; a failed write leaves nothing.

    The temporary file is opened with mode 0666 and the umask applied, as `open()` does, not
    with mkstemp (its files are 0600: an image extracted by a service account was unreadable
    to every other user of a shared store)."""
    folder = posixpath.dirname(path)
    tmp = posixpath.join(folder, f"{TMP_PREFIX}{uuid.uuid4().hex}")  # what `store gc` removes once old
    flags = os.O_CREAT | os.O_EXCL | os.O_WRONLY
    try:
        fd = os.open(tmp, flags, 0o666)
    except FileNotFoundError:
        os.makedirs(folder, exist_ok=True)
        fd = os.open(tmp, flags, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def _protocols(fs) -> tuple[str, ...]:
    return (fs.protocol,) if isinstance(fs.protocol, str) else tuple(fs.protocol)


class JsonObject(dict):
    """A JSON object that keeps the first value of a repeated key and lists the repeats.

    `json.load` silently keeps the last copy of a duplicated key; real releases have
    duplicated ids, and a loader must report them rather than lose one without a word.
    """

    duplicate_keys: list[str]

    @classmethod
    def from_pairs(cls, pairs: list[tuple[str, Any]]) -> JsonObject:
        obj = cls()
        obj.duplicate_keys = []
        for key, value in pairs:
            if key in obj:
                obj.duplicate_keys.append(key)
            else:
                obj[key] = value
        return obj


def extract_image(folder: Folder, data: bytes | None, name_hint: str | None = None) -> str:
    """Store embedded image bytes under `folder` by content hash and return the file's URI.

    Content addressing makes extraction idempotent and shared: the same image (across
    reruns, or repeated in a release) is stored once, at `<hh>/<hash>.<ext>`; a stored copy
    damaged since is written again.
    """
    path, _ = content_address(folder, data, name_hint)
    folder.write_content(path, data)
    return folder.uri(path)


def content_address(folder: Folder, data: bytes | None, name_hint: str | None = None) -> tuple[str, str]:
    """(path under `folder`, image hash) where `extract_image` stores these bytes."""
    if not data:
        raise BadRecord(None, "embedded image has no bytes")
    digest = image_hash(data)
    return posixpath.join(folder.path, digest[:2], f"{digest}.{image_extension(data, name_hint)}"), digest


_SIGNATURES = ((b"\x89PNG\r\n\x1a\n", "png"), (b"\xff\xd8\xff", "jpg"), (b"GIF8", "gif"), (b"BM", "bmp"))


def image_extension(data: bytes, name_hint: str | None = None) -> str:
    """The file extension of image bytes, from their signature (else the name's, else `img`)."""
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "webp"
    for signature, ext in _SIGNATURES:
        if data.startswith(signature):
            return ext
    hinted = posixpath.splitext(name_hint or "")[1].lstrip(".").lower()
    return hinted if hinted.isalnum() else "img"


def rating(value: Any, low: float, high: float, field: str) -> float:
    """One human rating: a real number (not a bool, not a string) within [low, high]."""
    number = number_value(value, field)
    if not low <= number <= high:
        raise BadRecord(field, f"rating {value!r} outside {low:g}..{high:g}")
    return number


def number_value(value: Any, field: str) -> float:
    """A finite number from JSON/CSV data; text that looks numeric is not silently accepted."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BadRecord(field, f"not a number: {value!r}")
    number = float(value)
    if not math.isfinite(number):
        raise BadRecord(field, f"not a finite number: {value!r}")
    return number


def parse_number(text: str | None, field: str) -> float:
    """A finite number written as text (CSV cells)."""
    try:
        number = float(text)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise BadRecord(field, f"not a number: {text!r}") from None
    if not math.isfinite(number):
        raise BadRecord(field, f"not a finite number: {text!r}")
    return number


def parse_int(text: str | None, field: str) -> int:
    """An integer written as text; "2.0" or "two" is a bad record, not a guess."""
    try:
        return int(str(text).strip())
    except (TypeError, ValueError):
        raise BadRecord(field, f"not an integer: {text!r}") from None


def text_value(value: Any, field: str) -> str:
    """A non-empty string: an empty caption would be scored as if it were a caption."""
    if not isinstance(value, str) or not value.strip():
        raise BadRecord(field, f"expected non-empty text, got {value!r}")
    return value


def require_image(folder: Folder, relative: str, field: str) -> str:
    """The URI of an image named in the data, which must stay inside `folder` and exist."""
    try:
        path = folder.join(relative)
    except BadRecord as exc:
        raise BadRecord(field, exc.message) from None
    if not folder.exists(path):
        raise BadRecord(field, f"image file not found: {folder.uri(path)}")
    return folder.uri(path)


class ProblemLog:
    """Collects the problems of one file, so each loader reports them the same way."""

    def __init__(self, file: str, problems: list[Problem]):
        self.file = file
        self.problems = problems

    def add(self, record: object, field: str | None, message: str) -> None:
        self.problems.append(Problem(self.file, str(record), field, message))

    def bad(self, record: object, exc: BadRecord) -> None:
        self.add(record, exc.field, exc.message)

    def duplicates(self, obj: JsonObject, what: str = "key", record: str | None = None) -> None:
        """Report the repeated keys of a JSON object (at `record`, default: the key itself)."""
        for key in obj.duplicate_keys:
            self.add(record or key, None, f"duplicate {what} {key!r}: only its first copy is used")


def items_table(rows: Iterable[dict[str, Any]], benchmark: str) -> pa.Table:
    """Build the final `ITEMS` table, filling `benchmark` and refusing duplicate item ids.

    Loaders skip duplicated records themselves (and report them); a duplicate reaching
    this point is a loader bug, so it raises instead of being reported.
    """
    rows = [{"benchmark": benchmark, "tags": [], **row} for row in rows]
    seen: set[str] = set()
    for row in rows:
        if row["item_id"] in seen:
            raise AssertionError(f"{benchmark}: loader produced item_id {row['item_id']!r} twice")
        seen.add(row["item_id"])
    table = pa.Table.from_pylist(rows, schema=ITEMS) if rows else ITEMS.empty_table()
    return conform(table, ITEMS, what=f"{benchmark} items")


def iter_jsonl(text: str) -> Iterator[tuple[int, str]]:
    """(line number, line) for each non-blank line."""
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            yield number, line


def read_csv(folder: Folder, path: str, required: Iterable[str]) -> tuple[list[str], list[tuple[str, dict[str, str]]]]:
    """The header and ("line N", row) of every row; a file lacking a required column raises."""
    reader = csv.DictReader(io.StringIO(folder.read_text(path), newline=""))
    header = list(reader.fieldnames or [])
    missing = [c for c in required if c not in header]
    if missing:
        raise BenchmarkFileError(f"{folder.uri(path)}: missing column(s) {missing}; found {header}")
    try:
        rows = [(f"line {reader.line_num}", row) for row in reader]
    except csv.Error as exc:
        raise BenchmarkFileError(f"{folder.uri(path)}: not valid CSV near line {reader.line_num} ({exc})") from exc
    return header, rows


def iter_parquet(
    folder: Folder, path: str, columns: list[str], optional: Iterable[str] = (), batch_rows: int = 64
) -> Iterator[tuple[int, dict[str, Any]]]:
    """(row index, row) of a Parquet file, reading only `columns` (required) and those of
    `optional` that the file has, a few rows at a time.

    Releases that embed images hold gigabytes per file; reading batches keeps memory small.
    """
    with folder.open(path) as f:
        try:
            parquet = pq.ParquetFile(f)
        except (pa.ArrowInvalid, OSError) as exc:
            raise BenchmarkFileError(f"{folder.uri(path)}: not a readable Parquet file ({exc})") from exc
        missing = [c for c in columns if c not in parquet.schema_arrow.names]
        if missing:
            raise BenchmarkFileError(
                f"{folder.uri(path)}: missing column(s) {missing}; found {parquet.schema_arrow.names}"
            )
        columns = columns + [c for c in optional if c in parquet.schema_arrow.names]
        index = 0
        for batch in parquet.iter_batches(batch_size=batch_rows, columns=columns):
            for row in batch.to_pylist():
                yield index, row
                index += 1
