"""VLM-as-judge: each backbone grades each distinct (image, caption) by generation.

Generations are cached raw in the backbone's generations store (key = backbone fingerprint,
prompt id, judge kind, image hash, caption, token budget) and parsed here, so a parser fix
costs no model time. A generation that is not a valid judgement (operators/judge_output.py) is an
error row that keeps the raw text, and its item's judge metric is null with the reason:
never a silent score.
"""
from __future__ import annotations

import logging

import polars as pl
import pyarrow as pa

from operators import schema
from operators.answering import IMAGE_GENERATION_TEMPLATES
from operators.engines.spec import BackboneSpec
from operators.hashing import content_key
from operators.judge_output import JudgeError, parse_judgement
from operators.metrics import catalog
from pipeline.config import ComputeSpec, PromptSet
from pipeline.stages.engine_stage import PartSink, StageReport, run_and_read, status_table
from pipeline.stages.placement import engine_pool
from pipeline.store.fs import write_table
from pipeline.store.parts import PartStore

log = logging.getLogger(__name__)

# judge/<backbone>.parquet: one row per (item, judge kind)
JUDGE_TABLE = pa.schema(
    [
        ("item_id", pa.string()),
        ("benchmark", pa.string()),
        ("backbone", pa.string()),
        ("kind", pa.string()),  # holistic | decomposed
        ("key", pa.string()),
        ("valid", pa.bool_()),
        ("score", pa.float64()),  # null unless valid
        ("reason", pa.string()),  # why not valid: "invalid_judge_output: ..." or "no_generation: ..."
        ("judgement", pa.string()),  # the validated judgement as canonical JSON
        ("raw_text", pa.string()),  # the generation as stored (null if none was made)
    ]
)
_REQUESTS = pa.schema([("key", pa.string()), ("backbone", pa.string()), ("kind", pa.string()), ("image_hash", pa.string()), ("image_uri", pa.string()), ("caption", pa.string())])


def judge_plan(items: pl.DataFrame, kinds: list[str], backbone: BackboneSpec, prompts: PromptSet, max_new_tokens: int) -> pl.DataFrame:
    """(item, kind) -> generation key; items sharing image and caption share a key."""
    frames = []
    for kind in kinds:
        gen_kind = f"judge_{kind}"
        prompt_id = prompts.prompt_id(IMAGE_GENERATION_TEMPLATES[gen_kind])
        pairs = items.select("image_hash", "caption").unique(maintain_order=True)
        keys = [content_key(backbone.fingerprint(), prompt_id, gen_kind, h, c, max_new_tokens) for h, c in pairs.iter_rows()]
        keyed = pairs.with_columns(key=pl.Series(keys, dtype=pl.String))
        frames.append(
            items.select("item_id", "benchmark", "image_hash", "image_uri", "caption")
            .join(keyed, on=["image_hash", "caption"], how="left", maintain_order="left")
            .with_columns(kind=pl.lit(kind), gen_kind=pl.lit(gen_kind))
        )
    return pl.concat(frames) if frames else pl.DataFrame()


def judge_requests(plan: pl.DataFrame, backbone: BackboneSpec) -> pa.Table:
    unique = plan.unique(subset="key", keep="first", maintain_order=True).sort("image_hash", "gen_kind")
    table = unique.select("key", backbone=pl.lit(backbone.name), kind="gen_kind", image_hash="image_hash", image_uri="image_uri", caption="caption")
    return table.to_arrow().cast(_REQUESTS)


class JudgeWorker:
    """Ray actor: one engine per replica; generates judgements on images and stores them raw."""

    def __init__(self, backbone: BackboneSpec, templates: dict, store_url: str, max_new_tokens: int):
        from operators.images import load_image
        from pipeline.stages.executor import load_engine  # shared in-process, own engine in a Ray actor

        self.backbone = backbone
        self.templates = templates
        self.max_new_tokens = max_new_tokens
        self.store = PartStore(store_url, schema.GENERATIONS)
        self.parts = PartSink(self.store)  # background part writes; the rows go back with the statuses
        self.engine = load_engine(backbone)
        self.load_image = load_image  # checks the bytes against the request's image hash

    def __call__(self, batch: pa.Table) -> pa.Table:
        from operators.answering import generate_image_batch

        generations, errors = generate_image_batch(
            self.engine, batch, self.templates, self.load_image, max_new_tokens=self.max_new_tokens, system=self.backbone.system_prompt
        )
        self.parts.write(generations)
        return status_table(batch.column("key"), errors)


