"""Keeping the engine busy: decode the next micro-batch's images while the engine runs the
current one, and move rows between Arrow and Python without per-row Arrow calls.

With real images, decoding a 1024^2 JPEG takes ~10 ms on a CPU core; done serially before
each engine call, a GPU waits for it. `pipelined` runs `prepare` (image decode) for chunk
k+1 in a background thread while `consume` (the engine call) works on chunk k, so a batch
costs about max(decode, engine) instead of their sum. PIL releases the GIL while it
decodes, so the threads really run side by side.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import pyarrow as pa

T = TypeVar("T")
U = TypeVar("U")

DECODE_THREADS = 4  # images of one micro-batch decoded side by side, when decoding is slow
SLOW_DECODE_S = 0.002  # a first image slower than this: decode the rest in threads (large JPEGs)
DEFAULT_MICRO_BATCH = 256  # rows per engine call when the engine does not say

_pools: dict[str, ThreadPoolExecutor] = {}
_pools_lock = threading.Lock()


def _pool(name: str, workers: int) -> ThreadPoolExecutor:
    """A process-wide thread pool, started once: an actor answers thousands of batches, and
    starting threads per batch costs more than a small batch's decode."""
    with _pools_lock:
        if name not in _pools:
            _pools[name] = ThreadPoolExecutor(workers, thread_name_prefix=name)
        return _pools[name]


def rows_of(batch: pa.Table) -> list[dict]:
    """`batch.to_pylist()`, built from whole columns (several times faster per row)."""
    names = batch.column_names
    columns = [batch.column(name).to_pylist() for name in names]
    return [dict(zip(names, values, strict=True)) for values in zip(*columns, strict=True)]


def table_of(rows: Sequence[Mapping], schema: pa.Schema) -> pa.Table:
    """`pa.Table.from_pylist(rows, schema)` built column by column; keys not in `schema` are ignored."""
    if not rows:
        return schema.empty_table()
    return pa.table({f.name: pa.array([r.get(f.name) for r in rows], type=f.type) for f in schema}, schema=schema)


def micro_batch_size(engine: object, requested: int | None = None) -> int:
    """Rows per engine call: `requested`, else a multiple of the engine's own batch size (so
    an engine that chunks its input sees exactly the chunks it saw before)."""
    if requested is not None:
        if requested < 1:
            raise ValueError(f"micro_batch must be at least 1, got {requested}")
        return requested
    size = getattr(getattr(engine, "spec", None), "batch_size", None)
    return 8 * size if isinstance(size, int) and size > 0 else DEFAULT_MICRO_BATCH


def chunks(rows: Sequence[T], size: int) -> list[Sequence[T]]:
    return [rows[start : start + size] for start in range(0, len(rows), size)]


def pipelined(items: Iterable[T], prepare: Callable[[T], U], consume: Callable[[T, U], None]) -> None:
    """For each item in order: consume(item, prepare(item)), with the next item's `prepare`
    running in a background thread during the current `consume`.

    `prepare` calls run one at a time, in order; an exception in either is raised here.
    A single item has nothing to overlap with and runs in the caller's thread.
    """
    items = list(items)
    if len(items) <= 1:
        for item in items:
            consume(item, prepare(item))
        return
    pool = _pool("prefetch", 1)
    upcoming = pool.submit(prepare, items[0])
    try:
        for k, item in enumerate(items):
            prepared = upcoming.result()
            if k + 1 < len(items):
                upcoming = pool.submit(prepare, items[k + 1])
            consume(item, prepared)
    finally:
        if not upcoming.cancel():  # never leave a prepare running past the call
            upcoming.exception()


class ImageCache:
    """The decoded images of one batch, by content hash; each distinct image decoded once.

    `load(rows)` decodes the rows' images not seen yet and returns the shared (images,
    failures) maps; a failure is the error text of an unreadable image. `load_image(uri, hash)`
    gets the hash too, so it can check the bytes it reads (`operators.images.load_image`). When the first image
    takes longer than SLOW_DECODE_S (real photos: ~10 ms), the rest are decoded in `threads`
    threads; small images are cheaper to decode than to hand to a thread.
    """

    def __init__(self, load_image: Callable[[str, str], object], threads: int = DECODE_THREADS):
        self.load_image = load_image
        self.threads = threads
        self.images: dict[str, object] = {}
        self.failures: dict[str, str] = {}

    def load(self, rows: Iterable[Mapping]) -> tuple[dict, dict]:
        return self.load_pairs((row.get("image_hash"), row.get("image_uri")) for row in rows)

    def load_pairs(self, pairs: Iterable[tuple[str | None, str | None]]) -> tuple[dict, dict]:
        """`load` for (image_hash, image_uri) pairs (columns, no row dicts); a None hash is skipped."""
        wanted: dict[str, str] = {}
        for h, uri in pairs:
            if h is not None and h not in self.images and h not in self.failures and h not in wanted:
                wanted[h] = uri
        todo = list(wanted.items())
        outcomes = []
        if todo:
            start = time.perf_counter()
            outcomes.append(self._decode(todo[0]))
            slow = time.perf_counter() - start > SLOW_DECODE_S
            if slow and len(todo) > 2 and self.threads > 1:
                outcomes += _pool(f"decode{self.threads}", self.threads).map(self._decode, todo[1:])
            else:
                outcomes += [self._decode(pair) for pair in todo[1:]]
        for h, (image, failure) in zip(wanted, outcomes, strict=True):
            if failure is None:
                self.images[h] = image
            else:
                self.failures[h] = failure
        return self.images, self.failures

    def _decode(self, pair: tuple[str, str]) -> tuple[object, str | None]:
        h, uri = pair
        try:
            return self.load_image(uri, h), None
        except Exception as exc:  # an unreadable image is a row error, not a crash
            return None, f"{type(exc).__name__}: {exc}"
