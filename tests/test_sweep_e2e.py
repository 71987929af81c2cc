"""End-to-end: the smoke sweep on local Ray, its determinism, dedup, resume and bad input."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
from killing import kill_when, settled

from operators import schema
from pipeline.config import load_config
from pipeline.store.parts import PartStore
from pipeline.sweep import run_sweep

REPO = Path(__file__).resolve().parent.parent
SMOKE = ["sweep=smoke", "compute.rows_per_part=16", "compute.progress_bars=false", "bootstrap.n_resamples=50"]
# For runs whose subject is answers and scores, not statistics (first_run computes them all):
# the demo's correlation statistics cut to SRCC, a tenth of a small sweep's metaeval time.
SRCC_ONLY = "benchmark_overrides.demo.protocol.statistics=[srcc]"

pytestmark = pytest.mark.slow


def smoke(root, *extra):
    return load_config([f"root={root}", *SMOKE, *extra])


def sorted_scores(run_dir) -> pl.DataFrame:
    return pl.read_parquet(f"{run_dir}/scores/smoke.parquet").sort("item_id", "metric")


@pytest.fixture(scope="module")
def first_run(ray_session, tmp_path_factory, tiny_vlm_dir):
    root = tmp_path_factory.mktemp("sweep_a")
    cfg = smoke(root)
    return cfg, run_sweep(cfg)


def test_smoke_sweep_scores_every_item_with_every_metric(first_run):
    cfg, result = first_run
    items = pl.read_parquet(f"{result.run_dir}/items.parquet")
    scores = sorted_scores(result.run_dir)
    assert set(items["benchmark"]) == {"demo", "demo_winoground", "demo_mcq"}
    assert scores.height == items.height * len(cfg.sweep.metrics)
    assert set(scores["metric"]) == set(cfg.sweep.metrics)
    # random weights still give finite numbers everywhere: nothing failed silently
    assert scores["score"].null_count() == 0
    assert result.errors.height == 0
    stats = result.statistics
    assert {"demo", "demo_winoground", "demo_mcq"} <= set(stats["benchmark"])
    assert {"srcc", "plcc", "pairwise_acc", "text_acc", "image_acc", "group_acc", "accuracy"} <= set(stats["statistic"])
    assert set(result.deltas["benchmark"]) == {"demo", "demo_winoground", "demo_mcq"}
    for name in ("manifest.json", "summary.txt", "statistics.csv", "errors.parquet", "questions.parquet", "records/smoke.parquet"):
        assert (Path(result.run_dir) / name).exists(), name


def test_requests_are_deduplicated(first_run):
    cfg, result = first_run
    (answers,) = [r for r in result.reports if r.stage == "answers"]
    keys = PartStore(f"{cfg.sweep.store}/answers/smoke", schema.ANSWERS).read()
    # every request sent exactly once, one stored answer per distinct key
    assert answers.sent == answers.needed == keys.num_rows
    records = pl.read_parquet(f"{result.run_dir}/records/smoke.parquet")
    items = pl.read_parquet(f"{result.run_dir}/items.parquet")
    depict = records.filter(pl.col("question_set") == "depict")
    caption_only = pl.from_arrow(keys).filter(pl.col("kind") == "caption").height
    assert caption_only == depict.select("caption", "question").n_unique()
    assert caption_only < depict.height  # fewer than items x questions
    holistic = pl.from_arrow(keys).filter(pl.col("kind") == "holistic").height
    assert holistic == items.select("image_hash", "caption").n_unique()
    image = pl.from_arrow(keys).filter(pl.col("kind") == "image").height
    assert image == records.select("image_hash", "question").n_unique()


def test_second_run_is_identical_and_a_rerun_sends_nothing(first_run, tmp_path):
    cfg, result = first_run
    other = run_sweep(smoke(tmp_path, SRCC_ONLY))
    assert sorted_scores(other.run_dir).equals(sorted_scores(result.run_dir))
    # the finished unit left a success marker, so the rerun skips it without listing the store
    assert len(list((Path(cfg.sweep.store) / "answers" / "smoke" / "_markers").glob("answers-*.json"))) == 1
    again = run_sweep(cfg)
    (answers,) = [r for r in again.reports if r.stage == "answers"]
    assert answers.sent == 0 and answers.cached == answers.needed
    assert sorted_scores(again.run_dir).equals(sorted_scores(result.run_dir))


def test_killed_sweep_resumes_without_resending_written_answers(ray_session, first_run, tmp_path):
    cfg, reference = first_run
    # the job joins this session's Ray (starting its own cost ~10 s); its SIGKILL takes its workers with it
    env = dict(os.environ, PYTHONUNBUFFERED="1", RAY_ADDRESS=ray_session.get_runtime_context().gcs_address)
    log_path = tmp_path / "killed.log"
    answers_dir = tmp_path / "store" / "answers" / "smoke"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            # Ray batches of 4 parts: a worker finishes the batch in its hands after the kill,
            # so with one batch for the whole stage there would be nothing left to resume
            [sys.executable, "jobs/sweep.py", f"root={tmp_path}", *SMOKE, SRCC_ONLY, "compute.num_cpus=2", "compute.rows_per_batch=64"],
            cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        kill_when(proc, lambda: len(list(answers_dir.glob("part-*.parquet"))) >= 3, log_path)
    store = PartStore(str(answers_dir), schema.ANSWERS)
    settled(lambda: len(store.part_paths()), quiet_s=3)
    written = set(store.keys().to_pylist())
    (ref_answers,) = [r for r in reference.reports if r.stage == "answers"]
    assert 0 < len(written) < ref_answers.needed, "the kill must land in the middle of the answers stage"

    resumed = run_sweep(smoke(tmp_path, SRCC_ONLY))
    (answers,) = [r for r in resumed.reports if r.stage == "answers"]
    assert answers.cached == len(written)
    assert answers.sent == answers.needed - len(written)  # nothing already written is asked again
    # every key was written exactly once across all parts
    keys = pl.concat([pl.read_parquet(p, columns=["key"]) for p in store.part_paths()])
    assert keys.height == keys["key"].n_unique() == answers.needed
    assert sorted_scores(resumed.run_dir).equals(sorted_scores(reference.run_dir))


def test_bad_inputs_become_error_rows_and_the_sweep_completes(ray_session, tmp_path):
    from benchmark_files import write_negbench

    data_root = tmp_path / "datasets"
    written = write_negbench(data_root / "negbench", n_rows=6)
    # rows 0 and 1 share a corrupt image, row 3 has an empty caption, row 2's captions get an
    # unparseable generation
    image = sorted((data_root / "negbench" / "val2017").glob("*.jpg"))[0]
    image.write_bytes(b"\xff\xd8\xff\xe0 this is not a jpeg")
    csv_path = data_root / "negbench" / "images" / "COCO_val_mcq_llama3.1_rephrased.csv"
    lines = csv_path.read_text().splitlines()
    lines[4] = lines[4].replace("This image features object 3-1.", "")
    csv_path.write_text("\n".join(lines) + "\n")
    generations = [
        {"contains": "object 2-", "text": "Sorry, I cannot describe that."},
        {"contains": "Description:", "text": '["Is there an object?", "Is the object visible?"]'},
    ]
    cfg = load_config(
        [f"root={tmp_path}", f"data_root={data_root}", "compute.progress_bars=false", "bootstrap.n_resamples=20"],
        overrides={
            "name": "bad-input",
            "backbones": ["zero-cost"],
            "benchmarks": ["negbench"],
            "metrics": ["depict", "agree", "vqascore"],
            "baselines": ["vqascore"],
            "questions": {"source": "model", "generator": "zero-cost", "sets": ["depict"]},
            "backbone_overrides": {"zero-cost": {"engine_options": {"generations": generations}}},
        },
    )
    result = run_sweep(cfg)
    reasons = result.errors.group_by("stage", "reason").len()
    counts = {(r["stage"], r["reason"]): r["len"] for r in reasons.iter_rows(named=True)}
    assert counts[("ingest", "bad_record")] == 1  # the row with an empty caption
    assert counts[("ingest", "unreadable_image")] == 8  # rows 0 and 1: 4 captions each
    assert counts[("questions", "unparseable_generation")] == 4  # 4 distinct captions of row 2
    scores = pl.read_parquet(f"{result.run_dir}/scores/zero-cost.parquet")
    assert scores["item_id"].n_unique() == 4 * (written.groups - 3)  # rows 2, 4, 5 scored
    no_questions = scores.filter((pl.col("metric") == "agree") & pl.col("score").is_null())
    assert no_questions.height == 4 and set(no_questions["note"]) == {"no_questions"}
    assert scores.filter(pl.col("metric") == "vqascore")["score"].null_count() == 0
    summary = (Path(result.run_dir) / "summary.txt").read_text()
    assert "unreadable_image: 8" in summary and "unparseable_generation: 4" in summary
