"""End to end: two small sweeps that differ only in questions.open_share, then the figure job.

The runs use the world oracle (answers from the demo world's truth, no model), so the test is
quick and what it checks has a known answer: on perfect answers DEPICT's commitment weight sets
the open questions aside (its SRCC does not move), while Soft-TIFA, which expects Yes to every
question, loses rank agreement once a quarter of the questions are open.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from pipeline.config import load_config
from pipeline.sweep import run_sweep

REPO = Path(__file__).resolve().parent.parent
SHARES = (0.25, 0.0)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def run_dirs(ray_session, tmp_path_factory):
    root = tmp_path_factory.mktemp("open_share_e2e")
    dirs = []
    for share in SHARES:
        cfg = load_config([f"root={root}", "sweep=demo", "backbones=[oracle]", "benchmarks=[demo,demo_mcq]", "questions.source=benchmark", f"questions.open_share={share}",
                           f"run_name=open-{share:g}", "bootstrap.n_resamples=30", "compute.progress_bars=false"])  # fmt: skip
        dirs.append(Path(run_sweep(cfg).run_dir))
    return dirs


@pytest.fixture(scope="module")
def figure(run_dirs, tmp_path_factory):
    out = tmp_path_factory.mktemp("figure")
    elsewhere = tmp_path_factory.mktemp("cwd")
    runs = ",".join(str(d) for d in run_dirs)
    done = subprocess.run([sys.executable, str(REPO / "jobs" / "tables.py"), f"runs=[{runs}]", "figure=open_share", f"out={out}"],
                          cwd=elsewhere, capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
    return out, done


def test_the_job_writes_the_figure_and_its_numbers(figure, run_dirs):
    out, done = figure
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("# Metrics against the share of open questions") and f"written to {out}/" in done.stdout
    assert (out / "open_share.png").read_bytes().startswith(b"\x89PNG")
    index = json.loads((out / "open_share_index.json").read_text())
    assert [r["open_share"] for r in index["runs"]] == [0.0, 0.25] and [r["run"] for r in index["runs"]] == [str(run_dirs[1]), str(run_dirs[0])]
    assert index["figure_metrics"] == ["dsg", "soft_tifa_am", "vqascore", "hard_fixed_yes", "depict"]
    realised = {r["open_share"]: r["realised_share"] for r in index["runs"]}
    assert realised[0.0] == {"demo": 0.0, "demo_mcq": 0.0}
    assert all(0.15 < v <= 0.25 for v in realised[0.25].values()), realised  # the fixed captions cap the share a little


def test_the_numbers_are_each_runs_statistics(figure, run_dirs):
    out, _ = figure
    data = pl.read_csv(out / "open_share_data.csv")
    for run_dir, share in zip(run_dirs, SHARES):
        stats = pl.read_parquet(run_dir / "statistics.parquet").filter(
            (pl.col("subset") == "all") & (((pl.col("benchmark") == "demo") & (pl.col("statistic") == "srcc")) | (pl.col("benchmark") == "demo_mcq"))
        )
        mine = data.filter(pl.col("share") == share)
        assert mine.height == stats.height and set(mine["run"]) == {str(run_dir)}
        joined = stats.join(mine, on=["benchmark", "backbone", "metric", "statistic"], suffix="_fig")
        assert joined.height == stats.height
        for column in ("value", "ci_low", "ci_high"):
            assert joined[column].to_list() == pytest.approx(joined[f"{column}_fig"].to_list(), abs=1e-12, nan_ok=True), column


def test_on_perfect_answers_depict_ignores_open_questions_and_soft_tifa_does_not(figure):
    out, _ = figure
    data = pl.read_csv(out / "open_share_data.csv").filter((pl.col("benchmark") == "demo") & (pl.col("backbone") == "oracle"))
    srcc = {(r["metric"], r["share"]): r["value"] for r in data.iter_rows(named=True)}
    assert srcc["depict", 0.25] == pytest.approx(srcc["depict", 0.0], abs=1e-9)
    assert srcc["soft_tifa_am", 0.25] < srcc["soft_tifa_am", 0.0] - 0.05
