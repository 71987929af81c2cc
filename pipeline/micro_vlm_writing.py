"""How well a backbone writes the demo world's question sets and judge verdicts, measured
through an engine exactly as the questions and judge stages call it.

Captions and scenes come from the world's held-out content slots (never drawn in training),
prompts are the run's own generation templates (`operators.answering.generate_batch` and
`generate_image_batch`), and what comes back is read by the production parsers. Per format:

- parse rate: the share of generations the parser accepts;
- exact match: the share whose parsed rows are the world's own (`Caption.question_rows`), or,
  for the judge, whose text is what a faithful judge writes (`operators.demo_generations`);
- for the judge, `valid` is the parse rate (operators/judge_output.py's strict schema).

`FLOORS`: parse >= 0.99 and exact >= 0.95 per question format.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa

from operators import demo_generations, demo_world
from operators.answering import generate_batch, generate_image_batch
from operators.judge_output import JudgeError, parse_judgement
from operators.parsing import ParseError, parse_claims, parse_dsg, parse_questions, questions_rows

FLOORS = {"parse": 0.99, "exact": 0.95}
PARSERS = {"depict": parse_questions, "dsg": parse_dsg, "claims": parse_claims}
GENERATION_KIND = {"depict": "questions", "dsg": "dsg", "claims": "claims"}  # pipeline.stages.questions' kinds


@dataclass(frozen=True)
class Written:
    """One generation with what the world says it should be."""

    kind: str  # depict | dsg | claims | judge_holistic | judge_decomposed
    caption: str
    text: str  # what the engine wrote ("" when the engine failed on it)
    parsed: bool
    exact: bool


def heldout_pairs(n: int, seed: int = 0) -> list[tuple[demo_world.Caption, demo_world.Scene]]:
    """`n` held-out (caption, scene) pairs: fresh scenes with one of their captions."""
    sampler = demo_world.WorldSampler(seed, "heldout")
    pairs = []
    for _ in range(n):
        scene = sampler.scene()
        pairs.append((sampler.caption(scene), scene))
    return pairs


def write_questions(engine, captions: Sequence[demo_world.Caption], templates: dict, open_share: float,
                    max_new_tokens: int, system: str | None = None) -> list[Written]:
    """Each caption's three question sets, written by the engine and checked against the world."""
    rows = [{"key": f"{qset}/{i}", "backbone": "eval", "kind": GENERATION_KIND[qset], "caption": c.text}
            for qset in PARSERS for i, c in enumerate(captions)]
    generations, _ = generate_batch(engine, pa.Table.from_pylist(rows), templates, max_new_tokens=max_new_tokens, system=system)
    text_of = dict(zip(generations.column("key").to_pylist(), generations.column("text").to_pylist()))
    out = []
    for qset, parse in PARSERS.items():
        for i, caption in enumerate(captions):
            text = text_of.get(f"{qset}/{i}", "")
            want = [r for r in caption.question_rows(open_share) if r["question_set"] == qset]
            try:
                got = questions_rows(qset, parse(text), caption=caption.text, source="benchmark")
            except ParseError:
                out.append(Written(qset, caption.text, text, False, False))
                continue
            out.append(Written(qset, caption.text, text, True, got == want))
    return out


def write_judgements(engine, pairs: Sequence[tuple[demo_world.Caption, demo_world.Scene]], templates: dict,
                     max_new_tokens: int, system: str | None = None) -> list[Written]:
    """Both judge kinds on each (caption, scene), checked against a faithful judge's text."""
    from operators.hashing import image_hash
    from operators.images import decode_image

    pngs = [demo_world.png_bytes(demo_world.render(scene)) for _, scene in pairs]
    hashes = [image_hash(png) for png in pngs]
    images = {h: png for h, png in zip(hashes, pngs)}
    rows = [{"key": f"{kind}/{i}", "backbone": "eval", "kind": f"judge_{kind}", "image_hash": hashes[i],
             "image_uri": f"heldout-{i}.png", "caption": caption.text}
            for kind in demo_generations.JUDGE_TEMPLATES for i, (caption, _) in enumerate(pairs)]
    generations, _ = generate_image_batch(engine, pa.Table.from_pylist(rows), templates,
                                          lambda uri, digest: decode_image(images[digest], uri),
                                          max_new_tokens=max_new_tokens, system=system)
    text_of = dict(zip(generations.column("key").to_pylist(), generations.column("text").to_pylist()))
    out = []
    for kind in demo_generations.JUDGE_TEMPLATES:
        for i, (caption, scene) in enumerate(pairs):
            text = text_of.get(f"{kind}/{i}", "")
            try:
                parse_judgement(kind, text)
                parsed = True
            except JudgeError:
                parsed = False
            out.append(Written(f"judge_{kind}", caption.text, text, parsed, text == demo_generations.judge_text(caption, scene, kind)))
    return out


