"""Every report table as plain data: rows, columns, cells with values and marks.

Builders read a `Run` and return `Table`s; `render` turns them into Markdown, LaTeX and
CSV. Keeping the numbers and marks here (not in the renderers) means all three formats
agree and tests can check a table without parsing text.

Conventions shared by every table:
- A cell with no value is missing (`Cell.value is None`): the run holds no such statistic,
  or it is undefined (NaN, e.g. a constant metric). Missing is never shown as 0.
- Best and second best are decided on the values *as displayed* (rounded to the column's
  digits), so two cells that print the same are marked the same. Every cell tied for best
  is bold; the next distinct value is underlined (every cell tied for it). Nothing is marked
  when fewer than two cells have values.
- A star marks a delta whose paired BCa 95% interval excludes zero.
- Metrics appear in a fixed order: the run's baselines (in config order), then any other
  metric, then Agree, then the target (DEPICT).

Table builders, by the DEPICT paper table they reproduce: `comparison_tables` (Table 2),
`size_ladder_table` (Tables 7 and 8), `template_tables` (9), `skill_tables` (10),
`commitment_gain_table` (12), `merge_tables` (13), `answer_distribution_table` (15),
`lambda_tables` (the numbers behind Figure 9).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace

import numpy as np
import polars as pl

from operators.metrics import catalog
from operators.metrics.holistic import lambda_sweep
from pipeline.metaeval import evaluate
from pipeline.reports.finished_run import Run
from pipeline.stats import choice
from pipeline.stats.diagnostics import (
    WeightingGain,
    answer_distribution,
    choice_weighting_gain,
    correlation_weighting_gain,
)

BENCHMARK_LABELS = {
    "genai_bench": "GenAI-Bench",
    "genai_bench_527": "GenAI-Bench-527",
    "tifa160": "TIFA160",
    "richhf": "RichHF",
    "winoground": "Winoground",
    "negbench": "NegBench",
}
STATISTIC_LABELS = {
    "srcc": "SRCC",
    "kendall": "Kendall tau-b",
    "pearson": "Pearson",
    "plcc": "PLCC",
    "pairwise_acc": "Pairwise acc.",
    "text_acc": "Text",
    "image_acc": "Image",
    "group_acc": "Group",
    "accuracy": "Acc.",
}
COMPARISON_STATISTICS = {
    "correlation": ("srcc", "kendall", "pearson"),  # Kendall / Pearson columns only where the run has them
    "winoground": ("text_acc", "image_acc", "group_acc"),
    "multiple_choice": ("accuracy",),
}
MERGE_METRICS = ("vqascore", "agree", "soft_tifa_am", "depict", "soft_tifa_am+vqascore")
MERGE_LABELS = {"depict": "DEPICT (Agree+VQA)"}
WEIGHTED, UNWEIGHTED, COMMITMENT = "depict", "agree_unweighted+vqascore", "mean_commitment"
IMPROVED_ABOVE = 0.01  # Table 12 "Improved": a gain above one point on all items
LAMBDAS = tuple(float(x) for x in np.round(np.linspace(0.0, 1.0, 21), 2))


def metric_label(metric: str) -> str:
    """The catalog's label (operators/metrics/catalog.py): one place names each metric."""
    return catalog.label(metric)


def benchmark_label(benchmark: str) -> str:
    return BENCHMARK_LABELS.get(benchmark, benchmark)


def statistic_label(statistic: str) -> str:
    return STATISTIC_LABELS.get(statistic, statistic)


# ---------------------------------------------------------------------------------------------
# The data structure


@dataclass
class Cell:
    value: float | None = None  # None: missing (never read as 0)
    text: str | None = None  # a text cell (a baseline's name, "4/5")
    ci: tuple[float, float] | None = None
    bold: bool = False
    underline: bool = False
    star: bool = False

    @property
    def missing(self) -> bool:
        return self.value is None and self.text is None


