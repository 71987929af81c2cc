"""A curation corpus drawn from the demo world, whose mismatched captions are known.

Why: a curation rule (keep a pair when its score passes a threshold) can only be judged
against pairs whose truth is known. The demo world knows whether every caption holds on every
scene, so a corpus drawn from it, with a chosen share of captions made false in named ways,
lets a curation report how well each metric keeps the matching pairs and drops the others
(`pipeline.curation.truth`).

Each pair is a fresh scene and a caption true of it (`WorldSampler.caption` with every clause
true); a mismatched pair then changes that caption in one named way, and the result must be
false of the scene:

- `swapped_attribute`: the colours of two differently coloured, differently shaped things are
  exchanged ("a red circle above a blue square" -> "a blue circle above a red square");
- `wrong_count`: a thing's number becomes one the scene does not have ("a red circle" ->
  "two red circles", "two stars" -> "three stars");
- `flipped_negation`: a denied thing is stated, or a stated one denied ("no blue star" ->
  "a blue star", "a square" -> "no square");
- `other_caption`: the caption is a true caption of another drawn scene, false of this one.

Scenes and captions come from the world's "bench" content slot (`WorldSampler(..., "bench")`)
on a stream of their own ("corpus-<seed>", which no integer seed of `demo_world.drawn_items`
shares), so no model trained on the training slot saw them. A simple scene ("a red star in the
middle") can still occur in both the corpus and the drawn benchmark: the slot has few of them.
Draws are seeded: the same settings give the same bytes on every machine. The caption forms a
kind can change are not drawn evenly (only captions with two coloured things can have their
colours swapped), which `docs/curation.md` names beside the measured numbers.

Pure: pyarrow and the standard library; `pipeline.curation.demo_corpus` writes the files.
"""
from __future__ import annotations

import io
import math
import random
import tarfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import pyarrow as pa

from operators.demo_world import (
    COLS,
    NUMBER_WORDS,
    ROWS,
    Caption,
    Clause,
    No,
    Relation,
    Scene,
    Thing,
    WorldSampler,
    consistent,
    png_bytes,
    render,
)
from operators.schema import QUESTIONS

MATCH = "match"  # the truth label of a pair whose caption describes its image
MISMATCH_KINDS = ("swapped_attribute", "wrong_count", "flipped_negation", "other_caption")
DEFAULT_KIND_SHARES = {kind: 1.0 / len(MISMATCH_KINDS) for kind in MISMATCH_KINDS}
DEFAULT_PAIRS = 300
DEFAULT_MISMATCH_SHARE = 0.5
DEFAULT_PAIRS_PER_SHARD = 100
# A pair whose edit cannot be made on one draw is drawn again; a kind that fails this many
# times in a row has no draws it can change (a bug, not bad luck: the rarest succeeds ~1 in 10).
MAX_TRIES = 5000

# Columns of the written inputs and of the truth file (kept apart from the inputs).
SHARD_SCHEMA = pa.schema([("image", pa.binary()), ("caption", pa.string()), ("pair_id", pa.string())])
TRUTH_SCHEMA = pa.schema(
    [
        ("shard", pa.string()),  # the input file's name without its extension (pairs-0000)
        ("row", pa.int64()),  # 0-based row (Parquet) or sample (WebDataset) in that file
        ("label", pa.string()),  # "match", or the mismatch kind
        ("pair_id", pa.string()),
        ("caption", pa.string()),  # what the inputs show
        ("true_caption", pa.string()),  # a caption true of the scene (a mismatch was made from it)
        ("scene", pa.string()),  # the scene's objects, "<colour> <shape> <row> <col>; ..."
    ]
)


@dataclass(frozen=True)
class CorpusPair:
    pair_id: str
    scene: Scene
    caption: Caption  # shown with the image
    label: str  # MATCH or one of MISMATCH_KINDS
    true_caption: Caption  # true of the scene; equals `caption` for a match


