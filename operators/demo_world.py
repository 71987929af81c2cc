"""The demo world: shape scenes on a 3x3 grid, captions built from clauses, their atomic
facts with a known truth, the exact rasteriser, the demo benchmark's fixed items, and a
seeded sampler of fresh scenes, captions and yes/no requests.

Each scene is a few flat shapes (circle, square, triangle, star) in four colours on a 3x3
grid, on a plain background, 256x256 pixels. A caption is built from clauses (things,
spatial relations, negations) that expand into atomic facts, and each fact can be checked
against the scene. `pipeline.benchmarks.demo` turns the fixed items below into the demo
benchmark; `operators.micro_vlm_recipe` trains the built-in micro VLM on `WorldSampler` draws.

Determinism: shapes are rasterised with exact numpy tests at pixel centres (Pillow's
drawing code changes between versions), and PNGs are written with uncompressed (stored)
deflate blocks: compressed bytes depend on the zlib build. So the bytes, and the image
hashes that key the answer cache, are the same on every machine.

Pure: numpy only (no Ray, no pipeline), so model code in `operators` can use it.
"""
from __future__ import annotations

import functools
import hashlib
import math
import random
import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from operators.parsing import Claim, DsgQuestion, distinct, questions_rows

# ---------------------------------------------------------------------------- scenes

SIZE = 256
ROWS = {"top": 0, "middle": 1, "bottom": 2}
COLS = {"left": 0, "centre": 1, "right": 2}
BACKGROUND = (250, 250, 250)
COLOURS = {"red": (220, 40, 40), "blue": (40, 80, 220), "green": (40, 160, 60), "yellow": (235, 190, 20)}
SHAPES = ("circle", "square", "triangle", "star")


@dataclass(frozen=True)
class SceneObject:
    shape: str
    colour: str
    row: int  # 0 top .. 2 bottom
    col: int  # 0 left .. 2 right


Scene = tuple[SceneObject, ...]


def scene(*objects: str) -> Scene:
    """Scene from phrases "<colour> <shape> <row> <col>", e.g. "red circle top left"."""
    parsed = []
    for phrase in objects:
        colour, shape, row, col = phrase.split()
        if colour not in COLOURS or shape not in SHAPES or row not in ROWS or col not in COLS:
            raise ValueError(f"bad scene object {phrase!r}")
        parsed.append(SceneObject(shape, colour, ROWS[row], COLS[col]))
    cells = [(o.row, o.col) for o in parsed]
    if len(set(cells)) != len(cells):
        raise ValueError(f"two objects share a cell in {objects}")
    return tuple(parsed)


def _matching(scene_: Scene, shape: str, colour: str | None) -> list[SceneObject]:
    return [o for o in scene_ if o.shape == shape and (colour is None or o.colour == colour)]


# ------------------------------------------------------------------- captions and facts

NUMBER_WORDS = {2: "two", 3: "three"}
RELATIONS = {  # relation -> holds(subject, object); strict on its own axis only
    "above": lambda s, o: s.row < o.row,
    "below": lambda s, o: s.row > o.row,
    "left of": lambda s, o: s.col < o.col,
    "right of": lambda s, o: s.col > o.col,
}


def _noun(shape: str, colour: str | None, plural: bool = False) -> str:
    return " ".join(filter(None, [colour, shape + ("s" if plural else "")]))


@dataclass(frozen=True)
class Fact:
    """One atomic, checkable statement of a caption, with its three question forms.

    kind: present (a shape is there), colour (a shape of that colour is there), count
    (exactly `count` matching shapes), spatial (some subject is `relation` some object),
    absent (no matching shape: the caption's answer to "Is there ...?" is No).
    """

    kind: str
    shape: str
    colour: str | None = None
    count: int | None = None
    relation: str | None = None
    other: tuple[str, str | None] | None = None  # spatial: (shape, colour) of the object
    plural: bool = False  # colour facts about a counted group read "Are the circles red?"

    def holds(self, scene_: Scene) -> bool:
        found = _matching(scene_, self.shape, self.colour)
        if self.kind in ("present", "colour"):
            return bool(found)
        if self.kind == "count":
            return len(found) == self.count
        if self.kind == "absent":
            return not found
        if self.kind == "spatial":
            targets = _matching(scene_, *self.other)
            return any(RELATIONS[self.relation](s, o) for s in found for o in targets if s is not o)
        raise ValueError(f"unknown fact kind {self.kind!r}")

    @property
    def parents(self) -> tuple[Fact, ...]:
        """DSG dependencies: a detail is only asked about once its object is known to exist."""
        if self.kind == "colour":
            return (Fact("present", self.shape),)
        if self.kind == "count":
            return (_head_fact(self.shape, self.colour, plural=True),)
        if self.kind == "spatial":
            return (_head_fact(self.shape, self.colour), _head_fact(*self.other))
        return ()

    def depict_question(self) -> str:
        """DEPICT question: asks about the world, so negations get an expected answer of No."""
        noun = _noun(self.shape, self.colour)
        if self.kind == "count":
            return f"Are there exactly {NUMBER_WORDS[self.count]} {_noun(self.shape, self.colour, True)}?"
        if self.kind == "spatial":
            return f"Is the {noun} {self.relation} the {_noun(*self.other)}?"
        return f"Is there a {noun}?"  # present, colour, absent

    def dsg_question(self) -> str:
        """DSG question: phrased so that a faithful image answers Yes (DSG's convention)."""
        if self.kind == "colour":
            if self.plural:
                return f"Are the {self.shape}s {self.colour}?"
            return f"Is the {self.shape} {self.colour}?"
        if self.kind == "absent":
            return f"Is there no {_noun(self.shape, self.colour)}?"
        return self.depict_question()

    def claim(self) -> Claim:
        noun = _noun(self.shape, self.colour)
        if self.kind == "present":
            return Claim(f"There is a {noun}.", "object")
        if self.kind == "colour":
            return Claim(f"There is a {noun}.", "attribute")
        if self.kind == "count":
            return Claim(f"There are exactly {NUMBER_WORDS[self.count]} {_noun(self.shape, self.colour, True)}.", "count")
        if self.kind == "spatial":
            return Claim(f"The {noun} is {self.relation} the {_noun(*self.other)}.", "spatial")
        return Claim(f"There is no {noun}.", "negation")


def _head_fact(shape: str, colour: str | None, plural: bool = False) -> Fact:
    """The most specific existence fact about a thing (what its details depend on)."""
    return Fact("colour", shape, colour, plural=plural) if colour else Fact("present", shape)


