"""The sweep DAG: ingest -> questions -> requests -> answers -> scores -> meta-evaluation.

Each model stage runs on Ray Data and writes content-addressed parts to the shared store;
the CPU stages in between (dedup, joins, formulas, statistics) run on the driver with
polars. Rerunning the same command recomputes nothing that was written, and a run killed
at any moment resumes where it stopped. A sweep of more than `window_items` items scores
them a window at a time (`pipeline.scoring.score_items_windowed`), writing the same files.
"""
from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field

import polars as pl
import pyarrow as pa

from operators import schema
from pipeline.config import ResolvedConfig, check_benchmark_folders, check_questions_file
from pipeline.model_guard import require_models
from pipeline.runtime import MemoryLimits, ensure_ray, git_commit, joins_cluster, library_versions, refuse_unshared_paths
from pipeline.scoring import Timings, remove_scratch, score_items_windowed
from pipeline.stages import ingest
from pipeline.stages.engine_stage import StageReport
from pipeline.store import run_folder
from pipeline.store.fs import write_bytes_atomic, write_table
from pipeline.store.lease import Lease

log = logging.getLogger(__name__)


@dataclass
class RunResult:
    run_dir: str
    run_id: str = ""
    reports: list[StageReport] = field(default_factory=list)
    timings: Timings = field(default_factory=Timings)
    counts: dict[str, int] = field(default_factory=dict)
    errors: pl.DataFrame | None = None
    scores: pl.DataFrame | None = None
    statistics: pl.DataFrame | None = None
    deltas: pl.DataFrame | None = None

    def report_table(self) -> pl.DataFrame:
        return pl.DataFrame([r.as_row() for r in self.reports])


def run_sweep(cfg: ResolvedConfig) -> RunResult:
    """Run (or resume) the whole sweep described by `cfg`; returns what it did.

    The run folder is all-or-nothing (pipeline/store/run_folder.py): marked running before the first
    output, finished with the list of its files after the last; a second sweep writing the same
    folder at the same time stops at once on the folder's lease (pipeline/store/lease.py).
    """
    s = cfg.sweep
    check_benchmark_folders(cfg)  # a mistyped data_root fails here, before Ray starts
    check_questions_file(cfg)  # and a mistyped questions.file
    require_models(cfg.backbones.values())  # a missing model or engine extra: one line in seconds, not minutes in a worker
    if joins_cluster(s.compute.address):  # a cluster may have several nodes: check paths before the first file
        start_ray(cfg)
    with Lease(cfg.run_dir, what=f"sweep {s.run_name}", ttl_s=s.lease.ttl_s, force=s.lease.force) as lease:
        return _run(cfg, lease)


def start_ray(cfg: ResolvedConfig) -> None:
    """Start or join Ray; on a cluster of several nodes, refuse local folders no other node sees."""
    s = cfg.sweep
    ensure_ray(s.compute.address, s.compute.num_cpus, s.compute.progress_bars, MemoryLimits.from_compute(s.compute))
    refuse_unshared_paths(sweep_paths(cfg), s.compute.shared_paths)


def sweep_paths(cfg: ResolvedConfig) -> dict[str, str]:
    """Every folder a sweep's workers read or write, by the setting that names it."""
    s = cfg.sweep
    paths = {"root": s.root, "store": s.store, "data_root": s.data_root}
    return paths | {f"benchmark_overrides.{name}.root": b.root for name, b in cfg.benchmarks.items()}


