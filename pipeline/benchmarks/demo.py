"""The built-in demo benchmark: synthetic shape scenes whose captions have a known truth.

Why it exists: the README's first command runs the whole sweep on a laptop with a tiny
model and no download. Each scene is a few flat shapes (circle, square, triangle, star) in
four colours on a 3x3 grid, on a plain background, 256x256 pixels. Each caption is built
from clauses (things, spatial relations, negations) that expand into atomic facts, and each
fact can be checked against the scene's ground truth. The facts give:

- the benchmark's own questions in the three question sets (`depict`, `dsg`, `claims`);
- the correlation part's `human` column, which is SYNTHETIC, not a human judgement: the mean
  rating (1..5) of simulated raters who each misjudge a fact with a fixed probability
  (`Caption.rater_ratings`; docs/method.md, "Meta-evaluation"). The manifest lists every fact
  with whether it holds, and each rater's rating, so each rating can be audited.

Three parts, one loader (`load(root, part=...)`):
- correlation: 8 captions x 3 images (one exact match, two with 1-3 false facts);
- winoground: 6 examples, 2 images x 2 captions that swap words;
- mcq: 8 NegBench-style rows, one image and 4 captions (affirmative / negation / hybrid).

The large demo (`drawn=True`; conf/benchmarks/demo_large*.yaml, opt-in) adds items drawn from
the world's reserved space, which today's training recipe never draws from:
56 captions x 3 images, 18 Winoground-style examples and 24 multiple-choice rows
(`operators.demo_world.drawn_items`; ids g001-0, gw01-i0-c0, gm01-o0).

The world itself (scenes, clauses, facts, the rasteriser and the fixed items) lives in
`operators.demo_world`, beside a seeded sampler of fresh draws that never repeats these items;
this module writes the benchmark's files and loads them. Nothing here is random: the items are
the whole specification, and the images are byte-identical on every machine (see
`operators.demo_world`). Images are content-addressed (`images/<hh>/<hash>.png`);
`manifest.json` is written last and doubles as the completion marker.
"""
from __future__ import annotations

import functools
import json
from typing import Any

import pyarrow as pa

from operators.demo_world import (  # noqa: F401  (re-exported: the demo's callers read the world's names here)
    BACKGROUND,
    COLOURS,
    COLS,
    CORRELATION,
    FIXED_ITEMS,
    MCQ,
    NUMBER_WORDS,
    RATERS,
    RELATIONS,
    ROWS,
    SHAPES,
    SIZE,
    WINOGROUND,
    Caption,
    Clause,
    CorrelationPrompt,
    Fact,
    McqRow,
    No,
    Relation,
    Scene,
    SceneObject,
    Thing,
    WinogroundExample,
    caption,
    drawn_items,
    png_bytes,
    render,
    scene,
)
from operators.hashing import image_hash
from operators.schema import QUESTIONS
from pipeline.benchmarks.common import LoadResult
from pipeline.benchmarks.io import BadOption, ProblemLog, items_table, rating, require_image, text_value
from pipeline.store.folder import BadRecord, Folder

LOADER = "demo"  # the name benchmark configs give as `loader:`
WRITES_OWN_FILES = True  # load() writes the release under root on first use

MANIFEST = "manifest.json"
# Bump when the manifest layout changes (drawing changes already change every image hash).
MANIFEST_VERSION = 1
BENCHMARK_NAMES = {"correlation": "demo", "winoground": "demo_winoground", "mcq": "demo_mcq"}



# ------------------------------------------------------------------ manifest and files


def _image_path(data: bytes) -> str:
    digest = image_hash(data)
    return f"images/{digest[:2]}/{digest}.png"