def number(value, ci_low=None, ci_high=None, star: bool = False) -> Cell:
    """A numeric cell; NaN or None is missing, and an interval with a NaN bound is dropped."""
    if value is None or not math.isfinite(value):
        return Cell()
    ci = None
    if ci_low is not None and ci_high is not None and math.isfinite(ci_low) and math.isfinite(ci_high):
        ci = (float(ci_low), float(ci_high))
    return Cell(value=float(value), ci=ci, star=star)


@dataclass(frozen=True)
class Column:
    key: str
    label: str
    group: str = ""  # a header spanning neighbouring columns (a benchmark)
    digits: int = 3
    scale: float = 1.0  # shown as value * scale (100 for percentages and points)
    signed: bool = False  # "+0.012"
    show_ci: bool = False  # print "[low, high]" after the value (CSV always carries intervals)

    @property
    def header(self) -> str:
        return f"{self.group} {self.label}".strip()

    def shown(self, value: float) -> float:
        """The value as displayed, rounded: what best / second best compare."""
        return round(value * self.scale, self.digits) + 0.0  # + 0.0 turns -0.0 into 0.0


@dataclass
class Row:
    labels: list[str]  # one per stub column
    cells: dict[str, Cell]
    section: str = ""


@dataclass
class Table:
    name: str  # file stem
    title: str
    caption: str  # how to read it
    stub: list[str]  # headers of the label columns
    columns: list[Column]
    rows: list[Row]
    backbones: list[str]  # what it covers
    benchmarks: list[str]
    paper: str = ""  # the DEPICT paper table it reproduces
    notes: list[str] = field(default_factory=list)

    def cell(self, label: str, column: str, section: str | None = None) -> Cell:
        """The cell of the one row that has `label` among its labels (in `section`, if given)."""
        rows = [r for r in self.rows if label in r.labels and (section is None or r.section == section)]
        if len(rows) != 1:
            raise KeyError(f"{self.name}: {len(rows)} rows labelled {label!r} (section {section!r})")
        return rows[0].cells.get(column, Cell())

    @property
    def sections(self) -> list[str]:
        return list(dict.fromkeys(r.section for r in self.rows))


def mark_best(cells: list[Cell], column: Column, *, second: bool = True) -> None:
    """Bold every cell tied for the highest displayed value; underline those tied for the next."""
    shown = [(column.shown(c.value), c) for c in cells if c.value is not None]
    if len(shown) < 2:
        return
    distinct = sorted({v for v, _ in shown}, reverse=True)
    for value, cell in shown:
        cell.bold = value == distinct[0]
        cell.underline = second and len(distinct) > 1 and value == distinct[1]


def _mark_columns(rows: list[Row], columns: list[Column], *, second: bool = True) -> None:
    for column in columns:
        mark_best([r.cells[column.key] for r in rows if column.key in r.cells], column, second=second)


def _mark_rows(rows: list[Row], columns: list[Column], *, second: bool = True) -> None:
    """Per-row marks; the rows' columns share one format, so the first sets the rounding."""
    for row in rows:
        mark_best([row.cells[c.key] for c in columns if c.key in row.cells], columns[0], second=second)


def file_stem(*parts: str) -> str:
    return "_".join(re.sub(r"[^A-Za-z0-9._-]+", "-", p).strip("-") for p in parts)


# ---------------------------------------------------------------------------------------------
# Looking values up in a run