def describe(scene_: Scene) -> str:
    """The scene as `demo_world.scene` phrases, joined by "; " (readable, and parsed back by
    `demo_world.scene(*text.split("; "))`)."""
    rows = {v: k for k, v in ROWS.items()}
    cols = {v: k for k, v in COLS.items()}
    return "; ".join(f"{o.colour} {o.shape} {rows[o.row]} {cols[o.col]}" for o in scene_)


def describes(cap: Caption, scene_: Scene) -> bool:
    """Whether every fact of the caption holds on the scene."""
    return all(f.holds(scene_) for f in cap.facts)


# ------------------------------------------------------------------ the edits


def _recoloured(clause: Clause, role: str, colour: str) -> Clause:
    if role == "thing":
        return Thing(clause.shape, colour, clause.count)
    if role == "subject":
        return Relation(Thing(clause.subject.shape, colour), clause.relation, clause.object)
    return Relation(clause.subject, clause.relation, Thing(clause.object.shape, colour))


def swapped_attribute(rng: random.Random, cap: Caption, scene_: Scene) -> Caption | None:
    """Two coloured things of different shapes and colours exchange their colours."""
    nouns = []  # (clause index, role, shape, colour)
    for i, clause in enumerate(cap.clauses):
        if isinstance(clause, Thing) and clause.colour:
            nouns.append((i, "thing", clause.shape, clause.colour))
        elif isinstance(clause, Relation):
            nouns += [(i, role, t.shape, t.colour) for role, t in (("subject", clause.subject), ("object", clause.object)) if t.colour]
    pairs = [(a, b) for k, a in enumerate(nouns) for b in nouns[k + 1:] if a[2] != b[2] and a[3] != b[3]]
    if not pairs:
        return None
    a, b = rng.choice(pairs)
    clauses = list(cap.clauses)
    clauses[a[0]] = _recoloured(clauses[a[0]], a[1], b[3])
    clauses[b[0]] = _recoloured(clauses[b[0]], b[1], a[3])  # a relation's two sides: both recoloured in turn
    return Caption(tuple(clauses))


def wrong_count(rng: random.Random, cap: Caption, scene_: Scene) -> Caption | None:
    """A thing's number becomes one that neither the caption nor the scene has."""
    things = [i for i, c in enumerate(cap.clauses) if isinstance(c, Thing)]
    if not things:
        return None
    i = rng.choice(things)
    thing = cap.clauses[i]
    actual = sum(o.shape == thing.shape and (thing.colour is None or o.colour == thing.colour) for o in scene_)
    numbers = [n for n in NUMBER_WORDS if n not in (actual, thing.count)]
    if not numbers:
        return None
    clauses = list(cap.clauses)
    clauses[i] = Thing(thing.shape, thing.colour, rng.choice(numbers))
    return Caption(tuple(clauses))


def flipped_negation(rng: random.Random, cap: Caption, scene_: Scene) -> Caption | None:
    """A denied thing is stated ("no star" -> "a star"), or a stated thing denied."""
    flippable = [i for i, c in enumerate(cap.clauses) if isinstance(c, (Thing, No))]
    if not flippable:
        return None
    i = rng.choice(flippable)
    clause = cap.clauses[i]
    clauses = list(cap.clauses)
    clauses[i] = Thing(clause.shape, clause.colour) if isinstance(clause, No) else No(clause.shape, clause.colour)
    return Caption(tuple(clauses))


def other_caption(sampler: WorldSampler, scene_: Scene) -> Caption:
    """A caption true of another drawn scene (whether it is false of this one is checked by
    the caller, as for every edit)."""
    while True:
        other = sampler.scene()
        cap = sampler.caption(other, p_true=1.0)
        if describes(cap, other):
            return cap


EDITS: dict[str, Callable[[random.Random, Caption, Scene], Caption | None]] = {
    "swapped_attribute": swapped_attribute,
    "wrong_count": wrong_count,
    "flipped_negation": flipped_negation,
}


