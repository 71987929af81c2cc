"""Run model work (answers, generations, detections, views) as a stage on a pool of Ray actors.

The driver reads the stored rows of the needed keys once (`PartStore.read(keys=...)`); the
keys that read did not return are missing (the anti-join). The missing rows go to a pool of
actors (`compute_blocks`; where the pool may run: `pipeline.stages.placement`) that each load
the engine once, in batches of thousands of rows. A batch is made of whole parts
(`rows_per_part`, cut from the full request list); the actor stores each part completely, in a
background thread while it computes the next, and only then returns each key's status together
with the row it stored. The stage's result is the stored rows plus the returned ones: nothing
the actors just wrote is read back, and a run killed at any moment keeps every finished part
and the rerun asks only for the rest.

Nothing the store holds is taken on trust: every needed key is checked against it (markers
are only notes), and a request that kills its worker is isolated and recorded as an error
row instead of restarting the worker forever.

The workers themselves (what an actor does with a batch) live beside their stages:
`pipeline.stages.engine_workers` (answers, generations), `evidence` and `judge`.
"""
from __future__ import annotations

import contextlib
import logging
import math
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc

from operators import schema
from operators.hashing import keys_digest
from operators.math_threads import use_threads
from operators.prefetch import pipelined
from pipeline.stages import executor
from pipeline.stages.placement import ActorPool, placeable
from pipeline.store.parts import MARKERS, Markers, PartStore

log = logging.getLogger(__name__)

STATUS = pa.schema(
    [
        ("key", pa.string()),
        ("ok", pa.bool_()),
        ("stage", pa.string()),
        ("source", pa.string()),
        ("field", pa.string()),
        ("reason", pa.string()),
        ("detail", pa.string()),
    ]
)


@dataclass
class StageReport:
    """What one (stage, unit) did: the numbers the run summary prints."""

    stage: str
    unit: str
    needed: int = 0  # distinct keys the run needs
    cached: int = 0  # already in the store before this run
    sent: int = 0  # handed to the engine by this run
    failed: int = 0  # recorded as errors
    seconds: float = 0.0
    quarantined: list = field(default_factory=list, repr=False)  # bad parts moved aside
    errors: pa.Table = field(default_factory=schema.ERRORS.empty_table, repr=False)

    def as_row(self) -> dict:
        return {k: getattr(self, k) for k in ("stage", "unit", "needed", "cached", "sent", "failed", "seconds")}


def status_table(keys, errors: pa.Table) -> pa.Table:
    """Per-key status of a processed batch: ok unless the key has an error row (its last one).

    Vectorised (a lookup of each key in the error keys): no Python per row.
    """
    keys = keys if isinstance(keys, (pa.Array, pa.ChunkedArray)) else pa.array(keys, pa.string())
    keys = keys.combine_chunks() if isinstance(keys, pa.ChunkedArray) else keys
    n = len(keys)
    if errors.num_rows == 0:
        columns = {"key": keys.cast(pa.string()), "ok": pa.repeat(pa.scalar(True), n)}
        columns |= {f.name: pa.nulls(n, f.type) for f in STATUS if f.name not in columns}
        return pa.table(columns, schema=STATUS)
    last_first = errors.take(pa.array(range(errors.num_rows - 1, -1, -1), pa.int64()))  # index_in finds the first match
    where = pc.index_in(keys, value_set=last_first.column("key").combine_chunks())
    columns = {"key": keys.cast(pa.string()), "ok": pc.is_null(where)}
    for f in STATUS:
        if f.name not in columns:
            columns[f.name] = last_first.column(f.name).combine_chunks().cast(f.type).take(where) if f.name in errors.column_names else pa.nulls(n, f.type)
    return pa.table(columns, schema=STATUS)


def run_engine_stage(**stage_kwargs) -> StageReport:
    """Compute every key of `requests` that `store` lacks; returns counts and error rows
    (`run_and_read` for callers that need no rows: the keys alone are read and returned)."""
    return run_and_read(columns=["key"], **stage_kwargs)[1]