class _Statistics:
    """statistics.parquet and deltas.parquet as dictionaries."""

    def __init__(self, run: Run):
        self.values = {
            (r["benchmark"], r["backbone"], r["metric"], r["subset"], r["statistic"]): r
            for r in run.statistics.iter_rows(named=True)
        }
        self.deltas = {(r["benchmark"], r["backbone"], r["subset"]): r for r in run.deltas.iter_rows(named=True)}
        self.present = {(benchmark, backbone, subset) for benchmark, backbone, _, subset, _ in self.values}

    def statistics_of(self, benchmark: str) -> set[str]:
        return {statistic for b, _, _, _, statistic in self.values if b == benchmark}

    def cell(self, benchmark: str, backbone: str, metric: str, statistic: str, subset: str = "all") -> Cell:
        row = self.values.get((benchmark, backbone, metric, subset, statistic))
        return number(row["value"], row["ci_low"], row["ci_high"]) if row else Cell()

    def n(self, benchmark: str, backbone: str, metric: str, statistic: str, subset: str = "all") -> Cell:
        row = self.values.get((benchmark, backbone, metric, subset, statistic))
        return number(row["n"]) if row and row["n"] is not None else Cell()

    def delta(self, benchmark: str, backbone: str, subset: str = "all") -> tuple[Cell, Cell]:
        """(delta cell with interval and star, cell naming the strongest baseline)."""
        row = self.deltas.get((benchmark, backbone, subset))
        if not row:
            return Cell(), Cell()
        cell = number(row["delta"], row["ci_low"], row["ci_high"], star=row["significant"] is True)
        return cell, Cell(text=metric_label(row["baseline"]))

    def has(self, benchmark: str, backbone: str, subset: str = "all") -> bool:
        return (benchmark, backbone, subset) in self.present

    def subsets(self, benchmark: str, prefix: str) -> list[str]:
        return sorted({s for b, _, s in self.present if b == benchmark and s.startswith(prefix)})


def ordered_metrics(run: Run, metrics) -> list[str]:
    """Baselines (config order), other metrics (config order, then by name), Agree, target."""
    metrics = set(metrics) - {COMMITMENT}
    last = [m for m in ("agree", run.target) if m in metrics]
    first = [m for m in run.baselines if m in metrics and m not in last]
    middle = [m for m in run.metrics if m in metrics and m not in first + last]
    middle += sorted(metrics - set(first + middle + last))
    return first + middle + last


def _metric_columns(metrics: list[str], **format_) -> list[Column]:
    return [Column(key=m, label=metric_label(m), **format_) for m in metrics]


def _delta_columns() -> list[Column]:
    return [Column("delta", "Δ", signed=True, show_ci=False), Column("baseline", "vs.")]


def _with_delta(stats: _Statistics, benchmark: str, backbone: str, subset: str, cells: dict[str, Cell]) -> dict[str, Cell]:
    cells["delta"], cells["baseline"] = stats.delta(benchmark, backbone, subset)
    return cells


def _section_label(run: Run, benchmark: str) -> str:
    info = run.benchmarks[benchmark]
    return f"{benchmark_label(benchmark)} ({statistic_label(info.primary)})"


_DELTA_NOTE = "Δ: {target} minus the strongest baseline of the row (vs.); *: its paired BCa 95% interval excludes zero."


# ---------------------------------------------------------------------------------------------
# Table 2: every metric on one backbone


def comparison_tables(run: Run) -> list[Table]:
    """Per backbone: every metric x every benchmark's headline statistics (DEPICT Table 2)."""
    stats = _Statistics(run)
    tables = []
    for backbone in run.backbones:
        where = {  # column -> (benchmark, statistic)
            Column(f"{b}:{s}", statistic_label(s), group=benchmark_label(b)): (b, s)
            for b, info in run.benchmarks.items()
            for s in COMPARISON_STATISTICS[info.kind]
            if s == COMPARISON_STATISTICS[info.kind][0] or s in stats.statistics_of(b)
        }
        columns = list(where)
        present = {k[2] for k in stats.values if k[1] == backbone}
        rows = []
        for metric in ordered_metrics(run, present | set(run.metrics)):
            cells = {c.key: stats.cell(b, backbone, metric, s) for c, (b, s) in where.items()}
            rows.append(Row([metric_label(metric)], cells))
        _mark_columns(rows, columns)
        covered = [b for b in run.benchmarks if stats.has(b, backbone)]
        notes = [f"{benchmark_label(b)}: no statistics for {backbone} in this run (shown as missing)." for b in run.benchmarks if b not in covered]
        tables.append(
            Table(
                name=file_stem("comparison", backbone),
                title=f"Metric comparison on {backbone}",
                caption=(
                    f"All metrics of run {run.name} with the same backbone ({backbone}): SRCC with human ratings on "
                    "correlation benchmarks, Winoground text / image / group accuracy, multiple-choice accuracy "
                    "(fractions). Bold: best per column; underlined: second."
                ),
                stub=["Metric"],
                columns=columns,
                rows=rows,
                backbones=[backbone],
                benchmarks=covered,
                paper="Table 2",
                notes=notes,
            )
        )
    return tables


