"""Accidents to a finished run's store, as a user has them: delete an answer part (its success
marker stays behind), truncate one, leave litter. Each rerun recomputes exactly what was lost
and gives the first run's scores; what is lost in the end: nothing."""
from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from operators import schema
from pipeline.config import load_config
from pipeline.store.admin import gc, verify
from pipeline.store.parts import PartStore
from pipeline.sweep import run_sweep

pytestmark = pytest.mark.slow

# The store is the subject, not the statistics (tests/test_sweep_e2e.py computes them all): the
# demo's correlation statistics are cut to SRCC, a tenth of a small sweep's metaeval time.
ARGS = ["sweep=smoke", "compute.rows_per_part=16", "compute.progress_bars=false", "bootstrap.n_resamples=20", "backbones=[zero-cost]",
        "benchmark_overrides.demo.protocol.statistics=[srcc]"]


def scores(result) -> pl.DataFrame:
    return pl.concat([pl.read_parquet(p) for p in sorted(Path(result.run_dir, "scores").glob("*.parquet"))]).sort("item_id", "metric")


def answers_report(result):
    (report,) = [r for r in result.reports if r.stage == "answers"]
    return report


def test_a_damaged_store_heals_on_the_next_run_and_verify_and_gc_report_it(ray_session, tmp_path):
    cfg = load_config([f"root={tmp_path}", *ARGS])
    first = run_sweep(cfg)
    reference = scores(first)
    assert reference["score"].null_count() == 0
    store_dir = tmp_path / "store" / "answers" / "zero-cost"
    store = PartStore(str(store_dir), schema.ANSWERS)
    needed = answers_report(first).needed
    assert list((store_dir / "_markers").glob("*.json")), "the first run leaves a success marker"

    # 1. delete one part; the marker that says "finished" stays. Before: the rerun trusted the
    #    marker (sent 0) and the lost keys' scores came out null, on every rerun.
    parts = sorted(store_dir.glob("part-*.parquet"))
    deleted = pl.read_parquet(parts[0]).height
    parts[0].unlink()
    second = run_sweep(cfg)
    report = answers_report(second)
    assert (report.cached, report.sent, report.failed) == (needed - deleted, deleted, 0)
    assert scores(second).equals(reference)

    # 2. truncate a part. Before: ArrowInvalid on '<Buffer>', naming no file, every rerun.
    victim = sorted(store_dir.glob("part-*.parquet"))[1]
    rows = pl.read_parquet(victim).height
    victim.write_bytes(victim.read_bytes()[:100])
    third = run_sweep(cfg)
    report = answers_report(third)
    assert (report.sent, report.failed) == (rows, 0)
    assert [q["path"] for q in report.quarantined] == [str(victim)]
    assert len(list((store_dir / "_quarantine").iterdir())) == 1  # kept for inspection
    assert victim.exists()  # written again under its own name
    assert scores(third).equals(reference)

    # 3. verify reads every part and marker; litter is reported, bad markers flagged
    (store_dir / "_markers" / "answers-broken.json").write_text("{not json")
    (store_dir / ".tmp-0123-part-abc.parquet").write_bytes(b"half")
    (report_,) = [r for r in verify(str(tmp_path / "store")) if r.url.endswith("answers/zero-cost")]
    assert report_.keys == report_.rows == needed and report_.parts == len(store.part_paths())
    assert report_.bytes == sum(p.stat().st_size for p in store_dir.glob("part-*.parquet"))
    assert not report_.bad_parts and [Path(b["path"]).name for b in report_.bad_markers] == ["answers-broken.json"]
    assert len(report_.temp_files) == 1 and len(report_.quarantined) == 1

    # 4. gc: a young temp file may belong to a live writer and stays; the rest goes
    removed = gc(str(tmp_path / "store"))
    assert sorted(Path(p).parent.name for p in removed) == ["_markers", "_quarantine"]
    assert (store_dir / ".tmp-0123-part-abc.parquet").exists()
    gc(str(tmp_path / "store"), min_age_s=0)
    assert not (store_dir / ".tmp-0123-part-abc.parquet").exists()
    assert all(r.ok and not r.temp_files and not r.quarantined for r in verify(str(tmp_path / "store")))
    # and the store still answers everything: the next run sends nothing
    fourth = run_sweep(cfg)
    assert answers_report(fourth).sent == 0
    assert scores(fourth).equals(reference)


def test_store_job_cli(tmp_path, capsys):
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "jobs"))
    import pyarrow as pa

    import jobs.store

    part_store = PartStore(str(tmp_path / "answers" / "b"), schema.ANSWERS)
    part_store.write(pa.table({"key": ["a", "b"], "backbone": ["b", "b"], "kind": ["image"] * 2, "logp_yes": [0.0, 0.0], "logp_no": [-1.0, -1.0]}))
    bad = tmp_path / "answers" / "b" / "part-ffff.parquet"
    bad.write_bytes(b"PAR1 junk")
    assert jobs.store.main(["verify", f"store={tmp_path}"]) == 1
    out = capsys.readouterr().out
    assert f"bad part {bad}" in out and "2 keys, 2 parts" in out
    assert jobs.store.main(["verify", f"store={tmp_path}", "repair=true"]) == 1  # reports, then moves it aside
    assert not bad.exists()
    assert jobs.store.main(["verify", f"store={tmp_path}"]) == 0
    assert jobs.store.main(["gc", f"store={tmp_path}", "dry_run=true"]) == 0
    assert "would remove" in capsys.readouterr().out
    assert jobs.store.main(["gc", f"store={tmp_path}"]) == 0
    assert not list((tmp_path / "answers" / "b" / "_quarantine").iterdir())
    assert jobs.store.main(["verify"]) == 2 and jobs.store.main(["check", "store=x"]) == 2 and jobs.store.main(["gc", "store=x", "min_age_s=-1"]) == 2
    capsys.readouterr()
    for command in ("verify", "gc", "compact"):  # a mistyped store is one line and exit 2, never "0 bad"
        assert jobs.store.main([command, f"store={tmp_path / 'no-such-store'}"]) == 2
        assert "no store at" in capsys.readouterr().err