@dataclass(frozen=True)
class Thing:
    """ "a red circle", "two circles", "three blue squares"."""

    shape: str
    colour: str | None = None
    count: int = 1

    def text(self) -> str:
        if self.count == 1:
            return f"a {_noun(self.shape, self.colour)}"
        return f"{NUMBER_WORDS[self.count]} {_noun(self.shape, self.colour, plural=True)}"

    def facts(self) -> list[Fact]:
        facts = [Fact("present", self.shape)]
        if self.colour:
            facts.append(Fact("colour", self.shape, self.colour, plural=self.count > 1))
        if self.count > 1:
            facts.append(Fact("count", self.shape, self.colour, count=self.count))
        return facts


@dataclass(frozen=True)
class Relation:
    """ "a red circle above a blue square" (both sides single things)."""

    subject: Thing
    relation: str
    object: Thing

    def text(self) -> str:
        return f"{self.subject.text()} {self.relation} {self.object.text()}"

    def facts(self) -> list[Fact]:
        if self.subject.count != 1 or self.object.count != 1 or self.relation not in RELATIONS:
            raise ValueError(f"unsupported relation clause {self}")
        spatial = Fact("spatial", self.subject.shape, self.subject.colour, relation=self.relation,
                       other=(self.object.shape, self.object.colour))
        return self.subject.facts() + self.object.facts() + [spatial]


@dataclass(frozen=True)
class No:
    """ "no circle", "no blue star"."""

    shape: str
    colour: str | None = None

    def text(self) -> str:
        return f"no {_noun(self.shape, self.colour)}"

    def facts(self) -> list[Fact]:
        return [Fact("absent", self.shape, self.colour)]


Clause = Thing | Relation | No


# The demo's simulated raters (`Caption.rater_ratings`): how many rate each pair, and how often
# one misjudges a fact of each kind (relations and counts are the easiest to get wrong).
RATERS = 5
RATER_ERROR = {"present": 0.05, "colour": 0.08, "absent": 0.08, "count": 0.12, "spatial": 0.15}

# NegBench's caption templates (`Caption.template`): nothing negated, only negations, both.
CAPTION_TEMPLATES = ("affirmative", "negation", "hybrid")


@dataclass(frozen=True)
class Caption:
    clauses: tuple[Clause, ...]

    @property
    def text(self) -> str:
        if self.template == "negation":
            return "a picture with " + " and ".join(c.text() for c in self.clauses)
        return " and ".join(c.text() for c in self.clauses)

    @property
    def template(self) -> str:
        """NegBench template: affirmative (nothing negated), negation (only), hybrid (both)."""
        negated = [isinstance(c, No) for c in self.clauses]
        return "negation" if all(negated) else "hybrid" if any(negated) else "affirmative"

    @property
    def repeats_a_shape(self) -> bool:
        """Whether two of its mentions name one shape ("a square left of a triangle and a green
        square"): a writer must then work out which details belong to which thing, and these are
        the captions micro-writer gets wrong (docs/method.md, "The demo benchmark")."""
        shapes = [t.shape for c in self.clauses for t in ((c.subject, c.object) if isinstance(c, Relation) else (c,))]
        return len(shapes) != len(set(shapes))

    @property
    def facts(self) -> list[Fact]:
        """Atomic facts in caption order, each once (a thing's existence before its details)."""
        return list(dict.fromkeys(f for clause in self.clauses for f in clause.facts()))

    def share_true(self, scene_: Scene) -> float:
        facts = self.facts
        return sum(f.holds(scene_) for f in facts) / len(facts)

    def rater_ratings(self, scene_: Scene) -> list[int]:
        """What each of the demo's simulated raters says of this caption on this scene (1-5).

        The raters' model was fixed before any metric was measured and is never tuned to one
        (docs/method.md, "Meta-evaluation"): each of RATERS people judges every stated fact and
        gets it wrong with probability RATER_ERROR[its kind]; their rating is 1 + 4 x the share
        of facts they judged true, rounded to a whole number. Seeded by the caption and the
        scene, so the same pair gets the same ratings on every machine."""
        facts = self.facts
        key = ";".join(sorted(f"{o.colour} {o.shape} {o.row} {o.col}" for o in scene_))
        rng = random.Random(f"raters/{self.text}/{key}")
        ratings = []
        for _ in range(RATERS):
            judged = [f.holds(scene_) != (rng.random() < RATER_ERROR[f.kind]) for f in facts]
            ratings.append(int(math.floor(1.0 + 4.0 * sum(judged) / len(judged) + 0.5)))
        return ratings

    def rating(self, scene_: Scene) -> float:
        """The demo's rating of this caption on this scene: the mean of its raters' (1..5, in
        steps of 1 / RATERS, so items tie as real benchmarks' do)."""
        ratings = self.rater_ratings(scene_)
        return sum(ratings) / len(ratings)

    def implies(self, fact: Fact) -> bool | None:
        """The answer the caption alone gives to a fact's depict question: Yes for a stated
        thing, No for a denied one, None when the caption leaves it open."""
        if fact in self.facts:
            return caption_truth(fact)
        return None

    def open_facts(self) -> list[Fact]:
        """Facts the caption leaves open that a question writer would ask about (docs/method.md,
        "Questions"): the colour of a single uncoloured thing, whether a single thing is really
        two, and the relation between two stated things that no clause relates. Each is true or
        false on an image, and undecided from the caption alone."""
        nouns: list[tuple[str, str | None]] = []
        related: set[frozenset] = set()
        for clause in self.clauses:
            if isinstance(clause, Thing) and clause.count == 1:
                nouns.append((clause.shape, clause.colour))
            elif isinstance(clause, Relation):
                pair = [(clause.subject.shape, clause.subject.colour), (clause.object.shape, clause.object.colour)]
                nouns += pair
                related.add(frozenset(pair))
        nouns = list(dict.fromkeys(nouns))
        # a shape named twice ("a star and three red stars") settles more than either mention
        named = [noun for clause in self.clauses for noun in _positive_nouns(clause)]
        out: list[Fact] = []
        for shape, colour in nouns:
            if sum(s == shape for s, _ in named) > 1:
                continue
            if colour is None:
                out += [Fact("colour", shape, c) for c in COLOURS]
            out.append(Fact("count", shape, colour, count=2))
        for a in nouns:
            for b in nouns:
                if a[0] != b[0] and frozenset((a, b)) not in related:
                    out += [Fact("spatial", a[0], a[1], relation=r, other=b) for r in RELATIONS]
        stated = set(self.facts) | {replace(f, plural=not f.plural) for f in self.facts}  # "a red star" is stated by "red stars"
        denied = {(f.shape, f.colour) for f in stated if f.kind == "absent"}
        return [f for f in dict.fromkeys(out) if f not in stated and (f.shape, f.colour) not in denied
                and (f.shape, None) not in denied]

    def open_questions(self, share: float) -> list[Fact]:
        """The open facts a question set of this caption asks about when `share` of its
        questions are open: share / (1 - share) * stated facts of them, rounded half up (fewer
        when the caption leaves fewer open), taken in `open_priority` order. A rule, not a
        draw: a question writer can learn it, and the same caption always gets the same set."""
        if not 0.0 <= share <= 0.5:
            raise ValueError(f"open question share must be between 0 and 0.5, got {share}")
        wanted = math.floor(share / (1.0 - share) * len(self.facts) + 0.5)
        return self.open_priority()[:wanted]

    def open_priority(self) -> list[Fact]:
        """The open facts in the order a writer asks about them (docs/method.md, "Questions"):
        first one question per kind and thing — the colour of each uncoloured thing (the first
        colour the caption does not name), then whether each thing is one of two, then the first
        relation of each unrelated pair — then everything else in `open_facts` order."""
        candidates = self.open_facts()
        named = {f.colour for f in self.facts if f.colour}
        first_colour = next((c for c in COLOURS if c not in named), None)
        seen_pairs: set[tuple] = set()
        rank = {}
        for index, fact in enumerate(candidates):
            if fact.kind == "colour":
                first = fact.colour == first_colour
                tier = 0
            elif fact.kind == "count":
                first, tier = True, 1
            else:
                pair = ((fact.shape, fact.colour), fact.other)
                first, tier = pair not in seen_pairs, 2
                seen_pairs.add(pair)
            rank[fact] = (tier if first else 3, index)
        return sorted(candidates, key=rank.__getitem__)

    def question_rows(self, open_share: float = 0.0) -> list[dict]:
        """The caption's questions in all three sets, as QUESTIONS rows (source: benchmark): one
        per stated fact, then the open ones `open_questions(open_share)` adds, each question once
        per set. Two facts can read as one DEPICT question or claim ("a blue triangle" and "three
        blue triangles" both state "Is there a blue triangle?"): the parsers keep the first of a
        repeat, and a metric must not count it twice (DSG asks them apart, singular and plural)."""
        facts = self.facts + self.open_questions(open_share)
        number = {fact: str(i) for i, fact in enumerate(facts, start=1)}
        by_thing = {(f.shape, f.colour): number[f] for f in self.facts if f.kind in ("present", "colour")}

        def parent_ids(fact: Fact) -> tuple[str, ...]:  # an open fact's parents, by thing (a stated single thing is not plural)
            return tuple(number.get(p) or by_thing[p.shape, p.colour] for p in fact.parents)

        dsg = [DsgQuestion(number[f], f.dsg_question(), parent_ids(f)) for f in facts]
        sets = {"depict": distinct(f.depict_question() for f in facts), "dsg": dsg,
                "claims": distinct((f.claim() for f in facts), lambda claim: claim.text)}
        return [row for qset, parsed in sets.items() for row in questions_rows(qset, parsed, caption=self.text, source="benchmark")]