# ---------------------------------------------------------------------------------------------
# Tables 7 and 8: size ladders


def size_ladder_table(run: Run) -> Table | None:
    """Baselines, target and Δ per backbone (grouped by family, by size), one block per benchmark."""
    stats = _Statistics(run)
    metrics = [m for m in run.baselines if m != run.target] + [run.target]
    metric_columns = _metric_columns(metrics)
    rows = []
    for benchmark, info in run.benchmarks.items():
        for backbone in run.ladder_order():  # a backbone without this benchmark shows missing cells
            cells = {m: stats.cell(benchmark, backbone, m, info.primary) for m in metrics}
            rows.append(Row([_family(run, backbone), backbone], _with_delta(stats, benchmark, backbone, "all", cells), _section_label(run, benchmark)))
    covered = [(b, n) for b in run.benchmarks for n in run.backbones if stats.has(b, n)]
    if not covered:
        return None
    _mark_rows(rows, metric_columns)
    return Table(
        name="size_ladder",
        title="Size ladders: baselines and DEPICT per backbone",
        caption=(
            "Primary statistic per benchmark (SRCC on correlation benchmarks, accuracy as a fraction otherwise). "
            "Backbones grouped by family and ordered by size. Bold: best in the row; underlined: second. "
            + _DELTA_NOTE.format(target=metric_label(run.target))
        ),
        stub=["Family", "Backbone"],
        columns=metric_columns + _delta_columns(),
        rows=rows,
        backbones=[n for n in run.ladder_order() if any(c[1] == n for c in covered)],
        benchmarks=[b for b in run.benchmarks if any(c[0] == b for c in covered)],
        paper="Tables 7 and 8",
    )


def _family(run: Run, backbone: str) -> str:
    return run.backbones[backbone].family or "—"


# ---------------------------------------------------------------------------------------------
# Table 9: multiple choice by template


def template_tables(run: Run) -> list[Table]:
    """Per benchmark with template subsets: accuracy by template, backbone x metric (Table 9)."""
    stats = _Statistics(run)
    metrics = ordered_metrics(run, [*run.baselines, "agree", run.target])
    metric_columns = _metric_columns(metrics)
    tables = []
    for benchmark, info in run.benchmarks.items():
        subsets = stats.subsets(benchmark, "template=")
        if not subsets:
            continue
        rows = []
        for subset in subsets:
            section = subset.removeprefix("template=").capitalize()
            for backbone in run.ladder_order():
                cells = {m: stats.cell(benchmark, backbone, m, info.primary, subset) for m in metrics}
                cells["n"] = stats.n(benchmark, backbone, run.target, info.primary, subset)
                rows.append(Row([backbone], _with_delta(stats, benchmark, backbone, subset, cells), section))
        _mark_rows(rows, metric_columns)
        tables.append(
            Table(
                name=file_stem("templates", benchmark),
                title=f"{benchmark_label(benchmark)} accuracy by template of the correct caption",
                caption=(
                    f"{statistic_label(info.primary)} per template (fractions; chance is 1 / number of options). "
                    "n: groups scored by the target. Bold: best in the row; underlined: second. "
                    + _DELTA_NOTE.format(target=metric_label(run.target))
                ),
                stub=["Backbone"],
                columns=metric_columns + [Column("n", "n", digits=0)] + _delta_columns(),
                rows=rows,
                backbones=[n for n in run.ladder_order() if any(stats.has(benchmark, n, s) for s in subsets)],
                benchmarks=[benchmark],
                paper="Table 9",
            )
        )
    return tables


# ---------------------------------------------------------------------------------------------
# Table 10: correlation by skill tag


