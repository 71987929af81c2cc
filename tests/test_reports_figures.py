"""Forest plot and lambda-sensitivity figures, built from a small in-memory run."""
from __future__ import annotations

import matplotlib.colors as mcolors
import polars as pl
import pytest

from pipeline.config import ProtocolSpec
from pipeline.metaeval import DELTAS_SCHEMA, STATISTICS_SCHEMA
from pipeline.reports.figures import OKABE_ITO, forest_plot, lambda_plot
from pipeline.reports.finished_run import BackboneInfo, BenchmarkInfo, Run

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def make_run(deltas: list[tuple]) -> Run:
    backbones = {n: BackboneInfo(n, f, s) for n, f, s in [("big", "fam", "27B"), ("other", "fam2", "8B"), ("small", "fam", "4B")]}
    benchmarks = {
        "corr": BenchmarkInfo("corr", ProtocolSpec(kind="correlation", primary_statistic="srcc")),
        "mcq": BenchmarkInfo("mcq", ProtocolSpec(kind="multiple_choice", statistics=["accuracy"], primary_statistic="accuracy")),
    }
    rows = [dict(zip(["benchmark", "backbone", "baseline", "delta", "ci_low", "ci_high", "significant"], d)) for d in deltas]
    frame = pl.DataFrame(
        [r | {"subset": "all", "statistic": "x", "metric": "depict", "n_groups": 5} for r in rows], schema=DELTAS_SCHEMA
    )
    empty = pl.DataFrame()
    return Run(
        url="mem://run", name="fig-test", backbones=backbones, benchmarks=benchmarks, metrics=["depict", "dsg", "vqascore"],
        target="depict", baselines=["dsg", "vqascore"], lam=0.5, n_resamples=10, seed=0, items=empty, scores=empty,
        statistics=pl.DataFrame(schema=STATISTICS_SCHEMA), deltas=frame, errors=empty,
    )  # fmt: skip


DELTAS = [
    ("corr", "big", "vqascore", 0.03, 0.01, 0.05, True),
    ("corr", "small", "dsg", -0.01, -0.04, 0.02, False),
    ("corr", "other", "vqascore", 0.02, float("nan"), float("nan"), None),
    ("mcq", "big", "vqascore", -0.05, -0.08, -0.02, True),
]


def markers(ax) -> list:
    return [line for line in ax.lines if line.get_marker() not in (None, "None", "") and len(line.get_xdata()) == 1]


def test_forest_plot_marks_significance_and_missing_cells():
    plot = forest_plot(make_run(DELTAS))
    assert plot.name == "forest_deltas" and plot.paper == "Figure 8"
    assert plot.backbones == ["small", "big", "other"] and plot.benchmarks == ["corr", "mcq"]  # family, then size
    corr, mcq = [ax for ax in plot.figure.axes if ax.get_visible()]
    assert corr.get_title() == "corr (SRCC)" and corr.get_xlabel() == "Δ SRCC" and mcq.get_title() == "mcq (Acc.)"
    assert [t.get_text() for t in corr.get_yticklabels()] == ["small", "big", "other"]
    points = {line.get_ydata()[0]: line for line in markers(corr)}
    y = {"small": 2, "big": 1, "other": 0}  # first backbone on top
    filled = {name: points[pos].get_markerfacecolor() != "white" for name, pos in y.items()}
    assert filled == {"small": False, "big": True, "other": False}
    assert points[y["big"]].get_xdata()[0] == 0.03
    assert mcolors.to_hex(points[y["small"]].get_color()) == OKABE_ITO[0].lower()  # dsg: first baseline
    assert mcolors.to_hex(points[y["big"]].get_color()) == OKABE_ITO[1].lower()
    assert len(corr.collections) == 2  # error bars for the two intervals; none for the NaN one
    assert sorted(t.get_text() for t in mcq.texts) == ["no data", "no data"]  # small and other lack mcq
    assert any(line.get_xdata()[0] == 0 and line.get_linestyle() == "--" for line in corr.lines if len(line.get_xdata()) == 2)
    labels = [t.get_text() for t in plot.figure.legends[0].get_texts()]
    assert labels == ["vs. DSG", "vs. VQAScore", "interval excludes 0", "interval includes 0 / none"]
    assert plot.png().startswith(PNG_SIGNATURE)


def test_forest_plot_needs_deltas():
    assert forest_plot(make_run([])) is None


def test_lambda_plot_styles_by_benchmark_kind():
    run = make_run(DELTAS)
    lams = [0.0, 0.5, 1.0]
    data = pl.DataFrame({
        "benchmark": ["corr"] * 3 + ["mcq"] * 3, "statistic": ["srcc"] * 3 + ["accuracy"] * 3,
        "lam": lams * 2, "value": [0.6, 0.7, 0.65, 0.8, 0.85, 0.7],
    })  # fmt: skip
    plot = lambda_plot(run, "big", data)
    (ax,) = plot.figure.axes
    corr, mcq, used = ax.lines
    assert corr.get_linestyle() == "-" and mcq.get_linestyle() == "--" and used.get_linestyle() == ":"
    assert list(mcq.get_ydata()) == [0.8, 0.85, 0.7] and list(used.get_xdata()) == [0.5, 0.5]
    assert ax.get_ylabel() == "SRCC (solid) / accuracy (dashed)" and ax.get_xlabel() == "λ, weight of the holistic term"
    assert [t.get_text() for t in plot.figure.legends[0].get_texts()] == ["corr (SRCC)", "mcq (Acc.)", "λ = 0.5 (used)"]
    assert (plot.name, plot.backbones, plot.benchmarks) == ("lambda_big", ["big"], ["corr", "mcq"])
    png = plot.png()
    assert png.startswith(PNG_SIGNATURE) and len(png) > 10_000


@pytest.mark.parametrize(("benchmarks", "label"), [(["corr"], "SRCC"), (["mcq"], "accuracy")])
def test_lambda_plot_y_label_names_only_what_is_drawn(benchmarks, label):
    data = pl.DataFrame({"benchmark": benchmarks, "statistic": ["s"], "lam": [0.5], "value": [0.5]})
    (ax,) = lambda_plot(make_run(DELTAS), "big", data).figure.axes
    assert ax.get_ylabel() == label


def test_lambda_plot_needs_data():
    assert lambda_plot(make_run(DELTAS), "big", pl.DataFrame(schema={"benchmark": pl.String, "lam": pl.Float64, "value": pl.Float64})) is None


def test_figures_leave_pyplot_alone():
    import matplotlib.pyplot as plt

    before = plt.get_fignums()
    forest_plot(make_run(DELTAS))
    assert plt.get_fignums() == before
