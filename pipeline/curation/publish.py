"""Writing a shard's outputs: its evidence and errors tables, then (a Ray task per shard,
`publish_task`) the filtered shard, its kept rows in their original order, and its decisions."""
from __future__ import annotations

import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from operators import schema
from operators.schema import error_table
from pipeline.curation.manifest import shard_url
from pipeline.curation.shards import Shard, ShardError, read_shard
from pipeline.runtime import task_options
from pipeline.store.fs import table_to_parquet_bytes, write_table


def write_shard_tables(output: str, shard_id: str, evidence: pl.DataFrame, errors: pl.DataFrame) -> None:
    shard_evidence = evidence.filter(pl.col("shard_id") == shard_id).drop("shard_id")
    write_table(shard_url(output, "evidence", shard_id), shard_evidence.to_arrow())
    shard_errors = errors.filter(pl.col("benchmark") == shard_id)
    write_table(shard_url(output, "errors", shard_id), schema.conform(shard_errors.to_arrow(), schema.ERRORS))



def publish(decided: list[tuple[Shard, pl.DataFrame]], output: str) -> pl.DataFrame:
    """Write the filtered shards and then their decisions (Ray Data, a task per shard);
    returns the error rows of the shards that could not be published."""
    import ray

    if not decided:
        return pl.from_arrow(schema.ERRORS.empty_table())
    dataset = ray.data.from_items(
        [
            {
                "shard_id": s.shard_id, "uri": s.uri, "format": s.format,
                "decisions": table_to_parquet_bytes(d.to_arrow()),
                "filtered_url": shard_url(output, "filtered", s.shard_id),
                "decisions_url": shard_url(output, "decisions", s.shard_id),
            }
            for s, d in decided
        ],
        override_num_blocks=len(decided),
    ).map_batches(publish_task, batch_size=1, batch_format="pyarrow", **task_options())
    tables = list(dataset.iter_batches(batch_size=None, batch_format="pyarrow"))
    return pl.from_arrow(schema.concat_errors(tables))


def publish_task(batch: pa.Table) -> pa.Table:
    """Write each shard's filtered copy, then its decisions (so a decisions file always
    describes what was published). Batch columns: shard_id, uri, format, decisions (Parquet
    bytes), filtered_url, decisions_url. Returns ERRORS rows for shards that failed."""
    problems = []
    for r in batch.to_pylist():
        try:
            decisions = pq.read_table(pa.BufferReader(r["decisions"]))
            write_table(r["filtered_url"], filtered_rows(read_shard(r["uri"], r["format"]), decisions, r["uri"]))
            write_table(r["decisions_url"], decisions)
        except Exception as exc:  # noqa: BLE001 - reported per shard
            problems.append({"stage": "curation", "benchmark": r["shard_id"], "source": r["uri"], "reason": "publish_failed", "detail": f"{r['uri']}: {type(exc).__name__}: {exc}"})
    return error_table(problems)


def filtered_rows(source: pa.Table, decisions: pa.Table, uri: str) -> pa.Table:
    """The kept rows of `source` in their original order, every original column unchanged,
    with the decisions' `score_<metric>` columns appended."""
    if source.num_rows != decisions.num_rows:
        raise ShardError(f"{uri}: has {source.num_rows} rows but {decisions.num_rows} were scored; the file changed")
    kept = decisions.filter(pc.fill_null(decisions.column("keep"), False)).sort_by("row")
    out = source.take(kept.column("row"))
    if "__error__" in out.column_names:  # the WebDataset reader's own note, not an original column
        out = out.drop_columns(["__error__"])
    for column in (c for c in kept.column_names if c.startswith("score_")):
        out = out.append_column(column, kept.column(column).cast(pa.float64()))
    return out
