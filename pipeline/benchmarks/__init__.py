"""Loaders of the human-rated benchmarks (one module each, plus the built-in `demo`): an official
release -> the ITEMS table and the problems found in it (`io`: record parsers; files are read
through `pipeline.store.folder.Folder`).

A module of this package is a loader when it declares `LOADER = "<name>"` (the name a
benchmark config's `loader:` field uses) and defines `load(root, **options) -> LoadResult`;
`loaders()` finds them, so adding a benchmark adds no entry anywhere else.
"""
from __future__ import annotations

import functools
import importlib
import pkgutil
from collections.abc import Callable
from types import ModuleType


@functools.cache
def loaders() -> dict[str, ModuleType]:
    """Every loader module of this package, by its declared name."""
    found: dict[str, ModuleType] = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
        module = importlib.import_module(f"{__name__}.{info.name}")
        name = getattr(module, "LOADER", None)
        if name is None:
            continue
        if name in found:
            raise RuntimeError(f"{module.__name__} and {found[name].__name__} both declare LOADER = {name!r}")
        if not callable(getattr(module, "load", None)):
            raise RuntimeError(f"{module.__name__} declares LOADER = {name!r} but defines no load(root, **options)")
        found[name] = module
    return found


def loader_names() -> tuple[str, ...]:
    return tuple(sorted(loaders()))


def loader(name: str) -> Callable:
    """The `load` function of the loader `name`; ValueError naming the valid ones if unknown."""
    module = loaders().get(name)
    if module is None:
        raise ValueError(f"unknown loader {name!r}; valid: {', '.join(loader_names())}")
    return module.load


def writes_own_files(name: str) -> bool:
    """The loader writes its release under root on first use (the built-in demo), so a
    missing root folder is not an error."""
    module = loaders().get(name)
    return bool(module is not None and getattr(module, "WRITES_OWN_FILES", False))
