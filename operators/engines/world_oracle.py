"""The world oracle: an engine that answers every yes/no request of the demo from the demo
world's truth (`operators.demo_world`), so each metric run on it shows its ceiling.

Why an engine: the ceiling of a metric is the same metric fed perfect answers. Answering
through the Engine interface reuses every production path unchanged (request planning, prompt
templates, the answer cache, formulas, meta-evaluation, tables); only the answers differ.

How it reads a request: the prompt text is one of the run's answer templates filled in, so the
kind and the question or caption come back by matching those templates exactly
(`operators.prompts.unfill`; the templates arrive through `use_templates`, which
`operators.answering.answer_batch` calls). A question is looked up among the question texts of
every fact of the world (both question sets' wordings), a caption is split into clauses looked
up among every clause text, and an image is decoded back into its scene cell by cell against
the rasteriser's own shapes. Anything else (an unknown wording, a photo, a resized or masked
scene) is a ValueError naming it, never a guess.

Answers: 1 - 1e-6 on the right word (finite log-probabilities); log(0.5) on both words for a
caption-only question the caption leaves open (`Caption.implies` is None).

Writing: a generation prompt (question sets, judge verdicts) is read back the same way, and
answered with what a faithful writer writes (`operators.demo_generations.answer_to`): the
ceiling of every metric whose questions or verdicts a model writes.
"""
from __future__ import annotations

import functools
import hashlib
import math
from collections.abc import Mapping, Sequence

import numpy as np

from operators import demo_generations, demo_world
from operators.answering import ANSWER_TEMPLATES  # request kind -> (template, the placeholder its text fills)
from operators.demo_world import COLOURS, NUMBER_WORDS, RELATIONS, SHAPES, SIZE, Caption, Fact, No, Relation, SceneObject, Thing
from operators.engines.base import Prompt
from operators.engines.spec import BackboneSpec
from operators.images import fit_pixels
from operators.prompts import unfill

# The version of this engine's answering logic: it stands for the model's revision in answer keys
# (BackboneSpec.fingerprint), so bump it whenever an answer could change and no stored answer of
# the old logic is reused.
REVISION = 1

P_DECIDED = 1.0 - 1e-6  # the right word's probability for a decided answer: log-probabilities stay finite
LOGP_RIGHT, LOGP_WRONG, LOGP_OPEN = math.log(P_DECIDED), math.log(1.0 - P_DECIDED), math.log(0.5)

FORMS = ("depict", "dsg")
WRITING_TEMPLATES = (*demo_generations.QUESTION_TEMPLATES.values(), *demo_generations.JUDGE_TEMPLATES.values())


# ---------------------------------------------------------------------- the world's texts

def _nouns() -> list[tuple[str, str | None]]:
    return [(shape, colour) for shape in SHAPES for colour in (None, *COLOURS)]


@functools.cache
def world_facts() -> tuple[Fact, ...]:
    """Every fact the demo world can state: each kind over every shape, colour (or none),
    count and relation, singular and plural colour wordings."""
    facts = [Fact("present", shape) for shape in SHAPES]
    facts += [Fact("colour", shape, colour, plural=plural) for shape in SHAPES for colour in COLOURS for plural in (False, True)]
    facts += [Fact("count", shape, colour, count=n) for shape, colour in _nouns() for n in NUMBER_WORDS]
    facts += [Fact("absent", shape, colour) for shape, colour in _nouns()]
    facts += [Fact("spatial", s, sc, relation=r, other=o) for s, sc in _nouns() for r in RELATIONS for o in _nouns()]
    return tuple(facts)


@functools.cache
def question_table() -> dict[str, tuple[tuple[Fact, str], ...]]:
    """Question text -> every (fact, form) whose DEPICT or DSG question reads so ("Is there a
    circle?" asks about a present circle, and about an absent one in DEPICT's wording)."""
    table: dict[str, list] = {}
    for fact in world_facts():
        for form in FORMS:
            table.setdefault(demo_world.fact_question(fact, form), []).append((fact, form))
    return {text: tuple(found) for text, found in table.items()}


