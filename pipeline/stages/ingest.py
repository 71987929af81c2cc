"""Ingest: benchmark files -> one validated items table with image content hashes."""
from __future__ import annotations

import logging
import time

import polars as pl
import pyarrow as pa

from operators import schema
from operators.image_ingest import hash_cache_keys, hash_images
from pipeline.benchmarks import loader
from pipeline.benchmarks.io import BadOption
from pipeline.config import BenchmarkSpec, ConfigError
from pipeline.runtime import task_options
from pipeline.stages import executor
from pipeline.stages.engine_stage import StageReport
from pipeline.store.fs import join_url
from pipeline.store.parts import PartStore

log = logging.getLogger(__name__)


def load_benchmark(spec: BenchmarkSpec):
    """Run the benchmark's loader (the module of pipeline.benchmarks that declares its name)."""
    try:
        load = loader(spec.loader)
    except ValueError as exc:
        raise ValueError(f"benchmark {spec.name}: {exc}") from None
    try:
        return load(spec.root, **dict(spec.options))
    except BadOption as exc:  # one line naming the setting, not a traceback
        raise ConfigError(f"benchmark {spec.name}.options", str(exc)) from exc


# Item columns a loader must fill for every item: the key, the image to score and the bootstrap
# resampling unit (a null caption is an input problem, reported by `drop_bad_captions`).
REQUIRED_ITEM_COLUMNS = ("item_id", "image_uri", "group_id")


def check_required(items: pl.DataFrame, spec: BenchmarkSpec) -> None:
    """Refuse a loader's items that leave a required column null, naming one such item."""
    for column in REQUIRED_ITEM_COLUMNS:
        empty = items.filter(pl.col(column).is_null())
        if empty.height:
            raise ValueError(
                f"benchmark {spec.name} (loader {spec.loader}): {empty.height} of {items.height} items have no "
                f"{column} (first: {empty.item(0, 'item_id')!r}); a loader fills it for every item (docs/DESIGN.md, items)"
            )


def limit_groups(items: pl.DataFrame, n: int | None) -> pl.DataFrame:
    """Keep the first `n` bootstrap groups (in file order): small runs keep whole groups."""
    if n is None:
        return items
    keep = items["group_id"].unique(maintain_order=True).head(n)
    return items.filter(pl.col("group_id").is_in(keep.implode()))


def _errors(rows: list[dict]) -> pa.Table:
    return schema.error_table(rows)


def load_items(benchmarks: dict[str, BenchmarkSpec]) -> tuple[pl.DataFrame, pl.DataFrame | None, pa.Table]:
    """Every benchmark's items (renamed to the run's benchmark names), shipped questions, problems."""
    frames, question_frames, problems = [], [], []
    for name, spec in benchmarks.items():
        result = load_benchmark(spec)
        items = pl.from_arrow(schema.conform(result.items, schema.ITEMS, what=f"benchmark {name} items"))
        check_required(items, spec)
        # The run's benchmark name (a config file may load the same loader twice, e.g. demo parts).
        items = items.with_columns(
            benchmark=pl.lit(name),
            item_id=pl.lit(f"{name}/") + pl.col("item_id").str.replace(r"^[^/]*/", ""),
        )
        items = limit_groups(items, spec.limit_groups)
        frames.append(items)
        if result.questions is not None:
            question_frames.append(pl.from_arrow(schema.conform(result.questions, schema.QUESTIONS, what=f"benchmark {name} questions")))
        for p in result.problems:
            problems.append(
                {"stage": "ingest", "benchmark": name, "source": p.file, "field": p.field, "reason": "bad_record", "detail": f"{p.record}: {p.message}"}
            )
        log.info("benchmark %s: %d items, %d problems", name, items.height, len(result.problems))
    items = pl.concat(frames) if frames else pl.from_arrow(schema.ITEMS.empty_table())
    dupes = items.filter(pl.col("item_id").is_duplicated())["item_id"].unique().to_list()
    if dupes:
        raise ValueError(f"duplicate item ids across benchmarks: {dupes[:5]}")
    questions = pl.concat(question_frames).unique(maintain_order=True) if question_frames else None
    return items, questions, _errors(problems)


def drop_bad_captions(items: pl.DataFrame) -> tuple[pl.DataFrame, pa.Table]:
    bad = items.filter(pl.col("caption").is_null() | (pl.col("caption").str.strip_chars() == ""))
    rows = [
        {"stage": "ingest", "benchmark": r["benchmark"], "item_id": r["item_id"], "field": "caption", "reason": "empty_caption", "detail": "caption is empty"}
        for r in bad.iter_rows(named=True)
    ]
    return items.filter(~pl.col("item_id").is_in(bad["item_id"].implode())), _errors(rows)


