"""Workers return what they computed; each stage reads its store once.

The stage's one keyed read gives both the cached rows and the anti-join, and each actor
returns the rows it stored with their statuses, so nothing is read back: no second read of
every needed key, and no read of a part the actors have just written. These tests run the stage in process
(pipeline.stages.executor) and count the parts the driver opens.
"""
from __future__ import annotations

import zlib

import numpy as np
import polars as pl
import pyarrow as pa
import pytest
from PIL import Image

from operators import schema
from pipeline.stages.engine_stage import ROW, PartSink, PartWriter, result_schema, run_and_read, status_table
from pipeline.stages.executor import LocalExecutor, running_locally
from pipeline.stages.placement import ActorPool
from pipeline.store.parts import PartStore

COLUMNS = ["key", "logp_yes", "logp_no"]


def logp(key: str) -> float:
    return -(zlib.crc32(key.encode()) % 1000) / 100


class Worker:
    """Scores a part (values fixed by the key) and stores it; `mode` picks a misbehaviour."""

    calls: list[int] = []
    mode = "sink"  # sink | direct (stores without a PartSink) | nothing (stores nothing, says ok)
    fail: set[str] = set()  # keys answered with an error row

    def __init__(self, store_url: str):
        self.store = PartStore(store_url, schema.ANSWERS)
        if Worker.mode == "sink":
            self.parts = PartSink(self.store)

    def __call__(self, batch: pa.Table) -> pa.Table:
        Worker.calls.append(batch.num_rows)
        keys = [k for k in batch.column("key").to_pylist() if k not in Worker.fail]
        n = len(keys)
        table = pa.table({"key": keys, "backbone": ["b"] * n, "kind": ["image"] * n,
                          "logp_yes": [logp(k) for k in keys], "logp_no": [-1.0] * n})
        if Worker.mode == "sink":
            self.parts.write(table)
        elif Worker.mode == "direct":
            self.store.write(table)
        failed = sorted(Worker.fail & set(batch.column("key").to_pylist()))
        errors = pa.table({"key": failed, "stage": ["answers"] * len(failed), "reason": ["bad_input"] * len(failed),
                           "detail": ["d"] * len(failed)})
        return status_table(batch.column("key"), schema.conform(errors, schema.ERRORS))


@pytest.fixture(autouse=True)
def fresh_worker():
    Worker.calls, Worker.mode, Worker.fail = [], "sink", set()
    yield


@pytest.fixture
def opened(monkeypatch):
    """Every part the driver's store reads open, in order."""
    paths = []
    real = PartStore.read_part

    def counting(self, path, columns=None):
        paths.append(path)
        return real(self, path, columns)

    monkeypatch.setattr(PartStore, "read_part", counting)
    return paths


def requests(n: int) -> pa.Table:
    return pa.table({"key": [f"{i:032x}" for i in range(n)], "prompt": [f"p{i}" for i in range(n)]})


def stage(url: str, reqs: pa.Table, *, part: int = 10, batch: int = 4096, columns=COLUMNS):
    with running_locally(LocalExecutor()):
        return run_and_read(columns=columns, stage="answers", unit="b", requests=reqs, store=PartStore(url, schema.ANSWERS),
                            worker_cls=Worker, worker_kwargs={"store_url": url}, pool=ActorPool(rows_per_batch=batch, rows_per_part=part))


def by_key(table: pa.Table) -> list[dict]:
    return sorted(table.to_pylist(), key=lambda r: r["key"])


def test_a_fresh_night_reads_back_none_of_the_parts_it_wrote(tmp_path, opened):
    """Before: after the stage, every needed key was read back from the 13 new parts."""
    url = str(tmp_path / "s")
    rows, report = stage(url, requests(130))
    assert opened == [] and report.sent == 130 and len(PartStore(url, schema.ANSWERS).part_paths()) == 13
    assert rows.schema.names == COLUMNS and by_key(rows) == by_key(PartStore(url, schema.ANSWERS).read(COLUMNS))
    assert all(r["logp_yes"] == logp(r["key"]) for r in rows.to_pylist())


