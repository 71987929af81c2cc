"""Nightly curation: score the new shards of image-caption pairs, keep the good ones, publish.

The same DAG as the sweep, not a second code path: shards are read into the ITEMS table
(Ray Data, one task per shard; embedded images written content-addressed under
<store>/images/), images are hashed by the sweep's ingest, and questions, answers and
scores come from `pipeline.scoring.score_items_all_backbones` against the shared answer
cache. Only the reading of shards and the publishing of decisions are curation's own.

Scoring is kept apart from deciding: every input row's scores are stored once
(`decisions/<shard_id>.parquet`), and `decide` re-applies a new `min_score` /
`top_fraction` to those stored scores without any model work.

Incremental: `manifest.json` records each processed shard by (uri, size, ETag or mtime, or
content hash) and the fingerprint of the scoring configuration; a run processes only shards
that are new or changed, so rerunning the same night does nothing and rewrites nothing.

Output layout (`output`, default <root>/curation/<name>):

    manifest.json                      processed shards: version, fingerprint, counts, rule
    filtered/<shard_id>.parquet        kept rows: the original columns + score_<metric> columns
    decisions/<shard_id>.parquet       every input row: row, item_id, score_<metric>..., note, error, keep
    evidence/<shard_id>.parquet        per (row, question): the question, p_v, p_t and log-probs
    errors/<shard_id>.parquet          the shard's bad rows
    runs/<run_id>/                     report.json, report.md, histogram.png, errors.parquet,
                                       and the shared scoring outputs (questions, scores/, records/)
"""
from __future__ import annotations

import io
import json
import logging
import math
import os
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa

from operators import schema
from operators.hashing import digest, keys_digest
from operators.metrics import yes_probability_expr
from pipeline import store as st
from pipeline.config import ConfigError, ResolvedConfig, SweepConfig, join_url, load_config, required_question_sets
from pipeline.lease import Lease
from pipeline.pairs_cache import FOLDER as PAIRS_FOLDER
from pipeline.pairs_cache import PairsCache
from pipeline.runtime import MemoryLimits, ensure_ray, git_commit, library_versions, task_options
from pipeline.scoring import Timings, question_generators, score_items_all_backbones
from pipeline.shards import (
    CHANGE_DETECTION,
    PAIRS,
    Shard,
    ShardError,
    count_rows,
    current_version,
    discover,
    publish_task,
    read_pairs_task,
)
from pipeline.stages import ingest
from pipeline.stages.answers import answer_store
from pipeline.stages.engine_stage import StageReport
from pipeline.stages.questions import generation_store
from pipeline.store_admin import compact_between_windows
from pipeline.store_prune import reading_packs

log = logging.getLogger(__name__)

MANIFEST_VERSION = 1


# -- configuration -------------------------------------------------------------------------------


@dataclass
class ShardColumns:
    """Column names in Parquet shards (WebDataset: `caption` is the .json field read when a
    sample has no .txt member)."""

    image: str = "image"  # binary image bytes, a path/URI string, or a {bytes, path} struct
    caption: str = "caption"
    # Optional Parquet column holding a content hash of each referenced image (e.g. DataComp's
    # sha256): such images are not read at ingest. Trusted as given; ignored for embedded bytes.
    image_hash: str | None = None


@dataclass
class CurationConfig(SweepConfig):
    """A sweep configuration plus what curation needs: inputs, columns, the decision rule."""

    # Globs, folders or files, local or s3://...; one string is one pattern.
    inputs: Any = field(default_factory=list)
    columns: ShardColumns = field(default_factory=ShardColumns)
    # How a changed shard is recognised: stat = (size, ETag or mtime); content = (size, hash of the bytes).
    detect_changes: str = "stat"
    metric: str = "depict"  # the score the decision reads
    min_score: float | None = 0.5  # keep rows scoring at least this
    top_fraction: float | None = None  # keep the best fraction of each shard's scored rows
    decide_only: bool = False  # re-apply the rule to stored scores; no model work
    # Also process again the shards whose rows failed last time (e.g. images repaired since):
    # their answers come from the cache, so only the failed rows cost model work.
    retry_failed: bool = False
    # Windows: the night is processed in groups of whole shards, each read, scored, published
    # and recorded in the manifest before the next (null: no limit of that kind).
    window_shards: int | None = None
    window_gb: float | None = 2.0  # input bytes per window
    # input rows per window: what bounds the driver's memory (small-image shards fit a million
    # pairs in 2 GB). Parquet footers and local tar headers give exact counts, else estimated.
    window_pairs: int | None = 100_000
    output: str = "${root}/curation/${name}"
    metrics: list[str] = field(default_factory=lambda: ["depict"])
    target: str = "${metric}"  # the sweep's meta-evaluation target; curation has none
    baselines: list[str] = field(default_factory=list)