def skill_tables(run: Run) -> list[Table]:
    """Per correlation benchmark with tag subsets and backbone: SRCC per skill (Table 10)."""
    stats = _Statistics(run)
    metrics = [m for m in run.baselines if m != run.target] + [run.target]
    metric_columns = _metric_columns(metrics)
    tables = []
    for benchmark, info in run.benchmarks.items():
        tags = stats.subsets(benchmark, "tag=")
        groups = [s for s in ("basic", "advanced") if stats.subsets(benchmark, s)]
        if not tags and not groups:
            continue
        layout = [("Overall", "all", "All items")]
        layout += [("Basic vs advanced", s, label) for s, label in (("basic", "Basic only (no advanced tag)"), ("advanced", "Advanced (any advanced tag)")) if s in groups]
        layout += [("Skills", t, t.removeprefix("tag=").capitalize()) for t in tags]
        for backbone in run.ladder_order():
            if not any(stats.has(benchmark, backbone, s) for _, s, _ in layout[1:]):
                continue
            rows = []
            for section, subset, label in layout:
                cells = {m: stats.cell(benchmark, backbone, m, info.primary, subset) for m in metrics}
                cells["n"] = stats.n(benchmark, backbone, run.target, info.primary, subset)
                rows.append(Row([label], _with_delta(stats, benchmark, backbone, subset, cells), section))
            _mark_rows(rows, metric_columns)
            tables.append(
                Table(
                    name=file_stem("skills", benchmark, backbone),
                    title=f"{benchmark_label(benchmark)} {statistic_label(info.primary)} by skill tag ({backbone})",
                    caption=(
                        "An item can carry several tags, so subsets overlap; an item is advanced if any of its tags is "
                        "an advanced skill. n: items. Bold: best in the row; underlined: second. "
                        + _DELTA_NOTE.format(target=metric_label(run.target))
                    ),
                    stub=["Subset"],
                    columns=metric_columns + [Column("n", "n", digits=0)] + _delta_columns(),
                    rows=rows,
                    backbones=[backbone],
                    benchmarks=[benchmark],
                    paper="Table 10",
                )
            )
    return tables


# ---------------------------------------------------------------------------------------------
# Table 12: what commitment weighting buys


def weighting_gains(run: Run, backbone: str, benchmark: str, *, n_resamples: int | None = None) -> tuple[list[WeightingGain], str | None]:
    """Weighted (`depict`) minus unweighted (`agree_unweighted+vqascore`) primary statistic,
    on all items and the least committed quartile, and what was left out (or None).
    ValueError says why it cannot be computed."""
    info = run.benchmarks[benchmark]
    n_resamples = run.n_resamples if n_resamples is None else n_resamples
    scores = run.scores.filter((pl.col("backbone") == backbone) & (pl.col("benchmark") == benchmark))
    scores = scores.filter(pl.col("metric").is_in([WEIGHTED, UNWEIGHTED, COMMITMENT]))
    wide = scores.pivot(on="metric", index="item_id", values="score", aggregate_function="first")
    absent = [m for m in (WEIGHTED, UNWEIGHTED, COMMITMENT) if m not in wide.columns]
    if absent:
        raise ValueError(f"no {', '.join(absent)} scores for {backbone} on {benchmark}")
    items = run.items.filter(pl.col("benchmark") == benchmark).join(wide, on="item_id", how="inner")
    if info.kind == "correlation":
        usable = items.drop_nulls(["human", WEIGHTED, UNWEIGHTED, COMMITMENT]).filter(
            pl.all_horizontal(pl.col(c).is_not_nan() for c in ("human", WEIGHTED, UNWEIGHTED, COMMITMENT))
        )
        gains = correlation_weighting_gain(
            usable[WEIGHTED], usable[UNWEIGHTED], usable["human"], usable[COMMITMENT], usable["group_id"],
            n_resamples=n_resamples, seed=run.seed,
        )  # fmt: skip
        left_out = items.height - usable.height
        return gains, f"{left_out} item(s) without a human value or one of the three scores left out" if left_out else None
    credit = {m: _group_credit(items.with_columns(score=pl.col(m)), info) for m in (WEIGHTED, UNWEIGHTED)}
    commitment = dict(items.group_by("group_id").agg(pl.col(COMMITMENT).mean()).drop_nulls().iter_rows())
    common = sorted(set(credit[WEIGHTED]) & set(credit[UNWEIGHTED]) & {g for g, c in commitment.items() if math.isfinite(c)})
    if len(common) < 2:
        raise ValueError(f"{len(common)} group(s) scored by both metrics for {backbone} on {benchmark}")
    gains = choice_weighting_gain(
        [credit[WEIGHTED][g] for g in common], [credit[UNWEIGHTED][g] for g in common], [commitment[g] for g in common],
        n_resamples=n_resamples, seed=run.seed,
    )  # fmt: skip
    left_out = items["group_id"].n_unique() - len(common)
    return gains, f"{left_out} group(s) not scorable by both metrics or without commitment left out" if left_out else None


