"""What every benchmark loader returns, and how it reports bad records."""
from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow as pa


@dataclass(frozen=True)
class Problem:
    """One bad record: skipped by the loader, reported to the user and the errors table."""

    file: str
    record: str  # row number, JSON key, tfrecord index: whatever lets a user find it
    field: str | None
    message: str

    def __str__(self) -> str:
        where = f"{self.file} [{self.record}]" + (f" field {self.field!r}" if self.field else "")
        return f"{where}: {self.message}"


@dataclass
class LoadResult:
    items: pa.Table  # operators.schema.ITEMS (image_hash left null)
    problems: list[Problem] = field(default_factory=list)
    questions: pa.Table | None = None  # operators.schema.QUESTIONS, when the benchmark ships them