def load_curation_config(args: Sequence[str] = (), conf_dir: Path | str | None = None, overrides: dict | None = None) -> ResolvedConfig:
    """Resolve `curation=<preset> key=value ...` (presets in conf/curation/) and validate it."""
    try:
        cfg = load_config(args, conf_dir, overrides, schema=CurationConfig, preset_key="curation")
    except ConfigError as exc:
        if exc.key == "target":  # target is ${metric} here: name the key the user wrote
            raise ConfigError("metric", str(exc).split(": ", 1)[1]) from None
        raise
    c: CurationConfig = cfg.sweep  # type: ignore[assignment]
    raw = c.inputs if isinstance(c.inputs, (list, tuple)) else [c.inputs] if c.inputs else []
    if not all(isinstance(p, str) and p.strip() for p in raw):
        raise ConfigError("inputs", f"expected globs, folders or files (strings), got {raw!r}")
    c.inputs = [_absolute(p) for p in raw]
    c.output = _absolute(c.output)
    validate_curation(cfg)
    return cfg


def _absolute(path: str) -> str:
    """Local paths become absolute (Ray workers run elsewhere); a trailing slash is kept."""
    if "://" in path:
        return path
    absolute = str(Path(os.path.expanduser(path)).resolve())
    return absolute + "/" if path.endswith("/") and absolute != "/" else absolute


def validate_curation(cfg: ResolvedConfig) -> None:
    c: CurationConfig = cfg.sweep  # type: ignore[assignment]
    if not c.decide_only and not c.inputs:
        raise ConfigError("inputs", "no input shards configured (e.g. inputs=[s3://bucket/incoming/*.parquet])")
    if len(c.backbones) != 1:
        raise ConfigError("backbones", f"curation scores with exactly one backbone, got {list(c.backbones)}")
    if c.metric not in c.metrics:
        raise ConfigError("metric", f"{c.metric!r} is not among the computed metrics {list(c.metrics)}")
    if c.min_score is not None and not math.isfinite(c.min_score):
        raise ConfigError("min_score", f"must be a finite number or null, got {c.min_score}")
    if c.top_fraction is not None and not 0.0 < c.top_fraction <= 1.0:
        raise ConfigError("top_fraction", f"must be in (0, 1] or null, got {c.top_fraction}")
    if c.window_shards is not None and c.window_shards < 1:
        raise ConfigError("window_shards", f"must be at least 1 or null, got {c.window_shards}")
    if c.window_gb is not None and not c.window_gb > 0:
        raise ConfigError("window_gb", f"must be positive or null, got {c.window_gb}")
    if c.window_pairs is not None and (isinstance(c.window_pairs, bool) or not isinstance(c.window_pairs, int) or c.window_pairs < 1):
        raise ConfigError("window_pairs", f"must be a whole number of at least 1 or null, got {c.window_pairs!r}")
    if c.detect_changes not in CHANGE_DETECTION:
        raise ConfigError("detect_changes", f"must be one of {CHANGE_DETECTION}, got {c.detect_changes!r}")
    for key in ("image", "caption"):
        if not getattr(c.columns, key).strip():
            raise ConfigError(f"columns.{key}", "must name a column")
    if c.columns.image_hash is not None and not (isinstance(c.columns.image_hash, str) and c.columns.image_hash.strip()):
        raise ConfigError("columns.image_hash", "must name a column, or be null")


def scoring_fingerprint(cfg: ResolvedConfig) -> str:
    """Hash of everything that changes a shard's stored scores (not the decision rule): a
    shard processed under another fingerprint is processed again (cached answers are free)."""
    s: CurationConfig = cfg.sweep  # type: ignore[assignment]
    q = s.questions
    backbone = cfg.backbones[s.backbones[0]]
    parts = {
        "backbone": [backbone.name, backbone.fingerprint()],
        "metrics": sorted(s.metrics),
        "lam": s.lam,
        "probability": s.probability,
        "prompts": {name: cfg.prompts.prompt_id(name) for name in sorted(cfg.prompts.templates)},
        "questions": {
            "source": q.source,
            "sets": sorted(required_question_sets(s)),
            "max_questions": q.max_questions,
            "generator": [q.generator, cfg.backbones[q.generator].fingerprint()] if q.source == "model" and not q.per_backbone else None,
        },
        "columns": [s.columns.image, s.columns.caption] + ([s.columns.image_hash] if s.columns.image_hash else []),
    }
    return digest(json.dumps(parts, sort_keys=True).encode())[:16]


