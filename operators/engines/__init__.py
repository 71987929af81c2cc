"""Model engines behind one interface (`base.Engine`), chosen by a backbone's `engine` field.

`ENGINES` is the one registry of engines: a backbone's `engine` field is validated against it
(pipeline/config.py) and an engine is added by its module plus one entry here. Engines are
named by module path and imported only when loaded, so importing this package pulls in
neither torch nor vllm (the pipeline imports it on CPU-only drivers).
"""
from __future__ import annotations

import importlib
import os
from collections.abc import Iterator
from contextlib import contextmanager

from operators.engines.base import Engine, Prompt
from operators.engines.spec import BackboneSpec

ENGINES: dict[str, str] = {
    "hf": "operators.engines.hf:HFEngine",
    "vllm": "operators.engines.vllm:VLLMEngine",
    "scripted": "operators.engines.scripted:ScriptedEngine",
    "world_oracle": "operators.engines.world_oracle:WorldOracleEngine",
}

# Engines that load no model: nothing to look for before a run (model_check), no loading to
# quiet. Their answers come from code, so the module's `REVISION` (the version of its answering
# logic, when it has one) stands for the model's revision in answer keys (`engine_revision`).
NO_WEIGHTS = frozenset({"scripted", "world_oracle"})


def engine_revision(engine: str) -> str | None:
    """The answering logic's version of an engine that loads no model (its module's REVISION),
    else None: a model's revision is its weights'."""
    if engine not in NO_WEIGHTS:
        return None
    revision = getattr(importlib.import_module(ENGINES[engine].split(":")[0]), "REVISION", None)
    return None if revision is None else str(revision)


def load_engine(spec: BackboneSpec) -> Engine:
    """Build the engine `spec.engine` names, loading its model."""
    target = ENGINES.get(spec.engine)
    if target is None:
        raise ValueError(
            f"backbone {spec.name!r}: unknown engine {spec.engine!r}; valid engines: {sorted(ENGINES)}"
        )
    module_name, class_name = target.split(":")
    with quiet_loading(spec.engine not in NO_WEIGHTS):
        engine_class = getattr(importlib.import_module(module_name), class_name)
        return engine_class(spec)


@contextmanager
def quiet_loading(loads_weights: bool = True) -> Iterator[None]:
    """Transformers' and the hub's progress bars ("Loading weights") off while a model loads:
    in a notebook or service that imported transformers before any job could quiet it, they
    are noise between the caller's own lines. DEPICT_VERBOSE=1 (a job's --verbose) keeps them."""
    if not loads_weights or os.environ.get("DEPICT_VERBOSE", "") not in ("", "0", "false"):
        yield
        return
    from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars
    from transformers.utils import logging as transformers_logging

    bars_were_on, hub_bars_were_on = transformers_logging.is_progress_bar_enabled(), not are_progress_bars_disabled()
    transformers_logging.disable_progress_bar()  # the hub's too
    try:
        yield
    finally:
        if bars_were_on:
            transformers_logging.enable_progress_bar()
        (enable_progress_bars if hub_bars_were_on else disable_progress_bars)()


__all__ = ["ENGINES", "NO_WEIGHTS", "BackboneSpec", "Engine", "Prompt", "engine_revision", "load_engine", "quiet_loading"]
