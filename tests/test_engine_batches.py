"""Ray batches of many parts: the same stored parts as one batch per part, resumable per part.

A worker call takes a batch of `rows_per_batch` rows made of whole parts and stores one part
per `rows_per_part` slice; these tests run the stage in process (pipeline.stages.executor), with a
worker that writes through a PartSink like the answer and generation workers.
"""
import random
import zlib

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from operators import schema
from pipeline.stages.engine_stage import PART, PartSink, PartWriter, cut_batches, run_engine_stage, status_table
from pipeline.stages.executor import LocalExecutor, running_locally
from pipeline.stages.placement import ActorPool
from pipeline.store.parts import PartStore


class Killed(BaseException):
    """Stands for a SIGKILL of the worker (not an error the stage could handle)."""


class ScoringWorker:
    """Scores a batch (a value fixed by the key), writes it as one part; may die on a given call."""

    calls: list[int] = []
    die_on_call: int | None = None

    def __init__(self, store_url: str):
        self.store = PartStore(store_url, schema.ANSWERS)
        self.parts = PartSink(self.store)

    def __call__(self, batch: pa.Table) -> pa.Table:
        assert PART not in batch.column_names
        ScoringWorker.calls.append(batch.num_rows)
        if ScoringWorker.die_on_call is not None and len(ScoringWorker.calls) == ScoringWorker.die_on_call:
            raise Killed()
        keys = batch.column("key").to_pylist()
        n = len(keys)
        self.parts.write(pa.table({"key": keys, "backbone": ["b"] * n, "kind": ["image"] * n,
                                   "logp_yes": [-(zlib.crc32(k.encode()) % 1000) / 100 for k in keys], "logp_no": [-1.0] * n}))
        return status_table(batch.column("key"), schema.ERRORS.empty_table())


@pytest.fixture(autouse=True)
def fresh_worker():
    ScoringWorker.calls, ScoringWorker.die_on_call = [], None
    yield


def requests(n: int) -> pa.Table:
    return pa.table({"key": [f"{i:032x}" for i in range(n)], "prompt": [f"p{i}" for i in range(n)]})


def run(store_url: str, reqs: pa.Table, pool: ActorPool):
    with running_locally(LocalExecutor()):
        return run_engine_stage(stage="answers", unit="b", requests=reqs, store=PartStore(store_url, schema.ANSWERS),
                                worker_cls=ScoringWorker, worker_kwargs={"store_url": store_url}, pool=pool)