# ------------------------------------------------------------------ the draw


def label_counts(pairs: int, mismatch_share: float, kind_shares: Mapping[str, float]) -> dict[str, int]:
    """How many pairs get each label: round(pairs x mismatch_share) mismatches, split between
    the kinds by their shares (largest remainders; ties to the kind listed first)."""
    mismatches = math.floor(pairs * mismatch_share + 0.5)
    total = sum(kind_shares.values())
    wanted = {k: mismatches * s / total for k, s in kind_shares.items()}
    counts = {k: math.floor(v) for k, v in wanted.items()}
    order = sorted(wanted, key=lambda k: (-(wanted[k] - counts[k]), list(wanted).index(k)))
    for k in order[: mismatches - sum(counts.values())]:
        counts[k] += 1
    return {MATCH: pairs - mismatches} | counts


class SettingError(ValueError):
    """A corpus setting out of range; `key` names it (the job's `key=value`)."""

    def __init__(self, key: str, message: str):
        self.key = key
        super().__init__(f"{key}: {message}")


def _number(value) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)


def _whole(value) -> bool:
    return not isinstance(value, bool) and isinstance(value, int)


def check_draw(pairs: int, mismatch_share: float, kind_shares: Mapping[str, float], seed: int = 0) -> None:
    """SettingError naming the draw setting that is out of range."""
    if not _whole(seed):
        raise SettingError("seed", f"must be a whole number, got {seed!r}")
    if not _whole(pairs) or pairs < 1:
        raise SettingError("pairs", f"must be a whole number of at least 1, got {pairs!r}")
    if not _number(mismatch_share) or not 0.0 <= mismatch_share <= 1.0:
        raise SettingError("mismatch_share", f"must be a number from 0 to 1, got {mismatch_share!r}")
    if not isinstance(kind_shares, Mapping) or not kind_shares:
        raise SettingError("kinds", f"name at least one mismatch kind with a share, e.g. kinds.wrong_count=1 (kinds: {', '.join(MISMATCH_KINDS)})")
    for kind, share in kind_shares.items():
        if kind not in MISMATCH_KINDS:
            raise SettingError(f"kinds.{kind}", f"unknown mismatch kind; valid: {', '.join(MISMATCH_KINDS)}")
        if not _number(share) or share < 0:
            raise SettingError(f"kinds.{kind}", f"a share must be a number >= 0, got {share!r}")
    if sum(kind_shares.values()) <= 0:
        raise SettingError("kinds", "the shares add up to 0; give at least one kind a share above 0")


def check_files(pairs_per_shard: int, open_share: float) -> None:
    """SettingError naming the file setting that is out of range."""
    if not _whole(pairs_per_shard) or pairs_per_shard < 1:
        raise SettingError("pairs_per_shard", f"must be a whole number of at least 1, got {pairs_per_shard!r}")
    if not _number(open_share) or not 0.0 <= open_share <= 0.5:
        raise SettingError("open_share", f"must be a number from 0 to 0.5, got {open_share!r}")


def draw_corpus(
    pairs: int = DEFAULT_PAIRS,
    mismatch_share: float = DEFAULT_MISMATCH_SHARE,
    kind_shares: Mapping[str, float] | None = None,
    seed: int = 0,
) -> list[CorpusPair]:
    """`pairs` pairs from the bench content slot, `label_counts` of each label in a seeded
    random order. The same arguments give the same pairs on every machine."""
    shares = DEFAULT_KIND_SHARES if kind_shares is None else kind_shares
    check_draw(pairs, mismatch_share, shares, seed)
    sampler = WorldSampler(f"corpus-{seed}", "bench")
    labels = [label for label, n in label_counts(pairs, mismatch_share, dict(shares)).items() for _ in range(n)]
    sampler.rng.shuffle(labels)
    return [_draw_pair(sampler, f"p{i:05d}", label) for i, label in enumerate(labels)]


