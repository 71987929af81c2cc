"""Comments and docs say what is true and why, in words that need no history.

The method's reference is docs/method.md, so nothing may point at a "SPEC section" of a file
outside the repository; an issue number means nothing to a reader of the code; "as before" or
"this stop" describe a change, not the code. The git log keeps the history.
"""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
HISTORY_WORDS = re.compile(
    r"\bissues? #?\d+|\bissue-\d+|\bSPEC (?:section|§)|\bSPEC\.md\b|\bas before\b|\bsince stop\b|\bthis stop\b"
    r"|\bused to (?:be|load|crash|write|hold|read|lose|check|drop|print|take)\b",
    re.IGNORECASE,
)
TEXT_SUFFIXES = {".py", ".md", ".yaml", ".yml", ".toml", ".txt", ".cfg", ".sh", ""}


def tracked_text_files() -> list[str]:
    out = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    return [name for name in out.splitlines() if Path(name).suffix in TEXT_SUFFIXES and name != "tests/test_history_words.py"]


def history_words(names: list[str], root: Path = REPO) -> list[str]:
    found = []
    for name in names:
        path = root / name
        if not path.is_file():
            continue
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            for match in HISTORY_WORDS.finditer(line):
                found.append(f"{name}:{number}: {match.group(0)!r} in: {line.strip()[:120]}")
    return found


def test_no_comment_or_doc_cites_an_issue_a_missing_spec_or_a_change():
    try:
        names = tracked_text_files()
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout (an installed wheel): nothing to read")
    found = history_words(names)
    assert not found, "say what is true and why (docs/method.md for the method):\n" + "\n".join(found)


@pytest.mark.parametrize(
    "line",
    [
        "# the floors of issue 27",
        '"""Scores (SPEC section 2)."""',
        "# see SPEC.md section 4",
        "gives the same rows as before.",
        "    # since stop 3 the writer keeps its parts",
        "# the check used to read only the path text",
    ],
)
def test_each_kind_of_history_word_is_caught(tmp_path, line):
    (tmp_path / "module.py").write_text(line + "\n")
    assert history_words(["module.py"], tmp_path)


def test_ordinary_words_pass(tmp_path):
    (tmp_path / "module.py").write_text('# Request kind used to answer each question set\n"""docs/method.md, "Answers"."""\n')
    assert history_words(["module.py"], tmp_path) == []