# -- the decision --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Rule:
    """Which rows to keep: score >= min_score, and among the best `top_fraction` of the
    shard's scored rows. A row without a score (bad input, failed answer) is never kept."""

    metric: str
    min_score: float | None = None
    top_fraction: float | None = None

    @classmethod
    def from_config(cls, c: CurationConfig) -> Rule:
        return cls(metric=c.metric, min_score=c.min_score, top_fraction=c.top_fraction)

    def as_dict(self) -> dict:
        return {"metric": self.metric, "min_score": self.min_score, "top_fraction": self.top_fraction}


def apply_rule(rows: pl.DataFrame, rule: Rule) -> pl.DataFrame:
    """`rows` (one shard) with a `keep` column.

    top_fraction keeps the k = ceil(f * n) best of the n scored rows, and every row tied
    with the k-th score, so the decision never depends on row order. It is per shard: a
    shard's outputs depend on that shard alone, whichever shards arrived the same night.
    """
    column = f"score_{rule.metric}"
    if column not in rows.columns:
        raise ValueError(f"no stored scores for metric {rule.metric!r} (columns: {rows.columns})")
    score = pl.col(column)
    valid = score.is_not_null() & score.is_not_nan()
    keep = valid
    if rule.min_score is not None:
        keep = keep & (score >= rule.min_score)
    if rule.top_fraction is not None:
        scored = rows.filter(valid)[column].sort(descending=True)
        k = math.ceil(round(rule.top_fraction * scored.len(), 9))
        keep = keep & (score >= scored[k - 1]) if k > 0 else pl.lit(False)
    return rows.with_columns(keep=keep.fill_null(False))


# -- the manifest of processed shards --------------------------------------------------------------


class Manifest:
    """Processed shards by URI. Written once at the end of a run, atomically: a run killed
    before that leaves the previous manifest, and the next run redoes the shards (from cache)."""

    def __init__(self, url: str, shards: dict[str, dict] | None = None):
        self.url = url
        self.shards = shards or {}

    @classmethod
    def load(cls, output: str) -> Manifest:
        url = f"{output}/manifest.json"
        if not st.exists(url):
            return cls(url)
        data = st.read_json(url)
        if data.get("version") != MANIFEST_VERSION:
            raise ValueError(f"{url}: manifest version {data.get('version')!r}, expected {MANIFEST_VERSION}")
        return cls(url, data["shards"])

    def is_current(self, shard: Shard, fingerprint: str) -> bool:
        entry = self.shards.get(shard.uri)
        return bool(entry) and (entry["size"], entry["version"], entry["fingerprint"]) == (shard.size, shard.version, fingerprint)

    def failed_rows(self, shard: Shard) -> int:
        """Rows of `shard` that failed when it was last processed (0 if never processed)."""
        return int(self.shards.get(shard.uri, {}).get("failed") or 0)

    def shard(self, uri: str) -> Shard:
        e = self.shards[uri]
        return Shard(uri=uri, size=e["size"], version=e["version"], format=e["format"])

    def record(self, shard: Shard, **info) -> None:
        self.shards[shard.uri] = {"shard_id": shard.shard_id, "size": shard.size, "version": shard.version, "format": shard.format, **info}

    def save(self) -> None:
        st.write_json(self.url, {"version": MANIFEST_VERSION, "shards": self.shards})


# -- the run -----------------------------------------------------------------------------------------


@dataclass
class ShardStats:
    shard: str
    shard_id: str
    rows_in: int
    kept: int
    dropped: int
    failed: int
    score_mean: float | None
    score_median: float | None
    score_p10: float | None
    score_p90: float | None
    lowest_kept: float | None
    filtered: str


@dataclass
class CurationResult:
    output: str
    run_id: str | None = None  # None: nothing to do
    run_dir: str | None = None
    mode: str = "score"  # score | decide
    shards: list[ShardStats] = field(default_factory=list)
    unchanged: int = 0  # shards skipped: already processed with this configuration
    skipped_with_failures: int = 0  # of those, shards with failed rows (retry_failed=true processes them again)
    reports: list[StageReport] = field(default_factory=list)
    timings: Timings = field(default_factory=Timings)
    errors: pl.DataFrame = field(default_factory=lambda: pl.from_arrow(schema.ERRORS.empty_table()))

    def stage(self, name: str) -> StageReport | None:
        return next((r for r in self.reports if r.stage == name), None)

    def totals(self) -> dict:
        keys = ("rows_in", "kept", "dropped", "failed")
        return {k: sum(getattr(s, k) for s in self.shards) for k in keys}


