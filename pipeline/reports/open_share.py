"""Each metric against the share of questions a caption leaves open, across finished runs.

Why several runs: one sweep measures one `questions.open_share`, so the curve is read from runs
that differ in that setting and nothing else; any other difference (backbones, benchmarks,
metrics, prompts, bootstrap settings) would mix its effect into the curve, so such a set is
refused naming the difference (`check_comparable`). Each point is the run's own statistic with
its own bootstrap interval (`statistics.parquet`, subset "all", the benchmark's primary
statistic); nothing is recomputed.

The share asked for is not always the share a run asks: a caption with few open facts caps it
(docs/method.md, "The demo benchmark"), so `realised_shares` measures it from the run's
questions: the share of a benchmark's DEPICT questions that are not the question of a fact its
caption states.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import polars as pl

from operators.engines.world_oracle import parse_caption
from pipeline.reports.finished_run import Run
from pipeline.reports.tables import Column, Row, Table, benchmark_label, metric_label, number, ordered_metrics, statistic_label

VARIED = "sweep.questions.open_share"
# Where or how a run ran, not what it measured: runs of one figure may differ in these.
NOT_COMPARED = ("sweep.run_name", "sweep.name", "sweep.root", "sweep.store", "sweep.data_root", "sweep.compute", "sweep.lease", "sweep.window_items")
# Per benchmark: where its files are, and the share its options take from questions.open_share.
NOT_COMPARED_PER_BENCHMARK = ("root", "options.open_share")
DIFFERENCES_SHOWN = 5
# The metrics the figure draws unless told: the target, the run's baselines and hard fixed-yes
# (which, like Soft-TIFA and DSG, expects Yes to every question).
EXTRA_FIGURE_METRICS = ("hard_fixed_yes",)
DATA_SCHEMA = {
    "share": pl.Float64, "realised_share": pl.Float64, "benchmark": pl.String, "statistic": pl.String, "backbone": pl.String,
    "metric": pl.String, "value": pl.Float64, "ci_low": pl.Float64, "ci_high": pl.Float64, "n": pl.Int64, "run": pl.String,
}  # fmt: skip


class RunsDiffer(ValueError):
    """The runs cannot be drawn as one curve: they differ in more than the share, or repeat one."""


def flatten(config: Any, prefix: str = "") -> dict[str, Any]:
    """A nested config as dotted paths -> leaf values (a list is one leaf)."""
    if not isinstance(config, dict):
        return {prefix: config}
    out: dict[str, Any] = {}
    for key, value in config.items():
        out.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


def _compared(path: str) -> bool:
    if path == VARIED or any(path == p or path.startswith(p + ".") for p in NOT_COMPARED):
        return False
    parts = path.split(".", 2)
    return not (parts[0] == "benchmarks" and len(parts) == 3 and parts[2] in NOT_COMPARED_PER_BENCHMARK)


def config_differences(runs: Sequence[Run]) -> list[str]:
    """Every config path (other than the share and where a run ran) on which a run differs from
    the first, as `path: value in <first run> but value in <run>`."""
    first = {p: v for p, v in flatten(runs[0].manifest.get("config") or {}).items() if _compared(p)}
    found = []
    missing = "(not set)"
    for run in runs[1:]:
        other = {p: v for p, v in flatten(run.manifest.get("config") or {}).items() if _compared(p)}
        for path in sorted(set(first) | set(other)):
            a, b = first.get(path, missing), other.get(path, missing)
            if a != b:
                found.append(f"{path}: {a!r} in {runs[0].url} but {b!r} in {run.url}")
    return found


def open_share(run: Run) -> float:
    """The share the run asked for (its manifest's resolved config)."""
    value = flatten(run.manifest.get("config") or {}).get(VARIED)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{run.url}/manifest.json: config has no number at {VARIED} (got {value!r}); rerun it with this version of the sweep")
    return float(value)


def check_comparable(runs: Sequence[Run]) -> None:
    """Refuse fewer than two runs, two runs at one share, or runs differing in anything else."""
    if len(runs) < 2:
        raise RunsDiffer(f"a figure across runs needs at least two runs, got {len(runs)}")
    differences = config_differences(runs)
    if differences:
        more = f" (and {len(differences) - DIFFERENCES_SHOWN} more)" if len(differences) > DIFFERENCES_SHOWN else ""
        raise RunsDiffer(f"the runs differ in more than questions.open_share: {'; '.join(differences[:DIFFERENCES_SHOWN])}{more}")
    seen: dict[float, str] = {}
    for run in runs:
        share = open_share(run)
        if share in seen:
            raise RunsDiffer(f"two runs have questions.open_share={share:g}: {seen[share]} and {run.url}; keep one")
        seen[share] = run.url


def realised_shares(run: Run) -> tuple[dict[str, float | None], list[str]]:
    """Per benchmark: open DEPICT questions / all DEPICT questions of its captions (None when
    a caption is not a demo caption, whose stated facts are unknown), and notes on why."""
    questions = run.questions().filter(pl.col("question_set") == "depict").unique(["caption", "question_id"])
    stated: dict[str, set[str] | None] = {}
    notes = []
    shares: dict[str, float | None] = {}
    for benchmark in run.benchmarks:
        captions = set(run.items.filter(pl.col("benchmark") == benchmark)["caption"].drop_nulls().to_list())
        asked = questions.filter(pl.col("caption").is_in(sorted(captions)))
        unknown = None
        for caption in sorted(captions):
            if caption not in stated:
                try:
                    stated[caption] = {f.depict_question() for f in parse_caption(caption).facts}
                except ValueError:
                    stated[caption] = None
            if stated[caption] is None and unknown is None:
                unknown = caption
        if unknown is not None:
            notes.append(f"{run.url}: {benchmark}: caption {unknown!r} is not a demo caption, so its open questions cannot be told apart; realised share not measured")
            shares[benchmark] = None
        elif asked.height == 0:
            notes.append(f"{run.url}: {benchmark}: no DEPICT questions in questions.parquet; realised share not measured")
            shares[benchmark] = None
        else:
            open_ = sum(q not in stated[c] for c, q in asked.select("caption", "question").iter_rows())
            shares[benchmark] = open_ / asked.height
    return shares, notes


def open_share_data(runs: Sequence[Run]) -> tuple[pl.DataFrame, list[str]]:
    """One row per (run share, benchmark's primary statistic, backbone, metric): the run's value,
    interval and n, with the realised share; rows by benchmark, backbone, metric, then share.
    Also notes (realised shares not measured, runs of different commits)."""
    runs = sorted(runs, key=open_share)
    first = runs[0]
    rows, notes = [], []
    for run in runs:
        share = open_share(run)
        realised, why = realised_shares(run)
        notes += why
        primary = {b: info.primary for b, info in run.benchmarks.items()}
        stats = run.statistics.filter(pl.col("subset") == "all")
        for r in stats.iter_rows(named=True):
            if primary.get(r["benchmark"]) != r["statistic"]:
                continue
            rows.append({"share": share, "realised_share": realised.get(r["benchmark"]), "benchmark": r["benchmark"], "statistic": r["statistic"],
                         "backbone": r["backbone"], "metric": r["metric"], "value": r["value"], "ci_low": r["ci_low"], "ci_high": r["ci_high"],
                         "n": r["n"], "run": run.url})  # fmt: skip
    commits = {run.url: run.manifest.get("git_commit") for run in runs}
    if len(set(commits.values())) > 1:
        notes.append("the runs were made by different code versions: " + ", ".join(f"{url} at {c or 'unknown'}" for url, c in commits.items()))
    data = pl.DataFrame(rows, schema=DATA_SCHEMA)
    benchmarks = list(first.benchmarks)
    backbones = list(first.backbones)
    metrics = ordered_metrics(first, set(data["metric"].to_list()))
    keys = {"benchmark": benchmarks, "backbone": backbones, "metric": metrics}
    order = [pl.col(c).replace_strict(v, list(range(len(v))), default=len(v), return_dtype=pl.Int64) for c, v in keys.items()]
    data = data.with_columns(*(o.alias(f"_{c}") for o, c in zip(order, keys))).sort("_benchmark", "_backbone", "_metric", "share")
    return data.drop("_benchmark", "_backbone", "_metric"), notes


def figure_metrics(run: Run, asked: Sequence[str] | None = None) -> list[str]:
    """The metrics to draw: `asked` (each must be one of the run's), else the target, the
    baselines and EXTRA_FIGURE_METRICS that the run computed."""
    if asked:
        unknown = [m for m in asked if m not in run.metrics]
        if unknown:
            raise ValueError(f"metrics {unknown} are not among the runs' metrics {run.metrics}")
        return list(dict.fromkeys(asked))
    wanted = {run.target, *run.baselines, *EXTRA_FIGURE_METRICS} & set(run.metrics)
    return ordered_metrics(run, wanted)


def _share_label(share: float) -> str:
    return f"{share:g}"


def open_share_table(data: pl.DataFrame, notes: Sequence[str] = ()) -> Table:
    """The figure's numbers, one block per benchmark, one row per (backbone, metric), one column
    per share, each value with its interval; the realised shares go in the notes."""
    shares = sorted(set(data["share"].to_list()))
    columns = [Column(_share_label(s), f"share {_share_label(s)}", show_ci=True) for s in shares]
    rows, realised_notes = [], []
    values = {(r["benchmark"], r["backbone"], r["metric"], r["share"]): r for r in data.iter_rows(named=True)}
    for benchmark in data["benchmark"].unique(maintain_order=True):
        part = data.filter(pl.col("benchmark") == benchmark)
        statistic = part["statistic"][0]
        section = f"{benchmark_label(benchmark)} ({statistic_label(statistic)})"
        for backbone, metric in part.select("backbone", "metric").unique(maintain_order=True).iter_rows():
            cells = {}
            for share in shares:
                r = values.get((benchmark, backbone, metric, share))
                cells[_share_label(share)] = number(r["value"], r["ci_low"], r["ci_high"]) if r else number(None)
            rows.append(Row([backbone, metric_label(metric)], cells, section))
        realised = dict(part.select("share", "realised_share").unique().iter_rows())
        shown = ", ".join(f"{_share_label(s)} -> {'not measured' if realised.get(s) is None else f'{realised[s]:.3f}'}" for s in shares)
        realised_notes.append(f"{benchmark_label(benchmark)}: share asked -> share of its DEPICT questions left open: {shown}.")
    return Table(
        name="open_share",
        title="Metrics against the share of open questions",
        caption=(
            "Each run's primary statistic per benchmark (SRCC on correlation benchmarks, accuracy as a fraction otherwise) "
            "with its bootstrap 95% interval, for runs that differ only in questions.open_share (columns: the share asked)."
        ),
        stub=["Backbone", "Metric"],
        columns=columns,
        rows=rows,
        backbones=list(data["backbone"].unique(maintain_order=True)),
        benchmarks=list(data["benchmark"].unique(maintain_order=True)),
        paper="",
        notes=realised_notes + list(notes),
    )
