"""End-to-end nightly curation on local Ray with the zero-cost engine: incremental nights, a
no-op rerun, re-deciding without model work, bad input, and SIGKILL + resume."""
from __future__ import annotations

import hashlib
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq
import pytest
from curation_shards import (
    CORRUPT_PNG,
    caption,
    pair_rows,
    tar_samples,
    write_parquet,
    write_tar,
)
from killing import kill_when, settled
from scipy.special import expit

from operators import schema
from pipeline.curation.curation_config import load_curation_config
from pipeline.curation.report import summary_text
from pipeline.curation.run import run_curation
from pipeline.curation.shards import discover, read_shard
from pipeline.store.parts import PartStore

REPO = Path(__file__).resolve().parent.parent
SMOKE = ["curation=smoke", "compute.progress_bars=false"]
QUESTIONS_PER_CAPTION = 3  # the smoke preset's scripted generator writes three questions
REQUESTS_PER_PAIR = 2 * QUESTIONS_PER_CAPTION + 1  # on the image, from the caption, holistic

pytestmark = pytest.mark.slow


def config(root: Path, *extra: str):
    return load_curation_config([*SMOKE, f"root={root}", f"inputs=[{root}/in/]", *extra])


def snapshot(folder: Path) -> dict[str, tuple[int, str]]:
    """Every file under `folder`: (mtime in ns, hash of the bytes)."""
    return {
        str(p.relative_to(folder)): (p.stat().st_mtime_ns, hashlib.blake2b(p.read_bytes(), digest_size=8).hexdigest())
        for p in sorted(folder.rglob("*")) if p.is_file()
    }


def tables(output: Path, kind: str) -> dict[str, pl.DataFrame]:
    return {p.stem: pl.read_parquet(p) for p in sorted((output / kind).glob("*.parquet"))}


def shard_id(path: Path) -> str:
    (shard,) = discover([str(path)])
    return shard.shard_id


@pytest.fixture(scope="module")
def nights(ray_session, tmp_path_factory):
    """Night 1 (two shards, a duplicate pair, a corrupt image, an empty caption, a broken shard),
    night 2 (one new shard), a rerun, two re-decisions and a changed shard, in that order;
    what each step left behind is captured as it happens."""
    root = tmp_path_factory.mktemp("curation")
    out = root / "curation" / "smoke"
    seen: dict = {"root": root, "out": out}

    a_rows = pair_rows(range(6))
    a_rows[2]["image"] = CORRUPT_PNG
    a_rows[4]["caption"] = "  "
    seen["a"] = write_parquet(root / "in" / "day1" / "a.parquet", a_rows)
    seen["b"] = write_tar(root / "in" / "day1" / "b.tar", tar_samples([0, 10, 11, 12, 13]))  # sample 0 repeats a.parquet row 0
    broken = root / "in" / "day1" / "z.parquet"
    broken.write_bytes(b"PAR1 but truncated")
    seen["night1"] = run_curation(config(root))
    seen["night1_decisions"] = tables(out, "decisions")
    seen["night1_evidence"] = tables(out, "evidence")
    seen["night1_filtered"] = {p.stem: pq.read_table(p) for p in sorted((out / "filtered").glob("*.parquet"))}
    seen["night1_manifest"] = json.loads((out / "manifest.json").read_text())
    seen["night1_stored"] = PartStore(str(root / "store" / "answers" / "zero-cost"), schema.ANSWERS).read().num_rows
    broken.unlink()  # the data team removes the broken upload

    before = snapshot(out)
    seen["c"] = write_parquet(root / "in" / "day2" / "c.parquet", pair_rows([1, 20, 21, 22], image="path", folder=root / "in" / "day2"))
    seen["night2"] = run_curation(config(root))
    seen["night2_changed"] = {k for k, v in snapshot(out).items() if before.get(k) != v}

    before = snapshot(root)
    seen["rerun"] = run_curation(config(root))
    seen["rerun_changed"] = {k for k, v in snapshot(root).items() if before.get(k) != v} | (before.keys() - snapshot(root).keys())

    store_before = snapshot(root / "store")
    seen["decided"] = run_curation(config(root, "decide_only=true", "min_score=0.7"))
    seen["decided_decisions"] = tables(out, "decisions")
    seen["decided_filtered"] = tables(out, "filtered")
    before = snapshot(out / "filtered")
    seen["decided_again"] = run_curation(config(root, "decide_only=true", "min_score=0.7"))
    seen["decided_again_changed"] = {k for k, v in snapshot(out / "filtered").items() if before.get(k) != v}
    seen["top"] = run_curation(config(root, "decide_only=true", "min_score=null", "top_fraction=0.5"))
    seen["top_decisions"] = tables(out, "decisions")
    seen["store_changed_by_decide"] = snapshot(root / "store") != store_before

    write_parquet(seen["c"], pair_rows([22, 20]))  # shard c is replaced upstream (pairs already answered)
    seen["changed"] = run_curation(config(root, "min_score=null", "top_fraction=0.5"))

    before = tables(out, "decisions")
    seen["retried"] = run_curation(config(root, "min_score=null", "top_fraction=0.5", "retry_failed=true"))
    seen["retried_changed"] = {k for k, v in tables(out, "decisions").items() if not before[k].equals(v)}
    return seen