def output_lease(c: CurationConfig) -> Lease:
    """One curation at a time per output: a second one exits at once (LeaseHeld) instead of
    dropping the first one's rows when both rewrite manifest.json (pipeline/lease.py)."""
    return Lease(c.output, what=f"curation {c.name}", ttl_s=c.lease.ttl_s, force=c.lease.force)


def run_curation(cfg: ResolvedConfig) -> CurationResult:
    """Process the new or changed shards (or, with decide_only, re-decide every shard)."""
    c: CurationConfig = cfg.sweep  # type: ignore[assignment]
    with output_lease(c) as lease:
        if c.decide_only:
            return decide(cfg, lease)
        # while this runs, `store gc gone_shards=true` removes no image pack it may be using
        with reading_packs(c.store, f"curation {c.name} ({c.output})", c.lease.ttl_s):
            return _score_new_shards(cfg, lease)


def _score_new_shards(cfg: ResolvedConfig, lease: Lease) -> CurationResult:
    c: CurationConfig = cfg.sweep  # type: ignore[assignment]
    result = CurationResult(output=c.output)
    clock = result.timings
    t_start = time.perf_counter()
    fingerprint = scoring_fingerprint(cfg)
    rule = Rule.from_config(c)
    with clock("discover"):
        manifest = Manifest.load(c.output)
        found = discover(c.inputs, c.detect_changes)
        # processed before, but with failed rows: done, unless retry_failed asks for them again
        failed = {s.uri for s in found if manifest.is_current(s, fingerprint) and manifest.failed_rows(s)}
        todo = [s for s in found if not manifest.is_current(s, fingerprint) or (c.retry_failed and s.uri in failed)]
    result.unchanged = len(found) - len(todo)
    result.skipped_with_failures = 0 if c.retry_failed else len(failed)
    _warn_other_rules(manifest, rule)
    if not todo:
        log.info("curation %s: %d shard(s), none new or changed: nothing to do", c.name, len(found))
        return result

    result.run_id = f"{time.strftime('%Y%m%d', time.gmtime())}-{keys_digest(f'{s.uri}@{s.version}' for s in todo)[:8]}"
    result.run_dir = run_dir = join_url(c.output, "runs", result.run_id)
    ensure_ray(c.compute.address, c.compute.num_cpus, c.compute.progress_bars, MemoryLimits.from_compute(c.compute))
    log.info("curation %s: %d new or changed shard(s) of %d; run %s", c.name, len(todo), len(found), result.run_id)

    with clock("discover"):
        rows = shard_row_counts(todo, pairs_cache(c)) if c.window_pairs is not None else None
    windows = plan_windows(todo, c.window_shards, c.window_gb, c.window_pairs, rows)
    # What the driver keeps across windows is per shard (stats, manifest entries) or per bad row
    # (errors); stage reports are folded into one per stage after each window.
    errors = pl.from_arrow(schema.ERRORS.empty_table())
    for k, window in enumerate(windows):
        window_dir = run_dir if len(windows) == 1 else join_url(run_dir, "windows", f"{k:04d}")
        log.info("curation %s: window %d of %d, %d shard(s)", c.name, k + 1, len(windows), len(window))
        errors = pl.concat([errors, process_window(cfg, window, window_dir, result, manifest, fingerprint, rule, lease)])
        result.reports = merge_reports(result.reports)
        if k + 1 < len(windows):
            with clock("compact"):
                compact_stores(cfg)
    result.errors = errors
    result.timings["total"] = time.perf_counter() - t_start
    write_report(cfg, result, rule)
    return result


# -- windows: a night in bounded pieces ----------------------------------------------------------


def compact_stores(cfg: ResolvedConfig) -> None:
    """Compact the answer and generation stores between windows (`compact_between_windows`)."""
    c: CurationConfig = cfg.sweep  # type: ignore[assignment]
    stores = [answer_store(c.store, cfg.backbones[b]) for b in c.backbones]
    stores += [generation_store(c.store, cfg.backbones[g]) for g in dict.fromkeys(question_generators(c))]
    for store in stores:
        compact_between_windows(store)


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


