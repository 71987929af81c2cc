"""Polars' and Arrow's allocators return freed memory to the system at once in pipeline processes.

Polars ships its own jemalloc, which keeps freed pages resident for 0.5 s (dirty) and then
1 s (lazily freed) in each of its arenas (four per CPU) before giving them back. A driver
scoring a curation window frees hundreds of MB of polars intermediates between its steps;
measured after a 100k-pair window, ~250 MB of RSS was such pages (released a second later),
and while they wait Arrow, numpy and Ray allocate fresh pages beside them. That raises the
driver's peak and makes it vary from window to window with thread timing. With both decays
at 0 a polars-heavy step (sort, join, group-by of 1M rows) peaks at 369 MB every time,
against 425-480 MB by default, and a 300k-pair curation's window peaks fell from 1.96 to
1.77 GB on average (docs/curation.md), at the same throughput.

Arrow's default pool (mimalloc in pyarrow's wheels) purges freed pages only a second after
the free (its `purge_delay`, 1000 ms), and only when the freeing thread next allocates: a
driver that builds a window's tables and then drops them keeps the pages. With the delay at
0 a 100k-pair curation window peaked at 1.43-1.45 GB instead of 1.68-1.71 GB (three runs or more
each), and held 0.28-0.36 GB of anonymous memory after the window instead of 0.47-0.56 GB, at the
same speed (docs/curation.md).

Both allocators read their settings once, when their library loads (`_RJEM_MALLOC_CONF`,
`MIMALLOC_PURGE_DELAY`; mimalloc's as pyarrow is imported); so this runs from
`pipeline/__init__.py`, before any pipeline module imports polars or pyarrow. Local Ray
workers inherit the driver's environment. A value the user set is kept.

The C allocator (glibc's malloc: Python objects over 512 bytes, Ray's core worker, gRPC,
Arrow's C++ containers) gives each new thread its own arena, up to eight per core. pyarrow and
polars start threads when they load, Ray starts dozens more in the driver, and memory freed in
one arena is reused only by the threads of that arena. A curation driver's RSS rose by ~30 MB
per 100k-pair window, all of it in glibc's thread arenas, though no allocation outlived its
window (memray). With two arenas, three 1M-pair nights rose by +1 to +20 MB per window, ~6 MB
of it the key indexes a process keeps (pipeline/store.py, bounded), at the same speed. glibc
reads MALLOC_ARENA_MAX when the process starts, so the cap is set with `mallopt` instead, at
import too, before pyarrow and polars start their threads.
"""
from __future__ import annotations

import ctypes
import os
import platform
import sys

ENV = "_RJEM_MALLOC_CONF"
POLARS_MALLOC_CONF = "dirty_decay_ms:0,muzzy_decay_ms:0"
ARROW_ENV = "MIMALLOC_PURGE_DELAY"
ARROW_PURGE_DELAY_MS = "0"
# library -> (the variable its allocator reads as it loads, our value)
SETTINGS = {"polars": (ENV, POLARS_MALLOC_CONF), "pyarrow": (ARROW_ENV, ARROW_PURGE_DELAY_MS)}


# Libraries loaded before pipeline whose allocator setting therefore did not apply here
# (`ensure_ray` says so in the driver's log).
LOADED_TOO_EARLY: list[str] = []


def configure_allocators() -> None:
    """Set polars' jemalloc and Arrow's mimalloc to release freed pages at once and cap glibc's
    malloc arenas, unless the user set them (polars' and Arrow's settings have no effect in a
    process that loaded them before importing pipeline: `LOADED_TOO_EARLY` names them)."""
    LOADED_TOO_EARLY[:] = [name for name, (env, _) in SETTINGS.items() if name in sys.modules and env not in os.environ]
    for env, value in SETTINGS.values():
        os.environ.setdefault(env, value)
    limit_malloc_arenas()


M_ARENA_MAX = -8  # glibc's mallopt parameter: the most arenas malloc may create
MALLOC_ARENAS = 2


def limit_malloc_arenas(arenas: int = MALLOC_ARENAS) -> bool:
    """Cap glibc's malloc arenas in this process (threads started later share them); True when
    set. Not on other C libraries, and not when the user set MALLOC_ARENA_MAX (or its glibc
    tunable) for the process: glibc has already applied that."""
    if platform.libc_ver()[0] != "glibc":
        return False
    if "MALLOC_ARENA_MAX" in os.environ or "glibc.malloc.arena_max" in os.environ.get("GLIBC_TUNABLES", ""):
        return False
    mallopt = ctypes.CDLL(None).mallopt
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return mallopt(M_ARENA_MAX, arenas) == 1