HASH_CACHE = pa.schema([("key", pa.string()), ("image_uri", pa.string()), ("image_hash", pa.string())])


def hash_item_images(items: pl.DataFrame, rows_per_task: int = 64, cache_url: str | None = None) -> tuple[pl.DataFrame, StageReport]:
    """Content hashes for every distinct image; unreadable images become errors.

    An image is read at most once: items that arrive with an `image_hash` (curation computed
    it while extracting the bytes, or the shard had a hash column) are kept as they are; with
    `cache_url`, a file whose (uri, size, ETag or mtime) was hashed before takes its hash from
    that cache; the rest are read, decoded and hashed by Ray Data tasks.
    """
    import ray

    start = time.perf_counter()
    known = items.filter(pl.col("image_hash").is_not_null())
    todo = items.filter(pl.col("image_hash").is_null())
    uris = todo.select("image_uri").unique(maintain_order=True)
    report = StageReport(stage="ingest", unit="images", needed=uris.height + known["image_uri"].n_unique())
    cached = pl.DataFrame(schema={"image_uri": pl.String, "image_hash": pl.String, "error": pl.String})
    cache = PartStore(cache_url, HASH_CACHE) if cache_url else None
    if cache is not None and uris.height:
        uris = uris.with_columns(key=pl.Series(hash_cache_keys(uris["image_uri"].to_list()), dtype=pl.String))
        wanted = pa.array(uris["key"].drop_nulls().unique().to_list(), pa.string())  # this input's files only, not the whole cache
        stored = pl.from_arrow(cache.read(["key", "image_hash"], keys=wanted))
        hits = uris.join(stored, on="key", how="inner")
        cached = hits.select("image_uri", "image_hash", error=pl.lit(None, pl.String))
        uris = uris.join(hits.select("key"), on="key", how="anti", nulls_equal=False)
    if uris.height:
        table = uris.select("image_uri").to_arrow()
        blocks = [table.slice(i, rows_per_task) for i in range(0, table.num_rows, rows_per_task)]
        local = executor.current()
        if local is not None:  # in-process (pipeline.stages.executor): the same function, no Ray
            hashed = pl.from_arrow(pa.concat_tables(local.map_batches(blocks, hash_images)))
        else:
            hashed_ds = ray.data.from_arrow(blocks).map_batches(hash_images, batch_format="pyarrow", batch_size=rows_per_task, **task_options())
            hashed = pl.from_arrow(pa.concat_tables(list(hashed_ds.iter_batches(batch_size=None, batch_format="pyarrow"))))
    else:
        hashed = pl.DataFrame(schema={"image_uri": pl.String, "image_hash": pl.String, "error": pl.String})
    if cache is not None and "key" in uris.columns:
        fresh = uris.join(hashed.filter(pl.col("error").is_null()), on="image_uri", how="inner").filter(pl.col("key").is_not_null())
        cache.write(fresh.select("key", "image_uri", "image_hash").to_arrow())
    report.sent = hashed.height
    report.cached = report.needed - report.sent
    table = pl.concat([cached, hashed])
    todo = todo.drop("image_hash").join(table, on="image_uri", how="left")
    bad = todo.filter(pl.col("error").is_not_null())
    report.failed = bad["image_uri"].n_unique()
    report.errors = _errors(
        [
            {"stage": "ingest", "benchmark": r["benchmark"], "item_id": r["item_id"], "source": r["image_uri"], "field": "image_uri", "reason": "unreadable_image", "detail": r["error"]}
            for r in bad.iter_rows(named=True)
        ]
    )
    good = pl.concat([known.select(schema.ITEMS.names), todo.filter(pl.col("error").is_null()).select(schema.ITEMS.names)])
    # keep the input order of items
    good = items.select("item_id").join(good, on="item_id", how="inner", maintain_order="left")
    report.seconds = time.perf_counter() - start
    return good.select(schema.ITEMS.names), report


def image_hash_cache(store: str) -> str:
    """The image-hash cache's folder in a shared store: a file is hashed once per version."""
    return join_url(store, "image_hashes")


def prepare_items(items: pl.DataFrame, store: str | None = None) -> tuple[pl.DataFrame, StageReport, list[pa.Table]]:
    """Drop empty captions, then hash every image (unreadable ones become errors).

    The sweep and curation both start here once they have their items table; with `store`,
    hashes are read from and added to its image-hash cache (`image_hash_cache`).
    """
    items, bad_captions = drop_bad_captions(items)
    items, report = hash_item_images(items, cache_url=image_hash_cache(store) if store else None)
    return items, report, [bad_captions, report.errors]
