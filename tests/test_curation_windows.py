"""Curation in windows of whole shards: the same outputs as one pass, the driver holding one
window at a time, and a job killed in the middle of a window resuming to the same outputs."""
from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from curation_shards import pair_rows, tar_samples, write_parquet, write_tar
from killing import kill_when, settled

from operators import schema
from pipeline.config import ConfigError
from pipeline.curation.curation_config import load_curation_config
from pipeline.curation.report import histogram_png, run_histogram
from pipeline.curation.run import run_curation
from pipeline.curation.shards import Shard, count_rows, discover
from pipeline.curation.windows import plan_windows, shard_row_counts
from pipeline.store.parts import PartStore

REPO = Path(__file__).resolve().parent.parent
SMOKE = ["curation=smoke", "compute.progress_bars=false"]
PER_PAIR = 7  # the smoke preset: three questions on the image and from the caption, one holistic

pytestmark = pytest.mark.slow


def write_inputs(root: Path) -> None:
    write_parquet(root / "in" / "a.parquet", pair_rows(range(12)))
    write_tar(root / "in" / "b.tar", tar_samples(range(12, 24)))
    write_parquet(root / "in" / "c.parquet", pair_rows([3, *range(24, 35)]))  # pair 3 again: a repeat across windows


def config(root: Path, *extra: str):
    return load_curation_config([*SMOKE, f"root={root}", f"inputs=[{root}/in/]", *extra])


def outputs(root: Path) -> dict[str, pl.DataFrame]:
    out = root / "curation" / "smoke"
    return {f"{kind}/{p.stem.split('-')[0]}": pl.read_parquet(p).drop("item_id", strict=False)
            for kind in ("filtered", "decisions", "evidence", "errors") for p in sorted((out / kind).glob("*.parquet"))}


def test_plan_windows_bounds_shards_and_bytes():
    shards = [Shard(uri=f"/s/{i}.parquet", size=size, version="v", format="parquet") for i, size in enumerate([5, 5, 20, 1, 1, 1])]
    sizes = lambda ws: [len(w) for w in ws]  # noqa: E731
    assert sizes(plan_windows(shards, None, None)) == [6]
    assert sizes(plan_windows(shards, 2, None)) == [2, 2, 2]
    assert sizes(plan_windows(shards, None, 10 / 1024**3)) == [2, 1, 3]  # a shard over the limit is a window of its own
    assert sizes(plan_windows(shards, 2, 10 / 1024**3)) == [2, 1, 2, 1]
    assert [s for w in plan_windows(shards, 4, 7 / 1024**3) for s in w] == shards  # order kept, nothing lost
    assert plan_windows([], 2, 1.0) == []


def test_plan_windows_bounds_pairs():
    shards = [Shard(uri=f"/s/{i}.parquet", size=1, version="v", format="parquet") for i in range(5)]
    rows = {s.uri: n for s, n in zip(shards, [40, 70, 30, 200, 10], strict=True)}
    sizes = lambda ws: [len(w) for w in ws]  # noqa: E731
    # tiny files holding many rows: bytes alone would put them in one window
    assert sizes(plan_windows(shards, None, 1.0, 100, rows)) == [1, 2, 1, 1]  # 40 | 70+30 | 200 (over: alone) | 10
    assert sizes(plan_windows(shards, 2, None, 1000, rows)) == [2, 2, 1]  # every limit applies
    with pytest.raises(ValueError, match="row counts"):
        plan_windows(shards, None, None, 100)


def test_row_counts_come_from_footers_and_tar_headers(tmp_path):
    write_inputs(tmp_path)
    write_tar(tmp_path / "in" / "d.tar.gz", tar_samples(range(40, 45)))
    found = {Path(s.uri).name: s for s in discover([f"{tmp_path}/in/"])}
    assert count_rows(found["a.parquet"]) == (12, True)
    assert count_rows(found["b.tar"]) == (12, True)  # members grouped by key: png + txt are one row
    rows, exact = count_rows(found["d.tar.gz"])  # compressed: estimated from the size, and said so
    assert not exact and rows >= 1
    assert shard_row_counts([found["a.parquet"], found["c.parquet"]]) == {found["a.parquet"].uri: 12, found["c.parquet"].uri: 12}


def test_run_histogram_counts_every_scored_row_once(ray_session, tmp_path):
    write_inputs(tmp_path)
    cfg = config(tmp_path, "window_pairs=12", "min_score=0.3")
    result = run_curation(cfg)
    assert len(list((tmp_path / "curation" / "smoke" / "runs" / result.run_id / "windows").iterdir())) == 3
    counts, edges = run_histogram(result.output, result.shards, "depict")
    decisions = pl.concat([pl.read_parquet(tmp_path / "curation" / "smoke" / "decisions" / f"{s.shard_id}.parquet") for s in result.shards])
    scored = decisions.filter(pl.col("error").is_null())["score_depict"]
    assert int(counts.sum()) == scored.len() == 36  # pair 3 twice: two input rows
    assert counts.tolist() == np.histogram(scored.to_numpy(), bins=len(counts), range=(edges[0], edges[-1]))[0].tolist()
    assert histogram_png(scored.to_list(), result_rule(cfg), result.shards).startswith(b"\x89PNG")


def result_rule(cfg):
    from pipeline.curation.rule import Rule

    return Rule.from_config(cfg.sweep)