@functools.cache
def claim_table() -> dict[str, tuple[Fact, ...]]:
    """Claim text -> the facts stated so ("There is no circle.")."""
    table: dict[str, list] = {}
    for fact in world_facts():
        table.setdefault(fact.claim().text, []).append(fact)
    return {text: tuple(found) for text, found in table.items()}


@functools.cache
def clause_table() -> dict[str, demo_world.Clause]:
    """Clause text -> clause: every thing (one, two or three), relation between two single
    things and negation the world can write."""
    things = [Thing(shape, colour, n) for shape, colour in _nouns() for n in (1, *NUMBER_WORDS)]
    singles = [t for t in things if t.count == 1]
    clauses = [*things, *(Relation(s, r, o) for s in singles for r in RELATIONS for o in singles), *(No(s, c) for s, c in _nouns())]
    table: dict[str, demo_world.Clause] = {}
    for clause in clauses:
        if table.setdefault(clause.text(), clause) != clause:
            raise RuntimeError(f"two demo clauses read {clause.text()!r}: the oracle could not tell them apart")
    return table


NEGATION_PREFIX = "a picture with "  # Caption.text of a caption whose every clause is a negation


def parse_caption(text: str) -> Caption:
    """The demo caption that reads `text`: its clauses (split on " and ", after the negation
    template's prefix) looked up among every clause text; ValueError for any other text."""
    body = text[len(NEGATION_PREFIX):] if text.startswith(NEGATION_PREFIX) else text
    clauses = []
    for part in body.split(" and "):
        clause = clause_table().get(part)
        if clause is None:
            raise ValueError(f"world oracle: caption {text!r}: {part!r} is not a clause of the demo world")
        clauses.append(clause)
    caption = Caption(tuple(clauses))
    if caption.text != text:
        raise ValueError(f"world oracle: caption {text!r} is not how the demo world writes {caption.text!r}")
    return caption


def caption_answer(caption: Caption, fact: Fact, form: str) -> bool | None:
    """What the caption alone answers to a fact's question in one wording: `Caption.implies`
    (the DEPICT wording's answer; None when the caption leaves it open), turned over for DSG's
    "Is there no ...?", which a caption denying the thing answers Yes."""
    implied = caption.implies(fact)
    if implied is None or form == "depict" or fact.kind != "absent":
        return implied
    return not implied


# ---------------------------------------------------------------------------- images

_PALETTE = np.array([demo_world.BACKGROUND, *COLOURS.values()], dtype=np.int64)  # render()'s indices
_CELL_EDGES = [round(k * SIZE / 3) for k in range(4)]


def _cell(row: int, col: int) -> tuple[slice, slice]:
    return slice(_CELL_EDGES[row], _CELL_EDGES[row + 1]), slice(_CELL_EDGES[col], _CELL_EDGES[col + 1])


@functools.cache
def _shape_masks() -> dict[tuple[int, int], tuple[tuple[str, np.ndarray], ...]]:
    """(row, col) -> (shape, its pixels within the cell) for every shape, from the rasteriser
    itself; a shape reaching past its cell would make cells ambiguous, so that raises."""
    masks = {}
    for row in range(3):
        for col in range(3):
            region = _cell(row, col)
            found = []
            for shape in SHAPES:
                drawn = demo_world.render((SceneObject(shape, next(iter(COLOURS)), row, col),)) != 0
                inside = drawn[region]
                if inside.sum() != drawn.sum():
                    raise RuntimeError(f"the demo's {shape} at cell ({row}, {col}) reaches past its cell")
                found.append((shape, inside))
            masks[row, col] = tuple(found)
    return masks


def _cell_name(row: int, col: int) -> str:
    names = {v: k for k, v in demo_world.ROWS.items()}, {v: k for k, v in demo_world.COLS.items()}
    return f"{names[0][row]} {names[1][col]}"


