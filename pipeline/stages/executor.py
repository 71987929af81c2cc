"""Where the map stages run: Ray Data (the default), or this process for small API calls.

Scoring ten pairs from a notebook should not start a Ray cluster, spawn actors and load
the model in each of them. Inside `running_locally(executor)` the DAG's map stages
(`run_and_read`, image hashing) call `executor.map_batches` instead of Ray Data: the
same worker classes and functions, the same batches, the same stored parts and markers, the
same results (each key's status and stored row), one batch after another in this process. The executor keeps its workers, and every
worker of one backbone shares one loaded engine, so a `Scorer` loads its model once and
reuses it across calls.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import pyarrow as pa

log = logging.getLogger(__name__)

_CURRENT: ContextVar[LocalExecutor | None] = ContextVar("depict_local_executor", default=None)


class LocalExecutor:
    """Runs map stages in this process and keeps their workers (and engines) between calls."""

    def __init__(self) -> None:
        self._workers: dict[tuple[str, str], object] = {}
        self._engines: dict[str, object] = {}
        self.engine_loads = 0  # how many models this executor has loaded (tests, logs)

    def map_batches(self, blocks: list[pa.Table], fn: Callable | type, constructor_kwargs: dict | None = None) -> list[pa.Table]:
        """Each block through `fn` (a function, or a class built once with `constructor_kwargs`
        whose instances are called per block, like a Ray Data actor), in order."""
        if isinstance(fn, type):
            call = self._worker(fn, constructor_kwargs or {})
        else:
            call = fn
        return [call(block) for block in blocks]

    def engine(self, backbone):
        """The backbone's engine, loaded on first use and shared by every worker after that."""
        key = backbone.fingerprint() + "|" + backbone.engine + "|" + backbone.name
        if key not in self._engines:
            from operators.engines import load_engine

            log.info("loading engine %s (%s) in this process", backbone.name, backbone.model_id)
            self._engines[key] = load_engine(backbone)
            self.engine_loads += 1
        return self._engines[key]

    def close(self) -> None:
        """Release the engines (GPU memory) and workers."""
        for engine in self._engines.values():
            close = getattr(engine, "close", None)
            if close is not None:
                close()
        self._engines.clear()
        self._workers.clear()

    def _worker(self, cls: type, kwargs: dict):
        key = (f"{cls.__module__}.{cls.__qualname__}", repr(sorted(kwargs.items())))
        if key not in self._workers:
            token = _CURRENT.set(self)  # the worker's constructor asks for the shared engine
            try:
                self._workers[key] = cls(**kwargs)
            finally:
                _CURRENT.reset(token)
        return self._workers[key]


def current() -> LocalExecutor | None:
    """The executor of the enclosing `running_locally` block; None: run on Ray."""
    return _CURRENT.get()


@contextmanager
def running_locally(executor: LocalExecutor) -> Iterator[LocalExecutor]:
    token = _CURRENT.set(executor)
    try:
        yield executor
    finally:
        _CURRENT.reset(token)


def load_engine(backbone):
    """What a worker calls to get its engine: the local executor's shared one when running
    in-process, else a fresh one (a Ray actor loads its own)."""
    local = current()
    if local is not None:
        return local.engine(backbone)
    from operators.engines import load_engine as load

    return load(backbone)
