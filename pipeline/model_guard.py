"""Refuse, before Ray starts or any stage runs, a backbone whose model cannot be loaded.

The sweep, curation, the `Scorer` API and `jobs/micro_vlm.py evaluate` call `require_models`
first, so a missing folder, a hub id that is neither cached nor reachable, or an engine whose
install extra is missing ends in seconds with one line (a ConfigError: exit 2 from a job)
naming the backbone, the model id and the fix (`operators.engines.model_check`).
"""
from __future__ import annotations

from collections.abc import Iterable

from operators.engines.model_check import model_problem
from operators.engines.spec import BackboneSpec
from pipeline.config import ConfigError

_found: set[tuple] = set()  # models already found loadable in this process: a hub id is asked once


def require_models(backbones: Iterable[BackboneSpec]) -> None:
    """ConfigError for the first backbone whose model cannot be loaded, naming the fix."""
    for spec in backbones:
        key = (spec.name, spec.model_id, spec.revision, spec.engine)
        if key in _found:
            continue
        problem = model_problem(spec)
        if problem is not None:
            field, line = problem
            raise ConfigError(f"backbones.{spec.name}.{field}", line)
        _found.add(key)