def test_first_night_scores_every_pair_once_and_reports_bad_rows(nights):
    result = nights["night1"]
    a, b = shard_id(nights["a"]), shard_id(nights["b"])
    assert {s.shard_id for s in result.shards} == {a, b}
    stats = {s.shard_id: s for s in result.shards}
    assert (stats[a].rows_in, stats[a].failed) == (6, 2) and (stats[b].rows_in, stats[b].failed) == (5, 0)
    reasons = {(r["item_id"], r["reason"]) for r in result.errors.iter_rows(named=True)}
    assert (f"{a}/2", "unreadable_image") in reasons and (f"{a}/4", "empty_caption") in reasons
    assert any(r["reason"] == "unreadable_shard" and "z.parquet" in r["detail"] for r in result.errors.iter_rows(named=True))

    # 8 distinct (image, caption) pairs: a.parquet rows 0, 1, 3, 5 and the tar's 10..13 (its 0 repeats a's)
    assert result.stage("questions").needed == result.stage("questions").sent == 8
    answers = result.stage("answers")
    assert answers.needed == answers.sent == 8 * REQUESTS_PER_PAIR
    assert nights["night1_stored"] == 8 * REQUESTS_PER_PAIR

    decisions = nights["night1_decisions"]
    da, db = decisions[a], decisions[b]
    assert da["error"].to_list() == [None, None, "unreadable_image", None, "empty_caption", None]
    assert db["score_depict"][0] == da["score_depict"][0]  # the repeated pair: same answers, same score
    for d in (da, db):
        expected = (d["score_depict"] >= 0.5).fill_null(False)
        assert d["keep"].to_list() == expected.to_list()
    manifest = nights["night1_manifest"]
    assert sorted(e["shard_id"] for e in manifest["shards"].values()) == sorted([a, b])  # the broken shard is retried next run


def test_filtered_shards_keep_the_original_columns_of_the_kept_rows(nights):
    a, b = shard_id(nights["a"]), shard_id(nights["b"])
    for name, path, fmt in ((a, nights["a"], "parquet"), (b, nights["b"], "webdataset")):
        source = read_shard(str(path), fmt)
        decisions = nights["night1_decisions"][name]
        kept_rows = decisions.filter("keep")["row"].to_list()
        filtered = nights["night1_filtered"][name]
        assert filtered.column_names == source.column_names + ["score_depict", "score_agree", "score_vqascore"]
        assert filtered.select(source.column_names).equals(source.take(kept_rows))
        assert filtered.column("score_depict").to_pylist() == decisions.filter("keep")["score_depict"].to_list()
    assert set(nights["night1_filtered"][b].column_names) >= {"__key__", "png", "txt"}


def test_evidence_has_each_question_with_both_answers(nights):
    a = shard_id(nights["a"])
    evidence = nights["night1_evidence"][a]
    assert sorted(set(evidence["row"].to_list())) == [0, 1, 3, 5]
    assert evidence.group_by("row").len()["len"].to_list() == [QUESTIONS_PER_CAPTION] * 4
    assert set(evidence["caption"]) == {caption(i) for i in (0, 1, 3, 5)}
    assert evidence["p_v"].to_numpy() == pytest.approx(expit(evidence["logp_yes_v"].to_numpy() - evidence["logp_no_v"].to_numpy()))
    assert evidence["p_t"].to_numpy() == pytest.approx(expit(evidence["logp_yes_t"].to_numpy() - evidence["logp_no_t"].to_numpy()))


