"""docs/DESIGN.md's layer rules hold for the code: the test reads both.

The rules come from DESIGN.md itself, so a change to the doc and a change to the code must
agree for the suite to pass:
- "Map of the packages": which pipeline package or module may import which (the `may import`
  column names rows above; every .py of operators/, pipeline/ and jobs/ must fall in a row);
- "Layers": what each top-level layer must not import (`must not`), and that a job imports
  nothing but the standard library and what its `may import` names.

Every import counts, wherever it is written: at the top, inside a function, under
`TYPE_CHECKING`, and `importlib.import_module("...")` / `__import__("...")` with a literal
name, since any of them puts the module in the process that runs the file.
"""
from __future__ import annotations

import ast
import re
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DESIGN = REPO / "docs" / "DESIGN.md"
LAYERS = ("operators", "pipeline", "jobs")
_TICKED = re.compile(r"`([^`]+)`")


# -- reading DESIGN.md ---------------------------------------------------------------------------


def _table(text: str, heading: str) -> list[dict[str, str]]:
    """The first Markdown table under `## <heading>`, as one dict per row (header -> cell)."""
    section = text.split(f"\n## {heading}\n", 1)
    assert len(section) == 2, f"docs/DESIGN.md has no section '## {heading}'"
    lines = [line for line in section[1].split("\n## ", 1)[0].splitlines() if line.startswith("|")]
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    rows = []
    for line in lines[2:]:  # lines[1] is the |---| rule
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        assert len(cells) == len(header), f"docs/DESIGN.md, {heading}: row with {len(cells)} cells: {line}"
        rows.append(dict(zip(header, cells)))
    return rows


@dataclass(frozen=True)
class Room:
    """One row of the package map: where it is, its name, and which rows it may import."""

    paths: tuple[str, ...]  # "pipeline/store/" (a folder) or "pipeline/cli.py" (a module)
    may_import: frozenset[str]  # names of other rows
    extra: tuple[tuple[str, frozenset[str]], ...]  # (module path, more names) for "(`pairs`: `api`)"
    order: int  # position in the table, bottom-up
    libraries: frozenset[str] | None = None  # "numpy, scipy": the only third-party ones; None: any


def _name(path: str) -> str:
    """`pipeline/store/` -> store, `pipeline/cli.py` -> cli, `operators/` -> operators."""
    return path.rstrip("/").rsplit("/", 1)[-1].removesuffix(".py")


def _libraries(cell: str) -> frozenset[str] | None:
    """The third-party libraries a `may import` cell allows when it lists them instead of rows:
    "numpy, scipy, polars" -> those; "standard library only" -> none; anything else -> no limit."""
    if _TICKED.search(cell) or cell.strip() == "third-party libraries only":
        return None
    if cell.strip() == "standard library only":
        return frozenset()
    return frozenset(word.strip() for word in cell.split(","))


@cache
def package_map() -> tuple[Room, ...]:
    rooms = []
    for order, row in enumerate(_table(DESIGN.read_text(), "Map of the packages")):
        paths = tuple(p for p in _TICKED.findall(row["where"]) if p.startswith(LAYERS))
        assert paths, f"docs/DESIGN.md, Map of the packages: a row names no path: {row['where']}"
        allowed = row["may import"]
        extra = []
        for inside in re.findall(r"\(([^()]*)\)", allowed):  # "(`pairs`: `api`)": one module's own extra
            names = _TICKED.findall(inside)
            if len(names) >= 2 and ":" in inside:
                owner = next(p for p in paths if _name(p) == names[0])
                extra.append((owner, frozenset(names[1:])))
                allowed = allowed.replace(f"({inside})", "")
        rooms.append(Room(paths, frozenset(_TICKED.findall(allowed)), tuple(extra), order, _libraries(allowed)))
    return tuple(rooms)


@cache
def layer_rules() -> dict[str, dict[str, frozenset[str]]]:
    """layer -> {"may": our packages, "libraries": third-party roots, "must_not": names} from the
    Layers table. "pyarrow, s3fs and botocore (why)": each word before a bracket is a library."""
    rules = {}
    for row in _table(DESIGN.read_text(), "Layers"):
        layer = _TICKED.findall(row["layer"])[0].rstrip("/")
        plain = re.sub(r"\([^()]*\)|`[^`]*`", "", row["may import"])
        libraries = {word.split(".")[0] for word in re.split(r",|\band\b", plain) for word in [word.strip()] if word}
        rules[layer] = {"may": frozenset(_TICKED.findall(row["may import"])), "libraries": frozenset(libraries),
                        "must_not": frozenset(_TICKED.findall(row["must not"]))}
    return rules


