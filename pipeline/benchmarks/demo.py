"""The built-in demo benchmark: synthetic shape scenes whose captions have a known truth.

Why it exists: the README's first command runs the whole sweep on a laptop with a tiny
model and no download. Each scene is a few flat shapes (circle, square, triangle, star) in
four colours on a 3x3 grid, on a plain background, 256x256 pixels. Each caption is built
from clauses (things, spatial relations, negations) that expand into atomic facts, and each
fact can be checked against the scene's ground truth. The facts give:

- the benchmark's own questions in the three question sets (`depict`, `dsg`, `claims`);
- the correlation part's `human` column, which is SYNTHETIC, not a human judgement:
  human = 1 + 4 * (share of the caption's facts that hold in the image), on a 1..5 scale.
  The manifest lists every fact with whether it holds, so each rating can be audited.

Three parts, one loader (`load(root, part=...)`):
- correlation: 8 captions x 3 images (one exact match, two with 1-3 false facts);
- winoground: 6 examples, 2 images x 2 captions that swap words;
- mcq: 8 NegBench-style rows, one image and 4 captions (affirmative / negation / hybrid).

Determinism: nothing is random (the data below is the whole specification). Shapes are
rasterised with exact numpy tests at pixel centres (Pillow's drawing code changes between
versions), and PNGs are written with uncompressed (stored) deflate blocks: compressed
bytes depend on the zlib build (Pillow wheels ship zlib-ng, CPython links system zlib).
So the bytes, and the image hashes that key the answer cache, are the same on every
machine. Images are content-addressed (`images/<hh>/<hash>.png`); `manifest.json` is
written last and doubles as the completion marker.
"""
from __future__ import annotations

import functools
import json
import math
import struct
import zlib
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from operators.hashing import image_hash
from operators.parsing import Claim, DsgQuestion, questions_rows
from operators.schema import QUESTIONS
from pipeline.benchmarks.common import LoadResult
from pipeline.benchmarks.io import ProblemLog, items_table, rating, require_image, text_value
from pipeline.store.folder import BadRecord, Folder

MANIFEST = "manifest.json"
# Bump when the manifest layout changes (drawing changes already change every image hash).
MANIFEST_VERSION = 1
BENCHMARK_NAMES = {"correlation": "demo", "winoground": "demo_winoground", "mcq": "demo_mcq"}

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
    def facts(self) -> list[Fact]:
        """Atomic facts in caption order, each once (a thing's existence before its details)."""
        return list(dict.fromkeys(f for clause in self.clauses for f in clause.facts()))

    def share_true(self, scene_: Scene) -> float:
        facts = self.facts
        return sum(f.holds(scene_) for f in facts) / len(facts)

    def synthetic_rating(self, scene_: Scene) -> float:
        """The demo's stand-in for a human rating: 1 + 4 * share of true facts (1..5)."""
        return 1.0 + 4.0 * self.share_true(scene_)

    def question_rows(self) -> list[dict]:
        """The caption's questions in all three sets, as QUESTIONS rows (source: benchmark)."""
        facts = self.facts
        number = {fact: str(i) for i, fact in enumerate(facts, start=1)}
        dsg = [DsgQuestion(number[f], f.dsg_question(), tuple(number[p] for p in f.parents)) for f in facts]
        sets = {"depict": [f.depict_question() for f in facts], "dsg": dsg, "claims": [f.claim() for f in facts]}
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


# ------------------------------------------------------------------ manifest and files


def _image_path(data: bytes) -> str:
    digest = image_hash(data)
    return f"images/{digest[:2]}/{digest}.png"


