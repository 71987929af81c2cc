"""Model engines behind one interface (`base.Engine`), chosen by a backbone's `engine` field.

`ENGINES` is the one registry of engines: a backbone's `engine` field is validated against it
(pipeline/config.py) and an engine is added by its module plus one entry here. Engines are
named by module path and imported only when loaded, so importing this package pulls in
neither torch nor vllm (the pipeline imports it on CPU-only drivers).
"""
from __future__ import annotations

import importlib

from operators.engines.base import Engine, Prompt
from operators.engines.spec import BackboneSpec

ENGINES: dict[str, str] = {
    "hf": "operators.engines.hf:HFEngine",
    "vllm": "operators.engines.vllm:VLLMEngine",
    "scripted": "operators.engines.scripted:ScriptedEngine",
}


def load_engine(spec: BackboneSpec) -> Engine:
    """Build the engine `spec.engine` names, loading its model."""
    target = ENGINES.get(spec.engine)
    if target is None:
        raise ValueError(
            f"backbone {spec.name!r}: unknown engine {spec.engine!r}; valid engines: {sorted(ENGINES)}"
        )
    module_name, class_name = target.split(":")
    engine_class = getattr(importlib.import_module(module_name), class_name)
    return engine_class(spec)


__all__ = ["ENGINES", "BackboneSpec", "Engine", "Prompt", "load_engine"]