def _build(drawn: bool = False, open_share: float = 0.0) -> tuple[dict[str, Any], dict[str, bytes]]:
    """The manifest and the image files (relative path -> bytes) the demo consists of: the fixed
    items, then (`drawn`) the large demo's items drawn from the world's reserved space; each
    caption's questions with `open_share` of them asking what it leaves open."""
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
        if extra.get("human") is not None:
            extra["raters"] = cap.rater_ratings(scene_)
        tags = sorted({f.claim().type for f in cap.facts})
        base = {"local_id": local_id, "image": add_image(scene_), "caption": cap.text, "group_id": group_id,
                "human": None, "image_index": None, "caption_index": None, "correct": None, "template": None}
        return base | extra | {"tags": tags, "facts": facts}

    parts = {"correlation": [], "winoground": [], "mcq": []}
    sets = [("", FIXED_ITEMS)]
    if drawn:
        sets.append(("g", drawn_items()))  # drawn items' ids start with g: g001-0, gw01-i0-c1, gm01-o2
    for prefix, (correlation, winoground, mcq) in sets:
        width = 3 if prefix else 2
        parts["correlation"] += [
            row(f"{prefix or 'c'}{p:0{width}d}-{v}", s, prompt.caption, prompt.caption.text, human=prompt.caption.rating(s))
            for p, prompt in enumerate(correlation, start=1)
            for v, s in enumerate(prompt.scenes)
        ]
        parts["winoground"] += [
            row(f"{prefix}w{e:02d}-i{i}-c{c}", ex.scenes[i], ex.captions[c], f"{prefix}w{e:02d}", image_index=i,
                caption_index=c, correct=i == c)
            for e, ex in enumerate(winoground, start=1)
            for i in (0, 1)
            for c in (0, 1)
        ]
        for r, mrow in enumerate(mcq, start=1):
            options = list(mrow.distractors)
            answer = (r - 1) % 4  # rotate the correct option's position through 0..3
            options.insert(answer, mrow.correct)
            parts["mcq"] += [
                row(f"{prefix}m{r:02d}-o{k}", mrow.scene, option, f"{prefix}m{r:02d}", caption_index=k, correct=k == answer,
                    template=mrow.correct.template)
                for k, option in enumerate(options)
            ]
    questions = [q for cap in captions.values() for q in cap.question_rows(open_share)]
    manifest = {
        "about": "Synthetic demo benchmark: flat shapes on a 3x3 grid. 'human' is SYNTHETIC: the mean of "
                 f"{RATERS} simulated raters ('raters'), each misjudging a fact of each kind with a fixed "
                 "probability and rating 1 + 4 * the share of facts they judged true, rounded (see each row's 'facts').",
        "open_share": open_share,
        "version": MANIFEST_VERSION,
        "images": {path: truth[path] for path in sorted(truth)},
        "parts": parts,
        "questions": questions,
    }
    return manifest, images


@functools.cache
def _demo_files(drawn: bool = False, open_share: float = 0.0) -> tuple[bytes, dict[str, bytes]]:
    """The manifest's bytes and the images; computed once per process (rendering is the cost)."""
    manifest, images = _build(drawn, open_share)
    return (json.dumps(manifest, indent=1, sort_keys=True, ensure_ascii=True) + "\n").encode("ascii"), images


def write_demo(root: str, drawn: bool = False, open_share: float = 0.0) -> None:
    """Write the demo's images and manifest under `root` (a folder or fsspec URL); `drawn` adds
    the large demo's drawn items (a root holds one of the two: the other's manifest is replaced).

    Idempotent and safe to run concurrently: a manifest with exactly the expected bytes
    means the demo is complete (it is written after every image), so nothing is redone;
    images are content-addressed, so an existing file always holds the right bytes.
    """
    folder = Folder(root)
    expected, images = _demo_files(drawn, open_share)
    manifest_path = folder.join(MANIFEST)
    if folder.fs.isfile(manifest_path) and folder.fs.cat_file(manifest_path) == expected:
        return
    for path, data in images.items():
        folder.write_once(folder.join(path), data)
    folder.write(manifest_path, expected)  # replaces an old or partial manifest atomically


# -------------------------------------------------------------------------- loader


def load(root: str, part: str = "correlation", drawn: bool = False, open_share: float = 0.0) -> LoadResult:
    """Items and shipped questions of one demo part, writing the demo first if needed; `drawn`
    loads the large demo (the fixed items, then those drawn from the world's reserved space);
    `open_share` of each caption's questions ask what the caption leaves open."""
    if part not in BENCHMARK_NAMES:
        raise BadOption(f"demo: unknown part {part!r}; valid: {sorted(BENCHMARK_NAMES)}")
    if not isinstance(drawn, bool):  # options.drawn=nope would otherwise be truthy: the large demo, silently
        raise BadOption(f"demo: drawn must be true or false, got {drawn!r}")
    if isinstance(open_share, bool) or not isinstance(open_share, (int, float)) or not 0.0 <= open_share <= 0.5:
        raise BadOption(f"demo: open_share must be a number from 0 to 0.5, got {open_share!r}")
    write_demo(root, drawn, float(open_share))
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
