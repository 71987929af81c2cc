"""A curation run: under the output's lease, score the new or changed shards window by window
(or, with decide_only, re-apply the rule to stored scores), then write the run's report."""
from __future__ import annotations

import json
import logging
import time

import polars as pl
import pyarrow as pa

from operators import schema
from operators.hashing import digest, keys_digest
from pipeline.config import ConfigError, ResolvedConfig, check_questions_file
from pipeline.curation.curation_config import CurationConfig, scoring_fingerprint
from pipeline.curation.manifest import Manifest, shard_url
from pipeline.curation.prune import reading_packs
from pipeline.curation.publish import publish, write_shard_tables
from pipeline.curation.report import CurationResult, ShardStats, shard_stats, write_report
from pipeline.curation.rows import evidence_table, locate_image_errors, pairs_cache, pairs_to_items, read_pairs, shard_rows
from pipeline.curation.rule import Rule, apply_rule
from pipeline.curation.shards import Shard, ShardError, current_version, discover
from pipeline.curation.windows import compact_stores, merge_reports, plan_windows, shard_row_counts
from pipeline.model_guard import require_models
from pipeline.runtime import MemoryLimits, ensure_ray, joins_cluster, refuse_unshared_paths
from pipeline.scoring import score_items_all_backbones
from pipeline.stages import ingest
from pipeline.store.fs import exists, join_url, read_table
from pipeline.store.lease import Lease

log = logging.getLogger(__name__)


def output_lease(c: CurationConfig) -> Lease:
    """One curation at a time per output: a second one exits at once (LeaseHeld) instead of
    dropping the first one's rows when both rewrite manifest.json (pipeline/store/lease.py)."""
    return Lease(c.output, what=f"curation {c.name}", ttl_s=c.lease.ttl_s, force=c.lease.force)



def start_ray(c: CurationConfig) -> None:
    """Start or join Ray; on a cluster of several nodes, refuse local inputs, output or store."""
    ensure_ray(c.compute.address, c.compute.num_cpus, c.compute.progress_bars, MemoryLimits.from_compute(c.compute))
    paths = {"output": c.output, "store": c.store} | {f"inputs[{k}]": uri for k, uri in enumerate(c.inputs)}
    refuse_unshared_paths(paths, c.compute.shared_paths)


def run_curation(cfg: ResolvedConfig) -> CurationResult:
    """Process the new or changed shards (or, with decide_only, re-decide every shard)."""
    c: CurationConfig = cfg.sweep  # type: ignore[assignment]
    if not c.decide_only:  # deciding again reads stored scores only: no model is loaded
        require_models(cfg.backbones.values())
        check_questions_file(cfg)
    if c.truth is not None and not exists(c.truth):  # read for the report, at the end: a typo fails now
        raise ConfigError("truth", f"{c.truth}: no such file")
    if joins_cluster(c.compute.address):  # a cluster may have several nodes: check its paths before any work
        start_ray(c)
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
    start_ray(c)
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
        items, report, errors = ingest.prepare_items(items, store=c.store)
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

    errors = pl.from_arrow(schema.concat_errors(error_tables))
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
            write_shard_tables(c.output, shard.shard_id, evidence, located)
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
            stored = pl.from_arrow(read_table(shard_url(c.output, "decisions", shard.shard_id)))
            try:
                decisions = apply_rule(stored.drop("keep"), rule)
            except ValueError as exc:
                problems.append(_error(shard, "metric_not_scored", str(exc)))
                continue
            if decisions["keep"].equals(stored["keep"]) and exists(shard_url(c.output, "filtered", shard.shard_id)):
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
            start_ray(c)
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
    return schema.error_table(rows)