def test_an_all_cached_rerun_opens_each_part_once(tmp_path, opened):
    """Before: twice (the missing-key check, then the read of the needed rows)."""
    url = str(tmp_path / "s")
    first, _ = stage(url, requests(130))
    opened.clear()
    again, report = stage(url, requests(130))
    assert (report.cached, report.sent, Worker.calls) == (130, 0, [10] * 13)
    assert sorted(opened) == sorted(PartStore(url, schema.ANSWERS).part_paths()) and len(opened) == 13
    assert by_key(again) == by_key(first)


def test_cached_and_computed_rows_come_back_together_and_error_keys_only_as_error_rows(tmp_path, opened):
    url = str(tmp_path / "s")
    stage(url, requests(40))  # parts 0-3 stored
    opened.clear()
    Worker.fail = {f"{i:032x}" for i in (45, 77)}
    reqs = requests(100)
    rows, report = stage(url, reqs)
    assert (report.cached, report.sent, report.failed) == (40, 60, 2)
    assert sorted(report.errors.column("key").to_pylist()) == sorted(Worker.fail)
    assert len(opened) == 4  # the old parts, once; nothing written now is read
    expected = [{"key": k, "logp_yes": logp(k), "logp_no": -1.0} for k in reqs.column("key").to_pylist() if k not in Worker.fail]
    assert by_key(rows) == expected == by_key(PartStore(url, schema.ANSWERS).read(COLUMNS, keys=reqs.column("key")))


def test_every_column_comes_back_as_stored_when_none_are_named(tmp_path):
    url = str(tmp_path / "s")
    rows, _ = stage(url, requests(25), columns=None)
    stored = PartStore(url, schema.ANSWERS).read()
    assert rows.schema.equals(stored.schema) and by_key(rows) == by_key(stored)
    assert rows.column("answer_mass").null_count == 25  # a column added later: null, as the store reads it


def test_a_worker_that_stores_without_returning_its_rows_is_read_once_more_not_recomputed(tmp_path, opened):
    Worker.mode = "direct"
    url = str(tmp_path / "s")
    rows, report = stage(url, requests(30))
    assert Worker.calls == [10, 10, 10] and report.sent == 30  # computed once
    assert len(rows) == 30 and len(opened) == 3  # the second pass found them in the store


def test_a_key_reported_done_but_never_stored_is_computed_again_and_then_stops_the_run(tmp_path):
    """Before (as a read-back check): a part that vanished after the stage; the guarantee is
    the same: never a silently null score."""
    Worker.mode = "nothing"
    with pytest.raises(RuntimeError, match="30 needed keys are still missing"):
        stage(str(tmp_path / "s"), requests(30))
    assert Worker.calls == [10, 10, 10] * 2


def test_a_bad_part_in_the_read_is_quarantined_and_its_keys_computed_again(tmp_path, opened):
    url = str(tmp_path / "s")
    first, _ = stage(url, requests(30))
    victim = PartStore(url, schema.ANSWERS).part_paths()[1]
    with open(victim, "r+b") as f:
        f.truncate(100)
    Worker.calls = []
    rows, report = stage(url, requests(30))
    assert (report.cached, report.sent, Worker.calls) == (20, 10, [10])
    assert [q["path"] for q in report.quarantined] == [victim]
    assert by_key(rows) == by_key(first)


def test_a_stale_marker_is_logged_removed_and_the_lost_keys_computed(tmp_path, caplog):
    url = str(tmp_path / "s")
    first, _ = stage(url, requests(30))
    markers = list((tmp_path / "s" / "_markers").glob("*.json"))
    assert len(markers) == 1
    (tmp_path / "s" / PartStore(url, schema.ANSWERS).part_paths()[0].rsplit("/", 1)[1]).unlink()
    Worker.calls = []
    rows, report = stage(url, requests(30))
    assert "says finished, but 10 of 30 keys are not in" in caplog.text
    assert report.sent == 10 and by_key(rows) == by_key(first)
    assert markers[0].exists()  # cleared, then written again once every key was there


