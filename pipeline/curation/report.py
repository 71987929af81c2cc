"""What a curation run reports: per-shard statistics, report.json and report.md, the score
histogram, and the summary jobs/curate.py prints."""
from __future__ import annotations

import io
import math
import time
from dataclasses import dataclass, field

import numpy as np
import polars as pl

from operators import schema
from pipeline.config import ResolvedConfig
from pipeline.curation.curation_config import CurationConfig
from pipeline.curation.manifest import shard_url
from pipeline.curation.rule import Rule
from pipeline.curation.shards import Shard
from pipeline.curation.truth import truth_section
from pipeline.runtime import git_commit, library_versions
from pipeline.scoring import Timings
from pipeline.stages.engine_stage import StageReport
from pipeline.store.fs import read_table, write_bytes_atomic, write_json, write_table


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
    truth: dict | None = None  # with truth=PATH: how right each metric's keep decisions are (`truth.truth_section`)

    def stage(self, name: str) -> StageReport | None:
        return next((r for r in self.reports if r.stage == name), None)

    def totals(self) -> dict:
        keys = ("rows_in", "kept", "dropped", "failed")
        return {k: sum(getattr(s, k) for s in self.shards) for k in keys}



def shard_stats(shard: Shard, output: str, rule: Rule) -> ShardStats:
    d = pl.from_arrow(read_table(shard_url(output, "decisions", shard.shard_id)))
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
        filtered=shard_url(output, "filtered", shard.shard_id),
    )



def write_report(cfg: ResolvedConfig, result: CurationResult, rule: Rule) -> None:
    """report.json, report.md, histogram.png and errors.parquet in the run folder."""
    c: CurationConfig = cfg.sweep  # type: ignore[assignment]
    run_dir = result.run_dir
    counts, edges = run_histogram(c.output, result.shards, rule.metric)
    if c.truth is not None:
        decisions = [(s.shard, pl.from_arrow(read_table(shard_url(c.output, "decisions", s.shard_id)))) for s in result.shards]
        result.truth = truth_section(c.truth, decisions, list(c.metrics), rule, c.bootstrap)
    write_bytes_atomic(f"{run_dir}/histogram.png", histogram_counts_png(counts, edges, rule, result.shards))
    write_table(f"{run_dir}/errors.parquet", schema.conform(result.errors.to_arrow(), schema.ERRORS))
    report = report_dict(cfg, result, rule)
    write_json(f"{run_dir}/report.json", report)
    write_bytes_atomic(f"{run_dir}/report.md", report_markdown(report).encode())



HISTOGRAM_BINS = 40



def run_histogram(output: str, shards: list[ShardStats], metric: str) -> tuple[np.ndarray, np.ndarray]:
    """(counts, bin edges) of the run's decision scores, reading one shard's column at a time:
    the night's scores are never in memory together. Scores all in [0, 1] use that range."""
    def scores(s: ShardStats) -> np.ndarray:
        d = pl.from_arrow(read_table(shard_url(output, "decisions", s.shard_id), columns=[f"score_{metric}", "error"]))
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
    } | ({"truth": result.truth} if result.truth is not None else {})



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
    if report.get("truth") is not None:
        lines += ["", *truth_markdown(report["truth"])]
    lines += ["", f"![score histogram]({report['histogram']})", ""]
    return "\n".join(lines)


def _cell(interval: dict) -> str:
    """0.912 [0.871, 0.944]; the estimate alone when there is no interval; "-" when undefined."""
    if interval["estimate"] is None:
        return "-"
    if interval["low"] is None or interval["high"] is None:
        return f"{interval['estimate']:.3f}"
    return f"{interval['estimate']:.3f} [{interval['low']:.3f}, {interval['high']:.3f}]"


def truth_markdown(truth: dict) -> list[str]:
    """The report's section on the truth file: per metric as the run's keep rule, then per kind."""
    labels = ", ".join(f"{k} {v}" for k, v in truth["labels"].items() if k != "match")
    lines = [
        "## Against the truth",
        "",
        f"`{truth['file']}` labels {truth['pairs']} of the run's rows: {truth['match']} match, {truth['mismatch']} mismatch"
        + (f" ({labels})" if labels else "") + f"; {truth['unlabelled_rows']} row(s) unlabelled.",
        "Each metric is judged as this run's keep rule on its own score (keep = the caption matches); "
        f"a row without a score is dropped. Intervals: {truth['interval']}.",
    ]
    if not truth["metrics"]:
        return lines
    lines += ["", "| metric | kept | unscored | precision | recall | mismatches dropped | ROC AUC |", "|---|---:|---:|---:|---:|---:|---:|"]
    for m in truth["metrics"]:
        name = f"**{m['metric']}** (decides)" if m["decides"] else m["metric"]
        lines.append(f"| {name} | {m['kept']} | {m['unscored']} | {_cell(m['precision'])} | {_cell(m['recall'])} | "
                     f"{_cell(m['mismatch_dropped'])} | {_cell(m['auc'])} |")
    kinds = list(truth["metrics"][0]["kinds"])
    if kinds:
        for title, key in (("Mismatches dropped, by kind", "dropped"), ("ROC AUC, matches against each kind", "auc")):
            lines += ["", f"### {title}", "", "| metric | " + " | ".join(f"{k} ({truth['labels'][k]})" for k in kinds) + " |",
                      "|---|" + "---:|" * len(kinds)]
            lines += [f"| {m['metric']} | " + " | ".join(_cell(m["kinds"][k][key]) for k in kinds) + " |" for m in truth["metrics"]]
    return lines



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
    if result.truth is not None:
        lines += truth_summary(result.truth)
    lines.append(f"report: {result.run_dir}/report.md   filtered shards: {result.output}/filtered/")
    return "\n".join(lines) + retry


def truth_summary(truth: dict) -> list[str]:
    """The printed summary's lines on the truth file: one per metric, as the run's keep rule."""
    lines = [f"against the truth ({truth['pairs']} labelled pairs: {truth['match']} match, {truth['mismatch']} mismatch; {truth['interval']}):"]
    for m in truth["metrics"]:
        lines.append(f"  {m['metric'] + (' (decides)' if m['decides'] else ''):<22} precision {_cell(m['precision']):<22} "
                     f"recall {_cell(m['recall']):<22} ROC AUC {_cell(m['auc'])}")
    return lines