def process_window(
    cfg: ResolvedConfig, shards: list[Shard], window_dir: str, result: CurationResult, manifest: Manifest, fingerprint: str, rule: Rule, lease: Lease
) -> pl.DataFrame:
    """Read, score, decide and publish one window of shards, then record them in the manifest
    (saved at once: a run killed in a later window keeps this one). Returns its error rows.

    Every output of a shard depends on that shard alone and answers are shared through the
    content-keyed cache, so a night processed in windows publishes exactly what one pass would.
    """
    c: CurationConfig = cfg.sweep  # type: ignore[assignment]
    clock = result.timings
    error_tables: list[pa.Table] = []
    with clock("ingest"):
        pairs = read_pairs(shards, cfg)
        items, pair_errors = pairs_to_items(pairs, shards)
        error_tables.append(pair_errors)
        items, report, errors = ingest.prepare_items(items, hash_cache=join_url(c.store, "image_hashes"))
        result.reports.append(report)
        error_tables += errors

    # questions -> requests -> answers -> scores: the sweep's own stages and answer cache
    if items.height:
        scored = score_items_all_backbones(items, None, cfg, window_dir, clock)
        result.reports += scored.reports
        error_tables += scored.errors
        scores = scored.scores
    else:
        scores = pl.from_arrow(schema.SCORES.empty_table())

    errors = pl.from_arrow(pa.concat_tables([schema.conform(t, schema.ERRORS) for t in error_tables]))
    with clock("publish"):
        rows = shard_rows(pairs, scores, errors, list(c.metrics), rule.metric)
        evidence = evidence_table(window_dir, c.backbones[0], pairs, c.probability)
        located = pl.concat([errors, locate_image_errors(errors, pairs)])
        unreadable = set(pairs.filter(pl.col("reason") == "unreadable_shard")["shard_id"].to_list())
        decided = []
        for shard in shards:
            if shard.shard_id in unreadable:
                continue  # an unreadable shard is retried next run; its error is in the run report
            decisions = apply_rule(rows.filter(pl.col("shard_id") == shard.shard_id).drop("shard_id").sort("row"), rule)
            _write_shard_tables(c.output, shard.shard_id, evidence, located)
            decided.append((shard, decisions))
        failures = publish(decided, c.output)
        errors = pl.concat([errors, failures])
        failed = set(failures["benchmark"].to_list())
        for shard, _ in decided:
            if shard.shard_id in failed:
                continue  # retried next run
            stats = shard_stats(shard, c.output, rule)
            result.shards.append(stats)
            manifest.record(shard, fingerprint=fingerprint, run_id=result.run_id, rule=rule.as_dict(), **_counts(stats))
        lease.check()  # taken over meanwhile (this run outlived its lease): commit nothing
        manifest.save()
    return errors


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
        m.errors = pa.concat_tables([m.errors, r.errors])
    return list(merged.values())


def decide(cfg: ResolvedConfig, lease: Lease | None = None) -> CurationResult:
    """Re-apply the configured rule to the stored scores of every processed shard: no
    question, answer or score is computed. Shards whose decisions do not change are not
    rewritten; a shard whose input file changed since it was scored is left to the next run."""
    c: CurationConfig = cfg.sweep  # type: ignore[assignment]
    if lease is None:
        with output_lease(c) as held:
            return decide(cfg, held)
    rule = Rule.from_config(c)
    result = CurationResult(output=c.output, mode="decide")
    t_start = time.perf_counter()
    manifest = Manifest.load(c.output)
    result.run_id = f"{time.strftime('%Y%m%d', time.gmtime())}-decide-{digest(json.dumps(rule.as_dict(), sort_keys=True).encode())[:8]}"
    result.run_dir = join_url(c.output, "runs", result.run_id)
    problems, decided = [], []
    with result.timings("decide"):
        for uri in sorted(manifest.shards):
            shard = manifest.shard(uri)
            stored = pl.from_arrow(st.read_table(_shard_url(c.output, "decisions", shard.shard_id)))
            try:
                decisions = apply_rule(stored.drop("keep"), rule)
            except ValueError as exc:
                problems.append(_error(shard, "metric_not_scored", str(exc)))
                continue
            if decisions["keep"].equals(stored["keep"]) and st.exists(_shard_url(c.output, "filtered", shard.shard_id)):
                continue  # same decisions: nothing to rewrite
            try:
                now = current_version(shard, c.detect_changes)
            except ShardError as exc:
                problems.append(_error(shard, "input_missing", str(exc)))
                continue
            if now != (shard.size, shard.version):
                problems.append(_error(shard, "changed_since_scoring", f"{uri}: changed since it was scored; the next run scores it again"))
                continue
            decided.append((shard, decisions))
        if decided:
            ensure_ray(c.compute.address, c.compute.num_cpus, c.compute.progress_bars, MemoryLimits.from_compute(c.compute))
        failures = publish(decided, c.output)
        failed = set(failures["benchmark"].to_list())
        for uri in sorted(manifest.shards):
            shard = manifest.shard(uri)
            if shard.shard_id in failed or any(p["benchmark"] == shard.shard_id for p in problems):
                continue
            stats = shard_stats(shard, c.output, rule)
            result.shards.append(stats)
            manifest.shards[uri].update(rule=rule.as_dict(), **_counts(stats))
        lease.check()
        manifest.save()
    result.errors = pl.concat([pl.from_arrow(_errors(problems)), failures])
    result.timings["total"] = time.perf_counter() - t_start
    write_report(cfg, result, rule)
    return result


