"""Parse generated text into yes/no questions, DSG question graphs or typed claims.

Generations are stored raw and parsed here, downstream, so a parser fix needs no model
time. The parsers are strict about meaning and lenient about packaging.

Accepted packaging (what real models wrap their answer in):
- thinking: `<think>...</think>` blocks are removed; text that only closes a block (the
  chat template opened it) is read after the last `</think>`; a block that never closes
  is `unclosed_think` (the model ran out of tokens while thinking).
- prose and code fences around the answer: the first JSON array in the text is read
  (an array whose first element starts with `"`, `{` or `[`, so "[1]" or "[Answer]" in
  prose is skipped); whatever follows it is ignored.
- entries as objects or as short lists: `{"id", "question", "parents"}` or
  `[id, question, [parents]]`; `{"claim" (or "text"), "type"}` or `[claim, type]`.
- a JSON object around the list (`{"questions": [...]}`): the list inside is read.
- questions only: when no JSON array is present, numbered or bulleted lines
  ("1.", "2)", "Q3:", "(4)", "-", "*", markdown bold) and unmarked lines ending in "?"
  are read; other prose lines are skipped.

Normalisation: whitespace is collapsed; a question without a final "?" gets one.
Duplicates (same text ignoring case and spacing) are dropped, the first kept, order kept;
a dropped DSG duplicate's id is redirected to the kept question.

Decisions:
- Trailing commas before `]` or `}` are repaired (a common small-model slip with one
  obvious meaning). Nothing else is repaired: single quotes, comments, missing commas or
  a truncated array are `bad_json`.
- Too many entries (after removing duplicates) is the error `too_many`, never a silent
  truncation: dropping questions would change what the score measures. The cap is
  `max_items` (default 32, the largest question count the DEPICT paper reports).
- DSG parents that name unknown ids (`unknown_parent`) or form a cycle (`cycle`) are
  errors; the parent "0" means "no parent" when no question has id "0" (the DSG
  paper's convention).

Every failure raises `ParseError(reason, snippet)` with a short machine-readable reason.
"""
from __future__ import annotations

import graphlib
import json
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from operators.schema import CLAIM_TYPES, QUESTION_SETS

DEFAULT_MAX_ITEMS = 32
_SNIPPET_CHARS = 120


class ParseError(ValueError):
    """Generated text that cannot be used; `reason` is machine-readable, `snippet` shows why."""

    snippet_chars = _SNIPPET_CHARS

    def __init__(self, reason: str, snippet: str = ""):
        self.reason = reason
        self.snippet = snippet[: self.snippet_chars]
        super().__init__(f"{reason}: {self.snippet}" if self.snippet else reason)


@dataclass(frozen=True)
class DsgQuestion:
    id: str
    question: str
    parents: tuple[str, ...] = ()


@dataclass(frozen=True)
class Claim:
    text: str
    type: str  # one of operators.schema.CLAIM_TYPES


# ------------------------------------------------------------------------ packaging

_ARRAY_START = re.compile(r'\[(?=\s*["{\[\]])')
_TRAILING_COMMA = re.compile(r",(\s*[\]}])")
_LIST_MARKER = re.compile(r"^(?:[-*\u2022]|\(\d{1,3}\)|(?:q(?:uestion)?\s*)?\d{1,3}\s*[.):\-])\s*", re.IGNORECASE)


def strip_thinking(text: str) -> str:
    """The answer part of a generation, without reasoning blocks."""
    if "</think>" in text:
        return text.rsplit("</think>", 1)[1]
    if "<think>" in text:
        before = text.split("<think>", 1)[0]
        if not before.strip():
            raise ParseError("unclosed_think", text[-_SNIPPET_CHARS:])
        return before
    return text


def _first_array(text: str) -> list | None:
    """The first JSON array in `text`; None if there is none, ParseError if it is malformed."""
    match = _ARRAY_START.search(text)
    if match is None:
        return None
    start = match.start()
    decoder = json.JSONDecoder()
    try:
        return decoder.raw_decode(text, start)[0]
    except json.JSONDecodeError as exc:
        error = exc
    try:
        return decoder.raw_decode(_TRAILING_COMMA.sub(r"\1", text[start:]))[0]
    except json.JSONDecodeError:
        context = text[max(start, error.pos - 40): error.pos + 40]
        raise ParseError("bad_json", f"{error.msg} at char {error.pos - start}: {context}") from None