def _group_credit(frame: pl.DataFrame, info) -> dict[str, float]:
    """group_id -> credit of the benchmark's primary accuracy, via pipeline.stats.choice."""
    if info.kind == "winoground":
        result = choice.winoground(frame)
        values = getattr(result, info.primary.removesuffix("_acc"))
    else:
        result = choice.multiple_choice(frame, info.protocol.tie_policy)
        values = result.credit
    return dict(zip(result.group_ids, values.tolist()))


def improved_count(gains: list[float]) -> str:
    """Benchmarks whose gain on all items is above IMPROVED_ABOVE, as "k/n" of those computed."""
    return f"{sum(g > IMPROVED_ABOVE for g in gains)}/{len(gains)}"


def commitment_gain_table(run: Run, *, n_resamples: int | None = None) -> Table | None:
    """Per backbone and benchmark: gain from commitment weighting, in points (Table 12)."""
    columns, rows, notes = [], [], []
    points = {"digits": 2, "scale": 100.0, "signed": True}
    for benchmark in run.benchmarks:
        group = benchmark_label(benchmark)
        columns += [Column(f"{benchmark}:all", "All", group=group, **points), Column(f"{benchmark}:least", "Least committed", group=group, **points)]
    covered = set()
    for backbone in run.ladder_order():
        cells, gains_all, gains_least = {}, [], []
        for benchmark in run.benchmarks:
            try:
                computed, left_out = weighting_gains(run, backbone, benchmark, n_resamples=n_resamples)
            except ValueError as exc:
                notes.append(f"{backbone} / {benchmark_label(benchmark)}: not computed ({exc}).")
                continue
            if left_out:
                notes.append(f"{backbone} / {benchmark_label(benchmark)}: {left_out}.")
            gains = {g.subset: g for g in computed}
            covered.add((benchmark, backbone))
            for subset, key in (("all", "all"), ("least_committed", "least")):
                gain = gains[subset].gain
                cells[f"{benchmark}:{key}"] = number(gain.estimate, gain.low, gain.high, star=math.isfinite(gain.low) and gain.excludes_zero)
            gains_all.append(gains["all"].gain.estimate)
            gains_least.append(gains["least_committed"].gain.estimate)
        if gains_all:  # a backbone with nothing computed keeps its row, all missing
            cells["mean_all"] = number(float(np.mean(gains_all)))
            cells["mean_least"] = number(float(np.mean(gains_least)))
            cells["improved"] = Cell(text=improved_count(gains_all))
        rows.append(Row([backbone], cells))
    if not covered:
        return None
    columns += [
        Column("mean_all", "Mean Δ (all)", **points),
        Column("mean_least", "Mean Δ (least committed)", **points),
        Column("improved", "Improved"),
    ]
    return Table(
        name="commitment_gain",
        title="Gain from commitment weighting",
        caption=(
            f"{metric_label(WEIGHTED)} (commitment-weighted agreement) minus its unweighted twin "
            f"({metric_label(UNWEIGHTED)}), on the primary statistic, in points (x100: SRCC points on correlation "
            "benchmarks, accuracy points otherwise), on all items and on the quartile of items (choice benchmarks: "
            "groups) with the lowest mean commitment. *: paired BCa 95% interval excludes zero. Means are over the "
            f"benchmarks the backbone has; Improved: benchmarks with a gain above {IMPROVED_ABOVE * 100:g} point on all items."
        ),
        stub=["Backbone"],
        columns=columns,
        rows=rows,
        backbones=[n for n in run.ladder_order() if any(c[1] == n for c in covered)],
        benchmarks=[b for b in run.benchmarks if any(c[0] == b for c in covered)],
        paper="Table 12",
        notes=notes,
    )


