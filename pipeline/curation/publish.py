"""Writing a shard's outputs: its evidence and errors tables, then (a Ray task per shard) the
filtered shard and its decisions."""
from __future__ import annotations

import polars as pl
import pyarrow as pa

from operators import schema
from pipeline.curation.manifest import shard_url
from pipeline.curation.shards import Shard, publish_task
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
    return pl.from_arrow(pa.concat_tables([schema.conform(t, schema.ERRORS) for t in tables])) if tables else pl.from_arrow(schema.ERRORS.empty_table())