def _answer(text: str) -> str:
    if not isinstance(text, str):
        raise ParseError("not_text", repr(text))
    answer = strip_thinking(text)
    if not answer.strip():
        raise ParseError("empty_output", text[-_SNIPPET_CHARS:])
    return answer


def _entries(text: str, what: str) -> list:
    answer = _answer(text)
    entries = _first_array(answer)
    if entries is None:
        raise ParseError("no_list", f"no JSON list of {what}: {answer.strip()}")
    return entries


def _clean(text: str) -> str:
    return " ".join(text.split())


def _key(text: str) -> str:
    return _clean(text).casefold()


T = TypeVar("T")


def distinct(items: Iterable[T], text: Callable[[T], str] = str) -> list[T]:
    """The first of each item whose text reads alike (cleaned, case-folded): how the parsers drop a
    repeated question or claim, and how a question set built in code must, so none counts twice."""
    kept: dict[str, T] = {}
    for item in items:
        kept.setdefault(_key(text(item)), item)
    return list(kept.values())


def _as_question(text: str) -> str:
    text = _clean(text)
    return text if text.endswith("?") else text.rstrip(".") + "?"


def _check_count(items: list, max_items: int) -> None:
    if not items:
        raise ParseError("empty", "the list holds no usable entries")
    if len(items) > max_items:
        raise ParseError("too_many", f"{len(items)} entries, at most {max_items} allowed")


def _bad_item(entry: Any, why: str) -> ParseError:
    return ParseError("bad_item", f"{why}: {json.dumps(entry)}")


def _text_field(entry: Any, value: Any, name: str) -> str:
    if not isinstance(value, str):
        raise _bad_item(entry, f"{name} must be text")
    return value


def _id(entry: Any, value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int)) or not str(value).strip():
        raise _bad_item(entry, "id must be a non-empty string or integer")
    return str(value).strip()


# ------------------------------------------------------------------------ questions


def _question_lines(answer: str) -> list[str]:
    """Numbered / bulleted lines, and unmarked lines that end in "?" (prose is skipped)."""
    questions = []
    for line in answer.splitlines():
        line = line.strip().strip("`*")
        marker = _LIST_MARKER.match(line)
        body = line[marker.end():] if marker else line
        body = body.strip().rstrip(",").strip('"*` \t')
        if body and (marker or body.endswith("?")):
            questions.append(body)
    return questions


def parse_questions(text: str, max_items: int = DEFAULT_MAX_ITEMS) -> list[str]:
    """Yes/no questions from a JSON list of strings (or numbered lines), deduplicated."""
    answer = _answer(text)
    entries = _first_array(answer)
    if entries is None:
        entries = _question_lines(answer)
        if not entries:
            raise ParseError("no_list", f"no JSON list or question lines: {answer.strip()}")
    questions = []
    for entry in entries:
        value = entry.get("question") if isinstance(entry, dict) else entry
        value = _text_field(entry, value, "question")
        if value.strip():
            questions.append(_as_question(value))
    result = distinct(questions)
    _check_count(result, max_items)
    return result


# ------------------------------------------------------------------------------ DSG


def _dsg_entry(entry: Any) -> tuple[str, str, list]:
    if isinstance(entry, dict):
        values = (entry.get("id"), entry.get("question"), entry.get("parents"))
    elif isinstance(entry, list) and len(entry) in (2, 3):
        values = (*entry, None) if len(entry) == 2 else tuple(entry)
    else:
        raise _bad_item(entry, "expected [id, question, [parents]] or an object with id, question, parents")
    qid, question, parents = values
    question = _text_field(entry, question, "question")
    if not question.strip():
        raise _bad_item(entry, "empty question")
    if parents is None:
        parents = []
    elif not isinstance(parents, list):
        parents = [parents]
    return _id(entry, qid), _as_question(question), [_id(entry, p) for p in parents]


