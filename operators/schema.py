"""Arrow schemas of the tables that flow between stages (see docs/DESIGN.md).

Keeping them in one place means a loader, a stage and a test all agree on column names
and types; `conform` turns "almost right" tables into exactly-right ones or says why not.
"""
from __future__ import annotations

from collections.abc import Iterable

import pyarrow as pa

ITEMS = pa.schema(
    [
        ("item_id", pa.string()),
        ("benchmark", pa.string()),
        ("image_uri", pa.string()),
        ("image_hash", pa.string()),
        ("caption", pa.string()),
        ("group_id", pa.string()),
        ("human", pa.float64()),
        ("image_index", pa.int32()),
        ("caption_index", pa.int32()),
        ("correct", pa.bool_()),
        ("template", pa.string()),
        ("tags", pa.list_(pa.string())),
    ]
)

QUESTIONS = pa.schema(
    [
        ("caption", pa.string()),
        ("question_set", pa.string()),
        ("question_id", pa.string()),
        ("question", pa.string()),
        ("parents", pa.list_(pa.string())),
        ("claim_type", pa.string()),
        ("source", pa.string()),
    ]
)

REQUESTS = pa.schema(
    [
        ("key", pa.string()),
        ("backbone", pa.string()),
        ("kind", pa.string()),
        ("prompt_id", pa.string()),
        ("image_hash", pa.string()),
        ("image_uri", pa.string()),
        ("caption", pa.string()),
        ("text", pa.string()),
    ]
)

# Field metadata of a column added to a stored table's schema after parts were written: a
# stored part without it reads as null there. Every other missing column makes a part bad.
ADDED_LATER = {"added_later": "true"}


def added_later(field: pa.Field) -> bool:
    return bool(field.metadata) and field.metadata.get(b"added_later") == b"true"


ANSWERS = pa.schema(
    [
        ("key", pa.string()),
        ("backbone", pa.string()),
        ("kind", pa.string()),
        ("logp_yes", pa.float64()),
        ("logp_no", pa.float64()),
        # P(yes spellings) + P(no spellings) = exp(logp_yes) + exp(logp_no): how much of the
        # next-token distribution went to an answer at all. Null in parts written before it
        # existed (read them with `conform`; the value follows from the two log-probs).
        pa.field("answer_mass", pa.float64(), metadata=ADDED_LATER),
    ]
)

GENERATIONS = pa.schema(
    [
        ("key", pa.string()),
        ("backbone", pa.string()),
        ("kind", pa.string()),
        ("text", pa.string()),
    ]
)

ERRORS = pa.schema(
    [
        ("stage", pa.string()),
        ("benchmark", pa.string()),
        ("item_id", pa.string()),
        ("key", pa.string()),
        ("source", pa.string()),
        ("field", pa.string()),
        ("reason", pa.string()),
        ("detail", pa.string()),
    ]
)

METRIC_SCORES = pa.schema(
    [
        ("item_id", pa.string()),
        ("metric", pa.string()),
        ("score", pa.float64()),
        ("note", pa.string()),
    ]
)

SCORES = pa.schema(
    [
        ("item_id", pa.string()),
        ("benchmark", pa.string()),
        ("backbone", pa.string()),
        ("metric", pa.string()),
        ("score", pa.float64()),
        ("note", pa.string()),
    ]
)

QUESTION_SETS = ("depict", "dsg", "claims")
CLAIM_TYPES = ("object", "attribute", "count", "action", "relation", "spatial", "negation", "other")
REQUEST_KINDS = ("caption", "image", "holistic", "claim")


def conform(table: pa.Table, schema: pa.Schema, *, what: str = "table") -> pa.Table:
    """Return `table` with exactly `schema`'s columns, in order and cast to its types.

    Missing nullable columns are added as nulls (a missing `tags` becomes empty lists);
    extra columns are dropped. A failed cast raises ValueError naming the column.
    """
    columns = []
    for field in schema:
        if field.name in table.column_names:
            column = table.column(field.name)
            try:
                column = column.cast(field.type)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                raise ValueError(f"{what}: column {field.name!r} cannot be read as {field.type}: {exc}") from exc
        elif pa.types.is_list(field.type):
            column = pa.array([[] for _ in range(table.num_rows)], type=field.type)
        else:
            column = pa.nulls(table.num_rows, type=field.type)
        columns.append(column)
    return pa.Table.from_arrays(columns, schema=schema)


def error_table(rows: list[dict]) -> pa.Table:
    """Error rows (dicts with any subset of ERRORS' columns) as an ERRORS table.

    Built against the schema, not inferred: `pa.Table.from_pylist` alone takes its columns
    from the first row, so a list starting with a row that has no `item_id` or `detail`
    silently dropped those fields from every row after it.
    """
    return pa.Table.from_pylist(rows, schema=ERRORS) if rows else ERRORS.empty_table()


def concat_errors(tables: Iterable[pa.Table]) -> pa.Table:
    """The error rows of several stages (or windows, shards, ...) as one ERRORS table, each
    table conformed first; no tables give an empty one."""
    conformed = [conform(t, ERRORS, what="errors") for t in tables]
    return pa.concat_tables(conformed) if conformed else ERRORS.empty_table()


def empty(schema: pa.Schema) -> pa.Table:
    return schema.empty_table()
