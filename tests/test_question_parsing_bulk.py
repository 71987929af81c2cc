"""Parsing generations in bulk (once per distinct text) gives exactly the rows and errors of
the former per-row loop, in the same order."""
import json

import polars as pl
import pyarrow as pa

from operators import schema
from operators.engines.spec import BackboneSpec
from operators.hashing import content_key
from operators.parsing import ParseError
from pipeline.stages.questions import generation_requests, parse_generation, parse_generations


def per_row(joined: pl.DataFrame, max_questions: int, source: str, items: pl.DataFrame):
    """The loop generated_questions ran before (reference)."""
    rows, errors = [], []
    caption_benchmark = dict(items.select("caption", "benchmark").unique(subset="caption", keep="first").iter_rows())
    for r in joined.iter_rows(named=True):
        try:
            for q in parse_generation(r["kind"], r["text"], max_questions):
                rows.append(q | {"caption": r["caption"], "source": source})
        except ParseError as exc:
            errors.append({"stage": "questions", "benchmark": caption_benchmark.get(r["caption"]), "key": r["key"], "source": source, "field": r["kind"], "reason": "unparseable_generation", "detail": f"{exc.reason}: {exc} | caption: {r['caption']!r} | output: {r['text'][:300]!r}"})
    questions = pl.from_arrow(schema.conform(pa.Table.from_pylist(rows), schema.QUESTIONS)) if rows else pl.from_arrow(schema.QUESTIONS.empty_table())
    return questions, errors


def test_bulk_parse_equals_per_row_parse():
    same = json.dumps(["Is there a cat?", "Is it black?"])
    dsg = json.dumps([{"id": "1", "question": "Is there a cat?", "parents": []}, {"id": "2", "question": "Is the cat black?", "parents": ["1"]}])
    claims = json.dumps([{"claim": "a cat", "type": "object"}, {"claim": "the cat is black", "type": "attribute"}])
    gens = [
        ("k1", "questions", "a cat", same), ("k2", "questions", "un chat noir 🐈", same), ("k3", "questions", "x", "no list here"),
        ("k4", "dsg", "a cat", dsg), ("k5", "claims", "a cat", claims), ("k6", "questions", "y", json.dumps(["Is there a dog?"])),
        ("k7", "claims", "z", "[not json"), ("k8", "questions", "x2", "no list here"),
    ]
    joined = pl.DataFrame(gens, schema=["key", "kind", "caption", "text"], orient="row").with_columns(backbone=pl.lit("g"))
    items = pl.DataFrame({"caption": ["a cat", "x", "z", "x2"], "benchmark": ["b1", "b2", "b3", "b2"]})
    got_q, got_e = parse_generations(joined, 8, "g", items)
    want_q, want_e = per_row(joined, 8, "g", items)
    assert got_q.equals(want_q)
    assert got_q.height == 2 + 2 + 2 + 2 + 1
    assert sorted(got_e, key=lambda e: e["key"]) == sorted(want_e, key=lambda e: e["key"])
    assert {e["key"] for e in got_e} == {"k3", "k7", "k8"}


def test_generation_request_keys_are_unchanged():
    generator = BackboneSpec(name="g", engine="scripted", model_id="scripted")

    class Prompts:
        def prompt_id(self, name):
            return f"v1:{name}"

    captions = ["a cat", "un café 日本", "a cat twice"]
    table = generation_requests(captions, ["depict", "dsg"], generator, Prompts())
    expected = [content_key(generator.fingerprint(), f"v1:generate_{t}", f"generate_{k}", c)
                for k, t in (("questions", "questions"), ("dsg", "dsg")) for c in captions]
    assert table.column("key").to_pylist() == expected
    assert table.column("kind").to_pylist() == ["questions"] * 3 + ["dsg"] * 3
    assert table.column("caption").to_pylist() == captions * 2