def _warn_other_rules(manifest: Manifest, rule: Rule) -> None:
    other = [uri for uri, e in manifest.shards.items() if e.get("rule") != rule.as_dict()]
    if other:
        log.warning(
            "%d processed shard(s) were decided with another rule; run with decide_only=true to re-apply %s to them",
            len(other), rule.as_dict(),
        )


def _counts(stats: ShardStats) -> dict:
    return {"rows": stats.rows_in, "kept": stats.kept, "dropped": stats.dropped, "failed": stats.failed}


def _error(shard: Shard, reason: str, detail: str) -> dict:
    return {"stage": "curation", "benchmark": shard.shard_id, "source": shard.uri, "reason": reason, "detail": detail}


def _errors(rows: list[dict]) -> pa.Table:
    return schema.conform(pa.Table.from_pylist(rows), schema.ERRORS) if rows else schema.ERRORS.empty_table()


def _shard_url(output: str, kind: str, shard_id: str) -> str:
    return join_url(output, kind, f"{shard_id}.parquet")


# -- shards -> items ---------------------------------------------------------------------------------


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


# -- scores -> per-shard tables ---------------------------------------------------------------------


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
    if not st.exists(url):
        return pl.DataFrame(schema={"shard_id": pl.String, "row": pl.Int64, "item_id": pl.String})
    records = pl.from_arrow(st.read_table(url))
    located = records.join(pairs.select("item_id", "shard_id", "row"), on="item_id", how="inner")
    return located.select(
        "shard_id", "row", "item_id", "caption", "question_set", "question_id", "question", "parents",
        yes_probability_expr("logp_yes_v", "logp_no_v", probability).alias("p_v"),
        yes_probability_expr("logp_yes_t", "logp_no_t", probability).alias("p_t"),
        "logp_yes_v", "logp_no_v", "logp_yes_t", "logp_no_t", "backbone",
    ).sort("shard_id", "row", "question_set", "question_id")


def _write_shard_tables(output: str, shard_id: str, evidence: pl.DataFrame, errors: pl.DataFrame) -> None:
    shard_evidence = evidence.filter(pl.col("shard_id") == shard_id).drop("shard_id")
    st.write_table(_shard_url(output, "evidence", shard_id), shard_evidence.to_arrow())
    shard_errors = errors.filter(pl.col("benchmark") == shard_id)
    st.write_table(_shard_url(output, "errors", shard_id), schema.conform(shard_errors.to_arrow(), schema.ERRORS))


# -- publishing the filtered shards --------------------------------------------------------------------


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
                "decisions": st.table_to_parquet_bytes(d.to_arrow()),
                "filtered_url": _shard_url(output, "filtered", s.shard_id),
                "decisions_url": _shard_url(output, "decisions", s.shard_id),
            }
            for s, d in decided
        ],
        override_num_blocks=len(decided),
    ).map_batches(publish_task, batch_size=1, batch_format="pyarrow", **task_options())
    tables = list(dataset.iter_batches(batch_size=None, batch_format="pyarrow"))
    return pl.from_arrow(pa.concat_tables([schema.conform(t, schema.ERRORS) for t in tables])) if tables else pl.from_arrow(schema.ERRORS.empty_table())


# -- the run report ----------------------------------------------------------------------------------