def rooms_by_name() -> dict[str, list[tuple[Room, str]]]:
    """A row's name -> its rows and paths; `pipeline` (what jobs may import) names every pipeline row."""
    out: dict[str, list[tuple[Room, str]]] = {}
    for room in package_map():
        for path in room.paths:
            out.setdefault(_name(path), []).append((room, path))
            if path.startswith("pipeline/"):
                out.setdefault("pipeline", []).append((room, path))
    return out


def room_of(module_path: str) -> tuple[Room, str] | None:
    """The row (and the row's path) a file or module path falls in: the longest path that covers it."""
    best = None
    for room in package_map():
        for path in room.paths:
            covers = module_path.startswith(path) if path.endswith("/") else module_path == path
            if covers and (best is None or len(path) > len(best[1])):
                best = (room, path)
    return best


# -- reading the code ----------------------------------------------------------------------------


def _module_file(module: str) -> str | None:
    """`pipeline.store.parts` -> "pipeline/store/parts.py" (or its package's __init__.py)."""
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        base = REPO.joinpath(*parts[:n])
        if base.with_suffix(".py").is_file():
            return base.with_suffix(".py").relative_to(REPO).as_posix()
        if (base / "__init__.py").is_file():
            return (base / "__init__.py").relative_to(REPO).as_posix()
    return None


