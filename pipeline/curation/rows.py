"""Shards in, rows out: every input row as a pair (through the pairs cache), the usable pairs as
ITEMS, and after scoring one decision row and the per-question evidence for each input row."""
from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor

import polars as pl
import pyarrow as pa

from operators import schema
from operators.metrics import yes_probability_expr
from pipeline.config import ResolvedConfig
from pipeline.curation.curation_config import CurationConfig
from pipeline.curation.pairs_cache import FOLDER as PAIRS_FOLDER
from pipeline.curation.pairs_cache import PairsCache
from pipeline.curation.shards import PAIRS, Shard, read_pairs_task
from pipeline.runtime import task_options
from pipeline.store.fs import exists, join_url, read_table

log = logging.getLogger(__name__)


def pairs_cache(c: CurationConfig) -> PairsCache:
    """Where the shards' PAIRS rows are kept, keyed by everything `read_pairs_task` is told."""
    options = {
        "image_column": c.columns.image,
        "caption_column": c.columns.caption,
        "images_url": join_url(c.store, "images"),
        "reserved": [f"score_{m}" for m in c.metrics],
        "hash_column": c.columns.image_hash,
    }
    return PairsCache(join_url(c.store, PAIRS_FOLDER), options)



def read_pairs(shards: list[Shard], cfg: ResolvedConfig) -> pl.DataFrame:
    """Every row of every shard as a PAIRS row, in (shard, row) order: from the pairs cache
    for shards read before, else read by Ray Data (a task per shard) and then cached."""
    import ray

    c: CurationConfig = cfg.sweep  # type: ignore[assignment]
    cache = pairs_cache(c)
    order = {s.shard_id: i for i, s in enumerate(shards)}
    with ThreadPoolExecutor(max_workers=min(16, max(1, len(shards)))) as pool:
        found = list(pool.map(cache.get, shards))
    frames = [pl.from_arrow(t) for t in found if t is not None]
    todo = [s for s, t in zip(shards, found, strict=True) if t is None]
    if todo:
        dataset = ray.data.from_items(
            [{"shard_id": s.shard_id, "uri": s.uri, "format": s.format} for s in todo], override_num_blocks=len(todo)
        ).map_batches(read_pairs_task, batch_size=1, batch_format="pyarrow", fn_kwargs=cache.options, **task_options())
        tables = [t.cast(PAIRS) for t in dataset.iter_batches(batch_size=None, batch_format="pyarrow")]
        read = pl.from_arrow(pa.concat_tables(tables)) if tables else pl.from_arrow(PAIRS.empty_table())
        by_id = read.partition_by("shard_id", as_dict=True)
        for s in todo:  # a shard with no rows has no group, and is cached as empty
            cache.put(s, by_id[(s.shard_id,)].to_arrow() if (s.shard_id,) in by_id else PAIRS.empty_table())
        frames.append(read)
    log.info("ingest: %d shard(s) read, %d from the pairs cache", len(todo), len(shards) - len(todo))
    pairs = pl.concat(frames) if frames else pl.from_arrow(PAIRS.empty_table())
    return (
        pairs.with_columns(_order=pl.col("shard_id").replace_strict(order, return_dtype=pl.Int64))
        .sort("_order", "row", nulls_last=False)
        .drop("_order")
        .with_columns(item_id=pl.col("shard_id") + "/" + pl.col("row").cast(pl.String))
    )



def pairs_to_items(pairs: pl.DataFrame, shards: list[Shard]) -> tuple[pl.DataFrame, pa.Table]:
    """The ITEMS table of the usable pairs (item_id `<shard_id>/<row>`, benchmark = shard id,
    one bootstrap group per pair) and the error rows of the rest."""
    uris = {s.shard_id: s.uri for s in shards}
    good = pairs.filter(pl.col("reason").is_null())
    items = good.select(
        "item_id", pl.col("shard_id").alias("benchmark"), "image_uri", "image_hash", "caption", pl.col("item_id").alias("group_id")
    )
    items = pl.from_arrow(schema.conform(items.to_arrow(), schema.ITEMS, what="curation items"))
    bad = pairs.filter(pl.col("reason").is_not_null())
    errors = bad.select(
        stage=pl.lit("ingest"), benchmark="shard_id", item_id="item_id",
        source=pl.col("shard_id").replace_strict(uris, return_dtype=pl.String), field="field", reason="reason", detail="detail",
    )
    return items, schema.conform(errors.to_arrow(), schema.ERRORS)



