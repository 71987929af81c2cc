"""VLM-as-judge outputs: strict JSON parsing and schema validation.

A judge's text is stored raw and parsed here. Only the packaging is forgiven: a closed
`<think>` block before the answer and one Markdown code fence around it. What remains
must be exactly one JSON object with exactly the fields below, of the right types and
ranges; anything else raises `JudgeError(reason, snippet)` and becomes an error row that
keeps the raw text, never a score.

holistic:    {"score": s}                       s a number in [0.05, 0.95]
decomposed:  {"claims": [{"claim": text, "type": one of CLAIM_TYPES,
                          "boxes": [[x0, y0, x1, y1], ...] on a 0..1000 grid, x0 < x1, y0 < y1
                                   (may be empty: an absent thing has no region),
                          "score": number in [0, 1], "explanation": non-empty text}, ...],
              "overall": number in [0, 1]}       1..max_claims claims

Booleans are not numbers here (JSON `true` would otherwise read as 1).
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

from operators.parsing import ParseError, strip_thinking
from operators.schema import CLAIM_TYPES

HOLISTIC_RANGE = (0.05, 0.95)
BOX_GRID = 1000
MAX_CLAIMS = 32
JUDGE_KINDS = ("holistic", "decomposed")
_SNIPPET = 160
_FENCE = re.compile(r"^```[a-zA-Z]*\s*\n(?P<body>.*)\n\s*```$", re.DOTALL)


class JudgeError(ParseError):
    """A judge output that is not a valid judgement; `reason` is machine-readable."""

    snippet_chars = _SNIPPET


@dataclass(frozen=True)
class JudgedClaim:
    claim: str
    type: str
    boxes: tuple[tuple[float, float, float, float], ...]  # 0..1000 grid
    score: float
    explanation: str


@dataclass(frozen=True)
class DecomposedJudgement:
    claims: tuple[JudgedClaim, ...]
    overall: float

    def as_json(self) -> str:
        return json.dumps(
            {"claims": [{"claim": c.claim, "type": c.type, "boxes": [list(b) for b in c.boxes], "score": c.score, "explanation": c.explanation} for c in self.claims], "overall": self.overall},
            sort_keys=True,
        )


def json_object(text: str) -> dict:
    """The single JSON object a judge answered with (after thinking and one code fence)."""
    if not isinstance(text, str):
        raise JudgeError("not_text", repr(text))
    try:
        answer = strip_thinking(text).strip()
    except ParseError as exc:
        raise JudgeError(exc.reason, exc.snippet) from None
    if not answer:
        raise JudgeError("empty_output", text[-_SNIPPET:])
    fenced = _FENCE.match(answer)
    if fenced:
        answer = fenced["body"].strip()
    try:
        value = json.loads(answer)
    except json.JSONDecodeError as exc:
        raise JudgeError("bad_json", f"{exc.msg} at char {exc.pos}: {answer[max(0, exc.pos - 40): exc.pos + 40]}") from None
    if not isinstance(value, dict):
        raise JudgeError("not_an_object", answer)
    return value


def _fields(obj: dict, required: tuple[str, ...], where: str) -> None:
    missing = [k for k in required if k not in obj]
    if missing:
        raise JudgeError("missing_field", f"{where} lacks {', '.join(missing)}: {json.dumps(obj)}")
    extra = sorted(set(obj) - set(required))
    if extra:
        raise JudgeError("unexpected_field", f"{where} has {', '.join(extra)}: {json.dumps(obj)}")


def _number(value: Any, where: str, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise JudgeError("wrong_type", f"{where} must be a number, got {json.dumps(value)}")
    if not math.isfinite(value) or not low <= value <= high:
        raise JudgeError("out_of_range", f"{where} must be in [{low}, {high}], got {value}")
    return float(value)


def _text(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise JudgeError("wrong_type", f"{where} must be text, got {json.dumps(value)}")
    if not value.strip():
        raise JudgeError("empty_text", f"{where} is empty")
    return " ".join(value.split())


def _box(value: Any, where: str) -> tuple[float, float, float, float]:
    if not isinstance(value, list) or len(value) != 4:
        raise JudgeError("wrong_type", f"{where} must be a list of 4 numbers, got {json.dumps(value)}")
    x0, y0, x1, y1 = (_number(v, f"{where}[{i}]", 0, BOX_GRID) for i, v in enumerate(value))
    if not (x0 < x1 and y0 < y1):
        raise JudgeError("bad_box", f"{where} needs x0 < x1 and y0 < y1, got {value}")
    return x0, y0, x1, y1


def parse_holistic(text: str) -> float:
    """The rubric score of a holistic judgement."""
    obj = json_object(text)
    _fields(obj, ("score",), "the answer")
    return _number(obj["score"], "score", *HOLISTIC_RANGE)


def _claim(entry: Any, i: int) -> JudgedClaim:
    where = f"claims[{i}]"
    if not isinstance(entry, dict):
        raise JudgeError("wrong_type", f"{where} must be an object, got {json.dumps(entry)}")
    _fields(entry, ("claim", "type", "boxes", "score", "explanation"), where)
    kind = _text(entry["type"], f"{where}.type")
    if kind not in CLAIM_TYPES:
        raise JudgeError("unknown_type", f"{where}.type {kind!r} (valid: {', '.join(CLAIM_TYPES)})")
    boxes = entry["boxes"]
    if not isinstance(boxes, list):
        raise JudgeError("wrong_type", f"{where}.boxes must be a list, got {json.dumps(boxes)}")
    return JudgedClaim(
        claim=_text(entry["claim"], f"{where}.claim"),
        type=kind,
        boxes=tuple(_box(b, f"{where}.boxes[{j}]") for j, b in enumerate(boxes)),
        score=_number(entry["score"], f"{where}.score", 0.0, 1.0),
        explanation=_text(entry["explanation"], f"{where}.explanation"),
    )


def parse_decomposed(text: str, max_claims: int = MAX_CLAIMS) -> DecomposedJudgement:
    """Claims with types, evidence boxes, scores and explanations, and the overall score."""
    obj = json_object(text)
    _fields(obj, ("claims", "overall"), "the answer")
    claims = obj["claims"]
    if not isinstance(claims, list):
        raise JudgeError("wrong_type", f"claims must be a list, got {json.dumps(claims)[:80]}")
    if not claims:
        raise JudgeError("empty", "claims is an empty list")
    if len(claims) > max_claims:
        raise JudgeError("too_many", f"{len(claims)} claims, at most {max_claims} allowed")
    parsed = tuple(_claim(entry, i) for i, entry in enumerate(claims))
    return DecomposedJudgement(parsed, _number(obj["overall"], "overall", 0.0, 1.0))


def parse_judgement(kind: str, text: str) -> tuple[float, str]:
    """(score, canonical JSON of the validated judgement) for a judge kind; raises JudgeError."""
    if kind == "holistic":
        score = parse_holistic(text)
        return score, json.dumps({"score": score})
    if kind == "decomposed":
        judgement = parse_decomposed(text)
        return judgement.overall, judgement.as_json()
    raise ValueError(f"unknown judge kind {kind!r}; valid: {JUDGE_KINDS}")