def caption(*clauses: Clause) -> Caption:
    return Caption(tuple(clauses))


# ------------------------------------------------------------------------ the data


@dataclass(frozen=True)
class CorrelationPrompt:
    caption: Caption
    scenes: tuple[Scene, ...]  # the first matches the caption exactly


@dataclass(frozen=True)
class WinogroundExample:
    captions: tuple[Caption, Caption]  # caption i describes image i
    scenes: tuple[Scene, Scene]


@dataclass(frozen=True)
class McqRow:
    scene: Scene
    correct: Caption
    distractors: tuple[Caption, Caption, Caption]


CORRELATION = (
    CorrelationPrompt(caption(Thing("circle", "red")), (
        scene("red circle middle centre"),
        scene("blue circle middle centre"),
        scene("green square top left", "yellow star bottom right"),
    )),
    CorrelationPrompt(caption(Thing("circle", "red", 2)), (
        scene("red circle top left", "red circle bottom right"),
        scene("red circle top left", "red circle bottom right", "red circle top right"),
        scene("blue circle top left", "blue circle bottom right"),
    )),
    CorrelationPrompt(caption(Relation(Thing("square"), "left of", Thing("circle"))), (
        scene("green square middle left", "yellow circle middle right"),
        scene("yellow circle middle left", "green square middle right"),
        scene("green square middle left", "green triangle middle right"),
    )),
    CorrelationPrompt(caption(Thing("star", "blue"), No("circle")), (
        scene("blue star middle centre", "red square top right"),
        scene("blue star middle centre", "red circle top right"),
        scene("yellow star middle left", "green circle middle right"),
    )),
    CorrelationPrompt(caption(Relation(Thing("circle", "red"), "above", Thing("square", "blue"))), (
        scene("red circle top centre", "blue square bottom centre"),
        scene("blue square top centre", "red circle bottom centre"),
        scene("blue circle top centre", "red square bottom centre"),
    )),
    CorrelationPrompt(caption(Thing("triangle", "green"), Thing("star", "yellow")), (
        scene("green triangle middle left", "yellow star middle right"),
        scene("green triangle middle left", "blue star middle right"),
        scene("red triangle middle left", "yellow square middle right"),
    )),
    CorrelationPrompt(caption(Thing("square", "blue", 3), No("triangle")), (
        scene("blue square top left", "blue square middle centre", "blue square bottom right"),
        scene("blue square top left", "blue square middle centre", "blue square bottom right", "red triangle top right"),
        scene("blue square top left", "blue square bottom right", "green triangle top right"),
    )),
    CorrelationPrompt(caption(Relation(Thing("circle", "yellow"), "right of", Thing("triangle", "green"))), (
        scene("green triangle middle left", "yellow circle middle right"),
        scene("yellow circle middle left", "green triangle middle right"),
        scene("green square middle left", "red circle middle right"),
    )),
)


def _swap(subject: Thing, relation: str, obj: Thing) -> tuple[Caption, Caption]:
    return caption(Relation(subject, relation, obj)), caption(Relation(obj, relation, subject))


