"""From a typed claim and detector boxes to the grounding-only support score s and its evidence.

Two steps, both pure (numpy only):

1. `plan_claim(text, claim_type)` reads the claim text and decides what to ask the detector:
   which entity phrases to ground (one, or a subject and an object) and which rule scores it.
2. `claim_support(plan, detections)` applies the rule to the detections of those phrases and
   returns (groundable, s in [0, 1], evidence boxes, note).

The rules (docs/method.md, "Evidence checks"); "confidence" is a kept box's score,
and a phrase with no kept box has confidence 0 (the detector looked and found nothing):

- object: s = the highest box score for the entity ("Is it there?").
- negation: s = 1 - the highest box score for the negated entity ("no knife": any knife
  found argues against the claim).
- count: k kept boxes vs the stated number n (digits or number words up to twenty):
  s = min(k, n) / max(k, n) * mean of the top min(k, n) box scores; "at least n" uses
  min(k, n) / n. k = 0 gives 0. A stated count of zero is read as a negation. A claim with
  no number we can read ("several apples") is ungroundable: a detector cannot check it.
- attribute: s = the highest text score of the attributed phrase ("green apples"). The
  text score averages the box's probabilities over every token of the phrase, so it
  combines the entity's confidence with the attribute's instead of letting the noun alone
  decide (a box score is a maximum over tokens and would ignore "green").
- spatial (and relation claims that name a spatial relation): ground the subject A and the
  object B separately; s = max over box pairs (a, b) with IoU(a, b) < 0.5 (two different
  things) of sqrt(score(a) * score(b)) * [a stands in the relation to b], judged from box
  geometry (image y grows downwards):
    left of: centre_x(a) < centre_x(b)       right of: centre_x(a) > centre_x(b)
    above / over: centre_y(a) < centre_y(b)  below / under / beneath: centre_y(a) > centre_y(b)
    on / on top of: above, and the boxes overlap horizontally
    in / inside: centre of a lies inside b
    next to / beside / near: the gap between the boxes is at most the larger box's size
  Depth relations (in front of, behind) cannot be read from 2-D boxes: ungroundable.
- relation naming a contact verb (holding, riding, wearing, ...): the same pair rule, with
  "the boxes intersect" as the geometry (an interaction needs the two things to touch).
  Any other relation is abstract: ungroundable.
- action, other: ungroundable (a detector localises things, not what they are doing or
  abstract properties); such claims only lower M in the metric's M/N factor.

Reading the text: question and existential frames ("Is there", "There are", "The image
shows") and leading determiners are dropped; "the apples are green" becomes the phrase
"green apples"; for object, attribute, count and negation claims the phrase stops at the
first spatial relation ("a cat on a mat" grounds "cat"). Claims of question sets without
types (DEPICT/DSG questions) get a type inferred from the text: a negation marker, a
number, a spatial relation, else object.
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from operators.grounding import Detections

SAME_THING_IOU = 0.5  # two boxes overlapping more than this are taken as one thing

_NUMBER_WORDS = {
    "zero": 0, "one": 1, "a single": 1, "single": 1, "two": 2, "a pair of": 2, "pair of": 2, "three": 3, "four": 4,
    "five": 5, "six": 6, "seven": 7, "eight": 8, "nine": 9, "ten": 10, "eleven": 11, "twelve": 12, "a dozen": 12,
    "thirteen": 13, "fourteen": 14, "fifteen": 15, "sixteen": 16, "seventeen": 17, "eighteen": 18,
    "nineteen": 19, "twenty": 20,
}
# relation -> canonical name; the depth relations are recognised only to be refused.
_SPATIAL = {
    "to the left of": "left of", "on the left of": "left of", "left of": "left of",
    "to the right of": "right of", "on the right of": "right of", "right of": "right of",
    "on top of": "on", "above": "above", "over": "above",
    "below": "below", "beneath": "below", "underneath": "below", "under": "below",
    "inside of": "in", "inside": "in", "within": "in", "in": "in", "on": "on",
    "next to": "near", "beside": "near", "near": "near", "close to": "near",
    "in front of": "depth", "behind": "depth",
}
_CONTACT_VERBS = (
    "holding", "holds", "hold", "riding", "rides", "ride", "wearing", "wears", "wear", "carrying", "carries",
    "carry", "eating", "eats", "touching", "touches", "hugging", "hugs", "pushing", "pushes", "pulling", "pulls",
    "feeding", "feeds", "kicking", "kicks", "playing with", "plays with", "using", "uses",
)
_NEGATION = re.compile(r"\b(?:no|not any|not a|not an|without|none of the|isn't any|aren't any|there is no|there are no)\s+(.+)")
_COUNT = re.compile(
    r"\b(?:(?P<atleast>at least|more than|over)\s+)?(?:(?:exactly|only|just|precisely)\s+)?"
    r"(?P<n>\d+|" + "|".join(sorted((re.escape(w) for w in _NUMBER_WORDS), key=len, reverse=True)) + r")\s+(?P<rest>.+)"
)
_SPATIAL_RE = re.compile(r"\b(" + "|".join(sorted((re.escape(k) for k in _SPATIAL), key=len, reverse=True)) + r")\b")
_CONTACT_RE = re.compile(r"\b(" + "|".join(sorted((re.escape(v) for v in _CONTACT_VERBS), key=len, reverse=True)) + r")\b")
_FRAMES = [
    re.compile(p)
    for p in (
        r"^(?:is|are) there\s+",
        r"^there(?:'s| is| are)\s+",
        r"^(?:does|do) (?:the|this) (?:image|picture|photo|figure) (?:show|contain|have|depict)\s+",
        r"^(?:the|this) (?:image|picture|photo|figure) (?:shows|contains|has|depicts)\s+",
        r"^(?:is|are)\s+",
    )
]
_DETERMINER = re.compile(r"^(?:a|an|the|some|this|that|these|those|its|their|his|her|any)\s+")
_TRAILING_VERB = re.compile(
    r"\s+(?:is|are|was|were|(?:is|are) (?:located|positioned|placed|sitting|standing|lying|hanging)|sits?|stands?|lies|lie|hangs?)$"
)
_COPULA = re.compile(r"^(?P<noun>.+?)\s+(?:is|are)\s+(?P<adj>.+)$")


@dataclass(frozen=True)
class ClaimPlan:
    """What to ground for one claim and which rule turns the boxes into s."""

    rule: str  # object | negation | count | attribute | spatial | contact | ungroundable
    phrases: tuple[str, ...] = ()  # entity phrases to ground (subject first)
    relation: str | None = None  # spatial: canonical relation name
    count: int | None = None
    at_least: bool = False
    reason: str | None = None  # why a claim is ungroundable

    @property
    def groundable(self) -> bool:
        return self.rule != "ungroundable"


@dataclass(frozen=True)
class ClaimSupport:
    groundable: bool
    s: float | None  # None when ungroundable
    evidence: np.ndarray = field(default_factory=lambda: np.zeros((0, 4)))  # (n, 4) pixel xyxy
    note: str | None = None


def _ungroundable(reason: str) -> ClaimPlan:
    return ClaimPlan("ungroundable", reason=reason)


def _normalise(text: str) -> str:
    text = " ".join(text.lower().replace("\u2019", "'").split()).strip(" .?!\"'")
    for frame in _FRAMES:
        text = frame.sub("", text, count=1)
    return text


def entity_phrase(text: str) -> str:
    """A detector phrase from a noun phrase: no leading determiner or trailing copula/verb."""
    text = text.strip(" ,.;:")
    text = _TRAILING_VERB.sub("", text)
    while True:
        stripped = _DETERMINER.sub("", text)
        if stripped == text:
            return text.strip(" ,.;:")
        text = stripped


def _attribute_phrase(text: str) -> str:
    """ "the apples are green" -> "green apples"; a noun phrase is kept as it is."""
    match = _COPULA.match(text)
    if match:
        return f"{match['adj']} {entity_phrase(match['noun'])}"
    return entity_phrase(text)


def _count(text: str) -> tuple[int, bool, str] | None:
    match = _COUNT.search(text)
    if match is None:
        return None
    n = match["n"]
    number = int(n) if n.isdigit() else _NUMBER_WORDS[n]
    return number, match["atleast"] is not None, entity_phrase(_split_spatial(match["rest"])[0])


def _split_spatial(text: str) -> tuple[str, str | None, str | None]:
    """(subject, relation, object) at the first spatial relation; (text, None, None) if none."""
    match = _SPATIAL_RE.search(text)
    if match is None:
        return text, None, None
    return text[: match.start()], _SPATIAL[match[1]], text[match.end():]


def infer_type(text: str) -> str:
    """A claim type for untyped questions (DEPICT/DSG)."""
    body = _normalise(text)
    if _NEGATION.search(body):
        return "negation"
    if _count(body) is not None:
        return "count"
    if _split_spatial(body)[1] is not None:
        return "spatial"
    return "object"


def _pair_plan(text: str, rule_if_verb: bool) -> ClaimPlan:
    subject, relation, obj = _split_spatial(text)
    if relation == "depth":
        return _ungroundable("depth_relation")
    if relation is not None:
        a, b = entity_phrase(subject), entity_phrase(obj)
        return ClaimPlan("spatial", (a, b), relation=relation) if a and b else _ungroundable("missing_entity")
    if rule_if_verb:
        verb = _CONTACT_RE.search(text)
        if verb is not None:
            a, b = entity_phrase(text[: verb.start()]), entity_phrase(text[verb.end():])
            return ClaimPlan("contact", (a, b), relation=verb[1]) if a and b else _ungroundable("missing_entity")
        return _ungroundable("abstract_relation")
    return _ungroundable("no_spatial_relation")


def plan_claim(text: str, claim_type: str | None) -> ClaimPlan:
    """Decide the rule and the phrases to ground for one claim (see the module docstring)."""
    kind = claim_type or infer_type(text)
    body = _normalise(text)
    if kind in ("action", "other"):
        return _ungroundable(f"{kind}_claim")
    if kind in ("spatial", "relation"):
        return _pair_plan(body, rule_if_verb=kind == "relation")
    if kind == "negation":
        match = _NEGATION.search(body)
        phrase = entity_phrase(_split_spatial(match[1])[0]) if match else ""
        return ClaimPlan("negation", (phrase,)) if phrase else _ungroundable("no_negated_entity")
    if kind == "count":
        counted = _count(body)
        if counted is None:
            return _ungroundable("no_stated_count")
        number, at_least, phrase = counted
        if not phrase:
            return _ungroundable("missing_entity")
        if number == 0:
            return ClaimPlan("negation", (phrase,))
        return ClaimPlan("count", (phrase,), count=number, at_least=at_least)
    if kind in ("object", "attribute"):
        subject = _split_spatial(body)[0]
        phrase = _attribute_phrase(subject) if kind == "attribute" else entity_phrase(subject)
        return ClaimPlan(kind, (phrase,)) if phrase else _ungroundable("missing_entity")
    raise ValueError(f"unknown claim type {claim_type!r}")


# ----------------------------------------------------------------------- geometry


def _centres(boxes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return (boxes[..., 0] + boxes[..., 2]) / 2, (boxes[..., 1] + boxes[..., 3]) / 2


def pairwise_iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(len(a), len(b)) IoU of xyxy boxes."""
    a, b = a[:, None, :], b[None, :, :]
    w = np.clip(np.minimum(a[..., 2], b[..., 2]) - np.maximum(a[..., 0], b[..., 0]), 0, None)
    h = np.clip(np.minimum(a[..., 3], b[..., 3]) - np.maximum(a[..., 1], b[..., 1]), 0, None)
    inter = w * h
    area_a = (a[..., 2] - a[..., 0]) * (a[..., 3] - a[..., 1])
    area_b = (b[..., 2] - b[..., 0]) * (b[..., 3] - b[..., 1])
    union = area_a + area_b - inter
    return np.divide(inter, union, out=np.zeros_like(inter, dtype=np.float64), where=union > 0)