def shard_stats(shard: Shard, output: str, rule: Rule) -> ShardStats:
    d = pl.from_arrow(st.read_table(_shard_url(output, "decisions", shard.shard_id)))
    scores = d.filter(pl.col("error").is_null())[f"score_{rule.metric}"]
    kept = d.filter(pl.col("keep"))
    n_failed = d.filter(pl.col("error").is_not_null()).height

    def stat(value) -> float | None:
        return None if value is None else round(float(value), 6)

    return ShardStats(
        shard=shard.uri,
        shard_id=shard.shard_id,
        rows_in=d.height,
        kept=kept.height,
        dropped=d.height - kept.height - n_failed,
        failed=n_failed,
        score_mean=stat(scores.mean()) if scores.len() else None,
        score_median=stat(scores.median()) if scores.len() else None,
        score_p10=stat(scores.quantile(0.1, "linear")) if scores.len() else None,
        score_p90=stat(scores.quantile(0.9, "linear")) if scores.len() else None,
        lowest_kept=stat(kept[f"score_{rule.metric}"].min()) if kept.height else None,
        filtered=_shard_url(output, "filtered", shard.shard_id),
    )


def write_report(cfg: ResolvedConfig, result: CurationResult, rule: Rule) -> None:
    """report.json, report.md, histogram.png and errors.parquet in the run folder."""
    c: CurationConfig = cfg.sweep  # type: ignore[assignment]
    run_dir = result.run_dir
    counts, edges = run_histogram(c.output, result.shards, rule.metric)
    st.write_bytes_atomic(f"{run_dir}/histogram.png", histogram_counts_png(counts, edges, rule, result.shards))
    st.write_table(f"{run_dir}/errors.parquet", schema.conform(result.errors.to_arrow(), schema.ERRORS))
    report = report_dict(cfg, result, rule)
    st.write_json(f"{run_dir}/report.json", report)
    st.write_bytes_atomic(f"{run_dir}/report.md", report_markdown(report).encode())


HISTOGRAM_BINS = 40


def run_histogram(output: str, shards: list[ShardStats], metric: str) -> tuple[np.ndarray, np.ndarray]:
    """(counts, bin edges) of the run's decision scores, reading one shard's column at a time:
    the night's scores are never in memory together. Scores all in [0, 1] use that range."""
    def scores(s: ShardStats) -> np.ndarray:
        d = pl.from_arrow(st.read_table(_shard_url(output, "decisions", s.shard_id), columns=[f"score_{metric}", "error"]))
        return d.filter(pl.col("error").is_null())[f"score_{metric}"].cast(pl.Float64).to_numpy()

    low, high = math.inf, -math.inf
    for s in shards:
        values = scores(s)
        if values.size:
            low, high = min(low, float(values.min())), max(high, float(values.max()))
    if low > high:
        return np.zeros(HISTOGRAM_BINS, dtype=np.int64), np.linspace(0.0, 1.0, HISTOGRAM_BINS + 1)
    span = (0.0, 1.0) if 0.0 <= low and high <= 1.0 else (low, high if high > low else low + 1.0)
    counts = np.zeros(HISTOGRAM_BINS, dtype=np.int64)
    for s in shards:
        counts += np.histogram(scores(s), bins=HISTOGRAM_BINS, range=span)[0]
    return counts, np.linspace(span[0], span[1], HISTOGRAM_BINS + 1)


def report_dict(cfg: ResolvedConfig, result: CurationResult, rule: Rule) -> dict:
    c: CurationConfig = cfg.sweep  # type: ignore[assignment]
    errors = result.errors.group_by("stage", "reason").len().sort("stage", "reason")
    return {
        "curation": c.name,
        "run_id": result.run_id,
        "mode": result.mode,
        "output": c.output,
        "backbone": c.backbones[0],
        "rule": rule.as_dict(),
        "metrics": list(c.metrics),
        "total": result.totals(),
        "shards": [vars(s) for s in result.shards],
        "unchanged_shards_skipped": result.unchanged,
        "errors_by_reason": {f"{r['stage']}/{r['reason']}": r["len"] for r in errors.iter_rows(named=True)},
        "stages": [r.as_row() for r in result.reports],
        "timings_s": {k: round(v, 3) for k, v in result.timings.items()},
        "git_commit": git_commit(),
        "versions": library_versions(),
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "histogram": "histogram.png",
    }


