"""All-or-nothing run outputs, as the accidents a user has: a rerun with other settings killed
between scores and statistics, a file changed after the run, two sweeps or two curations on
one output. In each case reports refuse the folder (or the second job stops) and what is
lost is nothing: rerunning the same command completes from the answer cache."""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
from curation_shards import pair_rows, write_parquet
from killing import kill_when

from pipeline.config import load_config
from pipeline.curation.curation_config import load_curation_config
from pipeline.curation.run import run_curation
from pipeline.reports.finished_run import open_run
from pipeline.store.lease import Lease, LeaseHeld
from pipeline.store.run_folder import RunNotFinished
from pipeline.sweep import run_sweep

REPO = Path(__file__).resolve().parent.parent
SMALL = [
    "sweep=smoke",
    "compute.rows_per_part=16", "compute.progress_bars=false", "bootstrap.n_resamples=50",
    "benchmark_overrides.demo.limit_groups=4", "benchmark_overrides.demo_winoground.limit_groups=3",
    "benchmark_overrides.demo_mcq.limit_groups=3",
]  # fmt: skip

pytestmark = pytest.mark.slow


def load_job(name: str):
    spec = importlib.util.spec_from_file_location(f"{name}_job", REPO / "jobs" / f"{name}.py")
    job = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(job)
    return job


def manifest(run_dir: Path) -> dict:
    return json.loads((run_dir / "manifest.json").read_text())


@pytest.fixture(scope="module")
def finished(ray_session, tmp_path_factory, tiny_vlm_dir):
    root = tmp_path_factory.mktemp("outputs")
    result = run_sweep(load_config([f"root={root}", *SMALL]))
    return root, Path(result.run_dir)


def test_a_finished_run_lists_every_output_with_its_digest(finished):
    _, run_dir = finished
    m = manifest(run_dir)
    assert m["status"] == "finished" and m["run_id"]
    on_disk = {str(p.relative_to(run_dir)) for p in run_dir.rglob("*") if p.is_file()} - {"manifest.json"}
    assert set(m["outputs"]) == on_disk
    assert {"scores/smoke.parquet", "statistics.parquet", "items.parquet", "records/smoke.parquet"} <= on_disk
    run = open_run(str(run_dir))
    assert run.problems == [] and run.lam == 0.5


def test_killed_rerun_with_other_settings_is_refused_then_completes(finished, tmp_path, ray_session):
    root, run_dir = finished
    before = open_run(str(run_dir))
    env = dict(os.environ, PYTHONUNBUFFERED="1", RAY_ADDRESS=ray_session.get_runtime_context().gcs_address)
    log_path = tmp_path / "rerun.log"
    scores = run_dir / "scores" / "smoke.parquet"
    # A large bootstrap keeps the statistics stage busy long after the new scores are written.
    rerun = [f"root={root}", *SMALL, "lam=0.2", "bootstrap.n_resamples=500000"]
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "jobs/sweep.py", *rerun], cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        kill_when(proc, lambda: manifest(run_dir).get("status") == "running" and scores.exists(), log_path, timeout=180)
    assert not (run_dir / "statistics.parquet").exists(), "the kill must land between scores and statistics"
    state = manifest(run_dir)
    assert state["status"] == "running" and state["run_id"] != before.outputs.run_id

    # reports refuse: the new scores (lam=0.2) must never be shown with the old statistics
    with pytest.raises(RunNotFinished, match="not a finished run.*Rerun the same sweep command"):
        open_run(str(run_dir))
    tables = subprocess.run([sys.executable, "jobs/tables.py", f"run={run_dir}"], cwd=REPO, capture_output=True, text=True, timeout=120, check=False)
    assert tables.returncode == 2 and len(tables.stderr.strip().splitlines()) == 1, tables.stderr
    assert "not a finished run" in tables.stderr and "Traceback" not in tables.stderr

    # What is lost: nothing. The killed job's lease is recognised as dead (same machine, PID
    # gone), and the same command finishes from the answer cache: no request sent, a
    # consistent lam=0.2 run.
    done = run_sweep(load_config([*rerun[:-1], "bootstrap.n_resamples=50"]))
    (answers,) = [r for r in done.reports if r.stage == "answers"]
    assert answers.sent == 0 and answers.cached == answers.needed
    after = open_run(str(run_dir))
    assert after.lam == 0.2 and manifest(run_dir)["status"] == "finished"
    depict = after.scores.filter(pl.col("metric") == "depict").sort("item_id")["score"]
    assert not depict.equals(before.scores.filter(pl.col("metric") == "depict").sort("item_id")["score"])


