"""Mutation testing: run the real pipeline with one line of a production module edited.

`mutated(module, old, new)` replaces the one occurrence of `old` in the module's source with
`new`, compiles the module again and swaps each changed function's code object into the
*original* function (module-level functions and methods), so every caller, including those
that imported the function by name, runs the mutant. Everything is restored on exit.

A test that uses it shows that a named floor notices a plausible bug in the code the pipeline
calls, not in a copy kept by the test. The code runs in this process: stages that run in Ray
workers need the local executor (`pipeline.stages.executor.running_locally`).
"""
from __future__ import annotations

import inspect
import types
from collections.abc import Iterator
from contextlib import contextmanager


def _functions(namespace: dict, prefix: str = "") -> dict[str, types.FunctionType]:
    out = {}
    for name, value in namespace.items():
        if isinstance(value, types.FunctionType):
            out[prefix + name] = value
        elif isinstance(value, type) and not prefix:
            out.update(_functions(dict(vars(value)), f"{name}."))
    return out


@contextmanager
def mutated(module: types.ModuleType, old: str, new: str) -> Iterator[None]:
    source = inspect.getsource(module)
    if source.count(old) != 1:
        raise AssertionError(f"{module.__name__}: the mutation's text occurs {source.count(old)} times, not once: {old!r}")
    namespace = {"__name__": module.__name__, "__file__": module.__file__, "__package__": module.__package__}
    exec(compile(source.replace(old, new), module.__file__, "exec"), namespace)
    originals = {name: f for name, f in _functions(vars(module)).items() if f.__module__ == module.__name__}
    mutants = _functions(namespace)
    saved = {}
    for name, original in originals.items():
        mutant = mutants.get(name)
        if mutant is not None and (mutant.__code__.co_code, mutant.__code__.co_consts) != (original.__code__.co_code, original.__code__.co_consts):
            saved[name] = original.__code__
            original.__code__ = mutant.__code__.replace(co_filename=original.__code__.co_filename)
    if not saved:
        raise AssertionError(f"{module.__name__}: the mutation {old!r} -> {new!r} changed no function")
    try:
        yield
    finally:
        for name, code in saved.items():
            originals[name].__code__ = code