@pytest.mark.parametrize("override", ["window_shards=0", "window_gb=0", "window_pairs=0"])
def test_bad_window_settings_are_config_errors(tmp_path, override):
    with pytest.raises(ConfigError, match=override.split("=")[0]):
        config(tmp_path, override)


def test_windowed_curation_publishes_what_one_pass_publishes(ray_session, tmp_path):
    one, windowed = tmp_path / "one", tmp_path / "windowed"
    write_inputs(one)
    write_inputs(windowed)
    single = run_curation(config(one, "window_gb=null"))
    owned = set(ray_session._private.worker.global_worker.core_worker.get_all_reference_counts())
    result = run_curation(config(windowed, "window_shards=1"))
    # the windows leave no Ray dataset, streaming executor or object reference behind
    gc.collect()
    kept = {"Dataset", "MaterializedDataset", "StreamingExecutor", "OpState", "RefBundle"}
    assert not [o for o in gc.get_objects() if type(o).__name__ in kept and str(type(o).__module__).startswith("ray.data")]
    assert set(ray_session._private.worker.global_worker.core_worker.get_all_reference_counts()) <= owned
    assert (windowed / "curation" / "smoke" / "runs" / result.run_id / "windows" / "0002" / "scores").is_dir()
    got, want = outputs(windowed), outputs(one)
    assert list(got) == list(want) and len(got) == 12
    for name in want:
        assert got[name].equals(want[name]), name
    assert result.totals() == single.totals()
    # the repeated pair is answered once across windows, as in one pass; one report per stage
    assert [r.stage for r in result.reports] == [r.stage for r in single.reports]
    assert result.stage("answers").sent == single.stage("answers").sent == 35 * PER_PAIR
    manifest = json.loads((windowed / "curation" / "smoke" / "manifest.json").read_text())
    assert len(manifest["shards"]) == 3
    # between windows the stores were compacted: the parts of windows 1-2 are key-indexed (the
    # next window searches their index instead of reading them whole); only the last window's
    # parts are left as written, and every answer is stored once
    for folder, per_window in (("answers/zero-cost", 12 * PER_PAIR), ("generations/zero-cost", 12)):
        store = windowed / "store" / folder
        compacted = sorted(store.glob("part-k*.parquet"))
        assert compacted and all(Path(f"{p}.keyidx").is_file() for p in compacted), folder
        loose = [p for p in store.glob("part-*.parquet") if not p.name.startswith("part-k")]
        assert sum(pl.read_parquet(p, columns=["key"]).height for p in loose) <= per_window, folder
        keys = pl.concat([pl.read_parquet(p, columns=["key"]) for p in store.glob("part-*.parquet")])["key"]
        assert keys.len() == keys.n_unique(), folder
    assert result.timings["compact"] > 0
    assert "compact" not in single.timings  # one window: nothing to compact between windows
    assert run_curation(config(windowed, "window_shards=1")).run_id is None  # nothing left to do


def test_a_job_killed_mid_window_resumes_to_the_same_outputs(ray_session, tmp_path):
    reference, root = tmp_path / "reference", tmp_path / "killed"
    write_inputs(reference)
    write_inputs(root)
    # many small parts in small Ray batches (a worker finishes its batch after the kill): the kill lands inside a window
    args = ["window_shards=1", "compute.rows_per_part=2", "compute.rows_per_batch=8"]
    env = dict(os.environ, PYTHONUNBUFFERED="1", RAY_ADDRESS=ray_session.get_runtime_context().gcs_address)
    manifest_path = root / "curation" / "smoke" / "manifest.json"
    answers_dir = root / "store" / "answers" / "zero-cost"

    def inside_second_window() -> bool:
        # window 1's parts were compacted (into part-k...) before window 2 wrote its own
        try:
            if not manifest_path.exists() or not (compacted := list(answers_dir.glob("part-k*.parquet"))):
                return False
            since = max(p.stat().st_mtime for p in compacted)
            return len([p for p in answers_dir.glob("part-*.parquet") if not p.name.startswith("part-k") and p.stat().st_mtime > since]) >= 4
        except FileNotFoundError:  # a part removed by the compaction meanwhile
            return False

    log_path = tmp_path / "killed.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "jobs/curate.py", *SMOKE, f"root={root}", f"inputs=[{root}/in/]", *args],
            cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        kill_when(proc, inside_second_window, log_path, timeout=240)
    store = PartStore(str(answers_dir), schema.ANSWERS)
    settled(lambda: len(store.part_paths()), quiet_s=1)
    recorded = json.loads(manifest_path.read_text())["shards"]
    assert [Path(u).name for u in recorded] == ["a.parquet"], "the kill must land after window 1 was recorded"
    written = len(store.keys())
    assert 12 * PER_PAIR < written < 35 * PER_PAIR, "the kill must land inside window 2"

    resumed = run_curation(config(root, *args))
    assert [Path(s.shard).name for s in resumed.shards] == ["b.tar", "c.parquet"]  # window 1 is not redone
    answers = resumed.stage("answers")
    assert answers.sent == 35 * PER_PAIR - written and answers.cached == answers.needed - answers.sent
    keys = pl.concat([pl.read_parquet(p, columns=["key"]) for p in store.part_paths()])
    assert keys.height == keys["key"].n_unique() == 35 * PER_PAIR  # no answer stored twice

    run_curation(config(reference, "window_gb=null"))
    got, want = outputs(root), outputs(reference)
    assert list(got) == list(want)
    for name in want:
        assert got[name].equals(want[name]), name