def summary(written: Sequence[Written]) -> dict[str, dict[str, float]]:
    """Per kind: n, parse rate and exact-match share."""
    out: dict[str, dict[str, float]] = {}
    for kind in dict.fromkeys(w.kind for w in written):
        mine = [w for w in written if w.kind == kind]
        out[kind] = {"n": len(mine), "parse": round(sum(w.parsed for w in mine) / len(mine), 3),
                     "exact": round(sum(w.exact for w in mine) / len(mine), 3)}
    return out


def by_caption(written: Sequence[Written]) -> list[dict]:
    """Exact match of each question format per kind of caption: its number of clauses and whether
    two of its mentions name one shape (`Caption.repeats_a_shape`), where a writer must work out
    which details belong to which thing. Says where a writer's misses are, not only how many."""
    from operators.engines.world_oracle import parse_caption

    groups: dict[tuple[int, bool], dict[str, list[bool]]] = {}
    for w in written:
        if w.kind in PARSERS:
            caption = parse_caption(w.caption)
            groups.setdefault((len(caption.clauses), caption.repeats_a_shape), {}).setdefault(w.kind, []).append(w.exact)
    return [{"clauses": clauses, "repeats_a_shape": repeats, "n": len(next(iter(kinds.values()))),
             **{kind: round(sum(hits) / len(hits), 3) for kind, hits in kinds.items()}}
            for (clauses, repeats), kinds in sorted(groups.items())]


def writing_floors(per_kind: dict[str, dict[str, float]]) -> dict[str, bool]:
    """Which of `FLOORS` each question format of a `summary` (or `question_match`) meets; the
    judge's verdicts have no floor of their own (their parse rate is the judge validity rate)."""
    return {f"{kind} {name} >= {FLOORS[name]}": row[name] >= FLOORS[name]
            for kind, row in per_kind.items() if kind in PARSERS for name in ("parse", "exact")}


def question_match(questions, captions: Sequence[str], sets: Sequence[str] = tuple(PARSERS)) -> dict[str, dict[str, float]]:
    """A run's written questions (its QUESTIONS table) against the world's, per question set:
    `parse`, the share of captions with any rows of that set (an unparseable generation leaves
    none), and `exact`, the share whose rows are exactly the world's
    (`Caption.question_rows(WRITTEN_OPEN_SHARE)`, source aside)."""
    from operators.engines.world_oracle import parse_caption

    columns = ["question_set", "question_id", "question", "parents", "claim_type"]
    written: dict[tuple[str, str], list[dict]] = {}
    for row in questions.select("caption", *columns).iter_rows(named=True):
        written.setdefault((row.pop("caption"), row["question_set"]), []).append({**row, "parents": list(row["parents"] or [])})
    out = {}
    for qset in sets:
        parsed = exact = 0
        for text in captions:
            rows = written.get((text, qset))
            if rows is None:
                continue
            parsed += 1
            want = [{k: r[k] for k in columns} for r in parse_caption(text).question_rows(demo_generations.WRITTEN_OPEN_SHARE)
                    if r["question_set"] == qset]
            got = sorted(rows, key=lambda r: int(r["question_id"]))
            exact += got == [{**r, "parents": list(r["parents"])} for r in want]
        out[qset] = {"n": len(captions), "parse": round(parsed / len(captions), 3), "exact": round(exact / len(captions), 3)}
    return out