def test_a_file_changed_or_added_after_the_run_is_refused_and_a_copy_still_reads(finished, tmp_path):
    _, run_dir = finished
    copy = tmp_path / "copied_run"
    shutil.copytree(run_dir, copy)  # cp -r / aws s3 sync of a finished run: still one run
    assert open_run(str(copy)).problems == []

    extra = copy / "scores" / "other.parquet"
    shutil.copy(copy / "scores" / "smoke.parquet", extra)  # a second writer's backbone
    with pytest.raises(RunNotFinished, match="other.parquet is not an output of run"):
        open_run(str(copy))
    extra.unlink()

    stats = pl.read_parquet(copy / "statistics.parquet")
    stats.with_columns(pl.col("value") * 0.5).write_parquet(copy / "statistics.parquet")
    with pytest.raises(RunNotFinished, match="statistics.parquet changed after run"):
        open_run(str(copy))
    (copy / "statistics.parquet").unlink()
    with pytest.raises(RunNotFinished, match="listed in manifest.json .* but missing"):
        open_run(str(copy))


def test_unfinished_and_finished_runs_on_s3(finished, moto_s3):
    _, run_dir = finished
    moto_s3.mkdir("runs-outputs")
    for path in run_dir.rglob("*"):
        if path.is_file():
            moto_s3.put(str(path), f"runs-outputs/runs/smoke/{path.relative_to(run_dir)}")
    assert open_run("s3://runs-outputs/runs/smoke").problems == []
    running = {**manifest(run_dir), "status": "running", "run_id": "20261201T000000Z-killed"}
    moto_s3.pipe("runs-outputs/runs/smoke/manifest.json", json.dumps(running).encode())
    with pytest.raises(RunNotFinished, match="run 20261201T000000Z-killed .* is running"):
        open_run("s3://runs-outputs/runs/smoke")


def test_a_second_sweep_on_the_same_run_folder_stops_before_any_work(finished):
    root, run_dir = finished
    before = {p: p.stat().st_mtime_ns for p in run_dir.rglob("*") if p.is_file()}
    cfg = load_config([f"root={root}", *SMALL, "lam=0.3"])
    with Lease(str(run_dir), what="sweep smoke", ttl_s=600):  # the first sweep, still running
        with pytest.raises(LeaseHeld, match="sweep smoke"):
            run_sweep(cfg)
    assert {p: p.stat().st_mtime_ns for p in run_dir.rglob("*") if p.is_file()} == before  # untouched


def test_two_curations_on_one_output(ray_session, tmp_path, capsys):
    root = tmp_path
    write_parquet(root / "in" / "a" / "night-a.parquet", pair_rows(range(6)))
    write_parquet(root / "in" / "b" / "night-b.parquet", pair_rows(range(6, 12)))
    smoke = ["curation=smoke", "compute.progress_bars=false", f"root={root}"]
    env = dict(os.environ, PYTHONUNBUFFERED="1", RAY_ADDRESS=ray_session.get_runtime_context().gcs_address)
    lease_file = root / "curation" / "smoke" / "_lease.json"
    log_path = tmp_path / "first.log"
    with open(log_path, "w") as log:
        first = subprocess.Popen(
            [sys.executable, "jobs/curate.py", *smoke, f"inputs=[{root}/in/a/]"],
            cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        try:
            deadline_ok = _wait_for(lambda: lease_file.exists() or first.poll() is not None, 120)
            assert deadline_ok and first.poll() is None, log_path.read_text()[-2000:]
            # The second curation (another cron entry, another input folder) stops at once.
            code = load_job("curate").main([*smoke, f"inputs=[{root}/in/b/]"])
            err = capsys.readouterr().err.strip().splitlines()
            assert code == 3 and len(err) == 1 and err[0].startswith("busy: ") and "lease.force=true" in err[0], err
            assert first.wait(timeout=240) == 0, log_path.read_text()[-2000:]
        finally:
            if first.poll() is None:
                first.kill()
    # What is lost: nothing. Run again, the second curation processes its shard, and the
    # manifest keeps both nights' shards (before the lease, the later writer dropped the other's).
    second = run_curation(load_curation_config([*smoke, f"inputs=[{root}/in/b/]"]))
    assert len(second.shards) == 1 and not lease_file.exists()
    shards = json.loads((root / "curation" / "smoke" / "manifest.json").read_text())["shards"]
    assert sorted(Path(uri).name for uri in shards) == ["night-a.parquet", "night-b.parquet"]


def _wait_for(condition, timeout: float) -> bool:
    import time

    deadline = time.time() + timeout
    while time.time() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return False