def test_run_report_counts_and_histogram(nights):
    result = nights["night1"]
    run_dir = Path(result.run_dir)
    report = json.loads((run_dir / "report.json").read_text())
    assert report["total"] == {"rows_in": 11, "kept": result.totals()["kept"], "dropped": 9 - result.totals()["kept"], "failed": 2}
    assert report["errors_by_reason"] == {"ingest/empty_caption": 1, "ingest/unreadable_image": 1, "ingest/unreadable_shard": 1}
    assert (run_dir / "histogram.png").read_bytes().startswith(b"\x89PNG")
    markdown = (run_dir / "report.md").read_text()
    assert "| **total** | 11 |" in markdown and "histogram.png" in markdown and str(nights["a"]) in markdown
    assert pl.read_parquet(run_dir / "errors.parquet").height == 3


def test_second_night_scores_only_the_new_shard(nights):
    result = nights["night2"]
    c = shard_id(nights["c"])
    assert [s.shard_id for s in result.shards] == [c] and result.unchanged == 2
    answers = result.stage("answers")
    # c holds 4 pairs; its first repeats a.parquet row 1, whose answers are cached
    assert (answers.needed, answers.cached, answers.sent) == (4 * REQUESTS_PER_PAIR, REQUESTS_PER_PAIR, 3 * REQUESTS_PER_PAIR)
    assert (result.stage("questions").cached, result.stage("questions").sent) == (1, 3)
    # only c's outputs, the manifest and the new run folder were written
    changed = nights["night2_changed"]
    assert {k.split("/")[0] for k in changed} == {"decisions", "evidence", "errors", "filtered", "manifest.json", "runs"}
    assert all(c in k or k == "manifest.json" or k.startswith(f"runs/{result.run_id}/") for k in changed)


def test_rerunning_the_same_night_does_nothing(nights):
    result = nights["rerun"]
    assert result.run_id is None and result.shards == [] and result.unchanged == 3
    assert result.reports == []  # no stage ran: nothing sent to any model
    assert nights["rerun_changed"] == set()
    # ... and says that a shard it skipped has failed rows, and how to process it again
    assert result.skipped_with_failures == 1
    assert "1 of the skipped shard(s) have failed rows" in summary_text(result) and "retry_failed=true" in summary_text(result)


def test_retry_failed_processes_again_only_the_shards_with_failed_rows(nights):
    """The cure for rows that failed on something since repaired (an image fixed on disk): the
    shard is processed again, its answers from the cache; shards without failures are skipped."""
    result = nights["retried"]
    a = shard_id(nights["a"])
    assert [s.shard_id for s in result.shards] == [a] and result.unchanged == 2
    answers = result.stage("answers")
    assert answers.sent == 0 and answers.cached == answers.needed > 0
    assert result.shards[0].failed == 2  # the corrupt image and the empty caption are still bad
    assert nights["retried_changed"] == set()  # the same decisions as the night before it


def test_a_new_rule_is_applied_to_stored_scores_without_model_work(nights):
    decided = nights["decided"]
    assert decided.mode == "decide" and decided.reports == [] and not nights["store_changed_by_decide"]
    assert not (Path(decided.run_dir) / "scores").exists() and (Path(decided.run_dir) / "report.md").exists()
    for name, d in nights["decided_decisions"].items():
        assert d["keep"].to_list() == (d["score_depict"] >= 0.7).fill_null(False).to_list()
        assert nights["decided_filtered"][name].height == d["keep"].sum()
        assert nights["decided_filtered"][name]["score_depict"].min() is None or nights["decided_filtered"][name]["score_depict"].min() >= 0.7
    assert decided.totals()["kept"] < nights["night1"].totals()["kept"] + nights["night2"].totals()["kept"]
    # the same rule again: no decision changes, nothing rewritten
    assert nights["decided_again_changed"] == set()
    for d in nights["top_decisions"].values():
        n_scored = d["score_depict"].is_not_null().sum()
        assert d["keep"].sum() == math.ceil(0.5 * n_scored)
        assert d.filter("keep")["score_depict"].min() > d.filter(~pl.col("keep") & pl.col("error").is_null())["score_depict"].max()
    manifest = json.loads((nights["out"] / "manifest.json").read_text())
    assert all(e["rule"] == {"metric": "depict", "min_score": None, "top_fraction": 0.5} for e in manifest["shards"].values())