def report_markdown(report: dict) -> str:
    rule = report["rule"]
    conditions = [f"`{rule['metric']}` >= {rule['min_score']}" if rule["min_score"] is not None else None,
                  f"top {rule['top_fraction']:.0%} of each shard" if rule["top_fraction"] is not None else None]
    t = report["total"]
    lines = [
        f"# Curation `{report['curation']}`, run `{report['run_id']}` ({report['mode']})",
        "",
        f"Backbone `{report['backbone']}`; keep rows with " + (" and ".join(x for x in conditions if x) or "any score") + ".",
        f"{len(report['shards'])} shard(s) in this report, {report['unchanged_shards_skipped']} unchanged shard(s) skipped.",
        "",
        "| | rows | kept | dropped | failed |",
        "|---|---:|---:|---:|---:|",
        f"| **total** | {t['rows_in']} | {t['kept']} | {t['dropped']} | {t['failed']} |",
        "",
        "## Shards",
        "",
        "| shard | rows | kept | dropped | failed | mean | median | p10 | p90 | lowest kept |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    fmt = lambda v: "" if v is None else f"{v:.3f}"  # noqa: E731
    for s in report["shards"]:
        lines.append(
            f"| `{s['shard']}` | {s['rows_in']} | {s['kept']} | {s['dropped']} | {s['failed']} | {fmt(s['score_mean'])} | "
            f"{fmt(s['score_median'])} | {fmt(s['score_p10'])} | {fmt(s['score_p90'])} | {fmt(s['lowest_kept'])} |"
        )
    lines += ["", "## Errors", ""]
    lines += [f"- {k}: {v}" for k, v in report["errors_by_reason"].items()] or ["none"]
    if report["stages"]:
        lines += ["", "## Stages", "", "| stage | unit | needed | cached | sent | failed | seconds |", "|---|---|---:|---:|---:|---:|---:|"]
        lines += [f"| {r['stage']} | {r['unit']} | {r['needed']} | {r['cached']} | {r['sent']} | {r['failed']} | {r['seconds']:.1f} |" for r in report["stages"]]
    lines += ["", f"![score histogram]({report['histogram']})", ""]
    return "\n".join(lines)


def histogram_png(scores: list[float], rule: Rule, shards: list[ShardStats]) -> bytes:
    """Histogram of the decision scores with the threshold (and the lowest kept score when a
    top fraction decides), as PNG bytes."""
    values = np.asarray(scores, dtype=np.float64)
    in_unit = bool(values.size) and 0.0 <= values.min() and values.max() <= 1.0
    counts, edges = np.histogram(values, bins=HISTOGRAM_BINS, range=(0.0, 1.0) if in_unit or not values.size else None)
    return histogram_counts_png(counts, edges, rule, shards)


def histogram_counts_png(counts: np.ndarray, edges: np.ndarray, rule: Rule, shards: list[ShardStats]) -> bytes:
    """`histogram_png` from counts per bin (`run_histogram`)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=100)
    try:
        ax.stairs(counts, edges, fill=True, color="#4878a8")
        if rule.min_score is not None:
            ax.axvline(rule.min_score, color="#c03030", linewidth=2, label=f"min_score {rule.min_score:g}")
        lowest = [s.lowest_kept for s in shards if s.lowest_kept is not None]
        if rule.top_fraction is not None and lowest:
            ax.axvline(min(lowest), color="#c08030", linestyle="--", label=f"lowest kept (top {rule.top_fraction:.0%} per shard)")
        ax.set_xlabel(f"{rule.metric} score")
        ax.set_ylabel("pairs")
        ax.set_title(f"{int(counts.sum())} scored pairs")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="upper left", fontsize=8)
        fig.tight_layout()
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png")
        return buffer.getvalue()
    finally:
        plt.close(fig)


def summary_text(result: CurationResult) -> str:
    """What jobs/curate.py prints at the end."""
    retry = (f"\n{result.skipped_with_failures} of the skipped shard(s) have failed rows; once their cause is fixed "
             "(see the run's errors), retry_failed=true processes them again") if result.skipped_with_failures else ""
    if result.run_id is None:
        return f"nothing to do: {result.unchanged} shard(s) already processed with this configuration ({result.output}){retry}"
    t = result.totals()
    lines = [f"curation run {result.run_id} ({result.mode}): {len(result.shards)} shard(s), {t['rows_in']} rows: "
             f"{t['kept']} kept, {t['dropped']} dropped, {t['failed']} failed; {result.unchanged} unchanged shard(s) skipped"]
    for r in result.reports:
        lines.append(f"  {r.stage:<10} {r.unit:<16} needed {r.needed:>7}  cached {r.cached:>7}  sent {r.sent:>7}  failed {r.failed:>5}  {r.seconds:6.1f}s")
    if result.errors.height:
        counts = result.errors.group_by("stage", "reason").len().sort("stage", "reason")
        lines.append("errors: " + ", ".join(f"{r['stage']}/{r['reason']}: {r['len']}" for r in counts.iter_rows(named=True)))
    lines.append(f"report: {result.run_dir}/report.md   filtered shards: {result.output}/filtered/")
    return "\n".join(lines) + retry