def run_and_read(*, columns: list[str] | None = None, **stage_kwargs) -> tuple[pa.Table, StageReport]:
    """Compute what the store lacks and return `columns` of every needed key: the rows stored
    before this run (one keyed read of the store) plus the rows the actors computed now
    (returned with their statuses, never read back).

    Each needed key is either returned or has an error row in the report. A key that comes
    back neither way (a worker that stored it without returning it, or did neither) is read
    and computed once more; if it is still missing, this raises rather than let a score
    silently turn null. A part that cannot be read is quarantined by the store's read, so its
    keys are computed again (`report.quarantined` lists it).
    """
    requests: pa.Table = stage_kwargs["requests"]
    rows, report = _read_and_compute(columns, **stage_kwargs)
    gap = _unaccounted(requests, rows, report)
    if gap:
        log.warning("%s/%s: %d needed keys came back neither computed nor failed; reading and computing them again", report.stage, report.unit, len(gap))
        lost = requests.filter(pc.is_in(requests.column("key"), value_set=pa.array(sorted(gap), pa.string())))
        more, again = _read_and_compute(columns, **(stage_kwargs | {"requests": lost}))
        rows = pa.concat_tables([rows, more])
        report.sent += again.sent
        report.failed += again.failed
        report.errors = schema.concat_errors([report.errors, again.errors])
        report.seconds += again.seconds
        report.quarantined += [q for q in again.quarantined if q not in report.quarantined]
        gap = _unaccounted(requests, rows, report)
        if gap:
            store: PartStore = stage_kwargs["store"]
            raise RuntimeError(f"{report.stage}/{report.unit}: {len(gap)} needed keys are still missing from {store.url} after computing them again, e.g. {sorted(gap)[:3]}")
    return rows, report


def _read_and_compute(
    columns: list[str] | None,
    *,
    stage: str,
    unit: str,
    requests: pa.Table,
    store: PartStore,
    worker_cls,
    worker_kwargs: dict,
    pool: ActorPool,
) -> tuple[pa.Table, StageReport]:
    """One pass: read the stored rows of the needed keys, compute the rest, return both.

    What to compute is decided by that read alone (the anti-join): a success marker from an
    earlier run of the same unit is only checked against it, and removed if keys have gone
    missing since (a deleted or quarantined part), so the stage heals the store.
    """
    start = time.perf_counter()
    report = StageReport(stage=stage, unit=unit, needed=requests.num_rows)
    row_schema = stored_row_schema(store, columns)
    if requests.num_rows == 0:
        return row_schema.empty_table(), report
    keys = requests.column("key")
    markers = Markers(f"{store.url}/{MARKERS}")
    unit_marker = f"{stage}-{keys_digest(keys)}"
    marked = markers.done(unit_marker)
    stored = store.read(row_schema.names, keys=keys).select(row_schema.names).cast(row_schema)  # the stage's one read
    missing = pc.invert(pc.is_in(keys, value_set=stored.column("key").combine_chunks()))
    blocks = cut_batches(requests, missing, pool)
    n_todo = sum(b.num_rows for b in blocks)
    report.cached = requests.num_rows - n_todo
    report.quarantined = list(store.quarantined)
    if marked and n_todo:
        log.warning("%s/%s: marker %s says finished, but %d of %d keys are not in %s; computing them again", stage, unit, unit_marker, n_todo, report.needed, store.url)
        markers.clear(unit_marker)
    if n_todo == 0:
        report.seconds = time.perf_counter() - start
        log.info("%s/%s: all %d keys cached%s", stage, unit, report.needed, " (finished before)" if marked else "")
        if not marked:
            markers.mark(unit_marker, report.as_row() | {"finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")})
        return stored, report

    log.info("%s/%s: %d needed, %d cached, %d to compute", stage, unit, report.needed, report.cached, n_todo)
    local = executor.current()
    if local is not None:  # in-process (pipeline.stages.executor): the same workers and batches, no Ray
        results = local.map_batches(blocks, PartWriter, {"worker_cls": worker_cls, "worker_kwargs": worker_kwargs, "row_schema": row_schema})
        results = pa.concat_tables(results) if results else result_schema(row_schema).empty_table()
    else:
        results = compute_blocks(blocks, worker_cls, worker_kwargs, pool, stage=stage, row_schema=row_schema)
    status, computed = split_results(results, row_schema)
    report.sent = status.num_rows
    bad = status.filter(pc.invert(status.column("ok")))
    report.failed = bad.num_rows
    report.errors = schema.conform(bad, schema.ERRORS, what="errors")
    report.seconds = time.perf_counter() - start
    if report.failed == 0:
        markers.mark(unit_marker, report.as_row() | {"finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")})
    return pa.concat_tables([stored, computed]), report