def locate_image_errors(errors: pl.DataFrame, pairs: pl.DataFrame) -> pl.DataFrame:
    """A model stage's image errors are per request, shared by every row showing that image, so
    they name no shard or row. For the shards' errors tables, one copy per row with that image:
    a row's `no_score` decision then has its cause (e.g. "changed since it was hashed") beside it."""
    unplaced = errors.filter(pl.col("benchmark").is_null() & pl.col("item_id").is_null() & pl.col("source").is_not_null())
    if unplaced.height == 0:
        return errors.clear()
    rows = pairs.filter(pl.col("image_uri").is_not_null()).select(pl.col("image_uri").alias("source"), benchmark="shard_id", item_id="item_id")
    located = unplaced.drop("benchmark", "item_id").join(rows, on="source", how="inner")
    return located.select(errors.columns).unique(maintain_order=True)



def shard_rows(pairs: pl.DataFrame, scores: pl.DataFrame, errors: pl.DataFrame, metrics: list[str], decision_metric: str) -> pl.DataFrame:
    """One row per input row: shard_id, row, item_id, score_<metric>..., note, error.

    `error` says why a row has no decision score: its ingest error (unreadable_image,
    empty_caption, ...) or `no_score` (e.g. no parseable questions, a failed answer).
    """
    rows = pairs.filter(pl.col("row").is_not_null()).select("shard_id", "row", "item_id")
    for metric in metrics:
        column = scores.filter(pl.col("metric") == metric).select("item_id", pl.col("score").alias(f"score_{metric}"))
        rows = rows.join(column, on="item_id", how="left", maintain_order="left")
    notes = scores.filter(pl.col("metric") == decision_metric).select("item_id", "note")
    first_error = errors.filter(pl.col("item_id").is_not_null()).unique(subset="item_id", keep="first", maintain_order=True)
    rows = rows.join(notes, on="item_id", how="left", maintain_order="left")
    rows = rows.join(first_error.select("item_id", pl.col("reason").alias("error")), on="item_id", how="left", maintain_order="left")
    no_score = pl.col(f"score_{decision_metric}").is_null() | pl.col(f"score_{decision_metric}").is_nan()
    return rows.with_columns(error=pl.when(pl.col("error").is_null() & no_score).then(pl.lit("no_score")).otherwise(pl.col("error")))



def evidence_table(run_dir: str, backbone: str, pairs: pl.DataFrame, probability: str) -> pl.DataFrame:
    """Per (item, question): the question and both answers as probabilities (p_v on the
    image, p_t from the caption alone) beside the raw log-probabilities."""
    url = join_url(run_dir, "records", f"{backbone}.parquet")
    if not exists(url):
        return pl.DataFrame(schema={"shard_id": pl.String, "row": pl.Int64, "item_id": pl.String})
    records = pl.from_arrow(read_table(url))
    located = records.join(pairs.select("item_id", "shard_id", "row"), on="item_id", how="inner")
    return located.select(
        "shard_id", "row", "item_id", "caption", "question_set", "question_id", "question", "parents",
        yes_probability_expr("logp_yes_v", "logp_no_v", probability).alias("p_v"),
        yes_probability_expr("logp_yes_t", "logp_no_t", probability).alias("p_t"),
        "logp_yes_v", "logp_no_v", "logp_yes_t", "logp_no_t", "backbone",
    ).sort("shard_id", "row", "question_set", "question_id")