def relation_holds(relation: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(len(a), len(b)) booleans: does box a stand in `relation` to box b?"""
    a, b = a[:, None, :], b[None, :, :]
    (ax, ay), (bx, by) = _centres(a), _centres(b)
    overlap_x = (a[..., 0] < b[..., 2]) & (b[..., 0] < a[..., 2])
    overlap_y = (a[..., 1] < b[..., 3]) & (b[..., 1] < a[..., 3])
    if relation == "left of":
        return ax < bx
    if relation == "right of":
        return ax > bx
    if relation == "above":
        return ay < by
    if relation == "below":
        return ay > by
    if relation == "on":
        return (ay < by) & overlap_x
    if relation == "in":
        return (b[..., 0] <= ax) & (ax <= b[..., 2]) & (b[..., 1] <= ay) & (ay <= b[..., 3])
    if relation == "near":
        gap_x = np.maximum(0, np.maximum(a[..., 0], b[..., 0]) - np.minimum(a[..., 2], b[..., 2]))
        gap_y = np.maximum(0, np.maximum(a[..., 1], b[..., 1]) - np.minimum(a[..., 3], b[..., 3]))
        size = np.maximum(np.maximum(a[..., 2] - a[..., 0], a[..., 3] - a[..., 1]), np.maximum(b[..., 2] - b[..., 0], b[..., 3] - b[..., 1]))
        return np.hypot(gap_x, gap_y) <= size
    if relation == "touch":
        return overlap_x & overlap_y
    raise ValueError(f"unknown spatial relation {relation!r}")


# -------------------------------------------------------------------------- rules


def _top(det: Detections, k: int = 1) -> np.ndarray:
    order = np.argsort(-det.box_scores, kind="stable")[:k]
    return det.boxes[order]


def _pair_support(plan: ClaimPlan, a: Detections, b: Detections) -> ClaimSupport:
    if len(a) == 0 or len(b) == 0:
        return ClaimSupport(True, 0.0, np.vstack([_top(a), _top(b)]), note="entity_not_found")
    relation = "touch" if plan.rule == "contact" else plan.relation
    holds = relation_holds(relation, a.boxes, b.boxes) & (pairwise_iou(a.boxes, b.boxes) < SAME_THING_IOU)
    strength = np.sqrt(a.box_scores[:, None] * b.box_scores[None, :]) * holds
    i, j = np.unravel_index(np.argmax(strength), strength.shape)
    if strength[i, j] <= 0:
        return ClaimSupport(True, 0.0, np.vstack([_top(a), _top(b)]), note="relation_not_seen")
    return ClaimSupport(True, float(strength[i, j]), np.vstack([a.boxes[i], b.boxes[j]]))


def claim_support(plan: ClaimPlan, detections: Mapping[str, Detections]) -> ClaimSupport:
    """Apply the plan's rule to the detections of its phrases (keyed by phrase)."""
    if not plan.groundable:
        return ClaimSupport(False, None, note=plan.reason)
    missing = [p for p in plan.phrases if p not in detections]
    if missing:
        raise KeyError(f"no detections for phrase(s) {missing}")
    first = detections[plan.phrases[0]]
    best = float(first.box_scores.max()) if len(first) else 0.0
    if plan.rule == "object":
        return ClaimSupport(True, best, _top(first))
    if plan.rule == "negation":
        return ClaimSupport(True, 1.0 - best, _top(first))
    if plan.rule == "attribute":
        if len(first) == 0:
            return ClaimSupport(True, 0.0, note="entity_not_found")
        i = int(np.argmax(first.text_scores))
        return ClaimSupport(True, float(first.text_scores[i]), first.boxes[i:i + 1])
    if plan.rule == "count":
        k, n = len(first), plan.count
        matched = min(k, n)
        if matched == 0:
            return ClaimSupport(True, 0.0, note="entity_not_found")
        ratio = matched / n if plan.at_least else matched / max(k, n)
        top = np.sort(first.box_scores)[::-1][:matched]
        return ClaimSupport(True, float(ratio * top.mean()), _top(first, matched))
    if plan.rule in ("spatial", "contact"):
        return _pair_support(plan, first, detections[plan.phrases[1]])
    raise ValueError(f"unknown rule {plan.rule!r}")
