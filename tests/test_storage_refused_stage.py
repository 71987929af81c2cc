"""A full disk while a worker stores its part ends the stage at once with the storage error
(one line from the job), instead of being taken for a lost worker: no batch is run through
the model a second time, no Ray traceback is printed, and the pool's actors are freed."""
from __future__ import annotations

import errno
import os
import sys
import time
from pathlib import Path

import pyarrow as pa
import pytest

from operators import schema
from pipeline.cli import storage_error
from pipeline.stages.engine_stage import PartSink, run_engine_stage, status_table
from pipeline.stages.placement import ActorPool
from pipeline.store.parts import PartStore
from pipeline.store.settings import retrying


class FullDisk(PartStore):
    """A store on a disk with no space left: every part write fails as the OS says it."""

    def write(self, table: pa.Table) -> str:
        url = self.part_url(table.column("key"))

        def no_space():
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        return retrying(f"write {url}", no_space)


class CountingWorker:
    """Answers a part (a line per call in `calls`: the model ran), then stores it on a full disk."""

    def __init__(self, store_url: str, calls: str, full: bool = True):
        self.parts = PartSink((FullDisk if full else PartStore)(store_url, schema.ANSWERS))
        self.calls = calls

    def __call__(self, batch: pa.Table) -> pa.Table:
        with open(self.calls, "a") as f:
            f.write(batch.column("key")[0].as_py() + "\n")
        n = batch.num_rows
        self.parts.write(pa.table({"key": batch.column("key"), "backbone": ["b"] * n, "kind": ["image"] * n,
                                   "logp_yes": [-1.0] * n, "logp_no": [-2.0] * n}))
        return status_table(batch.column("key"), schema.ERRORS.empty_table())


def requests(n: int) -> pa.Table:
    return pa.table({"key": [f"{i:032x}" for i in range(n)], "prompt": [f"p{i}" for i in range(n)]})


def test_a_full_disk_ends_the_stage_at_once_without_running_the_batch_again(ray_session, tmp_path, caplog, capfd):
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the actors cannot import this test file
    caplog.set_level("INFO")
    calls = tmp_path / "calls.txt"
    store = PartStore(str(tmp_path / "answers" / "b"), schema.ANSWERS)
    cpus = ray_session.available_resources().get("CPU")
    start = time.perf_counter()
    with pytest.raises(OSError) as raised:
        run_engine_stage(stage="answers", unit="b", requests=requests(40), store=store, worker_cls=CountingWorker,
                         worker_kwargs={"store_url": store.url, "calls": str(calls)},
                         pool=ActorPool(size=1, num_cpus=0.5, rows_per_batch=10, rows_per_part=10))
    seconds = time.perf_counter() - start
    started = calls.read_text().split()
    assert started and len(started) == len(set(started)), started  # no batch through the model twice
    output = caplog.text + "".join(capfd.readouterr())
    assert "lost their worker" not in output and "Traceback" not in output, output[-3000:]
    assert raised.value.errno == errno.ENOSPC  # the OSError itself, not Ray's wrapper
    part = store.part_url(requests(40).column("key")[:10])
    assert storage_error(raised.value).startswith(f"storage: cannot write {part}: no space left on device (ENOSPC); ")
    assert store.read().num_rows == 0
    deadline = time.time() + 30
    # the pool's actor is gone (at least the CPUs free when the stage started: an earlier test's killed
    # actors may still have been giving theirs back when `cpus` was read)
    while ray_session.available_resources().get("CPU", 0) < cpus and time.time() < deadline:
        time.sleep(0.5)
    assert ray_session.available_resources().get("CPU", 0) >= cpus
    print(f"full disk: the stage ended after {seconds:.1f} s, {len(started)} model calls")


def test_the_pool_writer_passes_other_errors_and_good_batches_through(tmp_path):
    from pipeline.stages.engine_stage import PoolWriter

    calls = str(tmp_path / "calls.txt")
    batch = requests(5)
    good = PoolWriter(CountingWorker, {"store_url": str(tmp_path / "ok"), "calls": calls, "full": False})
    assert good(batch).column("ok").to_pylist() == [True] * 5
    refused = PoolWriter(CountingWorker, {"store_url": str(tmp_path / "full"), "calls": calls})(batch)
    assert set(refused.column("reason").to_pylist()) == {"storage_refused"}
    broken = PoolWriter(CountingWorker, {"store_url": str(tmp_path / "x"), "calls": str(tmp_path / "no" / "such" / "dir")})
    with pytest.raises(FileNotFoundError):  # not a storage refusal of a part: raised unchanged
        broken(batch)
    assert Path(calls).read_text().split() == [f"{0:032x}"] * 2
