"""Orchestration: store/, benchmarks/, stages/, curation/, stats/, reports/, explore/ and the
modules jobs call (config, sweep, scoring, metaeval, api, pairs, preflight_checks,
micro_vlm_training, cli, runtime, console);
docs/DESIGN.md maps what each owns and may import.

`from pipeline import Scorer` is the Python API (pipeline/api.py); it is imported on first
use so that importing any other pipeline module (in every Ray worker) stays light.
Importing the package first sets polars' and Arrow's allocators to return freed memory at
once (pipeline/runtime.py): each reads its setting when it loads.
"""
from pipeline.runtime import configure_allocators

configure_allocators()


def __getattr__(name: str):
    if name in ("Scorer", "PairErrors"):
        from pipeline import api

        return getattr(api, name)
    raise AttributeError(f"module 'pipeline' has no attribute {name!r}")
