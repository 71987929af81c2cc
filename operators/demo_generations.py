"""What a faithful question writer and judge write about the demo world.

The micro VLM learns to write these texts (operators/micro_vlm_recipe.py), and the writer's
floors compare what it writes with them (pipeline/micro_vlm_training.py). Each text is what
the project's generation prompts ask for (conf/prompts/v1.yaml), in the packaging of the
prompts' own examples, so the production parsers read it back:

- the three question sets: exactly the rows `Caption.question_rows(open_share)` holds, the
  questions the caption leaves open included (docs/method.md, "The demo benchmark");
- the holistic judge: 0.05 + 0.9 x the share of the caption's facts the scene makes true, on
  the grid of hundredths;
- the decomposed judge: the caption's typed claims in order, each with the boxes of the scene
  objects it is about (0 to 1000 grid), 0.95 when it holds and 0.05 when not, a one-sentence
  reason, and the holistic score as the overall one.

A caption with a word the world does not know gets `REFUSAL`, which no parser reads as an
answer: the writer says it cannot read the caption instead of guessing (an error row, never
an empty question set that would score as perfect).

Pure: no Ray, no model code.
"""
from __future__ import annotations

import json
import re

from operators import demo_world
from operators.judge_output import BOX_GRID, HOLISTIC_RANGE

QUESTION_TEMPLATES = {"depict": "generate_questions", "dsg": "generate_dsg", "claims": "generate_claims"}
JUDGE_TEMPLATES = {"holistic": "judge_holistic", "decomposed": "judge_decomposed"}
# The share of open questions a writer's question sets hold: the micro VLM learnt to write this
# share, and the oracle writes it (the demo's `questions.open_share` sets benchmark questions).
WRITTEN_OPEN_SHARE = 0.25
REFUSAL = "This description uses words I was not taught, so I cannot answer."
CLAIM_SCORE = {True: 0.95, False: 0.05}
EXPLANATION = {True: "The image shows this.", False: "The image does not show this."}
_WORD = re.compile(r"[a-z]+")


def world_words() -> frozenset[str]:
    """Every word a demo caption can use."""
    words = {*demo_world.SHAPES, *(s + "s" for s in demo_world.SHAPES), *demo_world.COLOURS}
    words |= {*demo_world.NUMBER_WORDS.values(), *(w for r in demo_world.RELATIONS for w in r.split())}
    return frozenset(words | {"a", "no", "and", "picture", "with"})


def knows(text: str) -> bool:
    """Whether every word of a caption is a word of the world."""
    return set(_WORD.findall(text.lower())) <= world_words() and not re.search(r"[^a-z ]", text)


def _dumps(value) -> str:
    return json.dumps(value, ensure_ascii=False)


def question_text(caption: demo_world.Caption, question_set: str, open_share: float) -> str:
    """The answer to the `question_set`'s generation prompt: the world's own rows, as JSON."""
    rows = [r for r in caption.question_rows(open_share) if r["question_set"] == question_set]
    if question_set == "depict":
        return _dumps([r["question"] for r in rows])
    if question_set == "dsg":
        return _dumps([[r["question_id"], r["question"], list(r["parents"])] for r in rows])
    if question_set == "claims":
        return _dumps([[r["question"], r["claim_type"]] for r in rows])
    raise ValueError(f"unknown question set {question_set!r}; valid: {tuple(QUESTION_TEMPLATES)}")


def holistic_score(caption: demo_world.Caption, scene: demo_world.Scene) -> float:
    low, high = HOLISTIC_RANGE
    return round(low + (high - low) * caption.share_true(scene), 2)


def grid_box(obj: demo_world.SceneObject) -> list[int]:
    """An object's box on the judge's 0..1000 grid (pixels scaled, rounded to whole units)."""
    return [round(v * BOX_GRID / demo_world.SIZE) for v in demo_world.object_box(obj.shape, obj.row, obj.col)]


def evidence(fact: demo_world.Fact, scene: demo_world.Scene) -> list[demo_world.SceneObject]:
    """The scene objects a fact is about, in reading order (by row, then column: what the image
    shows, whatever order the scene lists them in): the matching things (for a relation, the
    subjects and objects of the pairs that hold it). A denial points at what contradicts it, so
    a true denial has no box."""
    found = sorted(demo_world._matching(scene, fact.shape, fact.colour), key=lambda o: (o.row, o.col))
    if fact.kind != "spatial":
        return found
    holds = demo_world.RELATIONS[fact.relation]
    targets = demo_world._matching(scene, *fact.other)
    pairs = [(s, o) for s in found for o in targets if s is not o and holds(s, o)]
    chosen = {obj for pair in pairs for obj in pair}
    return sorted(chosen, key=lambda o: (o.row, o.col))


def judge_text(caption: demo_world.Caption, scene: demo_world.Scene, kind: str) -> str:
    """The answer to the judge prompt of `kind` for this caption on this scene."""
    overall = holistic_score(caption, scene)
    if kind == "holistic":
        return _dumps({"score": overall})
    if kind != "decomposed":
        raise ValueError(f"unknown judge kind {kind!r}; valid: {tuple(JUDGE_TEMPLATES)}")
    claims = []
    for fact in caption.facts:
        claim, holds = fact.claim(), fact.holds(scene)
        claims.append({
            "claim": claim.text, "type": claim.type, "boxes": [grid_box(o) for o in evidence(fact, scene)],
            "score": CLAIM_SCORE[holds], "explanation": EXPLANATION[holds],
        })
    return _dumps({"claims": claims, "overall": overall})


def answer_to(template: str, caption: demo_world.Caption, scene: demo_world.Scene | None = None) -> str:
    """What a faithful writer answers to the generation template named `template` (a key of
    conf/prompts: generate_questions, generate_dsg, generate_claims, judge_holistic,
    judge_decomposed) about `caption` (and, for the judge, `scene`)."""
    for qset, name in QUESTION_TEMPLATES.items():
        if name == template:
            return question_text(caption, qset, WRITTEN_OPEN_SHARE)
    for kind, name in JUDGE_TEMPLATES.items():
        if name == template:
            if scene is None:
                raise ValueError(f"{template}: the judge needs the image's scene")
            return judge_text(caption, scene, kind)
    raise ValueError(f"{template!r} is not a generation template; valid: {[*QUESTION_TEMPLATES.values(), *JUDGE_TEMPLATES.values()]}")