def parse_dsg(text: str, max_items: int = DEFAULT_MAX_ITEMS) -> list[DsgQuestion]:
    """Questions with ids and parent ids; the graph must be acyclic and closed."""
    entries = _entries(text, "DSG questions")
    kept: dict[str, tuple[str, list[str]]] = {}  # id -> (question, parents), in order
    redirect: dict[str, str] = {}  # dropped duplicate's id -> kept id
    by_text: dict[str, str] = {}
    for entry in entries:
        qid, question, parents = _dsg_entry(entry)
        if qid in kept or qid in redirect:
            raise ParseError("duplicate_id", f"id {qid!r} is used twice")
        first = by_text.setdefault(_key(question), qid)
        if first != qid:
            redirect[qid] = first
        else:
            kept[qid] = (question, parents)
    _check_count(list(kept), max_items)
    questions = []
    for qid, (question, parents) in kept.items():
        resolved = []
        for parent in parents:
            if parent == "0" and "0" not in kept and "0" not in redirect:
                continue  # DSG's "0": no parent
            parent = redirect.get(parent, parent)
            if parent not in kept:
                raise ParseError("unknown_parent", f"question {qid!r} names parent {parent!r}, which is not in the list")
            if parent not in resolved:
                resolved.append(parent)
        questions.append(DsgQuestion(qid, question, tuple(resolved)))
    try:
        graphlib.TopologicalSorter({q.id: q.parents for q in questions}).prepare()
    except graphlib.CycleError as exc:
        raise ParseError("cycle", "parents form a cycle: " + " -> ".join(exc.args[1])) from None
    return questions


# --------------------------------------------------------------------------- claims


def _claim_entry(entry: Any) -> Claim:
    if isinstance(entry, dict):
        text = entry.get("claim", entry.get("text"))
        kind = entry.get("type")
    elif isinstance(entry, list) and len(entry) == 2:
        text, kind = entry
    else:
        raise _bad_item(entry, 'expected [claim, type] or an object with "claim" and "type"')
    text = _text_field(entry, text, "claim")
    kind = _text_field(entry, kind, "type").strip().lower()
    if not text.strip():
        raise _bad_item(entry, "empty claim")
    if kind not in CLAIM_TYPES:
        raise ParseError("unknown_type", f"claim type {kind!r} (valid: {', '.join(CLAIM_TYPES)})")
    return Claim(_clean(text), kind)


def parse_claims(text: str, max_items: int = DEFAULT_MAX_ITEMS) -> list[Claim]:
    """Typed atomic claims, deduplicated by text (the first type wins)."""
    result = distinct((_claim_entry(entry) for entry in _entries(text, "claims")), lambda claim: claim.text)
    _check_count(result, max_items)
    return result


# ------------------------------------------------------------------- table rows


def questions_rows(
    question_set: str,
    parsed: Sequence[str] | Sequence[DsgQuestion] | Sequence[Claim],
    caption: str | None = None,
    source: str | None = None,
) -> list[dict]:
    """QUESTIONS rows for one caption's parsed output, numbered "1".."k" in order.

    DSG parents are renumbered with their questions. `caption` and `source` are filled
    when given (callers that add them later may leave them out).
    """
    if question_set not in QUESTION_SETS:
        raise ValueError(f"unknown question set {question_set!r}; valid: {QUESTION_SETS}")
    expected = {"depict": str, "dsg": DsgQuestion, "claims": Claim}[question_set]
    wrong = [p for p in parsed if not isinstance(p, expected)]
    if wrong:
        raise TypeError(f"question set {question_set!r} takes {expected.__name__} entries, got {wrong[0]!r}")
    number = {q.id: str(i) for i, q in enumerate(parsed, start=1)} if question_set == "dsg" else {}
    rows = []
    for i, item in enumerate(parsed, start=1):
        row = {"question_set": question_set, "question_id": str(i), "parents": [], "claim_type": None}
        if question_set == "depict":
            row["question"] = item
        elif question_set == "dsg":
            row["question"] = item.question
            row["parents"] = [number[p] for p in item.parents]
        else:
            row["question"] = item.text
            row["claim_type"] = item.type
        if caption is not None:
            row["caption"] = caption
        if source is not None:
            row["source"] = source
        rows.append(row)
    return rows
