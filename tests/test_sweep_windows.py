"""The sweep in windows of items: the same output files as one pass, and a run killed in the
middle of a window resuming to those outputs while sending only what the kill lost."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
from killing import kill_when, settled
from same_outputs import assert_same_table

from operators import schema
from pipeline.config import ConfigError, load_config
from pipeline.store.parts import PartStore
from pipeline.sweep import run_sweep

REPO = Path(__file__).resolve().parent.parent
ZERO = ["sweep=smoke", "backbones=[zero-cost]", "benchmarks=[demo]", "compute.progress_bars=false", "bootstrap.n_resamples=50"]
# every file a finished run lists, less the summary (it prints wall times)
TABLES = ("items", "questions", "scores/zero-cost", "records/zero-cost", "statistics", "deltas", "errors")

pytestmark = pytest.mark.slow


def config(root, *extra):
    return load_config([f"root={root}", *ZERO, *extra])


def tables(run_dir) -> dict[str, pl.DataFrame]:
    """The run's tables, with the run's root folder (in image paths) written as <root>."""
    root = str(Path(run_dir).parents[1])
    def local(frame: pl.DataFrame) -> pl.DataFrame:
        return frame.with_columns(pl.col(pl.String).str.replace_all(root, "<root>", literal=True))
    return {name: local(pl.read_parquet(f"{run_dir}/{name}.parquet")) for name in TABLES}


def listed(run_dir) -> set[str]:
    return set(json.loads((Path(run_dir) / "manifest.json").read_text())["outputs"])


def answers_report(result):
    (report,) = [r for r in result.reports if r.stage == "answers"]
    return report


@pytest.fixture(scope="module")
def one_pass(ray_session, tmp_path_factory):
    root = tmp_path_factory.mktemp("one_pass")
    return run_sweep(config(root, "window_items=null"))


def test_window_items_must_be_positive(tmp_path):
    with pytest.raises(ConfigError, match="window_items"):
        config(tmp_path, "window_items=0")


def test_windowed_sweep_writes_what_one_pass_writes(one_pass, tmp_path):
    windowed = run_sweep(config(tmp_path, "window_items=7"))
    n_items = pl.read_parquet(f"{one_pass.run_dir}/items.parquet").height
    assert n_items > 3 * 7 and n_items % 7  # several windows, the last one partial
    got, want = tables(windowed.run_dir), tables(one_pass.run_dir)
    for name in TABLES:  # same rows in the same order: scores, records, statistics
        assert_same_table(name, got[name], want[name])
    assert listed(windowed.run_dir) == listed(one_pass.run_dir)  # no scratch left among the outputs
    assert not (Path(windowed.run_dir) / "_windows").exists()
    # requests shared across windows are answered once: the same counts as one pass
    w, o = answers_report(windowed), answers_report(one_pass)
    assert (w.needed, w.cached, w.sent, w.failed) == (o.needed, o.cached, o.sent, o.failed)
    assert w.answer_mass.equals(o.answer_mass)
    # the answers of earlier windows were compacted between windows (searched by key index)
    answers_dir = tmp_path / "store" / "answers" / "zero-cost"
    compacted = list(answers_dir.glob("part-k*.parquet"))
    assert compacted and all(Path(f"{p}.keyidx").is_file() for p in compacted)
    keys = pl.concat([pl.read_parquet(p, columns=["key"]) for p in answers_dir.glob("part-*.parquet")])["key"]
    assert keys.len() == keys.n_unique() == o.needed
    again = run_sweep(config(tmp_path, "window_items=7"))
    assert answers_report(again).sent == 0 and answers_report(again).cached == o.needed


def test_a_sweep_killed_mid_window_resumes_to_the_same_outputs(ray_session, one_pass, tmp_path):
    # small parts in small Ray batches (a worker finishes its batch after the kill); the job joins this Ray
    args = ["window_items=7", "compute.rows_per_part=2", "compute.rows_per_batch=8"]
    env = dict(os.environ, PYTHONUNBUFFERED="1", RAY_ADDRESS=ray_session.get_runtime_context().gcs_address)
    answers_dir = tmp_path / "store" / "answers" / "zero-cost"
    needed = answers_report(one_pass).needed
    scratch = tmp_path / "runs" / Path(one_pass.run_dir).name / "_windows"
    seen: dict[str, int] = {}

    def inside_second_window() -> bool:
        """Window 1's records are in the scratch folder and window 2 has written a few parts."""
        if not list(scratch.glob("*/records-*.parquet")):
            return False
        parts = len(list(answers_dir.glob("part-*.parquet")))
        return parts >= seen.setdefault("window 1 done", parts) + 3

    log_path = tmp_path / "killed.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "jobs/sweep.py", f"root={tmp_path}", *ZERO, *args],
            cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        kill_when(proc, inside_second_window, log_path)
    store = PartStore(str(answers_dir), schema.ANSWERS)
    settled(lambda: len(store.part_paths()), quiet_s=3)
    written = len(store.keys())
    assert 0 < written < needed, "the kill must land in the middle of the answers"
    assert scratch.is_dir()  # the killed run's scratch is left behind; the rerun removes it, lists none of it

    resumed = run_sweep(config(tmp_path, *args))
    report = answers_report(resumed)
    assert report.cached == written and report.sent == needed - written  # only what the kill lost is sent
    keys = pl.concat([pl.read_parquet(p, columns=["key"]) for p in store.part_paths()])
    assert keys.height == keys["key"].n_unique() == needed  # no answer stored twice
    got, want = tables(resumed.run_dir), tables(one_pass.run_dir)
    for name in TABLES:
        assert_same_table(name, got[name], want[name])
    assert listed(resumed.run_dir) == listed(one_pass.run_dir)
