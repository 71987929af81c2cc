"""What every loader needs to read an official release: record parsers and the items table.

Files are read through `pipeline.store.folder.Folder` (safe joins, one listing per directory,
local or on an object store). A record parser raises `BadRecord` naming the field; the loader
turns it into a `Problem` (`ProblemLog`) and skips the record. A whole file missing or
unreadable raises `FileError`.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Iterable, Iterator
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from fsspec.core import url_to_fs

from operators.schema import ITEMS, conform
from pipeline.benchmarks import writes_own_files
from pipeline.benchmarks.common import Problem
from pipeline.store.folder import BadRecord, FileError, Folder, JsonObject
from pipeline.store.settings import retrying


class BadOption(ValueError):
    """A loader option (a benchmark config's `options`) has a value the loader cannot use; the
    sweep reports it as a config error naming the benchmark's options."""


def missing_release_folder(root: str, loader: str) -> str | None:
    """Why `root` cannot hold the release (None if it can): checked before any work, so a
    mistyped data_root fails in one line naming the folder instead of deep in a loader."""
    if writes_own_files(loader):
        return None
    try:
        fs, path = url_to_fs(root)
        fs.invalidate_cache(path)
        if retrying(f"list {root}", lambda: fs.isdir(path)):
            return None
        return f"{root} is a file, not a folder" if retrying(f"check {root}", lambda: fs.exists(path)) else f"folder {root} does not exist"
    except (OSError, ValueError) as exc:
        return f"cannot read folder {root}: {' '.join(str(exc).split())}"


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
        raise FileError(f"{folder.uri(path)}: missing column(s) {missing}; found {header}")
    try:
        rows = [(f"line {reader.line_num}", row) for row in reader]
    except csv.Error as exc:
        raise FileError(f"{folder.uri(path)}: not valid CSV near line {reader.line_num} ({exc})") from exc
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
            raise FileError(f"{folder.uri(path)}: not a readable Parquet file ({exc})") from exc
        missing = [c for c in columns if c not in parquet.schema_arrow.names]
        if missing:
            raise FileError(
                f"{folder.uri(path)}: missing column(s) {missing}; found {parquet.schema_arrow.names}"
            )
        columns = columns + [c for c in optional if c in parquet.schema_arrow.names]
        index = 0
        for batch in parquet.iter_batches(batch_size=batch_rows, columns=columns):
            for row in batch.to_pylist():
                yield index, row
                index += 1
