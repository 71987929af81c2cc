"""Polars' allocator returns freed memory to the system at once in pipeline processes.

Polars ships its own jemalloc, which keeps freed pages resident for 0.5 s (dirty) and then
1 s (lazily freed) in each of its arenas (four per CPU) before giving them back. A driver
scoring a curation window frees hundreds of MB of polars intermediates between its steps;
measured after a 100k-pair window, ~250 MB of RSS was such pages (released a second later),
and while they wait Arrow, numpy and Ray allocate fresh pages beside them. That raises the
driver's peak and makes it vary from window to window with thread timing. With both decays
at 0 a polars-heavy step (sort, join, group-by of 1M rows) peaks at 369 MB every time,
against 425-480 MB by default, and a 300k-pair curation's window peaks fell from 1.96 to
1.77 GB on average (docs/curation.md), at the same throughput.

jemalloc reads its settings once, when polars loads, from `_RJEM_MALLOC_CONF`; so this runs
from `pipeline/__init__.py`, before any pipeline module imports polars. Local Ray workers
inherit the driver's environment. A value the user set is kept.
"""
from __future__ import annotations

import os

ENV = "_RJEM_MALLOC_CONF"
POLARS_MALLOC_CONF = "dirty_decay_ms:0,muzzy_decay_ms:0"


def configure_polars_allocator() -> None:
    """Set polars' jemalloc to release freed pages at once, unless the user set it (no
    effect in a process that loaded polars before importing pipeline)."""
    os.environ.setdefault(ENV, POLARS_MALLOC_CONF)
