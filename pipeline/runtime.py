"""Starting or joining Ray, and recording what the run ran on."""
from __future__ import annotations

import logging
import os
import subprocess
import sys
from dataclasses import dataclass
from importlib import metadata

from pipeline import allocator, storage

log = logging.getLogger(__name__)

_VERSIONED = ("ray", "polars", "pyarrow", "numpy", "scipy", "omegaconf", "transformers", "torch", "torchvision", "vllm", "s3fs")


GiB = 1024**3


@dataclass(frozen=True)
class MemoryLimits:
    """Memory ceilings, so that no stage can take a node down (issue: a 100k-item sweep drove
    the node to 22.4 of 23.5 GB and Ray OOM-killed and retried workers without end).

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
    if allocator.LOADED_TOO_EARLY:
        log.info("%s loaded before pipeline: its allocator keeps freed memory longer in this driver (import pipeline first; pipeline/allocator.py)", " and ".join(allocator.LOADED_TOO_EARLY))
    if not ray.is_initialized():
        kwargs = {"include_dashboard": False, "configure_logging": True, "logging_level": logging.WARNING}
        if address:
            kwargs["address"] = address
        elif not os.environ.get("RAY_ADDRESS"):
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
    """Storage settings to hand to every worker of this driver's job.

    Inside a submitted job, the variables its runtime_env already sets are left out: workers
    have them, and Ray refuses a driver that sets one of them again.
    """
    already = storage.submitted_job_env_vars()
    return {k: v for k, v in storage.worker_env().items() if k not in already}


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