def stored(url: str) -> tuple[list[str], list[dict]]:
    store = PartStore(url, schema.ANSWERS)
    names = sorted(p.rsplit("/", 1)[1] for p in store.part_paths())
    return names, sorted(store.read().to_pylist(), key=lambda r: r["key"])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_batches_hold_whole_parts_cut_from_the_full_request_list(seed):
    rng = random.Random(seed)
    reqs = requests(203)
    missing = pa.array([rng.random() < 0.6 for _ in range(reqs.num_rows)])
    batches = cut_batches(reqs, missing, ActorPool(rows_per_batch=35, rows_per_part=10))
    joined = pa.concat_tables(batches)
    assert joined.drop_columns([PART]).equals(reqs.filter(missing))  # every missing row once, in order
    assert joined.column(PART).to_pylist() == [i // 10 for i, m in enumerate(missing.to_pylist()) if m]
    for batch in batches[:-1]:
        assert batch.num_rows >= 35
    parts_per_batch = [set(b.column(PART).to_pylist()) for b in batches]
    assert all(not (a & b) for i, a in enumerate(parts_per_batch) for b in parts_per_batch[i + 1:])  # no part split
    assert cut_batches(reqs, pc.invert(pa.array([True] * reqs.num_rows)), ActorPool(rows_per_batch=35, rows_per_part=10)) == []


def test_batches_are_spread_over_the_pool_when_there_are_fewer_rows_than_a_batch_per_worker():
    """Before: 100 rows for 4 workers made one 4,096-row batch: one worker busy, three idle."""
    reqs = requests(100)
    every = pa.array([True] * 100)
    sizes = [b.num_rows for b in cut_batches(reqs, every, ActorPool(size=4, rows_per_batch=4096, rows_per_part=10))]
    assert sizes == [30, 30, 30, 10]  # whole parts, at least one batch per worker
    assert [b.num_rows for b in cut_batches(reqs, every, ActorPool(size=1, rows_per_batch=4096, rows_per_part=10))] == [100]
    assert [b.num_rows for b in cut_batches(reqs, every, ActorPool(size=64, rows_per_batch=4096, rows_per_part=10))] == [10] * 10
    assert [b.num_rows for b in cut_batches(reqs, every, ActorPool(size=2, rows_per_batch=20, rows_per_part=10))] == [20] * 5


def test_big_batches_store_the_same_parts_as_one_batch_per_part(tmp_path):
    reqs = requests(130)
    small = run(str(tmp_path / "small"), reqs, ActorPool(rows_per_batch=10))  # today's: a batch is a part
    calls_small = list(ScoringWorker.calls)
    ScoringWorker.calls = []
    big = run(str(tmp_path / "big"), reqs, ActorPool(rows_per_batch=4096, rows_per_part=10))
    assert ScoringWorker.calls == calls_small == [10] * 13  # the worker still sees one part at a time
    assert stored(str(tmp_path / "small")) == stored(str(tmp_path / "big"))
    assert small.sent == big.sent == 130 and big.failed == 0


def test_a_worker_killed_inside_a_batch_keeps_its_finished_parts_and_the_rerun_sends_only_the_rest(tmp_path):
    reqs = requests(130)
    url = str(tmp_path / "killed")
    ScoringWorker.die_on_call = 5  # dies on the 5th part of the single 130-row batch
    with pytest.raises(Killed):
        run(url, reqs, ActorPool(rows_per_batch=4096, rows_per_part=10))
    names, rows = stored(url)
    assert len(names) == 4 and len(rows) == 40  # the 4 finished parts were stored completely
    ScoringWorker.calls, ScoringWorker.die_on_call = [], None
    again = run(url, reqs, ActorPool(rows_per_batch=4096, rows_per_part=10))
    assert again.cached == 40 and again.sent == 90
    assert ScoringWorker.calls == [10] * 9  # the same parts as the interrupted run would have written
    ScoringWorker.calls = []
    run(str(tmp_path / "clean"), reqs, ActorPool(rows_per_batch=4096, rows_per_part=10))
    assert stored(url) == stored(str(tmp_path / "clean"))


def test_statuses_come_back_only_after_every_part_is_written(tmp_path):
    class FailingStore(PartStore):
        def write(self, table):
            if table.column("key")[0].as_py().endswith("5"):
                raise OSError("disk full")
            return super().write(table)

    writer = PartWriter(ScoringWorker, {"store_url": str(tmp_path / "s")})
    writer.worker.parts = PartSink(FailingStore(str(tmp_path / "s"), schema.ANSWERS))
    batch = cut_batches(requests(30), pa.array([True] * 30), ActorPool(rows_per_batch=100, rows_per_part=5))[0]
    with pytest.raises(OSError, match="disk full"):  # part 2 (keys ...05-...09) failed: no status at all
        writer(batch)
    writer.worker.parts = PartSink(PartStore(str(tmp_path / "ok"), schema.ANSWERS))
    status = writer(batch)
    assert status.column("key").to_pylist() == batch.column("key").to_pylist() and all(status.column("ok").to_pylist())
    assert PartStore(str(tmp_path / "ok"), schema.ANSWERS).read().num_rows == 30


def test_status_table_marks_each_key_with_its_last_error():
    errors = pa.table({"key": ["b", "b", "c"], "stage": ["answers"] * 3, "source": [None, "x", None],
                       "field": [None] * 3, "reason": ["r1", "r2", "r3"], "detail": ["d1", "d2", "d3"]})
    rows = status_table(["a", "b", "c", "d"], errors).to_pylist()
    assert [r["ok"] for r in rows] == [True, False, False, True]
    assert (rows[1]["reason"], rows[1]["source"], rows[2]["reason"]) == ("r2", "x", "r3")
    assert rows[0]["reason"] is None and rows[3]["detail"] is None


def test_engine_pools_take_batch_part_and_memory_settings_from_compute():
    from operators.engines.spec import BackboneSpec
    from pipeline.config import ComputeSpec
    from pipeline.stages.engine_stage import _actor_asks
    from pipeline.stages.placement import engine_pool

    pool = engine_pool(BackboneSpec(name="b", engine="scripted"), ComputeSpec(rows_per_part=64, rows_per_batch=2048, engine_memory_gb=1.5))
    assert (pool.rows_per_batch, pool.part_rows, pool.memory_gb) == (2048, 64, 1.5)
    assert _actor_asks(pool) == {"memory": int(1.5 * 2**30)}
    assert _actor_asks(engine_pool(BackboneSpec(name="b", engine="scripted"), ComputeSpec())) == {}


def test_rows_without_a_status_are_found_per_block_in_one_lookup():
    from pipeline.stages.engine_stage import _lost_rows

    blocks = [pa.table({"key": [f"k{b}-{i}" for i in range(5)], "text": [f"t{b}-{i}" for i in range(5)]}) for b in range(3)]
    returned = [pa.table({"key": ["k0-0", "k0-1", "k0-2", "k0-3", "k0-4", "k2-1", "k2-3"]})]
    lost = _lost_rows(blocks, returned)
    assert [t.column("key").to_pylist() for t in lost] == [[f"k1-{i}" for i in range(5)], ["k2-0", "k2-2", "k2-4"]]
    assert lost[1].column("text").to_pylist() == ["t2-0", "t2-2", "t2-4"]
    assert _lost_rows(blocks, [pa.concat_tables(blocks).select(["key"])]) == []
    assert sum(t.num_rows for t in _lost_rows(blocks, [])) == 15
    large = [b.cast(pa.schema([("key", pa.large_string()), ("text", pa.string())])) for b in blocks]  # keys from polars
    assert [t.num_rows for t in _lost_rows(large, returned)] == [5, 3]


class ThreadsWorker:
    """Reports, as each key's detail, the math threads its process had when it was built."""

    def __init__(self):
        import torch

        self.threads = torch.get_num_threads()

    def __call__(self, batch: pa.Table) -> pa.Table:
        keys = batch.column("key").to_pylist()
        errors = pa.table({"key": keys, "reason": ["threads"] * len(keys), "detail": [str(self.threads)] * len(keys)})
        return status_table(keys, errors)


def test_engine_actors_use_the_threads_compute_asks_for(ray_session, monkeypatch):
    """Ray starts an actor with one thread per CPU it reserves, so a CPU engine used one core of a
    laptop's many. `compute.threads_per_engine` sets them before the worker is built (0: every
    core), in the pool's actors and in the actors that isolate failures."""
    import os
    import sys

    import torch
    from ray import cloudpickle

    from operators.engines.spec import BackboneSpec
    from pipeline.config import ComputeSpec
    from pipeline.stages.engine_stage import _Host, compute_blocks
    from pipeline.stages.placement import engine_pool

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the actors cannot import this test file

    block = [pa.table({"key": ["a", "b"]})]
    assert engine_pool(BackboneSpec(name="b", engine="scripted"), ComputeSpec()).threads is None  # Ray's setting stays
    pool = engine_pool(BackboneSpec(name="b", engine="scripted"), ComputeSpec(threads_per_engine=3))
    assert set(compute_blocks(block, ThreadsWorker, {}, pool, stage="t").column("detail").to_pylist()) == {"3"}
    cores = str(len(os.sched_getaffinity(0)))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # restored after: later subprocesses must not inherit ours
    try:  # in this process (it sets this process's threads)
        assert _Host(ThreadsWorker, {}, None, 2).run(block[0]).column("detail").to_pylist() == ["2", "2"]
        assert _Host(ThreadsWorker, {}, None, 0).run(block[0]).column("detail").to_pylist() == [cores, cores]
        torch.set_num_threads(1)
        assert _Host(ThreadsWorker, {}, None, None).run(block[0]).column("detail").to_pylist() == ["1", "1"]  # left as it was
    finally:
        torch.set_num_threads(1)  # the suite's setting (conftest)


# A fresh driver (Ray's core logs the line once per process) joins the session's Ray and runs a
# stage's main pass on two actors.
MAIN_PASS = """
import pyarrow as pa
import ray
from pipeline.stages.engine_stage import compute_blocks, status_table
from pipeline.stages.placement import ActorPool

class Echo:
    def __call__(self, batch):
        return status_table(batch.column("key").to_pylist(), pa.table({"key": pa.array([], pa.string())}))

ray.init(log_to_driver=False)
blocks = [pa.table({"key": [f"k{i}", f"k{i}x"]}) for i in range(6)]
done = compute_blocks(blocks, Echo, {}, ActorPool(size=2, num_cpus=0.5), stage="answers/t")
print("ok", done.num_rows, sum(done.column("ok").to_pylist()))
"""


def test_the_main_pass_gives_ray_no_error_line_about_constructor_arguments(ray_session, tmp_path):
    """Ray's core logs an ERROR line for an actor that may restart with constructor arguments in
    the object store, as a Ray Data actor pool's actors always have; the stage's own actors get
    theirs inline."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parent.parent
    env = dict(os.environ, PYTHONPATH=str(repo), RAY_ADDRESS=ray_session.get_runtime_context().gcs_address)
    done = subprocess.run([sys.executable, "-c", MAIN_PASS], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "ok 12 12" in done.stdout
    assert [line for line in done.stderr.splitlines() if " E " in line[:40] or "core_worker" in line] == []
