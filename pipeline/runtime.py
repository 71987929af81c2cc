"""Starting or joining Ray, and recording what the run ran on."""
from __future__ import annotations

import logging
import os
import subprocess
import sys
from importlib import metadata

from pipeline import storage

log = logging.getLogger(__name__)

_VERSIONED = ("ray", "polars", "pyarrow", "numpy", "scipy", "omegaconf", "transformers", "torch", "torchvision", "vllm", "s3fs")


def ensure_ray(address: str | None = None, num_cpus: int | None = None, progress_bars: bool = True) -> None:
    """Join the cluster at `address` / $RAY_ADDRESS (set by `ray job submit`), else start local Ray.

    Workers get the driver's non-secret storage settings (endpoint, region), so that an
    answer actor on another node reads and writes the same s3:// store as the driver.
    """
    import ray

    if not ray.is_initialized():
        kwargs = {"include_dashboard": False, "configure_logging": True, "logging_level": logging.WARNING}
        if address:
            kwargs["address"] = address
        elif not os.environ.get("RAY_ADDRESS") and num_cpus is not None:
            kwargs["num_cpus"] = num_cpus
        env_vars = worker_env_vars()
        if env_vars:
            kwargs["runtime_env"] = {"env_vars": env_vars}
        ray.init(**kwargs)
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = progress_bars
    ctx.print_on_execution_start = False


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