def test_part_writer_returns_rows_only_after_every_part_is_written(tmp_path):
    class SlowStore(PartStore):
        def write(self, table):
            import time

            time.sleep(0.05)
            return super().write(table)

    Worker.fail = {f"{3:032x}"}
    url = str(tmp_path / "s")
    row_schema = pa.schema([schema.ANSWERS.field(c) for c in COLUMNS])
    writer = PartWriter(Worker, {"store_url": url}, row_schema)
    writer.worker.parts = PartSink(SlowStore(url, schema.ANSWERS))
    batch = requests(20).append_column("_part", pa.array([i // 5 for i in range(20)], pa.int32()))
    result = writer(batch)
    assert result.schema.equals(result_schema(row_schema)) and len(PartStore(url, schema.ANSWERS).part_paths()) == 4
    rows = result.column(ROW).to_pylist()
    assert rows[3] is None and result.column("ok").to_pylist()[3] is False
    assert [r["logp_yes"] for i, r in enumerate(rows) if i != 3] == [logp(f"{i:032x}") for i in range(20) if i != 3]
    assert writer.worker.parts.written == []  # handed over, not kept for the next batch


def test_views_go_through_big_batches_and_the_sink(tmp_path, opened):
    """Before: one Ray batch per part, written in the worker's call, then read back."""
    from pipeline.config import ComputeSpec
    from pipeline.stages import evidence

    image = tmp_path / "a.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (40, 60, 3), dtype=np.uint8)).save(image)
    views = ["minus_evidence", "minus_control", "only_evidence", "only_control"]
    reqs = pl.DataFrame({
        "key": [f"v{i}" for i in range(8)], "source_hash": ["h"] * 8, "image_uri": [str(image)] * 8, "view": views * 2,
        "boxes": [[[0, 0, 10 + i, 10 + i]] for i in range(8)], "fill": ["blur"] * 8, "sigma": [0.1] * 8,
    }).with_columns(pl.col("boxes").cast(pl.List(pl.List(pl.Int32)))).to_arrow()
    blocks = []
    local = LocalExecutor()
    real = local.map_batches
    local.map_batches = lambda b, fn, kwargs=None: blocks.append(len(b)) or real(b, fn, kwargs)
    with running_locally(local):
        rendered, report = evidence.run_views(reqs, str(tmp_path / "store"), ComputeSpec(rows_per_part=3, rows_per_batch=4096), 1, "u")
    assert blocks == [1] and report.sent == 8 and report.failed == 0
    assert len(PartStore(str(tmp_path / "store" / "views"), evidence.VIEW_IMAGES).part_paths()) == 3
    assert opened == []
    stored = PartStore(str(tmp_path / "store" / "views"), evidence.VIEW_IMAGES).read(["key", "image_hash", "image_uri"])
    assert rendered.sort("key").equals(pl.from_arrow(stored).sort("key"))


def test_grounding_goes_through_big_batches_and_the_sink(tmp_path, opened, tiny_gdino_dir):
    from pipeline.config import ComputeSpec, DetectorSpec
    from pipeline.stages import evidence

    uris = []
    for i in range(3):
        path = tmp_path / f"{i}.png"
        Image.fromarray(np.random.default_rng(i).integers(0, 256, (80, 120, 3), dtype=np.uint8)).save(path)
        uris.append(str(path))
    reqs = pa.table({"key": [f"g{i}{p}" for i in range(3) for p in "ab"], "image_hash": [f"h{i}" for i in range(3) for _ in "ab"],
                     "image_uri": [u for u in uris for _ in "ab"], "phrase": ["a dog.", "a cat."] * 3})
    detector = DetectorSpec(name="tiny", model_id=tiny_gdino_dir, image_size={"shortest_edge": 96, "longest_edge": 128}, gpus=0.0)
    with running_locally(LocalExecutor()):
        found, report = evidence.run_grounding(reqs, detector, str(tmp_path / "store"), ComputeSpec(rows_per_part=2, rows_per_batch=4096))
    store = PartStore(str(tmp_path / "store" / "grounding" / "tiny"), evidence.DETECTIONS)
    assert report.sent == 6 and report.failed == 0 and len(store.part_paths()) == 3 and opened == []
    stored = {r["key"]: r for r in store.read().to_pylist()}
    assert sorted(found) == sorted(stored)
    assert all(found[k].boxes.tolist() == stored[k]["boxes"] for k in stored)