def _run(cfg: ResolvedConfig, lease: Lease) -> RunResult:
    s = cfg.sweep
    result = RunResult(run_dir=cfg.run_dir)
    result.run_id = run_folder.new_run_id()
    run_folder.begin(result.run_dir, result.run_id, {"run_dir": result.run_dir, "config": cfg.to_dict()})
    clock = result.timings
    error_tables: list[pa.Table] = []
    t_start = time.perf_counter()
    start_ray(cfg)
    remove_scratch(result.run_dir)  # a killed windowed run's scratch is not an output of this one

    # -- ingest ----------------------------------------------------------------------------
    with clock("ingest"):
        items, shipped_questions, problems = ingest.load_items(cfg.benchmarks)
        error_tables.append(problems)
        items, report, errors = ingest.prepare_items(items, store=s.store)
        result.reports.append(report)
        error_tables += errors
        write_table(f"{result.run_dir}/items.parquet", schema.conform(items.to_arrow(), schema.ITEMS))
    result.counts["items"] = items.height
    result.counts["unique_captions"] = items["caption"].n_unique()
    result.counts["unique_images"] = items["image_hash"].n_unique()

    # -- questions, answers, scores (shared with curation), in windows of items ---------------
    scored = score_items_windowed(items, shipped_questions, cfg, result.run_dir, result.timings)
    result.reports += scored.reports
    error_tables += scored.errors
    result.scores = scored.scores
    result.counts["questions"] = scored.questions.height

    # -- meta-evaluation -------------------------------------------------------------------
    with clock("metaeval"):
        result.statistics, result.deltas, problems = metaevaluate(cfg, items, result.scores)
        error_tables.append(problems)
        write_table(f"{result.run_dir}/statistics.parquet", result.statistics.to_arrow())
        write_table(f"{result.run_dir}/deltas.parquet", result.deltas.to_arrow())
        _write_csv(f"{result.run_dir}/statistics.csv", result.statistics)
        _write_csv(f"{result.run_dir}/deltas.csv", result.deltas)

    errors = pl.from_arrow(schema.concat_errors(error_tables))
    result.errors = errors
    write_table(f"{result.run_dir}/errors.parquet", errors.to_arrow())
    result.counts["errors"] = errors.height
    result.timings["total"] = time.perf_counter() - t_start
    write_bytes_atomic(f"{result.run_dir}/summary.txt", summary_text(cfg, result).encode())
    lease.check()  # never mark finished a folder another run has taken over
    run_folder.finish(result.run_dir, result.run_id, manifest(cfg, result))
    return result


def metaevaluate(cfg: ResolvedConfig, items: pl.DataFrame, scores: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame, pa.Table]:
    """Statistics per benchmark x backbone x metric, and target-minus-best-baseline deltas."""
    from pipeline.metaeval import evaluate

    s = cfg.sweep
    stats, deltas, problems = [], [], []
    metric_ids = [m for m in s.metrics if m != "mean_commitment"]
    for name, bench in cfg.benchmarks.items():
        bench_items = items.filter(pl.col("benchmark") == name)
        bench_scores = scores.filter(pl.col("benchmark") == name)
        if bench_items.height == 0:
            continue
        res = evaluate(
            bench_scores.filter(pl.col("metric").is_in(metric_ids)),
            bench_items,
            bench.protocol,
            baselines=list(s.baselines),
            target=s.target,
            n_resamples=s.bootstrap.n_resamples,
            seed=s.bootstrap.seed,
            benchmark=name,
        )
        stats.append(res.statistics)
        deltas.append(res.deltas)
        problems += [{"stage": "metaeval", "benchmark": name, "reason": "metaeval_problem", "detail": str(p)} for p in res.problems]
    statistics = pl.concat(stats, how="diagonal_relaxed") if stats else pl.DataFrame()
    delta_table = pl.concat(deltas, how="diagonal_relaxed") if deltas else pl.DataFrame()
    problem_table = schema.error_table(problems)
    return statistics, delta_table, problem_table


def _write_csv(url: str, frame: pl.DataFrame) -> None:
    flat = frame.with_columns([pl.col(c).list.join(";") for c, t in frame.schema.items() if isinstance(t, pl.List)])
    write_bytes_atomic(url, flat.write_csv().encode())


def manifest(cfg: ResolvedConfig, result: RunResult) -> dict:
    from pipeline.preflight_checks import invariance_for_manifest

    return {
        "run_dir": result.run_dir,
        "config": cfg.to_dict(),
        "git_commit": git_commit(),
        "versions": library_versions(),
        "timings_s": {k: round(v, 3) for k, v in result.timings.items()},
        "counts": result.counts,
        "stages": [r.as_row() for r in result.reports],
        # whether an answer depends on its batch neighbours on this hardware, as preflight measured it
        "invariance": invariance_for_manifest(cfg.sweep.store, [cfg.backbones[name] for name in cfg.sweep.backbones]),
    }