# ---------------------------------------------------------------------------------------------
# Table 13: is the merge specific to Agree?


def merge_tables(run: Run) -> list[Table]:
    """Per backbone: the two parts and the two merges on each benchmark (Table 13)."""
    stats = _Statistics(run)
    columns = [Column(m, MERGE_LABELS.get(m, metric_label(m))) for m in MERGE_METRICS]
    merges = [c for c in columns if c.key in ("depict", "soft_tifa_am+vqascore")]
    tables = []
    for backbone in run.backbones:
        rows = []
        for benchmark, info in run.benchmarks.items():
            cells = {m: stats.cell(benchmark, backbone, m, info.primary) for m in MERGE_METRICS}
            rows.append(Row([benchmark_label(benchmark), statistic_label(info.primary)], cells))
        for row in rows:  # bold: the better of the two merges
            mark_best([row.cells[c.key] for c in merges], merges[0], second=False)
        tables.append(
            Table(
                name=file_stem("merge", backbone),
                title=f"Merging a decomposed term with VQAScore ({backbone})",
                caption=(
                    f"Both merges average a decomposed term with VQAScore using the run's weight (λ = {run.lam:g}); only the "
                    "decomposed term differs. Primary statistic per benchmark. Bold: the better of the two merges."
                ),
                stub=["Benchmark", "Statistic"],
                columns=columns,
                rows=rows,
                backbones=[backbone],
                benchmarks=[b for b in run.benchmarks if stats.has(b, backbone)],
                paper="Table 13",
            )
        )
    return tables


# ---------------------------------------------------------------------------------------------
# Table 15: what the caption-only answers look like


def answer_distribution_table(run: Run, *, n_resamples: int | None = None) -> Table | None:
    """Per backbone and benchmark: unique (caption, question) pairs, share of caption-only
    "no" answers (with a caption-level interval) and of undecided ones (Table 15)."""
    n_resamples = run.n_resamples if n_resamples is None else n_resamples
    percent = {"digits": 1, "scale": 100.0}
    columns = [
        Column("unique_q", "Unique Q", digits=0),
        Column("no_share", "NO share, % [95% CI]", show_ci=True, **percent),
        Column("undecided", "Undecided (w<0.2), %", **percent),
    ]
    rows, notes, covered = [], [], set()
    for backbone in run.backbones:
        try:
            records = run.records(backbone)
        except ValueError as exc:  # a malformed records file: say so, report the rest
            notes.append(str(exc))
            continue
        if records is None:
            notes.append(f"{backbone}: the run stored no per-question records.")
            continue
        depict = records.filter(pl.col("question_set") == "depict")
        for benchmark, info in run.benchmarks.items():
            items = run.items.filter(pl.col("benchmark") == benchmark)
            if info.kind != "correlation":  # one caption per item that is the right answer
                items = items.filter(pl.col("correct").fill_null(False))
            answers = depict.join(items.select("item_id"), on="item_id", how="semi")
            cells = {c.key: Cell() for c in columns}
            if answers.height:
                try:
                    result = answer_distribution(answers, n_resamples=n_resamples, seed=run.seed)
                except ValueError as exc:
                    notes.append(f"{backbone} / {benchmark_label(benchmark)}: {exc}")
                else:
                    covered.add(benchmark)
                    cells = {
                        "unique_q": number(result.n_pairs),
                        "no_share": number(result.no_share.estimate, result.no_share.low, result.no_share.high),
                        "undecided": number(result.undecided.estimate, result.undecided.low, result.undecided.high),
                    }
            rows.append(Row([benchmark_label(benchmark)], cells, backbone))
    if not rows:
        return None
    return Table(
        name="answer_distribution",
        title="Caption-only answer distributions",
        caption=(
            "Over unique (caption, question) pairs of the DEPICT question set: NO share = caption-only answer p_t < 0.5; "
            "undecided = commitment |2 p_t - 1| < 0.2. Intervals resample captions (BCa 95%). Choice benchmarks count "
            "only the correct caption of each group (Winoground: the matched pairings)."
        ),
        stub=["Benchmark"],
        columns=columns,
        rows=rows,
        backbones=list(dict.fromkeys(r.section for r in rows)),
        benchmarks=[b for b in run.benchmarks if b in covered],
        paper="Table 15",
        notes=notes,
    )