def judge_rows(plan: pl.DataFrame, generations: pl.DataFrame, failed: dict[str, str], backbone: str) -> tuple[pl.DataFrame, list[dict]]:
    """Parse each item's judgement: JUDGE_TABLE rows, and one error row per invalid generation."""
    texts = dict(generations.select("key", "text").iter_rows())
    parsed: dict[str, tuple[float | None, str | None, str | None]] = {}
    errors = []
    for key, kind, benchmark, item_id in plan.unique(subset="key", keep="first", maintain_order=True).select("key", "kind", "benchmark", "item_id").iter_rows():
        text = texts.get(key)
        if text is None:
            parsed[key] = (None, None, f"no_generation: {failed.get(key, 'missing')}")
            continue
        try:
            score, judgement = parse_judgement(kind, text)
            parsed[key] = (score, judgement, None)
        except JudgeError as exc:
            parsed[key] = (None, None, f"invalid_judge_output: {exc.reason}: {exc.snippet}")
            errors.append({"stage": "judge", "benchmark": benchmark, "item_id": item_id, "key": key, "source": backbone, "field": f"judge_{kind}", "reason": "invalid_judge_output", "detail": f"{exc} | output: {text[:300]!r}"})
    rows = [
        {"item_id": r["item_id"], "benchmark": r["benchmark"], "backbone": backbone, "kind": r["kind"], "key": r["key"],
         "valid": parsed[r["key"]][0] is not None, "score": parsed[r["key"]][0], "judgement": parsed[r["key"]][1],
         "reason": parsed[r["key"]][2], "raw_text": texts.get(r["key"])}
        for r in plan.iter_rows(named=True)
    ]
    table = pa.Table.from_pylist(rows, schema=JUDGE_TABLE) if rows else JUDGE_TABLE.empty_table()
    return pl.from_arrow(table), errors


def judge_scores(judged: pl.DataFrame, metric_ids: list[str]) -> pl.DataFrame:
    """SCORES rows of the requested judge metrics: the score, or null with the reason."""
    kinds = set(judged["kind"].to_list())
    frames = [
        judged.filter(pl.col("kind") == kind).select(
            "item_id", "benchmark", "backbone", metric=pl.lit(metric), score="score",
            note=pl.when(pl.col("valid")).then(None).otherwise(pl.col("reason")),
        )
        for metric, kind in ((m, catalog.judge_kind(m)) for m in catalog.ids("judge"))
        if kind in kinds and metric in metric_ids  # catalog order
    ]
    scores = pl.concat(frames) if frames else pl.from_arrow(schema.SCORES.empty_table())
    return pl.from_arrow(schema.conform(scores.to_arrow(), schema.SCORES, what="judge scores"))


def run_judge(
    items: pl.DataFrame,
    kinds: list[str],
    backbone: BackboneSpec,
    prompts: PromptSet,
    store_url: str,
    compute: ComputeSpec,
    *,
    metric_ids: list[str],
    max_new_tokens: int | None,
    out_dir: str,
) -> tuple[pl.DataFrame, StageReport]:
    """Generate (or read cached) judgements, parse them, write judge/<backbone>.parquet.

    Returns the judge metric SCORES rows and the stage report (its errors include one row per
    invalid judgement).
    """
    budget = max_new_tokens or backbone.max_new_tokens
    plan = judge_plan(items, kinds, backbone, prompts, budget)
    store = PartStore(f"{store_url}/generations/{backbone.name}", schema.GENERATIONS)
    requests = judge_requests(plan, backbone) if plan.height else _REQUESTS.empty_table()
    stored, report = run_and_read(
        columns=["key", "text"],
        stage="judge",
        unit=backbone.name,
        requests=requests,
        store=store,
        worker_cls=JudgeWorker,
        worker_kwargs={"backbone": backbone, "templates": prompts.templates, "store_url": store.url, "max_new_tokens": budget},
        pool=engine_pool(backbone, compute),
    )
    failed = {r["key"]: f"{r['reason']}: {r['detail']}" for r in report.errors.to_pylist()}
    generations = pl.from_arrow(stored)
    judged, errors = (judge_rows(plan, generations, failed, backbone.name) if plan.height else (pl.from_arrow(JUDGE_TABLE.empty_table()), []))
    write_table(f"{out_dir}/judge/{backbone.name}.parquet", judged.to_arrow())
    if errors:
        report.errors = schema.concat_errors([report.errors, schema.error_table(errors)])
        report.failed += len(errors)
    log.info("judge %s: %d judgements, %d valid", backbone.name, judged.height, judged["valid"].sum() or 0)
    return judge_scores(judged, metric_ids), report