WINOGROUND = (
    WinogroundExample(
        (caption(Relation(Thing("circle", "red"), "above", Thing("square", "blue"))),
         caption(Relation(Thing("circle", "blue"), "above", Thing("square", "red")))),
        (scene("red circle top centre", "blue square bottom centre"),
         scene("blue circle top centre", "red square bottom centre")),
    ),
    WinogroundExample(
        _swap(Thing("square"), "left of", Thing("circle")),
        (scene("green square middle left", "green circle middle right"),
         scene("green circle middle left", "green square middle right")),
    ),
    WinogroundExample(
        (caption(Relation(Thing("star", "green"), "above", Thing("triangle", "yellow"))),
         caption(Relation(Thing("star", "yellow"), "above", Thing("triangle", "green")))),
        (scene("green star top centre", "yellow triangle bottom centre"),
         scene("yellow star top centre", "green triangle bottom centre")),
    ),
    WinogroundExample(
        _swap(Thing("triangle"), "above", Thing("star")),
        (scene("blue triangle top left", "blue star bottom left"),
         scene("blue star top left", "blue triangle bottom left")),
    ),
    WinogroundExample(
        (caption(Thing("circle", count=2), Thing("square")), caption(Thing("circle"), Thing("square", count=2))),
        (scene("red circle top left", "red circle top right", "red square bottom centre"),
         scene("red circle top centre", "red square bottom left", "red square bottom right")),
    ),
    WinogroundExample(
        (caption(Thing("star", "red"), No("star", "blue")), caption(Thing("star", "blue"), No("star", "red"))),
        (scene("red star middle centre"), scene("blue star middle centre")),
    ),
)

MCQ = (
    McqRow(scene("red circle middle left", "blue square middle right"),
           caption(Thing("circle", "red"), Thing("square", "blue")),
           (caption(No("circle")), caption(Thing("circle", "red"), No("square")),
            caption(Thing("triangle", "green"), Thing("square", "blue")))),
    McqRow(scene("yellow star middle centre"),
           caption(No("circle")),
           (caption(No("star")), caption(Thing("circle", "yellow")), caption(Thing("circle"), No("star")))),
    McqRow(scene("green triangle middle centre"),
           caption(Thing("triangle", "green"), No("square")),
           (caption(Thing("square"), No("triangle")), caption(No("triangle")),
            caption(Thing("triangle", "green"), Thing("square", "red")))),
    McqRow(scene("blue circle top left", "blue circle bottom right"),
           caption(Thing("circle", "blue", 2)),
           (caption(Thing("circle", "blue", 3)), caption(No("circle", "blue")), caption(Thing("star"), No("circle")))),
    McqRow(scene("red square middle left", "green triangle middle right"),
           caption(No("star"), No("circle")),
           (caption(No("square")), caption(Thing("star", "red")), caption(Thing("star"), No("square")))),
    McqRow(scene("yellow circle middle left", "blue star middle right"),
           caption(Thing("circle", "yellow"), No("triangle")),
           (caption(Thing("triangle"), No("circle")), caption(No("star")),
            caption(Thing("triangle", "yellow"), Thing("star", "blue")))),
    McqRow(scene("green square top centre", "red triangle bottom centre"),
           caption(Relation(Thing("square", "green"), "above", Thing("triangle", "red"))),
           (caption(Relation(Thing("triangle", "red"), "above", Thing("square", "green"))), caption(No("square")),
            caption(Thing("square", "green"), No("triangle")))),
    McqRow(scene("red star middle left", "red circle middle right"),
           caption(Thing("star", "red"), No("square")),
           (caption(Thing("square"), No("star")), caption(No("circle")), caption(Thing("star", "blue"), Thing("circle", "red")))),
)

# ------------------------------------------------------------------------- drawing

_RADIUS = 0.33 * SIZE / 3
_TRIANGLE = ((0.0, -1.0), (0.95, 0.75), (-0.95, 0.75))
# Rounded so that libm differences in the last bit cannot move a vertex.
_STAR = tuple(
    (round(r * math.sin(math.pi * k / 5), 4), round(-r * math.cos(math.pi * k / 5), 4))
    for k, r in zip(range(10), [1.2, 0.55] * 5)  # a star looks smaller than a disc of equal radius
)
_PALETTE = (BACKGROUND, *COLOURS.values())
_PALETTE_INDEX = {name: i for i, name in enumerate(COLOURS, start=1)}


def _inside_polygon(x: np.ndarray, y: np.ndarray, vertices: list[tuple[float, float]]) -> np.ndarray:
    """Even-odd rule, vectorised over pixel centres."""
    inside = np.zeros(x.shape, dtype=bool)
    for (x0, y0), (x1, y1) in zip(vertices, vertices[1:] + vertices[:1]):
        crosses = (y0 > y) != (y1 > y)
        if y1 != y0:
            inside ^= crosses & (x < x0 + (y - y0) * (x1 - x0) / (y1 - y0))
    return inside


def _shape_mask(shape: str, cx: float, cy: float, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    r = _RADIUS
    if shape == "circle":
        return (x - cx) ** 2 + (y - cy) ** 2 <= r * r
    if shape == "square":
        return (np.abs(x - cx) <= 0.8 * r) & (np.abs(y - cy) <= 0.8 * r)
    unit = _TRIANGLE if shape == "triangle" else _STAR
    return _inside_polygon(x, y, [(cx + r * ux, cy + r * uy) for ux, uy in unit])


def render(scene_: Scene) -> np.ndarray:
    """(SIZE, SIZE) uint8 palette indices: 0 background, then COLOURS in order."""
    y, x = np.mgrid[0:SIZE, 0:SIZE] + 0.5
    pixels = np.zeros((SIZE, SIZE), dtype=np.uint8)
    cell = SIZE / 3
    for obj in scene_:
        mask = _shape_mask(obj.shape, (obj.col + 0.5) * cell, (obj.row + 0.5) * cell, x, y)
        pixels[mask] = _PALETTE_INDEX[obj.colour]
    return pixels


@functools.cache
def object_mask(shape: str, row: int, col: int) -> np.ndarray:
    """(SIZE, SIZE) booleans, read-only: the pixels `render` fills for one object (36 of them,
    computed once: boxes, masked views and composed training images all read these)."""
    y, x = np.mgrid[0:SIZE, 0:SIZE] + 0.5
    cell = SIZE / 3
    mask = _shape_mask(shape, (col + 0.5) * cell, (row + 0.5) * cell, x, y)
    mask.flags.writeable = False
    return mask


RGB_PALETTE = np.array(_PALETTE, dtype=np.uint8)  # palette index -> the PNG's RGB


@functools.cache
def object_box(shape: str, row: int, col: int) -> tuple[int, int, int, int]:
    """The tight box of a drawn shape in pixels, [x0, y0, x1, y1) as `render` fills it."""
    ys, xs = np.nonzero(object_mask(shape, row, col))
    return int(xs.min()), int(ys.min()), int(xs.max()) + 1, int(ys.max()) + 1


def png_bytes(indices: np.ndarray) -> bytes:
    """An 8-bit palette PNG with stored (uncompressed) deflate blocks: same bytes everywhere."""
    height, width = indices.shape
    raw = np.hstack([np.zeros((height, 1), np.uint8), indices.astype(np.uint8)]).tobytes()  # filter 0 per row
    blocks = [raw[i:i + 0xFFFF] for i in range(0, len(raw), 0xFFFF)]
    stream = b"\x78\x01" + b"".join(
        bytes([i == len(blocks) - 1]) + struct.pack("<HH", len(b), len(b) ^ 0xFFFF) + b for i, b in enumerate(blocks)
    ) + struct.pack(">I", zlib.adler32(raw))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 3, 0, 0, 0)  # 8-bit, palette, no interlace
    palette = bytes(channel for rgb in _PALETTE for channel in rgb)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"PLTE", palette) + chunk(b"IDAT", stream) + chunk(b"IEND", b"")