# ---------------------------------------------------------------------------------------------
# Figure 9's numbers: the merge weight


def lambda_sensitivity(run: Run, backbone: str, lams=LAMBDAS) -> pl.DataFrame:
    """`benchmark, statistic, lam, value`: the primary statistic of lam * VQAScore + (1 - lam) * Agree.

    Merged from the stored per-item scores with `operators.metrics.holistic.lambda_sweep` and
    measured with `pipeline.metaeval.evaluate`, so lam = 0.5 reproduces DEPICT's statistic.
    """
    frames = []
    for benchmark, info in run.benchmarks.items():
        scores = run.scores.filter((pl.col("backbone") == backbone) & (pl.col("benchmark") == benchmark))
        term, holistic = (scores.filter(pl.col("metric") == m).select("item_id", "metric", "score", "note") for m in ("agree", "vqascore"))
        if term.is_empty() or holistic.is_empty():
            continue
        swept = lambda_sweep(term, holistic, "agree", lams)
        names = {lam: f"lam={lam:g}" for lam in swept["lam"].unique()}
        long = swept.select("item_id", pl.col("lam").replace_strict(names, return_dtype=pl.String).alias("metric"), "score")
        protocol = replace(info.protocol, statistics=[info.primary], breakdowns=[])
        items = run.items.filter(pl.col("benchmark") == benchmark)
        result = evaluate(long, items, protocol, baselines=[], target="", n_resamples=0, benchmark=benchmark)
        values = result.statistics.filter(pl.col("subset") == "all").select(
            "benchmark", "statistic", pl.col("metric").str.strip_prefix("lam=").cast(pl.Float64).alias("lam"), "value"
        )
        frames.append(values.sort("lam"))
    schema = {"benchmark": pl.String, "statistic": pl.String, "lam": pl.Float64, "value": pl.Float64}
    return pl.concat(frames) if frames else pl.DataFrame(schema=schema)


def lambda_tables(run: Run, sensitivity: dict[str, pl.DataFrame] | None = None) -> list[Table]:
    """Per backbone: primary statistic per benchmark (columns) for each lambda (rows)."""
    tables = []
    for backbone in run.backbones:
        data = sensitivity[backbone] if sensitivity is not None else lambda_sensitivity(run, backbone)
        if data.is_empty():
            continue
        benchmarks = list(dict.fromkeys(data["benchmark"].to_list()))
        columns = [Column(b, statistic_label(run.benchmarks[b].primary), group=benchmark_label(b)) for b in benchmarks]
        values = {(r["benchmark"], r["lam"]): r["value"] for r in data.iter_rows(named=True)}
        lams = sorted(set(data["lam"].to_list()))
        rows = [Row([f"{lam:.2f}"], {b: number(values.get((b, lam))) for b in benchmarks}) for lam in lams]
        _mark_columns(rows, columns)
        tables.append(
            Table(
                name=file_stem("lambda", backbone),
                title=f"Sensitivity to the merge weight λ ({backbone})",
                caption=(
                    "Primary statistic of λ·VQAScore + (1 − λ)·Agree, recomputed from the stored per-item scores. "
                    f"λ = 0: decomposed term only; λ = 1: holistic only; the run used λ = {run.lam:g}. "
                    "Bold: best λ per column; underlined: second."
                ),
                stub=["λ"],
                columns=columns,
                rows=rows,
                backbones=[backbone],
                benchmarks=benchmarks,
                paper="Figure 9 (data)",
            )
        )
    return tables
