"""Report figures from a run's stored numbers (no model is rerun), drawn with matplotlib's Agg.

- `forest_plot` (DEPICT Figure 8): the target minus the strongest baseline per backbone and
  benchmark with its paired BCa 95% interval; filled markers where the interval excludes zero,
  colour and marker shape name the baseline.
- `lambda_plot` (Figure 9): the primary statistic of lam * VQAScore + (1 - lam) * Agree
  for lam in 0..1 (data from `tables.lambda_sensitivity`), solid lines for correlation
  benchmarks and dashed for choice benchmarks, a dotted line at the run's lam.
- `open_share_plot`: each metric's primary statistic against the share of questions the
  caption leaves open, across runs (data from `open_share.open_share_data`), one panel per
  benchmark, colour and marker per metric, line style per backbone, the runs' intervals as bars.

Figures are built on `matplotlib.figure.Figure` with an Agg canvas, never through pyplot,
so making them changes no global state and needs no display. Colours are the Okabe-Ito
palette (distinguishable with the common colour-vision deficiencies), always paired with a
marker shape so nothing depends on colour alone.
"""
from __future__ import annotations

import io
import math
from dataclasses import dataclass

import polars as pl
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from pipeline.reports.finished_run import Run
from pipeline.reports.tables import (
    benchmark_label,
    file_stem,
    metric_label,
    statistic_label,
)

OKABE_ITO = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#D55E00", "#56B4E9", "#F0E442", "#000000")
MARKERS = ("o", "s", "D", "^", "v", "P", "X", "*")
LINESTYLES = ("-", "--", ":", "-.")
DODGE = 0.008  # horizontal offset between neighbouring lines, as a share of the x range: bars stay apart


@dataclass
class Plot:
    name: str  # file stem
    title: str
    figure: Figure
    backbones: list[str]
    benchmarks: list[str]
    paper: str = ""

    def png(self, dpi: int = 150) -> bytes:
        buffer = io.BytesIO()
        self.figure.savefig(buffer, format="png", dpi=dpi)
        return buffer.getvalue()


def _figure(width: float, height: float) -> Figure:
    figure = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def _style(index: int) -> tuple[str, str]:
    return OKABE_ITO[index % len(OKABE_ITO)], MARKERS[index % len(MARKERS)]