def _draw_pair(sampler: WorldSampler, pair_id: str, label: str) -> CorpusPair:
    for _ in range(MAX_TRIES):
        scene_ = sampler.scene()
        true = sampler.caption(scene_, p_true=1.0)
        if not describes(true, scene_):
            continue
        if label == MATCH:
            return CorpusPair(pair_id, scene_, true, MATCH, true)
        shown = other_caption(sampler, scene_) if label == "other_caption" else EDITS[label](sampler.rng, true, scene_)
        if (shown is not None and shown.text != true.text and consistent(shown.clauses) and not describes(shown, scene_)
                and sampler.allowed_caption(shown.text)):
            return CorpusPair(pair_id, scene_, shown, label, true)
    raise RuntimeError(f"{pair_id}: no draw of {MAX_TRIES} could be made a {label} mismatch")


# ------------------------------------------------------------------ the files


def shard_stems(n_pairs: int, pairs_per_shard: int) -> list[str]:
    """Names (without extension) of the shards that hold `n_pairs` pairs, in order."""
    return [f"pairs-{k:04d}" for k in range(math.ceil(n_pairs / pairs_per_shard))]


def shard_slices(pairs: list[CorpusPair], pairs_per_shard: int) -> list[tuple[str, list[CorpusPair]]]:
    """(stem, pairs) per shard; a pair's row in its shard is its position in the slice."""
    return [(stem, pairs[k * pairs_per_shard:(k + 1) * pairs_per_shard]) for k, stem in enumerate(shard_stems(len(pairs), pairs_per_shard))]


def parquet_table(pairs: list[CorpusPair]) -> pa.Table:
    """One Parquet shard's rows: the image's PNG bytes, the caption and the pair id."""
    return pa.table(
        {"image": [png_bytes(render(p.scene)) for p in pairs], "caption": [p.caption.text for p in pairs], "pair_id": [p.pair_id for p in pairs]},
        schema=SHARD_SCHEMA,
    )


def webdataset_tar(pairs: list[CorpusPair]) -> bytes:
    """One WebDataset shard: `<pair_id>.png` and `<pair_id>.txt` per pair, in pair order, with
    fixed member metadata (same bytes on every machine)."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for p in pairs:
            for ext, data in (("png", png_bytes(render(p.scene))), ("txt", p.caption.text.encode())):
                info = tarfile.TarInfo(f"{p.pair_id}.{ext}")
                info.size, info.mtime, info.mode = len(data), 0, 0o644
                tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def truth_table(pairs: list[CorpusPair], pairs_per_shard: int) -> pa.Table:
    """Each pair's label, located by (shard, row) as the inputs hold it."""
    rows = [
        {"shard": stem, "row": row, "label": p.label, "pair_id": p.pair_id, "caption": p.caption.text,
         "true_caption": p.true_caption.text, "scene": describe(p.scene)}
        for stem, chunk in shard_slices(pairs, pairs_per_shard) for row, p in enumerate(chunk)
    ]
    return pa.Table.from_pylist(rows, schema=TRUTH_SCHEMA)


def questions_table(pairs: list[CorpusPair], open_share: float = 0.0) -> pa.Table:
    """Every shown caption's questions as the world writes them (`Caption.question_rows`, the
    rows the demo benchmark ships), in the QUESTIONS schema: what `questions.source=file`
    reads. A question writer sees the caption only, so a mismatched caption gets the
    questions of what it says, not of the image."""
    captions: dict[str, Caption] = {}
    for p in pairs:
        if captions.setdefault(p.caption.text, p.caption) != p.caption:
            raise ValueError(f"caption text {p.caption.text!r} is built from two different clause lists")
    rows = [row for cap in captions.values() for row in cap.question_rows(open_share)]
    return pa.Table.from_pylist(rows, schema=QUESTIONS)
