"""The jobs, one module each; `python jobs/<job>.py` from a clone, `depict <job>` once installed.

The `depict` command (pyproject.toml's [project.scripts]) calls `main` below, which runs the
job module's own `main`: the same code, arguments and exit codes as the script. The wheel
installs this folder as the package `jobs`, so an installed library has its jobs too.
"""
from __future__ import annotations

import ast
import importlib
import pkgutil
import sys
from pathlib import Path

USAGE = "usage: depict <job> [key=value ...]   (depict <job> --help: the job's options)"


def names() -> list[str]:
    """The job modules in this folder (found, not listed: a new job is a command at once)."""
    return sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_"))


def summary(name: str) -> str:
    """A job's first docstring line, read without importing it (imports load Ray and torch)."""
    doc = ast.get_docstring(ast.parse((Path(__file__).parent / f"{name}.py").read_text(encoding="utf-8"))) or ""
    return doc.strip().splitlines()[0].rstrip(":") if doc.strip() else ""


def help_text() -> str:
    width = max(map(len, names()))
    return "\n".join([USAGE, "", "jobs:", *(f"  {n:<{width}}  {summary(n)}" for n in names())])


def main(argv: list[str] | None = None) -> int:
    """`depict <job> ...`: exit 0 for --help, 2 for a missing or unknown job, else the job's code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(help_text(), file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    job, rest = argv[0], argv[1:]
    if job not in names():
        print(f"depict: unknown job {job!r}; one of {', '.join(names())}\n{USAGE}", file=sys.stderr)
        return 2
    return importlib.import_module(f"{__name__}.{job}").main(rest)
