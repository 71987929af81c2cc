"""Run model work (answers, generations) as a Ray Data actor-pool stage that writes parts.

The driver computes which keys are missing from the store (anti-join); Ray Data streams the
missing rows through a pool of actors that each load the engine once; every batch is
written to the store as one complete part before its status comes back, so a run killed at
any moment keeps all finished batches and the rerun asks only for the rest.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc

from operators import schema
from operators.engines.spec import BackboneSpec
from operators.hashing import keys_digest
from pipeline import executor
from pipeline.config import ComputeSpec
from pipeline.store import Markers, PartStore

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
    errors: pa.Table = field(default_factory=schema.ERRORS.empty_table, repr=False)

    def as_row(self) -> dict:
        return {k: getattr(self, k) for k in ("stage", "unit", "needed", "cached", "sent", "failed", "seconds")}


def status_table(keys: list[str], errors: pa.Table) -> pa.Table:
    """Per-key status of a processed batch: ok unless the key has an error row."""
    failed = {r["key"]: r for r in errors.to_pylist()}
    rows = []
    for key in keys:
        err = failed.get(key)
        rows.append(
            {"key": key, "ok": err is None}
            | ({k: err.get(k) for k in ("stage", "source", "field", "reason", "detail")} if err else {})
        )
    return pa.Table.from_pylist(rows, schema=STATUS)


@dataclass(frozen=True)
class ActorPool:
    """What a stage's workers need from Ray: how many, and each one's GPUs and CPUs
    (NeMo-Curator-style: a stage declares its resources, Ray places it)."""

    size: int = 1
    num_gpus: float = 0.0
    num_cpus: float = 1.0
    rows_per_batch: int = 256  # rows per worker call and per stored part (resume granularity)


def engine_pool(backbone: BackboneSpec, compute: ComputeSpec) -> ActorPool:
    """A backbone's engine replicas: a GPU group per vLLM engine (tensor parallel), CPU for hf/scripted."""
    if compute.gpus_per_engine is not None:
        gpus = compute.gpus_per_engine
    elif backbone.engine == "vllm":
        gpus = backbone.tensor_parallel_size
    else:
        gpus = 0
    return ActorPool(size=compute.engines_per_backbone, num_gpus=gpus, num_cpus=compute.cpus_per_engine, rows_per_batch=compute.rows_per_part)


def run_engine_stage(
    *,
    stage: str,
    unit: str,
    requests: pa.Table,
    store: PartStore,
    worker_cls,
    worker_kwargs: dict,
    pool: ActorPool,
) -> StageReport:
    """Compute every key of `requests` that `store` lacks; returns counts and error rows.

    A unit that finished without failures leaves a success marker named by the digest of its
    keys; asking for exactly that unit again skips it without listing the store.
    """
    import ray

    start = time.perf_counter()
    report = StageReport(stage=stage, unit=unit, needed=requests.num_rows)
    if requests.num_rows == 0:
        return report
    markers = Markers(f"{store.url}/_markers")
    unit_marker = f"{stage}-{keys_digest(requests.column('key').to_pylist())}"
    if markers.done(unit_marker):
        report.cached = report.needed
        report.seconds = time.perf_counter() - start
        log.info("%s/%s: finished before (marker %s)", stage, unit, unit_marker)
        return report
    # Batches are cut from the FULL request list, then filtered to the missing keys: a resumed
    # run sends exactly the batches the interrupted run had not finished, with the same
    # composition (so even batch-dependent numerics are identical) and the same part names.
    rows = pool.rows_per_batch
    missing = store.missing(requests.column("key"))
    blocks = []
    for start_row in range(0, requests.num_rows, rows):
        block = requests.slice(start_row, rows).filter(missing.slice(start_row, rows))
        if block.num_rows:
            blocks.append(block)
    n_todo = sum(b.num_rows for b in blocks)
    report.cached = requests.num_rows - n_todo
    if n_todo == 0:
        report.seconds = time.perf_counter() - start
        log.info("%s/%s: all %d keys cached", stage, unit, report.needed)
        markers.mark(unit_marker, report.as_row() | {"finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")})
        return report

    log.info("%s/%s: %d needed, %d cached, %d to compute", stage, unit, report.needed, report.cached, n_todo)
    local = executor.current()
    if local is not None:  # in-process (pipeline.executor): the same workers and batches, no Ray
        statuses = local.map_batches(blocks, worker_cls, worker_kwargs)
    else:
        dataset = ray.data.from_arrow(blocks).map_batches(
            worker_cls,
            fn_constructor_kwargs=worker_kwargs,
            batch_size=None,  # one block = one engine call = one stored part
            batch_format="pyarrow",
            compute=ray.data.ActorPoolStrategy(size=pool.size),
            num_gpus=pool.num_gpus,
            num_cpus=pool.num_cpus,
        )
        # Streaming: parts are written by the actors as batches finish, statuses come back here.
        statuses = list(dataset.iter_batches(batch_size=None, batch_format="pyarrow"))
    status = pa.concat_tables(statuses) if statuses else STATUS.empty_table()
    report.sent = status.num_rows
    bad = status.filter(pc.invert(status.column("ok")))
    report.failed = bad.num_rows
    report.errors = schema.conform(bad, schema.ERRORS, what="errors")
    report.seconds = time.perf_counter() - start
    if report.failed == 0:
        markers.mark(unit_marker, report.as_row() | {"finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")})
    return report


class AnswerWorker:
    """Ray actor: one engine per replica; answers a batch and stores it before returning."""

    def __init__(self, backbone: BackboneSpec, templates: dict, store_url: str):
        from operators.images import decode_image, read_image_bytes
        from pipeline.executor import load_engine  # shared in-process, own engine in a Ray actor

        self.backbone = backbone
        self.templates = templates
        self.store = PartStore(store_url, schema.ANSWERS)
        self.engine = load_engine(backbone)
        self.load_image = lambda uri: decode_image(read_image_bytes(uri), uri)

    def __call__(self, batch: pa.Table) -> pa.Table:
        from operators.answering import answer_batch

        answers, errors = answer_batch(self.engine, batch, self.templates, self.load_image, system=self.backbone.system_prompt)
        self.store.write(answers)
        return status_table(batch.column("key").to_pylist(), errors)


class GenerationWorker:
    """Ray actor: greedy generations (questions, DSG graphs, claims) stored raw."""

    def __init__(self, backbone: BackboneSpec, templates: dict, store_url: str):
        from pipeline.executor import load_engine  # shared in-process, own engine in a Ray actor

        self.backbone = backbone
        self.templates = templates
        self.store = PartStore(store_url, schema.GENERATIONS)
        self.engine = load_engine(backbone)

    def __call__(self, batch: pa.Table) -> pa.Table:
        from operators.answering import generate_batch

        generations, errors = generate_batch(
            self.engine, batch, self.templates, max_new_tokens=self.backbone.max_new_tokens, system=self.backbone.system_prompt
        )
        self.store.write(generations)
        return status_table(batch.column("key").to_pylist(), errors)
