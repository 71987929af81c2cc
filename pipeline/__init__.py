"""Orchestration: configs, loaders, store, stages, statistics, reports.

`from pipeline import Scorer` is the Python API (pipeline/api.py); it is imported on first
use so that importing any other pipeline module (in every Ray worker) stays light.
Importing the package first sets polars' allocator to return freed memory at once
(pipeline/allocator.py): polars reads that setting when it loads.
"""
from pipeline.allocator import configure_polars_allocator

configure_polars_allocator()


def __getattr__(name: str):
    if name in ("Scorer", "PairErrors"):
        from pipeline import api

        return getattr(api, name)
    raise AttributeError(f"module 'pipeline' has no attribute {name!r}")