def read_scene(pixels: np.ndarray) -> demo_world.Scene:
    """The demo scene an RGB image (SIZE x SIZE x 3, uint8) shows exactly; ValueError naming
    the first pixel off the palette, or the cell that holds no rendered shape."""
    if pixels.shape != (SIZE, SIZE, 3):
        raise ValueError(f"world oracle: a {pixels.shape[1]}x{pixels.shape[0]} image is not a demo scene ({SIZE}x{SIZE} RGB)")
    codes = (pixels[..., 0].astype(np.int64) << 16) | (pixels[..., 1].astype(np.int64) << 8) | pixels[..., 2]
    palette = (_PALETTE[:, 0] << 16) | (_PALETTE[:, 1] << 8) | _PALETTE[:, 2]
    index = np.full(codes.shape, -1, dtype=np.int64)
    for i, code in enumerate(palette):
        index[codes == code] = i
    if (index < 0).any():
        y, x = map(int, np.argwhere(index < 0)[0])
        raise ValueError(f"world oracle: pixel (x={x}, y={y}) has colour {tuple(int(c) for c in pixels[y, x])}, "
                         "which the demo's palette lacks: not a demo scene")
    colour_names = (None, *COLOURS)
    objects = []
    for (row, col), shapes in _shape_masks().items():
        cell = index[_cell(row, col)]
        inked = cell != 0
        if not inked.any():
            continue
        colours = np.unique(cell[inked])
        shape = next((name for name, mask in shapes if np.array_equal(mask, inked)), None)
        if shape is None or len(colours) != 1:
            raise ValueError(f"world oracle: cell ({row}, {col}) ({_cell_name(row, col)}) matches no rendered shape "
                             "of one colour (a masked or edited view?): not a demo scene")
        objects.append(SceneObject(shape, colour_names[int(colours[0])], row, col))
    scene = tuple(objects)
    if not np.array_equal(demo_world.render(scene), index):
        raise ValueError("world oracle: the image is not the rasteriser's picture of the scene its cells show: not a demo scene")
    return scene


# ---------------------------------------------------------------------------- the engine