def _unaccounted(requests: pa.Table, rows: pa.Table, report: StageReport) -> set[str]:
    """Needed keys that are neither in `rows` nor error rows of `report`."""
    keys = requests.column("key")
    gap = keys.filter(pc.invert(pc.or_(pc.is_in(keys, value_set=rows.column("key").combine_chunks()),
                                       pc.is_in(keys, value_set=report.errors.column("key").combine_chunks()))))
    return set(gap.to_pylist())


# -- what a worker call returns: each key's status and the row it stored -----------------------

ROW = "row"  # column of a worker result: the row stored for an ok key (null on error rows)


def stored_row_schema(store: PartStore, columns: list[str] | None) -> pa.Schema:
    """The store's fields a stage returns per key (`columns`, key first; None: all)."""
    wanted = list(columns) if columns else list(store.schema.names)
    if "key" not in wanted:
        wanted = ["key", *wanted]
    return pa.schema([store.schema.field(c) for c in wanted])


def result_schema(row_schema: pa.Schema | None) -> pa.Schema:
    """A worker call's result: STATUS, plus (when rows are asked for) the stored row per key."""
    return STATUS if row_schema is None else STATUS.append(pa.field(ROW, pa.struct(list(row_schema))))


def with_rows(status: pa.Table, written: list[pa.Table], row_schema: pa.Schema) -> pa.Table:
    """`status` plus each ok key's row taken from the tables the worker stored (vectorised: a
    lookup of each key in the written keys). A key with an error, or that was not written,
    gets a null row."""
    row_type = pa.struct(list(row_schema))
    ok = status.column("ok").combine_chunks()
    if written and status.num_rows:
        table = pa.concat_tables([_as_stored(t, row_schema) for t in written]).combine_chunks()
        where = pc.index_in(status.column("key").combine_chunks(), value_set=table.column("key").combine_chunks())
        where = pc.if_else(ok, where, pa.scalar(None, where.type))
        fields = pa.StructArray.from_arrays([table.column(f.name).combine_chunks() for f in row_schema], fields=list(row_schema))
        rows = fields.take(where)
    else:
        rows = pa.nulls(status.num_rows, row_type)
    return status.append_column(pa.field(ROW, row_type), rows)


def _as_stored(table: pa.Table, row_schema: pa.Schema) -> pa.Table:
    """A written table as the store keeps it (`PartStore.write`): a column added to the schema
    later may be missing (null), the rest cast to the stored types."""
    columns = []
    for f in row_schema:
        if f.name in table.column_names:
            columns.append(table.column(f.name).cast(f.type))
        elif schema.added_later(f):
            columns.append(pa.nulls(table.num_rows, f.type))
        else:
            raise ValueError(f"a worker stored a part without the {f.name!r} column")
    return pa.Table.from_arrays(columns, schema=row_schema)


def split_results(results: pa.Table, row_schema: pa.Schema) -> tuple[pa.Table, pa.Table]:
    """Worker results -> (STATUS rows, the returned rows of `row_schema`)."""
    status = results.select(STATUS.names)
    returned = results.filter(pc.is_valid(results.column(ROW))).column(ROW)
    if returned.num_chunks == 0 or len(returned) == 0:
        return status, row_schema.empty_table()
    return status, pa.Table.from_struct_array(returned).cast(row_schema)


PART = "_part"  # column of a Ray batch: which stored part each row belongs to (dropped by PartWriter)