def imports_of(path: Path, where: str) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in the file, wherever it is written;
    `where` is the file's place in the repository (relative imports resolve from it)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = tuple(where.split("/")[:-1])
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1])
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module
            found.append((node.lineno, module))
            for alias in node.names:  # `from pipeline import config`: the module pipeline.config
                if _module_file(f"{module}.{alias.name}") not in (None, _module_file(module)):
                    found.append((node.lineno, f"{module}.{alias.name}"))
        elif (
            isinstance(node, ast.Call)
            and (getattr(node.func, "attr", None) == "import_module" or getattr(node.func, "id", None) == "__import__")
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            found.append((node.lineno, node.args[0].value))
    return found


def source_files() -> list[tuple[str, Path]]:
    """(place in the repository, file) of every .py of the three layers."""
    return sorted((p.relative_to(REPO).as_posix(), p) for layer in LAYERS for p in (REPO / layer).rglob("*.py"))


# -- the rules -----------------------------------------------------------------------------------


def layer_violations(files: list[tuple[str, Path]]) -> list[str]:
    """Imports the Layers table forbids."""
    rules = layer_rules()
    bad = []
    for where, path in files:
        layer = where.split("/", 1)[0]
        for line, module in imports_of(path, where):
            root = module.split(".")[0]
            ours = rules[layer]["may"] | {layer}
            if root in rules[layer]["must_not"]:
                bad.append(f"{where}:{line} imports {module} ({layer}/ must not import {root})")
            elif root not in ours | rules[layer]["libraries"] and root not in sys.stdlib_module_names | {"__future__"}:
                allowed = ", ".join(sorted(ours | rules[layer]["libraries"]))
                bad.append(f"{where}:{line} imports {module} ({layer}/ import only the standard library and {allowed})")
    return bad


def map_violations(files: list[tuple[str, Path]]) -> list[str]:
    """Imports between rows of the package map that the importing row's `may import` does not name."""
    by_name = rooms_by_name()
    bad = []
    for where, path in files:
        here = room_of(where)
        if here is None:
            bad.append(f"{where} is in no row of docs/DESIGN.md's package map")
            continue
        room, own_path = here
        allowed = set(room.may_import)
        for owner, more in room.extra:
            if own_path == owner:
                allowed |= more
        allowed_paths = {p for name in allowed for _, p in by_name.get(name, [])}
        for line, module in imports_of(path, where):
            root = module.split(".")[0]
            if room.libraries is not None and root not in LAYERS and root not in sys.stdlib_module_names | {"__future__"}:
                if root not in room.libraries:
                    bad.append(f"{where}:{line} imports {module}, a library its row ({', '.join(room.paths)}) does not list")
            if root not in LAYERS:
                continue
            target_file = _module_file(module)
            if target_file is None or target_file == "pipeline/__init__.py":
                continue  # a package's own init (every pipeline import runs it); names checked above
            there = room_of(target_file)
            if there is None:
                bad.append(f"{where}:{line} imports {module}, which is in no row of the package map")
            elif there[1] != own_path and not any(target_file == p or (p.endswith("/") and target_file.startswith(p))
                                                  for p in allowed_paths):
                bad.append(f"{where}:{line} imports {module} ({_name(there[1])}), which its row "
                           f"({', '.join(room.paths)}) may not import")
    return bad


def test_the_design_tables_read_as_rules():
    """The parser finds every row, and each row's names are rows above it (no upward arrow)."""
    rooms = package_map()
    assert len(rooms) >= 15
    names = rooms_by_name()
    for room in rooms:
        for name in room.may_import:
            assert name in names, f"docs/DESIGN.md: {', '.join(room.paths)} may import `{name}`, which is no row"
            assert all(other.order < room.order for other, _ in names[name]), (
                f"docs/DESIGN.md: {', '.join(room.paths)} may import `{name}`, a row below it (rows go bottom-up)")
        for owner, more in room.extra:  # "(`pairs`: `api`)": another module of the same row
            assert {p for name in more for _, p in names.get(name, [])} <= set(room.paths) - {owner}, room
    rules = layer_rules()
    assert rules["operators"]["must_not"] >= {"ray", "pipeline"}
    assert rules["pipeline"]["must_not"] >= {"torch", "transformers", "vllm"}
    assert rules["jobs"]["may"] == {"pipeline"} and rules["jobs"]["libraries"] == set()
    assert {"numpy", "torch", "s3fs", "botocore"} <= rules["operators"]["libraries"]
    assert {"ray", "google", "google_crc32c", "matplotlib"} <= rules["pipeline"]["libraries"]
    assert not rules["pipeline"]["libraries"] & rules["pipeline"]["must_not"]


def test_layers_import_nothing_the_layers_table_forbids():
    bad = layer_violations(source_files())
    assert not bad, "docs/DESIGN.md, Layers:\n" + "\n".join(bad)


def test_every_module_imports_only_what_its_row_of_the_package_map_names():
    bad = map_violations(source_files())
    assert not bad, "docs/DESIGN.md, Map of the packages:\n" + "\n".join(bad)


# -- the checks can fail -------------------------------------------------------------------------


def _placed(tmp_path: Path, where: str, source: str) -> list[tuple[str, Path]]:
    """A file with `source`, read as if it were at `where` in the repository."""
    path = tmp_path / "module.py"
    path.write_text(source)
    return [(where, path)]


@pytest.mark.parametrize(
    ("where", "source", "expected"),
    [
        ("pipeline/stages/answers.py", "def f():\n    import torch\n", "pipeline/ must not import torch"),
        ("pipeline/scoring.py", "import importlib\nx = importlib.import_module('vllm.sampling_params')\n", "must not import vllm"),
        ("pipeline/store/folder.py", "from transformers import AutoModel\n", "must not import transformers"),
        ("operators/views.py", "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import ray\n", "must not import ray"),
        ("operators/judge_output.py", "from pipeline.config import SweepConfig\n", "must not import pipeline"),
        ("jobs/micro_vlm.py", "from operators.demo_world import FACT_TYPES\n", "jobs/ import only"),
        ("jobs/score.py", "def main():\n    from omegaconf import OmegaConf\n", "jobs/ import only"),
        ("pipeline/reports/figures.py", "import seaborn\n", "pipeline/ import only"),
        ("operators/images.py", "import cv2\n", "operators/ import only"),
    ],
)
def test_a_forbidden_import_is_caught_wherever_it_is_written(tmp_path, where, source, expected):
    bad = layer_violations(_placed(tmp_path, where, source))
    assert any(expected in line for line in bad), bad


@pytest.mark.parametrize(
    ("where", "source"),
    [
        ("pipeline/stats/bootstrap.py", "from pipeline.config import SweepConfig\n"),
        ("pipeline/store/folder.py", "from pipeline.stages import executor\n"),
        ("pipeline/store/folder.py", "from ..stages import executor\n"),
        ("pipeline/config.py", "def f():\n    from pipeline import scoring\n"),
        ("pipeline/benchmarks/demo.py", "from pipeline import config\n"),
        ("pipeline/stats/pairwise.py", "import pandas\n"),
        ("pipeline/console.py", "import numpy\n"),
    ],
)
def test_an_import_the_map_does_not_name_is_caught(tmp_path, where, source):
    bad = map_violations(_placed(tmp_path, where, source))
    assert any("may not import" in line or "does not list" in line for line in bad), bad


@pytest.mark.parametrize(
    ("where", "source"),
    [
        ("operators/views.py", "import polars\nfrom operators.hashing import content_key\n"),
        ("pipeline/stages/answers.py", "from pipeline.store.folder import Folder\nfrom . import executor\n"),
        ("jobs/sweep.py", "import sys\nfrom pipeline.sweep import run_sweep\n"),
        ("pipeline/stats/choice.py", "import numpy as np\nimport polars as pl\nfrom pipeline.stats import exact\n"),
        ("pipeline/console.py", "from __future__ import annotations\nimport logging\n"),
    ],
)
def test_imports_the_map_names_pass(tmp_path, where, source):
    files = _placed(tmp_path, where, source)
    assert map_violations(files) == [] and layer_violations(files) == []
