"""The process a job runs in: its allocators (set as `pipeline` is imported), starting or joining
Ray with memory limits, and recording what the run ran on."""
from __future__ import annotations

import ctypes
import logging
import os
import platform
import subprocess
import sys
from dataclasses import dataclass
from importlib import metadata

from pipeline import console
from pipeline.store import settings

log = logging.getLogger(__name__)


# -- allocators ------------------------------------------------------------------------------------
# Polars' and Arrow's allocators return freed memory to the system at once in pipeline processes.
#
# Polars ships its own jemalloc, which keeps freed pages resident for 0.5 s (dirty) and then
# 1 s (lazily freed) in each of its arenas (four per CPU) before giving them back. A driver
# scoring a curation window frees hundreds of MB of polars intermediates between its steps;
# measured after a 100k-pair window, ~250 MB of RSS was such pages (released a second later),
# and while they wait Arrow, numpy and Ray allocate fresh pages beside them. That raises the
# driver's peak and makes it vary from window to window with thread timing. With both decays
# at 0 a polars-heavy step (sort, join, group-by of 1M rows) peaks at 369 MB every time,
# against 425-480 MB by default, and a 300k-pair curation's window peaks fell from 1.96 to
# 1.77 GB on average (docs/curation.md), at the same throughput.
#
# Arrow's default pool (mimalloc in pyarrow's wheels) purges freed pages only a second after
# the free (its `purge_delay`, 1000 ms), and only when the freeing thread next allocates: a
# driver that builds a window's tables and then drops them keeps the pages. With the delay at
# 0 a 100k-pair curation window peaked at 1.43-1.45 GB instead of 1.68-1.71 GB (three runs or more
# each), and held 0.28-0.36 GB of anonymous memory after the window instead of 0.47-0.56 GB, at the
# same speed (docs/curation.md).
#
# Both allocators read their settings once, when their library loads (`_RJEM_MALLOC_CONF`,
# `MIMALLOC_PURGE_DELAY`; mimalloc's as pyarrow is imported); so this runs from
# `pipeline/__init__.py`, before any pipeline module imports polars or pyarrow. Local Ray
# workers inherit the driver's environment. A value the user set is kept.
#
# The C allocator (glibc's malloc: Python objects over 512 bytes, Ray's core worker, gRPC,
# Arrow's C++ containers) gives each new thread its own arena, up to eight per core. pyarrow and
# polars start threads when they load, Ray starts dozens more in the driver, and memory freed in
# one arena is reused only by the threads of that arena. A curation driver's RSS rose by ~30 MB
# per 100k-pair window, all of it in glibc's thread arenas, though no allocation outlived its
# window (memray). With two arenas, three 1M-pair nights rose by +1 to +20 MB per window, ~6 MB
# of it the key indexes a process keeps (pipeline/store/parts.py, bounded), at the same speed. glibc
# reads MALLOC_ARENA_MAX when the process starts, so the cap is set with `mallopt` instead, at
# import too, before pyarrow and polars start their threads.

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


# -- Ray and the run ---------------------------------------------------------------------------------

_VERSIONED = ("ray", "polars", "pyarrow", "numpy", "scipy", "omegaconf", "transformers", "torch", "torchvision", "vllm", "s3fs")


GiB = 1024**3


@dataclass(frozen=True)
class MemoryLimits:
    """Memory ceilings, so that no stage can take a node down (without them a 100k-item sweep
    drives the node to 22.4 of 23.5 GB and Ray OOM-kills and retries workers without end).

    - `object_store_memory_gb`: the object store of a local Ray (a cluster sets its own);
    - `data_object_store_fraction`: how much of the object store Ray Data's streaming executor
      may fill; past it, upstream operators wait (backpressure) instead of spilling or OOM;
    - `task_memory_gb`: logical memory each shard-reading, publishing or hashing task reserves,
      so Ray never runs more of them at once than the node's memory holds;
    - `oom_retries`: how often a task killed for memory is retried (Ray's default is forever).
    """

    object_store_memory_gb: float | None = None
    data_object_store_fraction: float = 0.5
    task_memory_gb: float = 2.0
    oom_retries: int = 3

    @classmethod
    def from_compute(cls, compute) -> MemoryLimits:
        defaults = cls()
        return cls(**{k: getattr(compute, k, getattr(defaults, k)) for k in cls.__dataclass_fields__})


_limits = MemoryLimits()