def summary_text(cfg: ResolvedConfig, result: RunResult) -> str:
    """The human-readable end-of-run summary (also printed by jobs/sweep.py)."""
    c = result.counts
    lines = [
        f"run: {cfg.sweep.run_name}   ({c.get('items', 0)} items, {c.get('unique_captions', 0)} captions, "
        f"{c.get('unique_images', 0)} images, {c.get('questions', 0)} questions)"
    ]
    notes = {b.note for b in cfg.backbones.values() if b.note and b.name in cfg.sweep.backbones}
    for note in sorted(notes):
        lines.append(f"NOTE: {note}")
    lines.append("")
    lines.append(f"{'stage':<10} {'unit':<16} {'needed':>8} {'cached':>8} {'sent':>8} {'failed':>7} {'seconds':>8}")
    for r in result.reports:
        lines.append(f"{r.stage:<10} {r.unit:<16} {r.needed:>8} {r.cached:>8} {r.sent:>8} {r.failed:>7} {r.seconds:>8.1f}")
    moved = [q for r in result.reports for q in getattr(r, "quarantined", [])]
    if moved:
        lines.append(f"store: {len(moved)} bad parts (unreadable or failing their checksum) moved to _quarantine/; "
                     "their keys were computed again (counted in sent)")
    mass_lines = [line for r in result.reports if hasattr(r, "mass_lines") for line in r.mass_lines()]
    if mass_lines:
        lines.append("")
        lines += mass_lines
    lines.append("")
    lines.append("wall time per stage: " + ", ".join(f"{k} {v:.1f}s" for k, v in result.timings.items()))
    if result.errors is not None and result.errors.height:
        counts = result.errors.group_by("stage", "reason").len().sort("stage", "reason")
        lines.append("errors: " + ", ".join(f"{r['stage']}/{r['reason']}: {r['len']}" for r in counts.iter_rows(named=True)))
    else:
        lines.append("errors: none")
    if result.statistics is not None and result.statistics.height:
        lines.append("")
        lines.append(headline_table(result.statistics, cfg))
    if cfg.sweep.evidence.enabled:
        lines.append("")
        lines += evidence_lines(cfg, result.run_dir)
    lines.append("")
    extra = (", evidence/" if cfg.sweep.evidence.enabled else "") + (", judge/" if any(r.stage == "judge" for r in result.reports) else "")
    lines.append(f"outputs: {result.run_dir}/  (items, questions, scores/, records/{extra}, statistics, deltas, errors, manifest.json)")
    lines.append(f"tables and figures: depict tables run={result.run_dir}")
    lines.append(f"answer cache: {cfg.sweep.store}/")
    return "\n".join(lines)


def evidence_lines(cfg: ResolvedConfig, run_dir: str) -> list[str]:
    """The causal deltas of each backbone's evidence checks, read back from the run folder."""
    from pipeline.reports.evidence import delta_lines, delta_summary
    from pipeline.store.fs import exists, join_url, read_table

    b = cfg.sweep.bootstrap
    summaries = {}
    for backbone in cfg.sweep.backbones:
        url = join_url(run_dir, "evidence", backbone, "deltas.parquet")
        if exists(url):
            deltas = pl.from_arrow(read_table(url))
            summaries[backbone] = delta_summary(deltas, b.n_resamples, b.seed, b.confidence)
    return delta_lines(summaries) if summaries else ["evidence deltas: none written (no claim was grounded)"]


def headline_table(statistics: pl.DataFrame, cfg: ResolvedConfig) -> str:
    """Primary statistic per benchmark (columns) and backbone x metric (rows), each with its
    bootstrap interval where the run computed one (`0.456 [0.180, 0.637]`), as a Markdown table."""
    columns: dict[str, dict[tuple[str, str], str]] = {}
    for name, bench in cfg.benchmarks.items():
        statistic = bench.protocol.primary_statistic
        sub = statistics.filter((pl.col("benchmark") == name) & (pl.col("statistic") == statistic) & (pl.col("subset") == "all"))
        columns[f"{name}:{statistic}"] = {(r["backbone"], r["metric"]): _with_interval(r) for r in sub.iter_rows(named=True)}
    keys = {key for cells in columns.values() for key in cells}
    if not keys:
        return ""
    order = {m: i for i, m in enumerate(cfg.sweep.metrics)}
    header = ["backbone", "metric", *columns]
    body = [[b, m, *(cells.get((b, m), "") for cells in columns.values())]
            for b, m in sorted(keys, key=lambda k: (k[0], order.get(k[1], len(order)), k[1]))]
    widths = [max(len(row[i]) for row in [header, *body]) for i in range(len(header))]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(row, widths)) + " |" for row in [header, *body]]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def _with_interval(row: dict) -> str:
    """`value [ci_low, ci_high]` to 3 decimals, as the report tables write a cell; the value
    alone without an interval; `-` for NaN."""
    from pipeline.reports.render import cell_text
    from pipeline.reports.tables import Cell, Column

    value, low, high = row["value"], row["ci_low"], row["ci_high"]
    if value is None or math.isnan(value):
        return "-"
    interval = None if low is None or high is None or math.isnan(low) or math.isnan(high) else (low, high)
    return cell_text(Cell(value, ci=interval), Column(key="", label="", digits=3, show_ci=True))
