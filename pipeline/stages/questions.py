"""Questions: unique captions -> DEPICT questions, DSG graphs and typed claims (generated, or
read from a file: `file_questions`).

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
from pipeline.config import NO_QUESTIONS_FILE, ComputeSpec, ConfigError, PromptSet
from pipeline.stages.engine_stage import StageReport, run_and_read
from pipeline.stages.engine_workers import GenerationWorker
from pipeline.stages.placement import engine_pool
from pipeline.store.folder import FileError
from pipeline.store.fs import read_table
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


def file_questions(items: pl.DataFrame, url: str, sets: list[str]) -> tuple[pl.DataFrame, pa.Table]:
    """Questions read from a file (questions.source=file), matched to the items by caption
    text: the rows of their captions and of the needed sets. A caption the file gives no
    questions of a needed set is one error row per (benchmark, caption, set) naming the file,
    so each curated shard's errors table says why its pairs with that caption have no score."""
    if not url:
        raise ConfigError("questions.file", NO_QUESTIONS_FILE)
    questions = read_questions_file(url)
    captions = items.select("caption", "benchmark").unique(maintain_order=True)
    questions = questions.filter(pl.col("question_set").is_in(sets)).join(captions.select("caption").unique(), on="caption", how="semi")
    have = questions.select("caption", "question_set").unique()
    rows = []
    for qset in sets:
        missing = captions.join(have.filter(pl.col("question_set") == qset), on="caption", how="anti")
        rows += [
            {"stage": "questions", "benchmark": r["benchmark"], "source": url, "field": "caption", "reason": "no_questions",
             "detail": f"the questions file {url} has no {qset!r} questions for caption {r['caption']!r}"}
            for r in missing.iter_rows(named=True)
        ]
    return questions, schema.error_table(rows)


def read_questions_file(url: str) -> pl.DataFrame:
    """A questions file as a QUESTIONS table, checked whole: a missing or unreadable file, a
    missing column, an empty caption, question or id, an unknown question set or claim type, a
    repeated (caption, question_set, question_id) or a DSG parent that is not a question of the
    same caption is a FileError naming the file, the row and the field. `source` is the file's
    own column where it has one, else "file"."""
    try:
        table = read_table(url)
    except FileNotFoundError:
        raise FileError(f"{url}: questions file not found (questions.file)") from None
    except (pa.ArrowInvalid, OSError) as exc:
        raise FileError(f"{url}: not a readable Parquet file ({exc})") from exc
    required = ("caption", "question_set", "question_id", "question")
    missing = [c for c in required if c not in table.column_names]
    if missing:
        raise FileError(f"{url}: lacks column(s) {missing}; a questions file has {list(schema.QUESTIONS.names)} (operators/schema.py)")
    try:
        frame = pl.from_arrow(schema.conform(table, schema.QUESTIONS, what=url))
    except ValueError as exc:
        raise FileError(str(exc)) from None
    frame = frame.with_columns(pl.col("source").fill_null("file"), pl.col("parents").fill_null([])).with_row_index("_row")

    def refuse(bad: pl.DataFrame, field: str, why: str) -> None:
        if bad.height:
            first = bad.row(0, named=True)
            raise FileError(f"{url}: row {first['_row']}, {field}: {why} (caption {first['caption']!r}; {bad.height} such row(s))")

    for column in required:
        refuse(frame.filter(pl.col(column).is_null() | (pl.col(column).str.strip_chars() == "")), column, "empty")
    refuse(frame.filter(~pl.col("question_set").is_in(schema.QUESTION_SETS)), "question_set", f"not one of {schema.QUESTION_SETS}")
    claims = frame.filter(pl.col("question_set") == "claims")
    refuse(claims.filter(~pl.col("claim_type").is_in(schema.CLAIM_TYPES) | pl.col("claim_type").is_null()), "claim_type", f"not one of {schema.CLAIM_TYPES}")
    refuse(frame.filter(~pl.struct("caption", "question_set", "question_id").is_first_distinct()), "question_id", "repeated for this caption and question set")
    dsg = frame.filter(pl.col("question_set") == "dsg")
    parents = dsg.select("_row", "caption", pl.col("parents").alias("parent")).explode("parent").drop_nulls("parent")
    unknown = parents.join(dsg.select("caption", pl.col("question_id").alias("parent")), on=["caption", "parent"], how="anti")
    refuse(unknown.sort("_row"), "parents", "names a question id this caption's dsg questions do not have")
    return frame.drop("_row")


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