def forest_plot(run: Run) -> Plot | None:
    """Δ with its interval, one panel per benchmark, one line per backbone (Figure 8)."""
    deltas = run.deltas.filter(pl.col("subset") == "all")
    benchmarks = [b for b in run.benchmarks if b in set(deltas["benchmark"])]
    backbones = [b for b in run.ladder_order() if b in set(deltas["backbone"])]
    if not benchmarks:
        return None
    rows = {(r["benchmark"], r["backbone"]): r for r in deltas.iter_rows(named=True)}
    used = [m for m in deltas["baseline"].unique(maintain_order=True)]
    order = [m for m in run.baselines if m in used] + sorted(set(used) - set(run.baselines))
    styles = {m: _style(i) for i, m in enumerate(order)}

    ncols = min(len(benchmarks), 3)
    nrows = math.ceil(len(benchmarks) / ncols)
    figure = _figure(4.0 * ncols + 1.2, nrows * (0.42 * len(backbones) + 1.5) + 1.0)
    axes = figure.subplots(nrows, ncols, squeeze=False, sharey=True)
    positions = {b: len(backbones) - 1 - i for i, b in enumerate(backbones)}  # first backbone on top
    for ax, benchmark in zip(axes.flat, benchmarks):
        statistic = statistic_label(run.benchmarks[benchmark].primary)
        for backbone, y in positions.items():
            row = rows.get((benchmark, backbone))
            if row is None or row["delta"] is None or not math.isfinite(row["delta"]):
                ax.text(0, y, "no data", ha="center", va="center", fontsize=7, color="0.45")
                continue
            colour, marker = styles[row["baseline"]]
            low, high, delta = row["ci_low"], row["ci_high"], row["delta"]
            if low is not None and high is not None and math.isfinite(low) and math.isfinite(high):
                ax.errorbar(delta, y, xerr=[[delta - low], [high - delta]], fmt="none", ecolor=colour, elinewidth=1.4, capsize=3)
            filled = row["significant"] is True
            ax.plot(delta, y, marker=marker, markersize=7, color=colour, markerfacecolor=colour if filled else "white", markeredgewidth=1.4, linestyle="none")
        ax.axvline(0.0, color="0.35", linestyle="--", linewidth=0.9)
        ax.set_title(f"{benchmark_label(benchmark)} ({statistic})", fontsize=10)
        ax.set_xlabel(f"Δ {statistic}", fontsize=9)
        ax.set_yticks(list(positions.values()), labels=list(positions), fontsize=8)
        ax.set_ylim(-0.7, len(backbones) - 0.3)
        ax.grid(axis="x", alpha=0.3)
        ax.tick_params(axis="x", labelsize=8)
    for ax in list(axes.flat)[len(benchmarks) :]:
        ax.set_visible(False)

    handles = [Line2D([], [], color=styles[m][0], marker=styles[m][1], linestyle="none", label=f"vs. {metric_label(m)}") for m in order]
    handles += [
        Line2D([], [], color="0.2", marker="o", linestyle="none", label="interval excludes 0"),
        Line2D([], [], color="0.2", marker="o", markerfacecolor="white", linestyle="none", label="interval includes 0 / none"),
    ]
    figure.legend(handles=handles, loc="outside lower center", ncol=min(len(handles), 6), fontsize=8, frameon=False)
    title = f"{metric_label(run.target)} minus the strongest baseline (paired BCa 95% intervals)"
    figure.suptitle(f"{title}\nrun {run.name}", fontsize=11)
    return Plot("forest_deltas", title, figure, backbones, benchmarks, paper="Figure 8")


def lambda_plot(run: Run, backbone: str, sensitivity: pl.DataFrame) -> Plot | None:
    """The primary statistic against lam for every benchmark of one backbone (Figure 9)."""
    if sensitivity.is_empty():
        return None
    benchmarks = list(dict.fromkeys(sensitivity["benchmark"].to_list()))
    figure = _figure(6.4, 5.0)
    ax = figure.subplots()
    kinds = set()
    for index, benchmark in enumerate(benchmarks):
        data = sensitivity.filter(pl.col("benchmark") == benchmark).sort("lam")
        info = run.benchmarks[benchmark]
        correlation = info.kind == "correlation"
        kinds.add("correlation" if correlation else "choice")
        colour, marker = _style(index)
        ax.plot(
            data["lam"].to_numpy(), data["value"].to_numpy(), color=colour, marker=marker, markersize=4,
            linestyle="-" if correlation else "--", linewidth=1.6,
            label=f"{benchmark_label(benchmark)} ({statistic_label(info.primary)})",
        )  # fmt: skip
    ax.axvline(run.lam, color="0.25", linestyle=":", linewidth=1.4, label=f"λ = {run.lam:g} (used)")
    ax.set_xlim(-0.02, 1.02)
    ax.set_xticks([0, 0.25, 0.5, 0.75, 1.0], labels=["0\nAgree only", "0.25", "0.5", "0.75", "1\nVQAScore only"])
    ax.set_xlabel("λ, weight of the holistic term")
    ylabel = {"correlation": "SRCC", "choice": "accuracy"}
    ax.set_ylabel(" (solid) / ".join(ylabel[k] for k in ("correlation", "choice") if k in kinds) + (" (dashed)" if len(kinds) == 2 else ""))
    ax.grid(alpha=0.3)
    figure.legend(loc="outside lower center", ncol=3, fontsize=8, frameon=False)
    title = f"Sensitivity to the merge weight λ ({backbone})"
    ax.set_title(f"{title}\nλ·VQAScore + (1 − λ)·Agree, run {run.name}", fontsize=10)
    return Plot(file_stem("lambda", backbone), title, figure, [backbone], benchmarks, paper="Figure 9")


