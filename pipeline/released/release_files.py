"""What a released-file reader returns, and the small file helpers the readers share."""
from __future__ import annotations

import json
from dataclasses import dataclass, field

import fsspec
import polars as pl

from pipeline.config import ProtocolSpec


@dataclass
class Released:
    scores: pl.DataFrame  # item_id, metric, score, note (long)
    items: pl.DataFrame  # item_id, group_id, human, benchmark
    protocol: ProtocolSpec  # the source's own evaluation protocol (its published choices)
    benchmark: str
    problems: list[str] = field(default_factory=list)
    target: str | None = None  # the metric deltas are computed for, unless the caller names one


def read_text_csv(path: str, required: tuple[str, ...], *, what: str) -> pl.DataFrame:
    """A CSV with every column as text (answers stay as written), or an error naming the column."""
    try:
        with fsspec.open(path, "rb") as handle:
            frame = pl.read_csv(handle, infer_schema_length=0)
    except FileNotFoundError as exc:
        raise FileNotFoundError(f"{what} file not found: {path}") from exc
    except (pl.exceptions.PolarsError, OSError) as exc:
        raise ValueError(f"{what} file {path} could not be read: {exc}") from exc
    missing = [c for c in required if c not in frame.columns]
    if missing:
        raise ValueError(f"{what} file {path}: missing column(s) {missing}; have {frame.columns}")
    return frame.with_row_index("row", offset=2)  # the file's line number (line 1 is the header)


def read_json(path: str, *, what: str):
    try:
        with fsspec.open(path, "rt", encoding="utf-8") as handle:
            return json.load(handle)
    except FileNotFoundError as exc:
        raise FileNotFoundError(f"{what} file not found: {path}") from exc
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{what} file {path} is not valid JSON: {exc}") from exc


def as_number(value) -> float | None:
    """A finite float, or None (text numbers accepted; bools, NaN, inf and junk refused)."""
    if isinstance(value, bool) or value is None:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if number == number and abs(number) != float("inf") else None