def ensure_ray(address: str | None = None, num_cpus: int | None = None, progress_bars: bool = True, memory: MemoryLimits | None = None) -> None:
    """Join the cluster at `address` / $RAY_ADDRESS (set by `ray job submit`), else start local Ray.

    Workers get the driver's non-secret storage settings (endpoint, region), so that an
    answer actor on another node reads and writes the same s3:// store as the driver.
    `memory` sets the ceilings (MemoryLimits); a cluster's object store and OOM retries are
    the cluster's own settings (docs/cluster.md), the rest apply to this driver's stages.
    """
    import ray

    global _limits
    _limits = memory or MemoryLimits()
    if LOADED_TOO_EARLY:
        log.info("%s loaded before pipeline: its allocator keeps freed memory longer in this driver (import pipeline first; pipeline/runtime.py)", " and ".join(LOADED_TOO_EARLY))
    if not ray.is_initialized():
        kwargs = {"include_dashboard": False, "configure_logging": True, "logging_level": console.library_log_level()}
        if address:
            kwargs["address"] = address
        if not joins_cluster(address):
            if num_cpus is not None:
                kwargs["num_cpus"] = num_cpus
            kwargs |= local_memory_kwargs(_limits)
        env_vars = worker_env_vars()
        if env_vars:
            kwargs["runtime_env"] = {"env_vars": env_vars}
        ray.init(**kwargs)
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = progress_bars
    ctx.print_on_execution_start = False
    store = ray.cluster_resources().get("object_store_memory")
    if store:
        limits = ctx.execution_options.resource_limits
        ctx.execution_options.resource_limits = limits.copy(object_store_memory=store * _limits.data_object_store_fraction)


class Unplaceable(RuntimeError):
    """Engines that ask for what no node of this cluster offers (GPUs, a custom resource): they
    would wait forever, so the stage stops at once, naming the setting to change."""


class LocalPathOnCluster(ValueError):
    """A local path given to a run on a Ray cluster whose nodes do not share it."""


def refuse_unshared_paths(paths: dict[str, str | None], shared: list[str] | tuple[str, ...] = ()) -> None:
    """On a Ray cluster of more than one node, refuse a local path before any work.

    Engine actors and tasks run on every node and write where they run: answer parts stored
    on a worker node's own disk are invisible to the driver, so a rerun recomputes them or
    reports keys that vanished. `paths` maps each setting to its value (for the message); a
    path under one of `shared` (a mount every node sees at the same place, `compute.shared_paths`)
    is accepted. One node (a laptop, one machine) needs no check.
    """
    from pipeline.store.fs import is_local_path  # not at the top: it loads pyarrow, which must come after the allocator settings

    local = {setting: path for setting, path in paths.items() if path and is_local_path(path) and not _under(path, shared)}
    if not local:
        return
    import ray

    nodes = sum(1 for node in ray.nodes() if node["Alive"])
    if nodes < 2:
        return
    setting, path = next(iter(local.items()))
    folder = path.removeprefix("file://")
    raise LocalPathOnCluster(
        f"{setting}={folder} is a local path, but this Ray cluster has {nodes} nodes and each would write to its own disk "
        f"(answers computed on another node would vanish from this run); use {setting}=s3://<bucket>/<prefix>, or, if every "
        f"node mounts {folder} at the same path (NFS, Lustre), declare it: compute.shared_paths=[{folder}]"
    )


def joins_cluster(address: str | None) -> bool:
    """Whether this job joins a running Ray cluster (which may have several nodes) rather
    than starting a local Ray of one node. `local` (Ray's word for "start a new one here", which
    users export to keep several instances apart) is a local Ray."""
    return (address or os.environ.get("RAY_ADDRESS") or "local") != "local"


def _under(path: str, folders: list[str] | tuple[str, ...]) -> bool:
    path = os.path.abspath(path.removeprefix("file://"))
    for folder in folders:
        folder = os.path.abspath(os.path.expanduser(folder))
        if path == folder or path.startswith(folder.rstrip(os.sep) + os.sep):
            return True
    return False


def local_memory_kwargs(limits: MemoryLimits) -> dict:
    """ray.init arguments that bound a local Ray's memory."""
    kwargs: dict = {"_system_config": {"task_oom_retries": limits.oom_retries}}
    if limits.object_store_memory_gb is not None:
        kwargs["object_store_memory"] = int(limits.object_store_memory_gb * GiB)
    return kwargs


def task_options() -> dict:
    """Ray Data arguments for CPU tasks that hold a shard or a block of images in memory:
    the memory each reserves (at most a CPU's share of the node's, so a task can always be
    placed). Retries after an OOM kill are bounded by `oom_retries` (local Ray)."""
    import ray

    resources = ray.cluster_resources() if ray.is_initialized() else {}
    share = resources.get("memory", 0) / max(resources.get("CPU", 1), 1)
    memory = int(_limits.task_memory_gb * GiB)
    if share:
        memory = min(memory, int(0.8 * share))
    return {"memory": memory}


def worker_env_vars() -> dict[str, str]:
    """Storage settings (and the quieting of libraries, pipeline/console.py) to hand to every
    worker of this driver's job.

    Inside a submitted job, the variables its runtime_env already sets are left out: workers
    have them, and Ray refuses a driver that sets one of them again.
    """
    already = settings.submitted_job_env_vars()
    return {k: v for k, v in (settings.worker_env() | console.worker_env()).items() if k not in already}


def library_versions() -> dict[str, str | None]:
    versions = {"python": sys.version.split()[0]}
    for name in _VERSIONED:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def git_commit(cwd: str | None = None) -> str | None:
    """The commit of the code that ran (None outside a git checkout, e.g. a Ray working_dir)."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=cwd or os.path.dirname(__file__), capture_output=True, text=True, timeout=5
        )
        commit = out.stdout.strip()
        if out.returncode != 0 or not commit:
            return None
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], cwd=cwd or os.path.dirname(__file__), capture_output=True, text=True, timeout=5
        ).stdout.strip()
        return commit + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None