def cut_batches(requests: pa.Table, missing: pa.Array, pool: ActorPool) -> list[pa.Table]:
    """The batches a stage sends: parts cut from the FULL request list, filtered to the missing
    keys, then consecutive parts joined into batches of at least `pool.rows_per_batch` rows,
    or fewer when that would leave workers of the pool idle (every worker gets a batch while
    there are at least as many parts as workers).

    Parts are cut before filtering, so a resumed run writes exactly the parts the
    interrupted run had not finished, with the same composition (even batch-dependent
    numerics are identical) and the same names. Batches only group parts: one worker call
    per batch (Ray's fixed cost per batch is paid per thousands of rows), one stored part per
    part inside it (a kill loses at most the parts not yet written).
    """
    import numpy as np

    part_of = pa.array((np.arange(requests.num_rows, dtype=np.int64) // pool.part_rows).astype(np.int32))
    todo = requests.append_column(PART, part_of).filter(missing)
    if todo.num_rows == 0:
        return []
    # Batch boundaries fall only between parts: close a batch at the first part end past the target.
    target = min(pool.rows_per_batch, math.ceil(todo.num_rows / max(pool.size, 1)))
    batches, begin = [], 0
    for end in _part_ends(todo):
        if end - begin >= target or end == todo.num_rows:
            batches.append(todo.slice(begin, end - begin))
            begin = end
    return batches


def _part_ends(table: pa.Table) -> list[int]:
    """Row index just past each part of `table` (consecutive rows with the same PART value)."""
    parts = table.column(PART).combine_chunks()
    changes = pc.indices_nonzero(pc.not_equal(parts[:-1], parts[1:])).to_pylist()
    return [int(i) + 1 for i in changes] + [table.num_rows]


class PartWriter:
    """Wraps a stage worker: one worker call (and one stored part) per part of a Ray batch.

    A worker with a `prepare(part)` method (the answer worker: it decodes the part's images)
    is called as `worker(part, prepare(part))`, and the next part is prepared in a background
    thread while the current one computes, so the engine does not wait on image decoding
    between parts.

    A worker that writes through a `PartSink` (`worker.parts`) writes in the background
    while it computes the next part; every write is finished before the result is returned,
    so a key reported here is always in a complete part. With `row_schema`, the result also
    carries each ok key's stored row (`with_rows`), taken from what the sink wrote: the
    driver needs no read-back.
    """

    def __init__(self, worker_cls, worker_kwargs: dict, row_schema: pa.Schema | None = None, threads: int | None = None):
        use_threads(threads)  # before the worker loads its model
        self.worker = worker_cls(**worker_kwargs)
        self.row_schema = row_schema

    def __call__(self, batch: pa.Table) -> pa.Table:
        sink = getattr(self.worker, "parts", None)
        sink = sink if isinstance(sink, PartSink) else None
        with sink.deferred() if sink is not None else contextlib.nullcontext():
            if PART not in batch.column_names:
                parts = [batch]
            else:
                body = batch.drop_columns([PART])
                cuts = [0, *_part_ends(batch)]
                parts = [body.slice(a, b - a) for a, b in zip(cuts[:-1], cuts[1:]) if b > a]
            prepare = getattr(self.worker, "prepare", None)
            if prepare is None:
                statuses = [self.worker(part) for part in parts]
            else:  # the next part's inputs (decoded images) are prepared while this part computes
                statuses = []
                pipelined(parts, prepare, lambda part, ready: statuses.append(self.worker(part, ready)))
        # leaving `deferred()` waited for every part: the statuses below are all stored
        status = pa.concat_tables(statuses) if statuses else STATUS.empty_table()
        if self.row_schema is None:
            return status
        written = sink.written if sink is not None else []  # a worker without a sink returns no rows
        if sink is not None:
            sink.written = []
        return with_rows(status, written, self.row_schema)


class PartSink:
    """A worker's part writes: immediate, or (inside `deferred()`) in one background thread so
    the next part's model work overlaps this part's encoding and upload.

    Leaving `deferred()` waits for every write and raises the first failure, so a caller
    never reports a key whose part is not complete. The tables written inside the block stay
    in `written` (until the next block) for the caller to return.
    """

    def __init__(self, store: PartStore):
        self.store = store
        self.written: list[pa.Table] = []
        self._pool: ThreadPoolExecutor | None = None
        self._pending: list = []

    def write(self, table: pa.Table) -> None:
        if self._pool is None:
            self.store.write(table)
        else:
            self.written.append(table)
            self._pending.append(self._pool.submit(self.store.write, table))

    @contextlib.contextmanager
    def deferred(self):
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="part-writer")
        self.written = []
        try:
            yield self
        finally:
            pool, pending, self._pool, self._pending = self._pool, self._pending, None, []
            pool.shutdown(wait=True)
            for future in pending:
                future.result()  # raises the first failed write


# -- a write the storage refuses: the run ends at once ------------------------------------------

REFUSED = "storage_refused"  # status reason of a batch whose part the storage refused to take


class PoolWriter(PartWriter):
    """PartWriter in a stage's main pass: a part the storage refuses (no space left, read-only,
    quota, access denied; `pipeline.cli.storage_error`) is returned as the batch's result
    (`refused_status`), not raised: the driver raises that failure itself at once
    (`raise_refused`), instead of a task error wrapped in Ray's traceback, and no batch is run
    through the model again."""

    def __call__(self, batch: pa.Table) -> pa.Table:
        from pipeline.cli import storage_error

        try:
            return super().__call__(batch)
        except Exception as exc:
            if storage_error(exc) is None:
                raise
            refused = refused_status(batch, exc, self.row_schema)
            if refused is None:
                raise
            return refused


def refused_status(batch: pa.Table, exc: BaseException, row_schema: pa.Schema | None) -> pa.Table | None:
    """Error rows for `batch` carrying `exc` (pickled, as base64 in `detail`) to the driver;
    None when it cannot be pickled. The link of `exc`'s chain that holds the storage failure
    is sent (pickling keeps an exception's notes but drops its causes)."""
    import base64

    from ray import cloudpickle

    from pipeline.cli import chain, storage_error

    line = storage_error(exc)
    link = next((c for c in chain(exc) if storage_error(c) == line), exc)
    try:
        detail = base64.b64encode(cloudpickle.dumps(link)).decode()
    except Exception:  # noqa: BLE001 (an exception Ray cannot pickle either: raised as it is)
        return None
    n = batch.num_rows
    status = pa.table({
        "key": batch.column("key").cast(pa.string()),
        "ok": pa.repeat(pa.scalar(False), n),
        "stage": pa.nulls(n, pa.string()),
        "source": pa.nulls(n, pa.string()),
        "field": pa.nulls(n, pa.string()),
        "reason": pa.repeat(pa.scalar(REFUSED, pa.string()), n),
        "detail": pa.repeat(pa.scalar(detail, pa.string()), n),
    }, schema=STATUS)
    return status if row_schema is None else with_rows(status, [], row_schema)


def raise_refused(results: pa.Table) -> None:
    """Raise the storage failure a worker returned in `results` (`PoolWriter`), if any."""
    import base64

    from ray import cloudpickle

    refused = results.filter(pc.equal(results.column("reason"), REFUSED))
    if refused.num_rows:
        raise cloudpickle.loads(base64.b64decode(refused.column("detail")[0].as_py()))


# -- running batches on actors, with poison-request isolation ------------------------------------

# Workers that may die during a stage's main pass, per worker of its pool, before the rest of
# its batches go to `isolate_failures` one worker at a time. A batch is never retried on a
# fresh worker there: a batch whose worker died is isolated instead, so one request that kills
# its worker cannot loop forever.
MAX_ACTOR_RESTARTS = 4
# Batches queued on one worker at a time: the next one is there when a call returns.
BATCHES_IN_FLIGHT = 2
# Poison requests a stage isolates before it gives up on the rest of the failed batches
# (each costs about log2(rows per batch) + 1 worker deaths); past it they are error rows, so
# a node where every call dies (a broken GPU) ends the stage instead of bisecting forever.
MAX_POISON_REQUESTS = 16


def compute_blocks(blocks: list[pa.Table], worker_cls, worker_kwargs: dict, pool: ActorPool, *, stage: str, row_schema: pa.Schema | None = None) -> pa.Table:
    """Run every block through a pool of `worker_cls` actors; returns one result row per key
    (`result_schema(row_schema)`: its status, and its stored row when `row_schema` is given).

    Main pass: `pool.size` plain Ray actors (`_Host`) take the blocks as they free up, each
    block a task argument; the actors' own arguments are small values Ray passes inline. (A
    Ray Data actor pool would pass its actors references into the object store, and Ray logs
    an error line for every actor that may restart with such arguments.) A block whose actor
    died (OOM, segfault, CUDA error, os._exit) is not retried there: a fresh actor takes the
    next blocks, and the dead one's keys come back without a status and go to
    `isolate_failures`, which halves the block until the request that kills the worker stands
    alone and becomes an error row (`worker_died`).
    """
    import ray
    from ray.exceptions import RayActorError

    pool = placeable(pool, stage)
    remote = ray.remote(num_cpus=pool.num_cpus, num_gpus=pool.num_gpus, max_restarts=0, max_task_retries=0, **_actor_asks(pool))(_Host)
    queue, starting, running, free = list(blocks), {}, {}, []
    statuses, deaths, dead = [], 0, set()
    progress = Progress(stage, sum(b.num_rows for b in blocks))

    def start() -> None:
        actor = remote.remote(worker_cls, worker_kwargs, row_schema, pool.threads, PoolWriter)
        starting[actor.ready.remote()] = actor

    def died(actor) -> None:
        nonlocal deaths, free
        if actor._actor_id in dead:  # its other queued batch
            return
        dead.add(actor._actor_id)
        deaths += 1
        free = [a for a in free if a._actor_id != actor._actor_id]
        if deaths < pool.size * MAX_ACTOR_RESTARTS and queue:
            start()

    for _ in range(min(pool.size, len(queue))):
        start()
    try:
        while queue or running:
            while free and queue:
                actor = free.pop(0)
                running[actor.run.remote(queue.pop(0))] = actor
            if not running and not starting:
                break  # no worker left: the rest is isolated below
            ref = ray.wait([*running, *starting], num_returns=1)[0][0]
            if ref in starting:
                actor = starting.pop(ref)
                try:
                    ray.get(ref)
                    free += [actor] * BATCHES_IN_FLIGHT
                except RayActorError as exc:
                    if "creation task" in str(exc):  # its constructor raised: the same every time
                        raise RuntimeError(f"{stage}: the worker cannot start: {_last_line(exc)}") from exc
                    log.warning("%s: a worker died while starting (%s)", stage, _death_reason(exc)[:300])
                    died(actor)
                continue
            actor = running.pop(ref)
            try:
                batch = ray.get(ref)
            except RayActorError:
                died(actor)
                continue
            raise_refused(batch)  # the storage refused a part: nothing else can be stored either
            statuses.append(batch)
            progress.add(batch.num_rows)
            free.append(actor)
    finally:
        for actor in {a._actor_id: a for a in [*free, *running.values(), *starting.values()]}.values():
            ray.kill(actor)
    failed = _lost_rows(blocks, statuses)
    if failed:
        log.warning("%s: %d batches (%d requests) lost their worker; isolating the cause", stage, len(failed), sum(b.num_rows for b in failed))
        statuses.append(isolate_failures(failed, worker_cls, worker_kwargs, pool, stage=stage, row_schema=row_schema))
    return pa.concat_tables(statuses) if statuses else result_schema(row_schema).empty_table()


class Progress:
    """One log line every `every_s` seconds while a stage runs: requests done of total, rate, ETA."""

    def __init__(self, stage: str, total: int, every_s: float = 10.0):
        self.stage, self.total, self.every_s = stage, total, every_s
        self.done, self.start = 0, time.perf_counter()
        self.last = self.start

    def add(self, n: int) -> None:
        self.done += n
        now = time.perf_counter()
        if now - self.last < self.every_s or self.done >= self.total:
            return
        self.last = now
        rate = self.done / (now - self.start)
        log.info("%s: %d/%d requests (%.0f%%), %.1f/s, about %.0f s left", self.stage, self.done, self.total,
                 100 * self.done / self.total, rate, (self.total - self.done) / rate)


def _lost_rows(blocks: list[pa.Table], statuses: list[pa.Table]) -> list[pa.Table]:
    """The rows of each block that came back without a status (their worker died).

    One lookup of every block's keys in one hash set of the returned keys (a lookup per
    block would build that set once per block: quadratic in a stage's requests).
    """
    done = pa.concat_tables(statuses).column("key").combine_chunks().cast(pa.string()) if statuses else pa.array([], pa.string())
    keys = pa.concat_arrays([b.column("key").combine_chunks().cast(pa.string()) for b in blocks])  # blocks may hold large_string keys
    lost = pc.invert(pc.is_in(keys, value_set=done))
    if not pc.any(lost).as_py():
        return []
    failed, offset = [], 0
    for b in blocks:
        rows = b.filter(lost.slice(offset, b.num_rows))
        offset += b.num_rows
        if rows.num_rows:
            failed.append(rows)
    return failed


class _Host:
    """A plain Ray actor around a stage worker: a stage's main pass runs on several (with
    `PoolWriter`, which returns a refused write as the batch's result), failure isolation on
    one at a time."""

    def __init__(self, worker_cls, worker_kwargs: dict, row_schema: pa.Schema | None = None, threads: int | None = None,
                 writer: type[PartWriter] = PartWriter):
        self.worker = writer(worker_cls, worker_kwargs, row_schema, threads)

    def ready(self) -> bool:
        return True

    def run(self, batch: pa.Table) -> pa.Table:
        return self.worker(batch)


def isolate_failures(
    blocks: list[pa.Table], worker_cls, worker_kwargs: dict, pool: ActorPool, *, stage: str,
    max_poison: int = MAX_POISON_REQUESTS, row_schema: pa.Schema | None = None,
) -> pa.Table:
    """Rerun batches whose worker died, halving each that dies again, down to single requests.

    A single request that still kills its worker becomes an error row with the reason Ray
    gives (exit code, OOM kill, ...); everything else is computed and stored as usual. A
    worker that cannot even start is a broken stage, not a poison request: that raises.
    """
    import ray
    from ray.exceptions import RayActorError

    max_deaths = max_poison * (math.ceil(math.log2(max(b.num_rows for b in blocks))) + 1)
    remote = ray.remote(num_cpus=pool.num_cpus, num_gpus=pool.num_gpus, max_restarts=0, max_task_retries=0, **_actor_asks(pool))(_Host)
    queue = list(blocks)
    statuses, deaths, actor = [], 0, None
    while queue:
        block = queue.pop(0)
        if deaths >= max_deaths:
            statuses.append(_died(block, stage, f"not retried: workers died {deaths} times while isolating failures in this stage", row_schema))
            continue
        if actor is None:
            actor = _start(remote, worker_cls, worker_kwargs, stage, row_schema=row_schema, threads=pool.threads)
        try:
            statuses.append(ray.get(actor.run.remote(block)))
        except RayActorError as exc:
            deaths += 1
            actor = None
            reason = _death_reason(exc)
            if block.num_rows == 1:
                log.warning("%s: request %s kills its worker (%s); recorded as an error row", stage, block.column("key")[0], reason)
                statuses.append(_died(block, stage, reason, row_schema))
            else:
                half = block.num_rows // 2
                queue[:0] = [block.slice(0, half), block.slice(half)]
    if actor is not None:
        ray.kill(actor)
    return pa.concat_tables(statuses) if statuses else result_schema(row_schema).empty_table()


def _actor_asks(pool: ActorPool) -> dict:
    """Ray's per-actor memory reservation (bytes) and custom resources, when the pool asks for them."""
    asks = {"memory": int(pool.memory_gb * 2**30)} if pool.memory_gb else {}
    return asks | ({"resources": dict(pool.resources)} if pool.resources else {})


def _start(remote, worker_cls, worker_kwargs: dict, stage: str, attempts: int = 3, row_schema: pa.Schema | None = None,
           threads: int | None = None):
    """A fresh worker, ready to take a batch; a worker that fails to start `attempts` times
    in a row is a broken stage (bad model path, no GPU), not a poison request: that raises."""
    import ray
    from ray.exceptions import RayActorError

    for attempt in range(1, attempts + 1):
        actor = remote.remote(worker_cls, worker_kwargs, row_schema, threads)
        try:
            ray.get(actor.ready.remote())
            return actor
        except RayActorError as exc:
            if "creation task" in str(exc):  # its constructor raised: the same every time
                raise RuntimeError(f"{stage}: the worker cannot start: {_last_line(exc)}") from exc
            if attempt == attempts:
                raise RuntimeError(f"{stage}: the worker cannot start ({attempts} attempts): {_death_reason(exc)}") from exc
            log.warning("%s: a worker died while starting (%s); starting another", stage, _death_reason(exc)[:300])


def _last_line(exc: Exception) -> str:
    """The exception a remote traceback ends with (what the user needs to read first)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[-1] if lines else type(exc).__name__


def _death_reason(exc: Exception) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}"[:2000]


def _died(block: pa.Table, stage: str, detail: str, row_schema: pa.Schema | None = None) -> pa.Table:
    n = block.num_rows
    status = pa.table(
        {
            "key": block.column("key"),
            "ok": pa.repeat(pa.scalar(False), n),
            "stage": pa.repeat(pa.scalar(stage, pa.string()), n),
            "source": pa.nulls(n, pa.string()),
            "field": pa.nulls(n, pa.string()),
            "reason": pa.repeat(pa.scalar("worker_died", pa.string()), n),
            "detail": pa.repeat(pa.scalar(detail, pa.string()), n),
        },
        schema=STATUS,
    )
    return status if row_schema is None else with_rows(status, [], row_schema)
