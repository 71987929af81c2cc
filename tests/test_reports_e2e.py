"""End to end: one smoke sweep, then `jobs/tables.py` on it (locally and through S3)."""
from __future__ import annotations

import csv
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from pipeline.config import load_config
from pipeline.reports.write import write_reports
from pipeline.sweep import run_sweep

REPO = Path(__file__).resolve().parent.parent
TABLES = ["comparison_smoke", "size_ladder", "templates_demo_mcq", "skills_demo_smoke", "commitment_gain", "merge_smoke", "answer_distribution", "lambda_smoke"]
FIGURES = ["forest_deltas.png", "lambda_smoke.png"]

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def run_dir(ray_session, tmp_path_factory):
    root = tmp_path_factory.mktemp("reports_e2e")
    # the demo carries skill tags; asking for the tag breakdown gives the skill table something to show
    cfg = load_config([f"root={root}", "sweep=smoke", "compute.progress_bars=false", "bootstrap.n_resamples=50", "benchmark_overrides.demo.protocol.breakdowns=[tags]"])
    return Path(run_sweep(cfg).run_dir)


@pytest.fixture(scope="module")
def cli(run_dir, tmp_path_factory):
    """The job as a user runs it: another directory, only the script's path."""
    elsewhere = tmp_path_factory.mktemp("cwd")
    return subprocess.run([sys.executable, str(REPO / "jobs" / "tables.py"), f"run={run_dir}"], cwd=elsewhere, capture_output=True, text=True, timeout=300, check=False)


def read_csv(path: Path) -> list[dict]:
    with path.open() as handle:
        return list(csv.DictReader(handle))


def test_every_table_and_figure_is_written_and_indexed(run_dir, cli):
    assert cli.returncode == 0, cli.stderr
    out = run_dir / "tables"
    assert "# Reports for run smoke" in cli.stdout and f"written to {out}/" in cli.stdout
    for name in TABLES:
        for fmt in ("md", "tex", "csv"):
            assert (out / f"{name}.{fmt}").stat().st_size > 100, f"{name}.{fmt}"
    for name in FIGURES:
        assert (out / name).read_bytes().startswith(b"\x89PNG")
    index = json.loads((out / "index.json").read_text())
    assert index["skipped"] == [] and index["problems"] == []
    assert [t["name"] for t in index["tables"]] == TABLES
    assert [f["file"] for f in index["figures"]] == FIGURES
    listed = {f for t in index["tables"] for f in t["files"].values()} | {f["file"] for f in index["figures"]}
    assert listed | {"index.json", "index.md"} == {p.name for p in out.iterdir()}
    assert all(t["run"] == str(run_dir) and t["backbones"] == ["smoke"] for t in index["tables"])
    assert (out / "index.md").read_text().startswith("# Reports for run smoke")


def test_comparison_table_matches_the_run_statistics(run_dir, cli):
    statistics = pl.read_parquet(run_dir / "statistics.parquet").filter(pl.col("subset") == "all")
    rows = {r["Metric"]: r for r in read_csv(run_dir / "tables" / "comparison_smoke.csv")}
    assert list(rows)[:3] == ["DSG", "Soft-TIFA-AM", "VQAScore"] and list(rows)[-2:] == ["Agree", "DEPICT"]
    expected = statistics.filter((pl.col("metric") == "depict") & (pl.col("benchmark") == "demo_winoground"))
    for stat, column in (("text_acc", "demo_winoground Text"), ("group_acc", "demo_winoground Group")):
        value = expected.filter(pl.col("statistic") == stat)["value"][0]
        assert float(rows["DEPICT"][column]) == pytest.approx(value, abs=1e-9)
    srcc = statistics.filter((pl.col("metric") == "dsg") & (pl.col("statistic") == "srcc"))["value"][0]
    assert float(rows["DSG"]["demo SRCC"]) == pytest.approx(srcc, abs=1e-9)


def test_lambda_one_half_reproduces_depict(run_dir, cli):
    """The sensitivity curve is recomputed from per-item scores; at the run's lambda it must
    give DEPICT's own statistic from the sweep."""
    statistics = pl.read_parquet(run_dir / "statistics.parquet").filter((pl.col("subset") == "all") & (pl.col("metric") == "depict"))
    half = {r["λ"]: r for r in read_csv(run_dir / "tables" / "lambda_smoke.csv")}["0.50"]
    for benchmark, statistic, column in (("demo", "srcc", "demo SRCC"), ("demo_winoground", "group_acc", "demo_winoground Group"), ("demo_mcq", "accuracy", "demo_mcq Acc.")):
        value = statistics.filter((pl.col("benchmark") == benchmark) & (pl.col("statistic") == statistic))["value"][0]
        assert float(half[column]) == pytest.approx(value, abs=1e-9), benchmark


def test_skill_table_lists_the_demo_tags(run_dir, cli):
    sections = [r["section"] for r in read_csv(run_dir / "tables" / "skills_demo_smoke.csv")]
    assert sections[:3] == ["Overall", "Basic vs advanced", "Basic vs advanced"] and "Skills" in sections


def test_cli_rejects_bad_arguments(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("tables_job", REPO / "jobs" / "tables.py")
    job = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(job)
    assert job.main(["out=x"]) == 2 and "run=<run dir" in capsys.readouterr().err
    assert job.main([f"run={tmp_path}", "colour=red"]) == 2
    assert job.main([f"run={tmp_path}"]) == 2 and "manifest.json not found" in capsys.readouterr().err
    assert job.parse_args(["run=r", "formats=[md, csv]", "n_resamples=70"]) == {"run": "r", "out": None, "formats": ["md", "csv"], "n_resamples": 70}
    for bad in ("n_resamples=0", "n_resamples=-5", "n_resamples=many", "formats=[md,docx]"):
        assert job.main([f"run={tmp_path}", bad]) == 2, bad  # checked before the run is read


@pytest.fixture
def s3_bucket(moto_s3):
    moto_s3.mkdir("reports")
    return moto_s3


def test_reads_and_writes_a_run_on_s3(run_dir, cli, s3_bucket):
    for path in run_dir.rglob("*"):  # the run as a sweep with root=s3://... leaves it (no local tables)
        if path.is_file() and "tables" not in path.relative_to(run_dir).parts:
            s3_bucket.put(str(path), f"reports/runs/smoke/{path.relative_to(run_dir)}")
    index = write_reports("s3://reports/runs/smoke", formats=["md", "csv"], n_resamples=20)
    assert index["out"] == "s3://reports/runs/smoke/tables"
    written = {p.rsplit("/", 1)[-1] for p in s3_bucket.ls("reports/runs/smoke/tables")}
    assert {f"{t}.{fmt}" for t in TABLES for fmt in ("md", "csv")} | set(FIGURES) | {"index.json", "index.md"} == written
    local = (run_dir / "tables" / "merge_smoke.csv").read_text()
    assert s3_bucket.cat("reports/runs/smoke/tables/merge_smoke.csv").decode() == local  # same numbers from S3