def _build() -> tuple[dict[str, Any], dict[str, bytes]]:
    """The manifest and the image files (relative path -> bytes) the demo consists of."""
    images: dict[str, bytes] = {}
    truth: dict[str, list[dict]] = {}
    captions: dict[str, Caption] = {}

    def add_image(scene_: Scene) -> str:
        data = png_bytes(render(scene_))
        path = _image_path(data)
        images[path] = data
        truth[path] = [{"shape": o.shape, "colour": o.colour, "row": o.row, "col": o.col} for o in scene_]
        return path

    def row(local_id: str, scene_: Scene, cap: Caption, group_id: str, **extra: Any) -> dict:
        if captions.setdefault(cap.text, cap) != cap:
            raise ValueError(f"caption text {cap.text!r} is built from two different clause lists")
        facts = [[f.claim().text, f.holds(scene_)] for f in cap.facts]
        tags = sorted({f.claim().type for f in cap.facts})
        base = {"local_id": local_id, "image": add_image(scene_), "caption": cap.text, "group_id": group_id,
                "human": None, "image_index": None, "caption_index": None, "correct": None, "template": None}
        return base | extra | {"tags": tags, "facts": facts}

    correlation = [
        row(f"c{p:02d}-{v}", s, prompt.caption, prompt.caption.text, human=prompt.caption.synthetic_rating(s))
        for p, prompt in enumerate(CORRELATION, start=1)
        for v, s in enumerate(prompt.scenes)
    ]
    winoground = [
        row(f"w{e:02d}-i{i}-c{c}", ex.scenes[i], ex.captions[c], f"w{e:02d}", image_index=i, caption_index=c, correct=i == c)
        for e, ex in enumerate(WINOGROUND, start=1)
        for i in (0, 1)
        for c in (0, 1)
    ]
    mcq = []
    for r, mrow in enumerate(MCQ, start=1):
        options = list(mrow.distractors)
        answer = (r - 1) % 4  # rotate the correct option's position through 0..3
        options.insert(answer, mrow.correct)
        mcq += [
            row(f"m{r:02d}-o{k}", mrow.scene, option, f"m{r:02d}", caption_index=k, correct=k == answer,
                template=mrow.correct.template)
            for k, option in enumerate(options)
        ]
    questions = [q for cap in captions.values() for q in cap.question_rows()]
    manifest = {
        "about": "Synthetic demo benchmark: flat shapes on a 3x3 grid. 'human' is SYNTHETIC: "
                 "1 + 4 * share of the caption's facts that hold in the image (see each row's 'facts').",
        "version": MANIFEST_VERSION,
        "images": {path: truth[path] for path in sorted(truth)},
        "parts": {"correlation": correlation, "winoground": winoground, "mcq": mcq},
        "questions": questions,
    }
    return manifest, images


@functools.cache
def _demo_files() -> tuple[bytes, dict[str, bytes]]:
    """The manifest's bytes and the images; computed once per process (rendering is the cost)."""
    manifest, images = _build()
    return (json.dumps(manifest, indent=1, sort_keys=True, ensure_ascii=True) + "\n").encode("ascii"), images


def write_demo(root: str) -> None:
    """Write the demo's images and manifest under `root` (a folder or fsspec URL).

    Idempotent and safe to run concurrently: a manifest with exactly the expected bytes
    means the demo is complete (it is written after every image), so nothing is redone;
    images are content-addressed, so an existing file always holds the right bytes.
    """
    folder = Folder(root)
    expected, images = _demo_files()
    manifest_path = folder.join(MANIFEST)
    if folder.fs.isfile(manifest_path) and folder.fs.cat_file(manifest_path) == expected:
        return
    for path, data in images.items():
        folder.write_once(folder.join(path), data)
    folder.write(manifest_path, expected)  # replaces an old or partial manifest atomically


# -------------------------------------------------------------------------- loader


def load(root: str, part: str = "correlation") -> LoadResult:
    """Items and shipped questions of one demo part, writing the demo first if needed."""
    if part not in BENCHMARK_NAMES:
        raise ValueError(f"demo: unknown part {part!r}; valid: {sorted(BENCHMARK_NAMES)}")
    write_demo(root)
    folder = Folder(root)
    manifest_path = folder.join(MANIFEST)
    manifest = folder.read_json(manifest_path)
    result = LoadResult(items=pa.table({}))
    log = ProblemLog(folder.uri(manifest_path), result.problems)
    rows = []
    for index, record in enumerate(manifest.get("parts", {}).get(part, [])):
        try:
            rows.append(_item(folder, record, part))
        except BadRecord as exc:
            log.bad(f"parts.{part}[{index}]", exc)
    benchmark = BENCHMARK_NAMES[part]
    result.items = items_table(rows, benchmark)
    captions = {r["caption"] for r in rows}
    questions = [q for q in manifest.get("questions", []) if q.get("caption") in captions]
    result.questions = pa.Table.from_pylist(questions, schema=QUESTIONS) if questions else QUESTIONS.empty_table()
    return result


def _item(folder: Folder, record: dict, part: str) -> dict:
    if not isinstance(record, dict):
        raise BadRecord(None, f"expected an object, got {type(record).__name__}")
    item = {
        "item_id": f"{BENCHMARK_NAMES[part]}/{text_value(record.get('local_id'), 'local_id')}",
        "image_uri": require_image(folder, record.get("image"), "image"),
        "caption": text_value(record.get("caption"), "caption"),
        "group_id": text_value(record.get("group_id"), "group_id"),
        "tags": list(record.get("tags") or []),
    }
    if part == "correlation":
        item["human"] = rating(record.get("human"), 1.0, 5.0, "human")
    else:
        for field in ("caption_index", "correct") + (("image_index",) if part == "winoground" else ("template",)):
            if record.get(field) is None:
                raise BadRecord(field, "missing")
            item[field] = record[field]
    return item