def open_share_plot(data: pl.DataFrame, metrics: list[str], *, runs: str = "") -> Plot | None:
    """The primary statistic of each metric in `metrics` against the share asked, one panel per
    benchmark; tick labels give the share each benchmark realised (from `data.realised_share`)."""
    data = data.filter(pl.col("metric").is_in(metrics))
    if data.is_empty():
        return None
    benchmarks = list(data["benchmark"].unique(maintain_order=True))
    backbones = list(data["backbone"].unique(maintain_order=True))
    shares = sorted(set(data["share"].to_list()))
    metrics = [m for m in metrics if m in set(data["metric"])]
    span = (shares[-1] - shares[0]) or 1.0
    lines = [(b, m) for b in backbones for m in metrics]
    offsets = {line: (k - (len(lines) - 1) / 2) * DODGE * span for k, line in enumerate(lines)}

    figure = _figure(5.2 * len(benchmarks) + 0.6, 5.4)
    axes = figure.subplots(1, len(benchmarks), squeeze=False)[0]
    for ax, benchmark in zip(axes, benchmarks):
        part = data.filter(pl.col("benchmark") == benchmark)
        statistic = statistic_label(part["statistic"][0])
        for (backbone, metric), offset in offsets.items():
            rows = part.filter((pl.col("backbone") == backbone) & (pl.col("metric") == metric)).sort("share")
            if rows.is_empty():
                continue
            colour, marker = _style(metrics.index(metric))
            first = backbone == backbones[0]
            x = [s + offset for s in rows["share"].to_list()]
            y = [v if v is not None else math.nan for v in rows["value"].to_list()]
            ax.plot(x, y, color=colour, marker=marker, markersize=5, linestyle=LINESTYLES[backbones.index(backbone) % len(LINESTYLES)],
                    linewidth=1.4, markerfacecolor=colour if first else "white", markeredgewidth=1.2, label=f"{backbone} {metric}")  # fmt: skip
            for xi, yi, low, high in zip(x, y, rows["ci_low"].to_list(), rows["ci_high"].to_list()):
                if all(v is not None and math.isfinite(v) for v in (yi, low, high)):
                    ax.errorbar(xi, yi, yerr=[[yi - low], [high - yi]], fmt="none", ecolor=colour, elinewidth=0.9, capsize=2, alpha=0.8)
        realised = dict(part.select("share", "realised_share").unique().iter_rows())
        ticks = [f"{s:g}\n({'?' if realised.get(s) is None else f'{realised[s]:.2f}'})" for s in shares]
        ax.set_xticks(shares, labels=ticks, fontsize=8)
        ax.set_xlim(shares[0] - 0.06 * span, shares[-1] + 0.06 * span)
        ax.set_title(f"{benchmark_label(benchmark)} ({statistic})", fontsize=10)
        ax.set_xlabel("questions.open_share asked\n(share of DEPICT questions left open)", fontsize=9)
        ax.set_ylabel(statistic, fontsize=9)
        ax.grid(alpha=0.3)
        ax.tick_params(axis="y", labelsize=8)

    handles = [Line2D([], [], color=_style(i)[0], marker=_style(i)[1], linestyle="none", label=metric_label(m)) for i, m in enumerate(metrics)]
    handles += [
        Line2D([], [], color="0.2", marker="o", markerfacecolor="0.2" if i == 0 else "white", linestyle=LINESTYLES[i % len(LINESTYLES)], label=b)
        for i, b in enumerate(backbones)
    ]
    figure.legend(handles=handles, loc="outside lower center", ncol=min(len(handles), 7), fontsize=8, frameon=False)
    title = "Metrics against the share of questions the caption leaves open"
    figure.suptitle(f"{title} (bars: each run's bootstrap 95% interval)" + (f"\n{runs}" if runs else ""), fontsize=11)
    return Plot("open_share", title, figure, backbones, benchmarks)