class WorldOracleEngine:
    """Engine `world_oracle`: yes/no answers and written texts from the demo world's truth."""

    def __init__(self, spec: BackboneSpec):
        if spec.max_image_pixels < SIZE * SIZE or spec.min_image_pixels > SIZE * SIZE:
            raise ValueError(
                f"backbone {spec.name!r} (engine world_oracle) reads {SIZE}x{SIZE} demo scenes pixel for pixel: it needs "
                f"min_image_pixels <= {SIZE * SIZE} <= max_image_pixels (got {spec.min_image_pixels}, {spec.max_image_pixels}), "
                "so no scene is resized")
        self.spec = spec
        self.templates: dict[str, str] = {}
        self._scenes: dict[str, demo_world.Scene] = {}
        self.n_scored = 0

    def use_templates(self, templates: Mapping[str, str]) -> None:
        """The templates that fill this run's prompts (operators.answering.answer_batch passes them)."""
        names = [name for name, _ in ANSWER_TEMPLATES.values()] + list(WRITING_TEMPLATES)
        self.templates = {name: templates[name] for name in names if name in templates}

    def score_yes_no(self, prompts: Sequence[Prompt]) -> np.ndarray:
        out = np.empty((len(prompts), 2), dtype=np.float64)
        for i, prompt in enumerate(prompts):
            answer = self.answer(prompt)
            out[i] = (LOGP_OPEN, LOGP_OPEN) if answer is None else (LOGP_RIGHT, LOGP_WRONG) if answer else (LOGP_WRONG, LOGP_RIGHT)
        self.n_scored += len(prompts)
        return out

    def generate(self, prompts: Sequence[Prompt], max_new_tokens: int) -> list[str]:
        """What a faithful writer writes to each generation prompt (`max_new_tokens` does not
        cut it: the oracle is the ceiling, and its longest text is a few hundred tokens)."""
        return [self.write(prompt) for prompt in prompts]

    def write(self, prompt: Prompt) -> str:
        matches = []
        for name in WRITING_TEMPLATES:
            if name in self.templates and (prompt.image is not None) == name.startswith("judge_"):
                values = unfill(self.templates[name], prompt.user)
                if values is not None and "caption" in values:
                    matches.append((name, values["caption"]))
        if len(matches) != 1:
            shown = "with an image" if prompt.image is not None else "without an image"
            why = "matches none of" if not matches else f"matches {len(matches)} of ({', '.join(n for n, _ in matches)})"
            raise ValueError(f"world oracle: the prompt {prompt.user[:80]!r}... ({shown}) {why} the generation templates "
                             f"{sorted(n for n in self.templates if n in WRITING_TEMPLATES)}: cannot tell what it asks")
        name, caption = matches[0]
        scene = self.scene(prompt) if prompt.image is not None else None
        return demo_generations.answer_to(name, parse_caption(caption), scene)

    def close(self) -> None:
        self._scenes.clear()

    # ------------------------------------------------------------------ reading a request

    def answer(self, prompt: Prompt) -> bool | None:
        """The world's answer to one prompt: True, False, or None where the caption leaves it open."""
        kind, value = self.read(prompt)
        if kind == "caption":
            caption, question = value
            found = self._question(question)
            said = {caption_answer(parse_caption(caption), fact, form) for fact, form in found} - {None}
            return _one(said, f"caption {caption!r} and question {question!r}") if said else None
        scene = self.scene(prompt)
        if kind == "image":
            found = self._question(value)
            return _one({demo_world.image_truth(fact, form, scene) for fact, form in found}, f"question {value!r}")
        if kind == "holistic":
            return all(fact.holds(scene) for fact in parse_caption(value).facts)
        facts = claim_table().get(value)
        if facts is None:
            raise ValueError(f"world oracle: {value!r} is not a claim of the demo world")
        return _one({fact.holds(scene) for fact in facts}, f"claim {value!r}")

    def read(self, prompt: Prompt) -> tuple[str, object]:
        """(kind, what it asks): the question for image prompts, (caption, question) for
        caption-only ones, the caption for holistic ones, the claim for claim ones; found by
        matching the run's templates exactly."""
        if not self.templates:
            raise ValueError("world oracle: no prompt templates: it reads a request back from its prompt, so it needs the "
                             "templates that filled it (use_templates; operators.answering.answer_batch passes the run's)")
        matches = []
        for kind, (name, field) in ANSWER_TEMPLATES.items():
            if name in self.templates and (prompt.image is None) == (kind == "caption"):  # only caption-only prompts lack an image
                values = unfill(self.templates[name], prompt.user)
                needed = (field, "caption") if kind == "caption" else (field,)
                if values is not None and all(n in values for n in needed):
                    matches.append((kind, (values["caption"], values[field]) if kind == "caption" else values[field]))
        if len(matches) != 1:
            shown = "with an image" if prompt.image is not None else "without an image"
            why = "matches none of" if not matches else f"matches {len(matches)} of ({', '.join(k for k, _ in matches)})"
            raise ValueError(f"world oracle: the prompt {prompt.user!r} ({shown}) {why} the answer templates "
                             f"{sorted(self.templates)}: cannot tell what it asks")
        return matches[0]

    def scene(self, prompt: Prompt) -> demo_world.Scene:
        """The prompt's image as a demo scene, decoded once per image (by its id, else its pixels)."""
        if prompt.image_id in self._scenes:
            return self._scenes[prompt.image_id]
        image = fit_pixels(prompt.image, self.spec.max_image_pixels, self.spec.min_image_pixels)
        key = prompt.image_id or hashlib.blake2b(image.tobytes() + repr(image.size).encode(), digest_size=16).hexdigest()
        if key not in self._scenes:
            self._scenes[key] = read_scene(np.asarray(image.convert("RGB")))
        return self._scenes[key]

    @staticmethod
    def _question(text: str) -> tuple[tuple[Fact, str], ...]:
        found = question_table().get(text)
        if found is None:
            raise ValueError(f"world oracle: {text!r} is not a question of the demo world")
        return found


def _one(values: set, what: str) -> bool:
    """The single answer all readings of a text agree on (a demo text never means two things)."""
    if len(values) != 1:
        raise ValueError(f"world oracle: the {what} has readings with different answers: {sorted(values)}")
    return values.pop()
