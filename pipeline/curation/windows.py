"""A night in bounded pieces: consecutive groups of whole shards, each read, scored, published
and recorded before the next, so the driver's memory is bounded by a window, not the night."""
from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor

from operators import schema
from pipeline.config import ResolvedConfig
from pipeline.curation.curation_config import CurationConfig
from pipeline.curation.pairs_cache import PairsCache
from pipeline.curation.shards import Shard, count_rows
from pipeline.scoring import question_generators
from pipeline.stages.answers import answer_store
from pipeline.stages.engine_stage import StageReport
from pipeline.stages.questions import generation_store
from pipeline.store.admin import compact_between_windows

log = logging.getLogger(__name__)


def plan_windows(
    shards: list[Shard], max_shards: int | None, max_gb: float | None, max_pairs: int | None = None, rows: dict[str, int] | None = None
) -> list[list[Shard]]:
    """Consecutive groups of shards, each at most `max_shards` shards, `max_gb` of input and
    `max_pairs` input rows (`rows`: per shard URI); a shard over a limit is a window of its own.
    The driver holds one window's pairs, questions and answers at a time, so its memory is
    bounded by the window, not the night."""
    if max_pairs is not None and rows is None:
        raise ValueError("plan_windows: max_pairs needs the shards' row counts")
    windows: list[list[Shard]] = []
    size = pairs = 0
    for shard in shards:
        n = rows[shard.uri] if max_pairs is not None else 0
        full = windows and (
            (max_shards is not None and len(windows[-1]) >= max_shards)
            or (max_gb is not None and size + shard.size > max_gb * 1024**3)
            or (max_pairs is not None and pairs + n > max_pairs)
        )
        if not windows or full:
            windows.append([])
            size = pairs = 0
        windows[-1].append(shard)
        size += shard.size
        pairs += n
    return windows



def shard_row_counts(shards: list[Shard], cache: PairsCache | None = None) -> dict[str, int]:
    """Input rows per shard URI: from the pairs cache for shards read before, else read from
    footers and headers, in a few threads (object stores answer slowly, not expensively);
    shards whose count is estimated are logged."""
    with ThreadPoolExecutor(max_workers=min(16, max(1, len(shards)))) as pool:
        counted = list(pool.map(lambda s: _cached_count(s, cache) or count_rows(s), shards))
    estimated = [s.uri for s, (_, exact) in zip(shards, counted, strict=True) if not exact]
    if estimated:
        log.info("window planning: row counts of %d shard(s) estimated from their size (e.g. %s)", len(estimated), estimated[0])
    return {s.uri: n for s, (n, _) in zip(shards, counted, strict=True)}



def _cached_count(shard: Shard, cache: PairsCache | None) -> tuple[int, bool] | None:
    n = cache.row_count(shard) if cache is not None else None
    return None if n is None else (n, True)



def compact_stores(cfg: ResolvedConfig) -> None:
    """Compact the answer and generation stores between windows (`compact_between_windows`)."""
    c: CurationConfig = cfg.sweep  # type: ignore[assignment]
    stores = [answer_store(c.store, cfg.backbones[b]) for b in c.backbones]
    stores += [generation_store(c.store, cfg.backbones[g]) for g in dict.fromkeys(question_generators(c))]
    for store in stores:
        compact_between_windows(store)



def merge_reports(reports: list[StageReport]) -> list[StageReport]:
    """One report per (stage, unit): the windows' counts, seconds and errors added up."""
    merged: dict[tuple[str, str], StageReport] = {}
    for r in reports:
        m = merged.get((r.stage, r.unit))
        if m is None:
            merged[(r.stage, r.unit)] = StageReport(r.stage, r.unit, r.needed, r.cached, r.sent, r.failed, r.seconds, r.errors)
            continue
        m.needed += r.needed
        m.cached += r.cached
        m.sent += r.sent
        m.failed += r.failed
        m.seconds += r.seconds
        m.errors = schema.concat_errors([m.errors, r.errors])
    return list(merged.values())

