"""Table plumbing every metric module shares.

The metric modules read answer tables with `read_table`, score only the requested items
(`requested_items`) and write the long metric table with `long_scores`, so that every
requested item gets exactly one row per metric whatever the input held.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping

import polars as pl
import pyarrow as pa

METRIC_COLUMNS = {"item_id": pl.String, "metric": pl.String, "score": pl.Float64, "note": pl.String}


def _as_expr(column: str | pl.Expr) -> pl.Expr:
    return pl.col(column) if isinstance(column, str) else column



def read_table(table: pl.DataFrame | pa.Table, columns: Mapping[str, pl.DataType], *, what: str) -> pl.DataFrame:
    """`table` as a polars DataFrame holding `columns`, cast to the given types.

    Raises ValueError naming the table (`what`) and the column when a column is missing or
    cannot be read as its type; extra columns are dropped.
    """
    frame = table if isinstance(table, pl.DataFrame) else pl.from_arrow(table)
    if not isinstance(frame, pl.DataFrame):
        raise TypeError(f"{what}: expected a table, got {type(table).__name__}")
    missing = [name for name in columns if name not in frame.columns]
    if missing:
        raise ValueError(f"{what}: missing column(s) {', '.join(missing)}; have {', '.join(frame.columns)}")
    out = []
    for name, dtype in columns.items():
        try:
            out.append(frame.get_column(name).cast(dtype, strict=True))
        except (pl.exceptions.InvalidOperationError, pl.exceptions.ComputeError) as exc:
            raise ValueError(f"{what}: column {name!r} cannot be read as {dtype}: {exc}") from exc
    return pl.DataFrame(out)


def requested_items(item_ids: Iterable[str] | pl.Series | pa.Array) -> pl.DataFrame:
    """One-column frame of the item ids to score, first occurrence order, no repeats."""
    if isinstance(item_ids, (pa.Array, pa.ChunkedArray)):
        series = pl.Series("item_id", item_ids.to_pylist(), dtype=pl.String)
    elif isinstance(item_ids, pl.Series):
        series = item_ids.cast(pl.String).rename("item_id")
    else:
        series = pl.Series("item_id", list(item_ids), dtype=pl.String)
    if series.null_count():
        raise ValueError(f"item ids: {series.null_count()} null item id(s) among {len(series)}")
    return series.unique(maintain_order=True).to_frame()


def keyed_rows(frame: pl.DataFrame, keys: list[str], *, what: str) -> pl.DataFrame:
    """`frame` in `keys` order, after checking that `keys` identify its rows (ValueError naming
    the first repeated key). The formulas sum floats per item, and a float sum depends on the
    order of its terms: in key order, a score is a function of the answers alone, not of the
    order they were stored in (a resumed run stores them in another order than an
    uninterrupted one, and must print the same scores to the last bit)."""
    repeated = frame.filter(pl.struct(keys).is_duplicated())
    if repeated.height:
        first = repeated.row(0, named=True)
        where = ", ".join(f"{key} {first[key]!r}" for key in keys)
        raise ValueError(f"{what}: duplicate rows for {where} ({repeated.height} rows share a key)")
    return frame.sort(keys, nulls_last=True)


def long_scores(
    items: pl.DataFrame,
    per_item: pl.DataFrame,
    metrics: Mapping[str, tuple[pl.Expr, pl.Expr]],
    *,
    absent_note: str,
) -> pl.DataFrame:
    """The long metric table: one row per (requested item, metric).

    `per_item` has one row per item that had input rows; `metrics` maps a metric id to
    (score expression, note expression) over its columns. Items without input rows get a
    null score with `absent_note`.
    """
    present = per_item.with_columns(_present=pl.lit(True))
    joined = items.join(present, on="item_id", how="left", maintain_order="left")
    absent = pl.col("_present").is_null()
    frames = [
        joined.select(
            pl.col("item_id"),
            pl.lit(metric, dtype=pl.String).alias("metric"),
            pl.when(absent).then(None).otherwise(score).cast(pl.Float64).alias("score"),
            pl.when(absent).then(pl.lit(absent_note)).otherwise(note).cast(pl.String).alias("note"),
        )
        for metric, (score, note) in metrics.items()
    ]
    return pl.concat(frames) if frames else empty_scores()


def empty_scores() -> pl.DataFrame:
    return pl.DataFrame(schema=METRIC_COLUMNS)


def missing_note(bad: str | pl.Expr, total: str | pl.Expr, unit: str = "questions") -> pl.Expr:
    """Note "missing_answer: <bad> of <total> <unit>" for an item whose score is null."""
    return pl.format("missing_answer: {} of {} " + unit, _as_expr(bad), _as_expr(total))