# ------------------------------------------------------------------------ the sampler

# The fact types an evaluation reports: what each atomic fact asks about.
FACT_TYPES = {"present": "existence", "colour": "attribute", "count": "count", "spatial": "spatial", "absent": "negation"}
REQUEST_KINDS = ("image", "caption", "holistic")
# Seed spaces: a draw's generator is seeded with (split tag, seed), so the splits never share a
# stream; `WorldSampler` also refuses every fixed benchmark scene and caption text outright.
SPLITS = {"train": 1, "heldout": 2, "bench": 3}
# The splits also differ in content: a hash of a scene's objects, and of a caption's words as a
# multiset, puts each in one of CONTENT_SLOTS slots. The drawn benchmark ("bench") draws only from
# slot 0, held-out measurement ("heldout") only from slot 1, training from the rest: a model
# trained on draws never saw a held-out or benchmark scene or caption, however many it drew.
CONTENT_SLOTS = 8
SLOT_OF_SPLIT = {"bench": 0, "heldout": 1}


def content_slot(text: str) -> int:
    digest = hashlib.blake2b(text.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % CONTENT_SLOTS


def scene_slot(scene_: Scene) -> int:
    """A scene's content slot (order-free: a scene is a set of objects)."""
    return content_slot(";".join(sorted(f"{o.colour} {o.shape} {o.row} {o.col}" for o in scene_)))


def caption_slot(text: str) -> int:
    """A caption text's content slot, by its words as a multiset: the two captions of a
    swapped-word pair share one."""
    return content_slot("caption:" + " ".join(sorted(text.split())))


_SPLIT_OF_SLOT = {slot: split for split, slot in SLOT_OF_SPLIT.items()}


def split_of_slot(slot: int) -> str:
    return _SPLIT_OF_SLOT.get(slot, "train")


def reserved_scene(scene_: Scene) -> bool:
    """Whether a scene lies in the drawn benchmark's space."""
    return scene_slot(scene_) == SLOT_OF_SPLIT["bench"]


def reserved_caption(text: str) -> bool:
    """Whether a caption text lies in the drawn benchmark's space."""
    return caption_slot(text) == SLOT_OF_SPLIT["bench"]


@dataclass(frozen=True)
class WorldRequest:
    """One yes/no request of a kind the pipeline sends, with its truth in the demo world.

    kind: image (question on the scene), caption (question on the caption text alone: what does
    the caption imply?) or holistic (does the scene show the caption?). fact_type: the asked
    fact's type (FACT_TYPES values; "holistic" for holistic requests). form: the question set
    whose wording was used (depict or dsg; "" for holistic).
    """

    kind: str
    scene: Scene | None
    caption: str | None
    question: str | None
    answer: bool | None  # None: a caption-only question the caption leaves open (`open_request`)
    fact_type: str
    form: str = ""
    facts: tuple[Fact, ...] = ()  # the asked fact (image, caption), or the caption's facts (holistic)
    # claim requests only: the masked view asked on (operators.demo_views.SceneView), whose
    # things `scene` then lists; None: the scene itself
    view: object = None


Items = tuple[Sequence[CorrelationPrompt], Sequence[WinogroundExample], Sequence[McqRow]]
FIXED_ITEMS: Items = (CORRELATION, WINOGROUND, MCQ)


def item_scenes(items: Items) -> list[Scene]:
    """Every scene of a benchmark's (correlation, winoground, mcq) items."""
    correlation, winoground, mcq = items
    return [s for p in correlation for s in p.scenes] + [s for e in winoground for s in e.scenes] + [r.scene for r in mcq]


def item_captions(items: Items) -> list[Caption]:
    """Every caption of a benchmark's (correlation, winoground, mcq) items."""
    correlation, winoground, mcq = items
    return [p.caption for p in correlation] + [c for e in winoground for c in e.captions] + [
        c for r in mcq for c in (r.correct, *r.distractors)]


def benchmark_scenes() -> frozenset[frozenset[SceneObject]]:
    """Every scene of the demo benchmark's fixed items, as sets of objects (order-free)."""
    return frozenset(frozenset(s) for s in item_scenes(FIXED_ITEMS))


def benchmark_captions() -> frozenset[str]:
    """Every caption text of the demo benchmark's fixed items."""
    return frozenset(c.text for c in item_captions(FIXED_ITEMS))


def image_truth(fact: Fact, form: str, scene_: Scene) -> bool:
    """The answer to a fact's question asked on a scene: a depict question about an absent
    thing ("Is there a circle?") asks whether it is there; every other form asks the fact."""
    if form == "depict" and fact.kind == "absent":
        return not fact.holds(scene_)
    return fact.holds(scene_)


def question_type(fact: Fact, form: str) -> str:
    """What a question asked on an image is about, from its wording: a depict question about a
    negated thing ("Is there a circle?") asks for existence (or a colour), as any other would;
    only the DSG form ("Is there no circle?") asks a negation."""
    if form == "depict" and fact.kind == "absent":
        return FACT_TYPES["colour" if fact.colour else "present"]
    return FACT_TYPES[fact.kind]


def caption_truth(fact: Fact) -> bool:
    """The answer a caption implies to its fact's depict question: No for a negated thing."""
    return fact.kind != "absent"


def fact_question(fact: Fact, form: str) -> str:
    return fact.depict_question() if form == "depict" else fact.dsg_question()


def _positive_nouns(clause: Clause) -> list[tuple[str, str | None]]:
    if isinstance(clause, Thing):
        return [(clause.shape, clause.colour)]
    if isinstance(clause, Relation):
        return [(clause.subject.shape, clause.subject.colour), (clause.object.shape, clause.object.colour)]
    return []


def consistent(clauses: tuple[Clause, ...]) -> bool:
    """No repeated clause, and no negation that denies a thing another clause states."""
    if len(set(clauses)) != len(clauses):
        return False
    stated = [noun for c in clauses for noun in _positive_nouns(c)]
    for c in clauses:
        if isinstance(c, No) and any(shape == c.shape and c.colour in (None, colour) for shape, colour in stated):
            return False
    counted = [(c.shape, c.colour) for c in clauses if isinstance(c, Thing)]
    return len(set(counted)) == len(counted)  # "two circles and a circle" says two things at once


CLAUSE_WEIGHTS = (45, 45, 10)  # how often a drawn caption has 1, 2 and 3 clauses


class WorldSampler:
    """Seeded draws of scenes, captions and yes/no requests from the demo world.

    `split` picks a seed space ("train", "heldout" or "bench"): the same (split, seed) always
    gives the same draws, and no two splits share a generator; a string seed names a stream no
    integer seed shares (the curation corpus, `operators.demo_corpus`, draws "corpus-<n>"). No
    draw is ever a fixed benchmark scene or caption text, and each split draws only scenes and
    captions of its own content slots (`scene_slot`, `caption_slot`; checked on every draw, not
    assumed), so a model trained on draws is measured on held-out draws and on the benchmark's
    items as on unseen content.
    """

    def __init__(self, seed: int | str = 0, split: str = "train"):
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; valid: {sorted(SPLITS)}")
        self.rng = random.Random(f"demo-world/{split}/{seed}")
        self.split = split
        self._scenes = benchmark_scenes()
        self._captions = benchmark_captions()

    def allowed_scene(self, scene_: Scene) -> bool:
        return frozenset(scene_) not in self._scenes and split_of_slot(scene_slot(scene_)) == self.split

    def allowed_caption(self, text: str) -> bool:
        return text not in self._captions and split_of_slot(caption_slot(text)) == self.split

    # ------------------------------------------------------------------ scenes

    def scene(self) -> Scene:
        """1-6 shapes in distinct cells; often repeated shapes and colours (counts, attribute swaps)."""
        rng = self.rng
        while True:
            n = rng.choices((1, 2, 3, 4, 5, 6), weights=(12, 26, 26, 18, 12, 6))[0]
            objects: list[SceneObject] = []
            for cell in rng.sample(range(9), n):
                if objects and rng.random() < 0.45:  # a relative of a shape already there
                    base = rng.choice(objects)
                    shape = base.shape if rng.random() < 0.7 else rng.choice(SHAPES)
                    colour = base.colour if rng.random() < 0.55 else rng.choice(tuple(COLOURS))
                else:
                    shape, colour = rng.choice(SHAPES), rng.choice(tuple(COLOURS))
                objects.append(SceneObject(shape, colour, cell // 3, cell % 3))
            drawn = tuple(objects)
            if self.allowed_scene(drawn):
                return drawn

    # ------------------------------------------------------------------ facts

    def _noun(self, scene_: Scene, present: bool) -> tuple[str, str | None]:
        """A (shape, colour or None) that names something in the scene, or that does not."""
        rng = self.rng
        for _ in range(50):
            if scene_ and (present or rng.random() < 0.6):
                obj = rng.choice(scene_)
                shape, colour = obj.shape, obj.colour if rng.random() < 0.6 else None
                if not present:  # a near miss: another colour or another shape
                    if rng.random() < 0.6:
                        colour = rng.choice([c for c in COLOURS if c != obj.colour])
                    else:
                        shape = rng.choice([s for s in SHAPES if s != obj.shape])
            else:
                shape, colour = rng.choice(SHAPES), rng.choice((*COLOURS, None))
            if bool(_matching(scene_, shape, colour)) == present:
                return shape, colour
        return shape, colour

    def fact(self, scene_: Scene, fact_type: str, holds: bool) -> Fact | None:
        """A fact of one type about the scene that holds (or not), None when there is none."""
        rng = self.rng
        if fact_type == "existence":
            shape, _ = self._noun(scene_, holds)
            fact = Fact("present", shape)
        elif fact_type == "attribute":
            shape, colour = self._noun(scene_, holds)
            if colour is None:
                colour = rng.choice(tuple(COLOURS))
            fact = Fact("colour", shape, colour, plural=rng.random() < 0.2)
        elif fact_type == "negation":
            shape, colour = self._noun(scene_, not holds)
            fact = Fact("absent", shape, colour)
        elif fact_type == "count":
            fact = self._count_fact(scene_, holds)
        elif fact_type == "spatial":
            fact = self._spatial_fact(scene_, holds)
        else:
            raise ValueError(f"unknown fact type {fact_type!r}")
        return fact if fact is not None and fact.holds(scene_) == holds else None

    def _count_fact(self, scene_: Scene, holds: bool) -> Fact | None:
        rng = self.rng
        groups = {}
        for obj in scene_:
            for key in ((obj.shape, None), (obj.shape, obj.colour)):
                groups[key] = groups.get(key, 0) + 1
        keys = sorted(groups, key=lambda k: (k[0], k[1] or ""))
        if holds:
            keys = [k for k in keys if groups[k] in NUMBER_WORDS]
            if not keys:
                return None
            shape, colour = rng.choice(keys)
            return Fact("count", shape, colour, count=groups[shape, colour])
        if keys and rng.random() < 0.75:  # off by one or two: the hard case
            shape, colour = rng.choice(keys)
            wrong = [n for n in NUMBER_WORDS if n != groups[shape, colour]]
        else:
            shape, colour = rng.choice(SHAPES), rng.choice((*COLOURS, None))
            wrong = [n for n in NUMBER_WORDS if n != groups.get((shape, colour), 0)]
        return Fact("count", shape, colour, count=rng.choice(wrong))

    def _spatial_fact(self, scene_: Scene, holds: bool) -> Fact | None:
        rng = self.rng
        if len(scene_) < 2:
            return None
        subject, other = rng.sample(scene_, 2)
        s_colour = subject.colour if rng.random() < 0.6 else None
        o_colour = other.colour if rng.random() < 0.6 else None
        if (subject.shape, s_colour) == (other.shape, o_colour):
            s_colour, o_colour = subject.colour, other.colour
            if s_colour == o_colour:
                return None
        holding = [r for r, test in RELATIONS.items() if test(subject, other)]
        if holds:
            relation = rng.choice(holding) if holding else None
        elif holding and rng.random() < 0.7:  # the mirrored relation: the hard case
            mirror = {"above": "below", "below": "above", "left of": "right of", "right of": "left of"}
            relation = mirror[rng.choice(holding)]
        else:
            relation = rng.choice(tuple(RELATIONS))
        if relation is None:
            return None
        if not holds and s_colour and o_colour and rng.random() < 0.3:  # swapped colours (Winoground)
            s_colour, o_colour = o_colour, s_colour
        return Fact("spatial", subject.shape, s_colour, relation=relation, other=(other.shape, o_colour))

    # ------------------------------------------------------------------ captions

    def _clause(self, scene_: Scene, true: bool) -> Clause | None:
        rng = self.rng
        pick = rng.random()
        if pick < 0.45:  # a thing, maybe counted
            fact_type = rng.choice(("existence", "attribute", "count"))
            fact = self.fact(scene_, fact_type, true)
            if fact is None:
                return None
            return Thing(fact.shape, fact.colour, fact.count or 1)
        if pick < 0.72:
            fact = self.fact(scene_, "spatial", true)
            if fact is None:
                return None
            return Relation(Thing(fact.shape, fact.colour), fact.relation, Thing(*fact.other))
        fact = self.fact(scene_, "negation", true)
        return None if fact is None else No(fact.shape, fact.colour)

    def caption(self, scene_: Scene, p_true: float = 0.6, max_clauses: int = 3,
                clause_weights: Sequence[float] = CLAUSE_WEIGHTS) -> Caption:
        """A caption of 1-3 clauses (how often each count: `clause_weights`), each true of the
        scene with probability `p_true`."""
        rng = self.rng
        while True:
            n = rng.choices(range(1, max_clauses + 1), weights=tuple(clause_weights)[:max_clauses])[0]
            clauses = tuple(c for c in (self._clause(scene_, rng.random() < p_true) for _ in range(n)) if c is not None)
            if clauses and consistent(clauses):
                cap = Caption(clauses)
                if self.allowed_caption(cap.text):
                    return cap

    def swapped_pair(self, scene_: Scene) -> tuple[Caption, Caption] | None:
        """A Winoground-style pair: a true relation caption and the same words swapped."""
        fact = self.fact(scene_, "spatial", True)
        if fact is None:
            return None
        subject, other = Thing(fact.shape, fact.colour), Thing(*fact.other)
        first = Caption((Relation(subject, fact.relation, other),))
        if self.rng.random() < 0.5 and subject.colour and other.colour:  # swap the colours
            second = Caption((Relation(Thing(subject.shape, other.colour), fact.relation, Thing(other.shape, subject.colour)),))
        else:  # swap the things
            second = Caption((Relation(other, fact.relation, subject),))
        if first == second or not (self.allowed_caption(first.text) and self.allowed_caption(second.text)):
            return None
        return first, second

    # ------------------------------------------------------------------ requests

    def open_request(self) -> WorldRequest:
        """A caption-only request the caption leaves open (`Caption.open_facts`): its answer is
        None, and a model should put its answer near 0.5."""
        kind = self.rng.choice(("colour", "count", "spatial"))  # each kind of open question as often
        while True:
            cap = self.caption(self.scene())
            candidates = [f for f in cap.open_facts() if f.kind == kind]
            if candidates:
                fact = self.rng.choice(candidates)
                return WorldRequest("caption", None, cap.text, fact.depict_question(), None, FACT_TYPES[fact.kind], "depict", (fact,))

    def request(self, kind: str, fact_type: str | None = None, answer: bool | None = None,
                template: str | None = None, negbench_form: bool = False) -> WorldRequest:
        """One request of `kind`; the fact type and the answer are drawn evenly unless given.

        `template` (caption requests only) asks for a caption of one NegBench template
        ("hybrid": things stated beside things denied, where a model reading "no" anywhere in the
        caption as the answer goes wrong). `negbench_form` draws that caption in the short form
        the multiple-choice part writes (one or two clauses of things and denials, "a star and
        no circle") instead of the correlation part's longer mix with relations."""
        if template is not None and (kind != "caption" or template not in CAPTION_TEMPLATES):
            raise ValueError(f"template {template!r} is for caption requests, one of {', '.join(CAPTION_TEMPLATES)}")
        if negbench_form and (kind != "caption" or template is None):
            raise ValueError("negbench_form is for caption requests of a named template")
        if negbench_form and fact_type == "spatial":
            raise ValueError("no caption of the NegBench form implies an answer to a spatial question (it states no relations)")
        rng = self.rng
        if kind == "caption":  # a caption implies Yes about what it states and No about what it denies
            possible = {"affirmative": {True}, "negation": {False}}.get(template, {True, False})
            if fact_type is not None:
                possible &= {fact_type != "negation"}
            if answer is None and possible:
                answer = rng.random() < 0.5 if len(possible) == 2 else possible.pop()
            elif answer not in possible:
                which = f"{template} caption" if template else "caption"
                raise ValueError(f"no {which} implies {'Yes' if answer else 'No'} to a {fact_type or 'any'} question")
        if answer is None:
            answer = rng.random() < 0.5
        if kind == "image":
            fact_type = fact_type or rng.choice(tuple(FACT_TYPES.values()))
            while True:
                scene_ = self.scene()
                form = rng.choice(("depict", "dsg"))
                # a depict question about an absent thing asks whether it is there
                holds = (not answer) if (form == "depict" and fact_type == "negation") else answer
                fact = self.fact(scene_, fact_type, holds)
                if fact is not None:
                    return WorldRequest("image", scene_, None, fact_question(fact, form), image_truth(fact, form, scene_), fact_type, form, (fact,))
        if kind == "caption":
            while True:
                scene_ = self.scene()
                cap = _mcq_caption(self, scene_, template, rng.random() < 0.5) if negbench_form else self.caption(scene_)
                if cap is None or (template is not None and cap.template != template):
                    continue
                facts = [f for f in cap.facts if caption_truth(f) == answer and (fact_type is None or FACT_TYPES[f.kind] == fact_type)]
                if facts:
                    fact = rng.choice(facts)
                    return WorldRequest("caption", None, cap.text, fact.depict_question(), caption_truth(fact), FACT_TYPES[fact.kind], "depict", (fact,))
        if kind == "holistic":
            while True:
                scene_ = self.scene()
                if rng.random() < 0.15:
                    pair = self.swapped_pair(scene_)
                    if pair is None:
                        continue
                    cap = pair[0] if answer else pair[1]
                else:
                    cap = self.caption(scene_, p_true=0.97 if answer else 0.7)
                holds = all(f.holds(scene_) for f in cap.facts)
                if holds == answer:
                    return WorldRequest("holistic", scene_, cap.text, None, holds, "holistic", facts=tuple(cap.facts))
        raise ValueError(f"unknown request kind {kind!r}; valid: {REQUEST_KINDS}")


# ------------------------------------------------------------------ the drawn benchmark items

# How many items the large demo draws beyond the fixed ones: correlation captions (3 images
# each), Winoground-style examples (2 x 2) and multiple-choice rows (1 image, 4 captions).
DRAWN_SIZES = {"correlation": 56, "winoground": 18, "mcq": 24}


def _free_cell(rng: random.Random, scene_: Scene) -> tuple[int, int] | None:
    taken = {(o.row, o.col) for o in scene_}
    free = [c for c in range(9) if divmod(c, 3) not in taken]
    return None if not free else divmod(rng.choice(free), 3)


def _edit(rng: random.Random, scene_: Scene) -> Scene:
    """One small change to a scene: recolour, reshape, move, remove, add, or swap two cells."""
    objects = list(scene_)
    i = rng.randrange(len(objects))
    obj = objects[i]
    kind = rng.choice(("colour", "shape", "move", "remove", "add", "swap"))
    if kind == "colour":
        objects[i] = SceneObject(obj.shape, rng.choice([c for c in COLOURS if c != obj.colour]), obj.row, obj.col)
    elif kind == "shape":
        objects[i] = SceneObject(rng.choice([s for s in SHAPES if s != obj.shape]), obj.colour, obj.row, obj.col)
    elif kind in ("move", "add") and (cell := _free_cell(rng, scene_)) is not None:
        if kind == "move":
            objects[i] = SceneObject(obj.shape, obj.colour, *cell)
        else:
            objects.append(SceneObject(rng.choice(SHAPES), rng.choice(tuple(COLOURS)), *cell))
    elif kind == "remove" and len(objects) > 1:
        del objects[i]
    elif kind == "swap" and len(objects) > 1:
        j = rng.choice([k for k in range(len(objects)) if k != i])
        a, b = objects[i], objects[j]
        objects[i], objects[j] = SceneObject(a.shape, a.colour, b.row, b.col), SceneObject(b.shape, b.colour, a.row, a.col)
    return tuple(objects)


def _true_of(cap: Caption, scene_: Scene) -> bool:
    return all(f.holds(scene_) for f in cap.facts)


def _draw_correlation(sampler: WorldSampler, n: int, taken: set[str]) -> list[CorrelationPrompt]:
    """Captions true of a drawn scene, each with two edited scenes that break some of its facts
    (one to three edits: graded ratings, sometimes no fact left)."""
    rng, out = sampler.rng, []
    while len(out) < n:
        match = sampler.scene()
        cap = sampler.caption(match, p_true=1.0)
        if cap.text in taken or len(cap.facts) < 2 or not _true_of(cap, match):
            continue
        others: dict[frozenset, Scene] = {}
        for _ in range(400):
            edited = match
            for _ in range(rng.choice((1, 1, 2, 3))):
                edited = _edit(rng, edited)
            key = frozenset(edited)
            if key != frozenset(match) and key not in others and cap.share_true(edited) < 1 and sampler.allowed_scene(edited):
                others[key] = edited
        shares = {}
        for edited in others.values():  # two different ratings where the edits allow
            shares.setdefault(cap.share_true(edited), edited)
        picked = list(shares.values())[:2] if len(shares) >= 2 else list(others.values())[:2]
        if len(picked) == 2:
            taken.add(cap.text)
            out.append(CorrelationPrompt(cap, (match, *picked)))
    return out


def _swaps(scene_: Scene) -> list[Scene]:
    """Every scene made by swapping two objects' cells, or their colours."""
    out = []
    for i in range(len(scene_)):
        for j in range(i + 1, len(scene_)):
            a, b = scene_[i], scene_[j]
            for x, y in ((SceneObject(a.shape, a.colour, b.row, b.col), SceneObject(b.shape, b.colour, a.row, a.col)),
                         (SceneObject(a.shape, b.colour, a.row, a.col), SceneObject(b.shape, a.colour, b.row, b.col))):
                swapped = list(scene_)
                swapped[i], swapped[j] = x, y
                out.append(tuple(swapped))
    return out


def _draw_winoground(sampler: WorldSampler, n: int, taken: set[str]) -> list[WinogroundExample]:
    """Swapped-word caption pairs, each with the scene it describes and a swap of that scene that
    the other caption describes (and the first does not)."""
    rng, out = sampler.rng, []
    while len(out) < n:
        first_scene = sampler.scene()
        pair = sampler.swapped_pair(first_scene)
        if pair is None or {pair[0].text, pair[1].text} & taken:
            continue
        first, second = pair
        if not _true_of(first, first_scene) or _true_of(second, first_scene):
            continue
        fits = [s for s in _swaps(first_scene) if _true_of(second, s) and not _true_of(first, s) and sampler.allowed_scene(s)]
        if fits:
            taken |= {first.text, second.text}
            out.append(WinogroundExample((first, second), (first_scene, rng.choice(fits))))
    return out


def _mcq_caption(sampler: WorldSampler, scene_: Scene, template: str, true: bool) -> Caption | None:
    """A NegBench-style caption of one template (affirmative / negation / hybrid), true of the
    scene or not: the false ones deny what is there or state what is not."""
    rng = sampler.rng

    def thing(holds: bool) -> Clause | None:
        fact = sampler.fact(scene_, rng.choice(("existence", "attribute", "count")), holds)
        return None if fact is None else Thing(fact.shape, fact.colour, fact.count or 1)

    def no(holds: bool) -> Clause | None:
        fact = sampler.fact(scene_, "negation", holds)
        return None if fact is None else No(fact.shape, fact.colour)

    for _ in range(50):
        lie = rng.random() < 0.5  # which clause of a false two-clause caption lies
        if template == "affirmative":
            clauses = [thing(true)] if rng.random() < 0.5 else [thing(true or lie), thing(true or not lie)]
        elif template == "negation":
            clauses = [no(true)] if rng.random() < 0.5 else [no(true or lie), no(true or not lie)]
        else:
            clauses = [thing(true or lie), no(true or not lie)]
        if any(c is None for c in clauses) or not consistent(tuple(clauses)):
            continue
        cap = Caption(tuple(clauses))
        if cap.template == template and _true_of(cap, scene_) == true and sampler.allowed_caption(cap.text):
            return cap
    return None


def _draw_mcq(sampler: WorldSampler, n: int) -> list[McqRow]:
    """One scene, a true caption (the templates in turn) and a false one of each template."""
    out: list[McqRow] = []
    while len(out) < n:
        scene_ = sampler.scene()
        correct = _mcq_caption(sampler, scene_, CAPTION_TEMPLATES[len(out) % 3], True)
        wrong = [_mcq_caption(sampler, scene_, t, False) for t in CAPTION_TEMPLATES]
        options = [correct, *wrong]
        if all(options) and len({c.text for c in options}) == 4:
            out.append(McqRow(scene_, correct, tuple(wrong)))
    return out


@functools.cache
def drawn_items(seed: int = 0) -> Items:
    """The large demo's drawn items, from the reserved "bench" split: never a training draw,
    never a fixed item, the same on every machine for a given seed."""
    sampler = WorldSampler(seed, "bench")
    taken: set[str] = set()
    correlation = _draw_correlation(sampler, DRAWN_SIZES["correlation"], taken)
    winoground = _draw_winoground(sampler, DRAWN_SIZES["winoground"], taken)
    return tuple(correlation), tuple(winoground), tuple(_draw_mcq(sampler, DRAWN_SIZES["mcq"]))
