"""Polars' and Arrow's allocators give freed pages back at once in pipeline processes
(pipeline/runtime.py): freed memory that lingered raised and scattered the driver's peak from
window to window.
(That a curation window leaves no Ray dataset, executor or object reference behind is checked
in test_curation_windows.py.)"""
from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.runtime import ARROW_ENV, ENV, MALLOC_ARENAS, POLARS_MALLOC_CONF

REPO = Path(__file__).resolve().parent.parent


def run_probe(code: str, env: dict) -> subprocess.CompletedProcess:
    """Run `code` in a fresh interpreter (allocators read their settings as they load); it must succeed."""
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return out

# jemalloc prints its options at exit with stats_print; polars' jemalloc is prefixed `_rjem_`.
PROBE = (
    "import os, pipeline; os.environ[{env!r}] = ','.join(filter(None, [os.environ.get({env!r}), 'stats_print:true,stats_print_opts:mdablxe'])); "
    "import polars as pl; pl.DataFrame({{'a': range(10)}}).sum(); print('env', os.environ[{env!r}])"
)


def polars_allocator_options(env: dict) -> tuple[str, dict[str, str]]:
    out = run_probe(PROBE.format(env=ENV), env)
    text = out.stdout + out.stderr
    options = dict(line.strip().split(": ", 1)[0:2] for line in text.splitlines() if line.strip().startswith("opt.") and ": " in line)
    if "opt.dirty_decay_ms" not in options:
        pytest.skip("this polars build does not use jemalloc")
    return text, {k: v.split()[0] for k, v in options.items()}


def clean_env() -> dict:
    env = {k: v for k, v in os.environ.items() if k not in (ENV, ARROW_ENV)}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    return env


def test_importing_pipeline_makes_polars_return_freed_memory_at_once():
    _, options = polars_allocator_options(clean_env())
    assert options["opt.dirty_decay_ms"] == "0"  # polars' own default: 500
    assert options["opt.muzzy_decay_ms"] == "0"  # polars' own default: 1000


def test_an_allocator_setting_of_the_user_is_kept():
    text, options = polars_allocator_options(clean_env() | {ENV: "dirty_decay_ms:250"})
    assert options["opt.dirty_decay_ms"] == "250"
    assert POLARS_MALLOC_CONF not in text


# mimalloc prints its options when it starts with MIMALLOC_VERBOSE=1 (pyarrow's default pool).
ARROW_PROBE = "import pipeline, pyarrow as pa; pa.array([1, 2, 3]); print(pa.default_memory_pool().backend_name)"


def arrow_allocator_options(env: dict) -> dict[str, str]:
    out = run_probe(ARROW_PROBE, env | {"MIMALLOC_VERBOSE": "1"})
    if out.stdout.strip() != "mimalloc":
        pytest.skip(f"this pyarrow's default pool is {out.stdout.strip()}, not mimalloc")
    lines = [ln.split("option '", 1)[1] for ln in (out.stdout + out.stderr).splitlines() if ln.startswith("option '")]
    return {ln.split("'", 1)[0]: ln.split(": ", 1)[1].split()[0] for ln in lines}


def test_importing_pipeline_makes_arrow_purge_freed_pages_at_once():
    options = arrow_allocator_options(clean_env())
    assert options["purge_delay"] == "0"  # the default of pyarrow's mimalloc: 1000 (ms)


def test_an_arrow_allocator_setting_of_the_user_is_kept():
    assert arrow_allocator_options(clean_env() | {ARROW_ENV: "25"})["purge_delay"] == "25"


# glibc's malloc_info writes one <heap nr="..."> element per arena. Each new thread that
# allocates gets an arena of its own while there are fewer than the limit.
ARENAS_PROBE = """
import ctypes, tempfile, threading
import pipeline  # caps the arenas (pipeline/runtime.py)
import pyarrow, polars  # both start threads as they load
alive = threading.Barrier(6)
def allocate():  # every thread allocates while all six are alive (an exited thread frees its arena)
    [bytearray(4096) for _ in range(100)]  # over pymalloc's 512 bytes: glibc's malloc
    alive.wait()
threads = [threading.Thread(target=allocate) for _ in range(6)]
[t.start() for t in threads]; [t.join() for t in threads]
libc = ctypes.CDLL(None)
libc.fopen.restype = ctypes.c_void_p
libc.fopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
libc.fclose.argtypes = [ctypes.c_void_p]
libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
with tempfile.NamedTemporaryFile(suffix=".xml") as out:
    f = libc.fopen(out.name.encode(), b"w"); libc.malloc_info(0, f); libc.fclose(f)
    print(open(out.name).read().count("<heap nr="))
"""


def malloc_arenas(env: dict) -> int:
    if platform.libc_ver()[0] != "glibc":
        pytest.skip("glibc's malloc only")
    return int(run_probe(ARENAS_PROBE, env).stdout.split()[-1])


def test_importing_pipeline_makes_threads_share_two_malloc_arenas():
    assert malloc_arenas(clean_env()) == MALLOC_ARENAS == 2


def test_an_arena_limit_of_the_user_is_kept():
    """Also the probe's own check: with a limit of 64, the six threads (and pyarrow's and
    polars' own) take arenas of their own."""
    assert malloc_arenas(clean_env() | {"GLIBC_TUNABLES": "glibc.malloc.arena_max=64"}) >= 7  # the main arena and one per thread
    assert malloc_arenas(clean_env() | {"MALLOC_ARENA_MAX": "3"}) == 3


LATE_PROBE = "import pyarrow, pipeline; from pipeline.runtime import LOADED_TOO_EARLY; print(LOADED_TOO_EARLY)"


def test_a_library_loaded_before_pipeline_is_named_not_silently_left_as_it_was():
    assert run_probe(LATE_PROBE, clean_env()).stdout.strip() == "['pyarrow']"
    assert run_probe(LATE_PROBE, clean_env() | {ARROW_ENV: "0"}).stdout.strip() == "[]"  # set by the user before pyarrow loaded: it applied