def test_a_changed_shard_is_scored_again_and_replaces_its_outputs(nights):
    result = nights["changed"]
    c = shard_id(nights["c"])
    assert [s.shard_id for s in result.shards] == [c] and result.unchanged == 2
    answers = result.stage("answers")
    assert (answers.needed, answers.cached, answers.sent) == (2 * REQUESTS_PER_PAIR, 2 * REQUESTS_PER_PAIR, 0)
    decisions = pl.read_parquet(nights["out"] / "decisions" / f"{c}.parquet")
    assert decisions.height == 2 and decisions["keep"].sum() == 1  # top half of 2
    filtered = pl.read_parquet(nights["out"] / "filtered" / f"{c}.parquet")
    best = decisions.sort("score_depict")["row"][-1]
    assert filtered["caption"].to_list() == [[caption(22), caption(20)][best]]


# -- SIGKILL in the middle of the answers, then resume ------------------------------------------------


def write_kill_inputs(root: Path) -> None:
    write_parquet(root / "in" / "a.parquet", pair_rows(range(16)))
    write_tar(root / "in" / "b.tar", tar_samples(range(16, 32)))


# many small parts, so the kill lands between two of them; small Ray batches, since a worker
# finishes the batch in its hands after the driver is killed
KILL = ["compute.rows_per_part=4", "compute.rows_per_batch=16"]


def test_killed_curation_resumes_to_the_same_outputs(ray_session, tmp_path):
    reference_root, root = tmp_path / "reference", tmp_path / "killed"
    write_kill_inputs(reference_root)
    write_kill_inputs(root)

    # The job joins the test session's Ray (as `ray job submit` joins a cluster): no second Ray to start.
    env = dict(os.environ, PYTHONUNBUFFERED="1", RAY_ADDRESS=ray_session.get_runtime_context().gcs_address)
    log_path = tmp_path / "killed.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "jobs/curate.py", *SMOKE, f"root={root}", f"inputs=[{root}/in/]", *KILL],
            cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        answers_dir = root / "store" / "answers" / "zero-cost"
        kill_when(proc, lambda: len(list(answers_dir.glob("part-*.parquet"))) >= 6, log_path, timeout=120)
    store = PartStore(str(answers_dir), schema.ANSWERS)
    settled(lambda: len(store.part_paths()), quiet_s=1)
    written = len(store.keys())
    needed = 32 * REQUESTS_PER_PAIR
    assert 0 < written < needed, "the kill must land in the middle of the answers stage"
    assert not (root / "curation" / "smoke" / "manifest.json").exists()

    resumed = run_curation(config(root, *KILL))
    assert resumed.totals()["rows_in"] == 32 and len(resumed.shards) == 2
    answers = resumed.stage("answers")
    assert (answers.needed, answers.cached, answers.sent) == (needed, written, needed - written)
    keys = pl.concat([pl.read_parquet(p, columns=["key"]) for p in store.part_paths()])
    assert keys.height == keys["key"].n_unique() == needed  # no answer stored twice

    # The uninterrupted reference cuts bigger parts (faster); the zero-cost engine answers each
    # prompt on its own, so part boundaries cannot change a number.
    reference = run_curation(config(reference_root))
    assert reference.stage("answers").sent == needed
    out, ref_out = root / "curation" / "smoke", reference_root / "curation" / "smoke"
    for kind in ("filtered", "decisions", "evidence"):
        got, want = tables(out, kind), tables(ref_out, kind)  # shard ids differ: they hash the full path
        assert [k.split("-")[0] for k in got] == [k.split("-")[0] for k in want] == ["a", "b"]
        for got_table, want_table in zip(got.values(), want.values(), strict=True):
            assert got_table.drop("item_id", strict=False).equals(want_table.drop("item_id", strict=False)), kind
    for filtered in tables(out, "filtered").values():
        key = "__key__" if "__key__" in filtered.columns else "url"
        assert filtered[key].n_unique() == filtered.height  # no row published twice
