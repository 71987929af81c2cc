"""docs/method.md is what code comments point at: its headings stay, and what it names exists.

Comments cite it as `docs/method.md, "<heading>"`; every such citation in the repository must
name a heading the page has, and every file the page names must be in the repository.
"""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
METHOD = REPO / "docs" / "method.md"
STABLE = ("Questions", "Answers", "DEPICT score", "Baselines", "Evidence checks", "Meta-evaluation", "System")
CITATION = re.compile(r'method\.md(?:#[\w-]+)?\)?,?\s+"([^"]+)"')
FILE_NAMED = re.compile(r"`((?:operators|pipeline|jobs|conf|bench|tests|docs)/[\w./<>-]*)`")


def headings(text: str) -> set[str]:
    return {line.lstrip("#").strip() for line in text.splitlines() if line.startswith("#")}


def test_the_stable_headings_are_there():
    have = {line[3:].strip() for line in METHOD.read_text().splitlines() if line.startswith("## ")}
    assert set(STABLE) <= have, f"docs/method.md lacks {sorted(set(STABLE) - have)}: code comments point at them"


def test_every_file_the_method_names_exists():
    missing = []
    for path in FILE_NAMED.findall(METHOD.read_text()):
        if "<" in path:  # a pattern such as conf/prompts/<version>.yaml: its folder must exist
            path = path.split("<", 1)[0]
        if not (REPO / path).exists():
            missing.append(path)
    assert not missing, f"docs/method.md names files that are not in the repository: {missing}"


def citations(names: list[str], root: Path = REPO) -> list[tuple[str, int, str]]:
    found = []
    for name in names:
        path = root / name
        if path.suffix not in {".py", ".md", ".yaml", ".yml"} or not path.is_file():
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            found += [(name, number, heading) for heading in CITATION.findall(line)]
    return found


def test_every_citation_of_the_method_names_one_of_its_headings():
    try:
        out = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout (an installed wheel): nothing to read")
    have = headings(METHOD.read_text())
    found = citations([name for name in out.splitlines() if name != "tests/test_method_doc.py"])
    assert found, "no comment cites docs/method.md: the citation pattern no longer matches how they are written"
    wrong = [f"{name}:{number}: {heading!r}" for name, number, heading in found if heading not in have]
    assert not wrong, "citations of docs/method.md naming no heading of it:\n" + "\n".join(wrong)


def test_a_citation_of_a_missing_heading_is_found(tmp_path):
    (tmp_path / "module.py").write_text('"""Control boxes (docs/method.md, "Masked views")."""\n')
    assert citations(["module.py"], tmp_path) == [("module.py", 1, "Masked views")]
    assert "Masked views" not in headings(METHOD.read_text())
