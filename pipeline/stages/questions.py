"""Questions: unique captions -> DEPICT questions, DSG graphs and typed claims.

Generation runs once per distinct caption (never per item) at temperature 0, and the raw
text is cached in the generations store; parsing happens here, so a parser fix costs no
model time. A generation that cannot be parsed is an error row for its caption, and the
items with that caption get null scores with a reason downstream.
"""
from __future__ import annotations

import logging

import polars as pl
import pyarrow as pa

from operators import schema
from operators.answering import GENERATION_TEMPLATES
from operators.engines.spec import BackboneSpec
from operators.hashing import content_keys
from operators.parsing import ParseError, parse_claims, parse_dsg, parse_questions, questions_rows
from pipeline.config import ComputeSpec, PromptSet
from pipeline.stages.engine_stage import StageReport, run_and_read
from pipeline.stages.engine_workers import GenerationWorker
from pipeline.stages.placement import engine_pool
from pipeline.store.parts import PartStore

log = logging.getLogger(__name__)

# question set -> generation kind
GENERATION_KIND = {"depict": "questions", "dsg": "dsg", "claims": "claims"}


def provided_questions(items: pl.DataFrame, questions: pl.DataFrame | None, sets: list[str]) -> tuple[pl.DataFrame, pa.Table]:
    """Questions shipped with the benchmarks; captions lacking a set are reported."""
    if questions is None:
        questions = pl.from_arrow(schema.QUESTIONS.empty_table())
    questions = questions.filter(pl.col("question_set").is_in(sets))
    have = questions.select("caption", "question_set").unique()
    captions = items.select("caption", "benchmark").unique(subset="caption", keep="first", maintain_order=True)
    rows = []
    for qset in sets:
        missing = captions.join(have.filter(pl.col("question_set") == qset), on="caption", how="anti")
        rows += [
            {"stage": "questions", "benchmark": r["benchmark"], "field": "caption", "reason": "no_questions", "detail": f"the benchmark ships no {qset!r} questions for caption {r['caption']!r}"}
            for r in missing.iter_rows(named=True)
        ]
    errors = schema.error_table(rows)
    return questions, errors


def generation_store(store_url: str, generator: BackboneSpec) -> PartStore:
    return PartStore(f"{store_url}/generations/{generator.name}", schema.GENERATIONS)


def generation_requests(captions: list[str], sets: list[str], generator: BackboneSpec, prompts: PromptSet) -> pa.Table:
    """One request per (question set, caption); keys hashed in bulk, the fingerprint once."""
    fingerprint = generator.fingerprint()
    frames = []
    for qset in sets:
        kind = GENERATION_KIND[qset]
        prompt_id = prompts.prompt_id(GENERATION_TEMPLATES[kind])
        keys = content_keys([captions], prefix=(fingerprint, prompt_id, f"generate_{kind}"))
        n = len(captions)
        frames.append(pa.table({"key": keys, "backbone": [generator.name] * n, "kind": [kind] * n, "caption": pa.array(captions, pa.string())}))
    schema_ = pa.schema([("key", pa.string()), ("backbone", pa.string()), ("kind", pa.string()), ("caption", pa.string())])
    return pa.concat_tables([f.cast(schema_) for f in frames]) if frames else schema_.empty_table()


def parse_generation(kind: str, text: str, max_questions: int) -> list[dict]:
    """Raw generated text -> QUESTIONS rows (without caption/source); raises ParseError."""
    if kind == "questions":
        return questions_rows("depict", parse_questions(text, max_items=max_questions))
    if kind == "dsg":
        return questions_rows("dsg", parse_dsg(text, max_items=max_questions))
    if kind == "claims":
        return questions_rows("claims", parse_claims(text, max_items=max_questions))
    raise ValueError(f"unknown generation kind {kind!r}")


def generated_questions(
    items: pl.DataFrame,
    sets: list[str],
    generator: BackboneSpec,
    prompts: PromptSet,
    store_url: str,
    compute: ComputeSpec,
    max_questions: int,
) -> tuple[pl.DataFrame, StageReport]:
    """Generate (or read cached) questions for every distinct caption, then parse them."""
    captions = items["caption"].unique(maintain_order=True).to_list()
    requests = generation_requests(captions, sets, generator, prompts)
    store = generation_store(store_url, generator)
    stored, report = run_and_read(
        columns=["key", "text"],
        stage="questions",
        unit=generator.name,
        requests=requests,
        store=store,
        worker_cls=GenerationWorker,
        worker_kwargs={"backbone": generator, "templates": prompts.templates, "store_url": store.url},
        pool=engine_pool(generator, compute),
    )
    stored = pl.from_arrow(stored).select("key", "text")
    joined = pl.from_arrow(requests).join(stored, on="key", how="inner")
    questions, errors = parse_generations(joined, max_questions, generator.name, items)
    if errors:
        report.errors = schema.concat_errors([report.errors, schema.error_table(errors)])
        report.failed += len(errors)
    log.info("questions from %s: %d rows for %d captions, %d unparseable", generator.name, questions.height, len(captions), len(errors))
    return questions, report


def parse_generations(joined: pl.DataFrame, max_questions: int, source: str, items: pl.DataFrame) -> tuple[pl.DataFrame, list[dict]]:
    """Generations (key, kind, caption, text) -> QUESTIONS rows and error rows.

    Each distinct (kind, text) is parsed once and joined back to its captions: a generator
    that writes the same text for many captions (templated or scripted output) costs one parse.
    """
    distinct = joined.select("kind", "text").unique(maintain_order=True).with_row_index("_g")
    parsed, failures = [], {}
    for g, kind, text in distinct.iter_rows():
        try:
            parsed += [q | {"_g": g} for q in parse_generation(kind, text, max_questions)]
        except ParseError as exc:
            failures[g] = exc
    located = joined.join(distinct, on=["kind", "text"], how="left", nulls_equal=True, maintain_order="left")
    rows = (
        pl.DataFrame(parsed, schema_overrides={"_g": pl.UInt32, "parents": pl.List(pl.String), "claim_type": pl.String}, infer_schema_length=None)
        if parsed else pl.DataFrame(schema={"_g": pl.UInt32})
    )
    questions = pl.from_arrow(schema.QUESTIONS.empty_table())
    if rows.height:
        out = located.select("_g", "caption").join(rows, on="_g", how="inner", maintain_order="left_right").with_columns(source=pl.lit(source))
        questions = pl.from_arrow(schema.conform(out.drop("_g").to_arrow(), schema.QUESTIONS))
    errors = []
    if failures:
        caption_benchmark = dict(items.select("caption", "benchmark").unique(subset="caption", keep="first").iter_rows())
        for r in located.filter(pl.col("_g").is_in(list(failures))).iter_rows(named=True):
            exc = failures[r["_g"]]
            errors.append(
                {"stage": "questions", "benchmark": caption_benchmark.get(r["caption"]), "key": r["key"], "source": source, "field": r["kind"], "reason": "unparseable_generation", "detail": f"{exc.reason}: {exc} | caption: {r['caption']!r} | output: {r['text'][:300]!r}"}
            )
    return questions, errors
