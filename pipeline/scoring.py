"""The scoring half of the DAG, shared by the sweep and nightly curation:
items -> questions -> per-backbone requests -> answers -> scores and per-question records.

Both jobs call `score_items_all_backbones`, so they run the same stages against the same
answer cache: a pair scored by a sweep is never asked again by curation, and vice versa.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, fields

import polars as pl
import pyarrow as pa

from operators import answer_mass, schema
from operators.metrics import catalog
from pipeline.config import ResolvedConfig, SweepConfig
from pipeline.stages.answers import AnswerPlan, AnswerReport, answer_store, plan_answers, run_answers
from pipeline.stages.engine_stage import StageReport
from pipeline.stages.evidence import run_evidence
from pipeline.stages.judge import run_judge
from pipeline.stages.questions import file_questions, generated_questions, provided_questions
from pipeline.stages.scores import errors_for_items, question_records, score_items
from pipeline.store.admin import compact_between_windows
from pipeline.store.fs import filesystem, is_local, local_atomic_file, read_table, write_table

log = logging.getLogger(__name__)
WINDOWS_FOLDER = "_windows"  # scratch for per-window records; removed once they are merged


class Timings(dict):
    """Wall seconds per stage name, accumulated across backbones."""

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self[name] = self.get(name, 0.0) + time.perf_counter() - start


@dataclass
class Scored:
    questions: pl.DataFrame
    scores: pl.DataFrame  # operators.schema.SCORES, every backbone
    reports: list[StageReport] = field(default_factory=list)
    errors: list[pa.Table] = field(default_factory=list)


def needs_holistic(metric_ids: list[str]) -> bool:
    return any(catalog.reads_holistic(m) for m in metric_ids)


def question_generators(s: SweepConfig) -> list[str]:
    """The backbones that write questions: each backbone its own, one shared generator, or
    none when the questions ship with the benchmark or are read from a file."""
    q = s.questions
    if q.source != "model":
        return []
    return list(s.backbones) if q.per_backbone else [q.generator]


def obtain_questions(items: pl.DataFrame, shipped: pl.DataFrame | None, cfg: ResolvedConfig, out: Scored) -> dict[str, pl.DataFrame]:
    """Questions for every backbone: shipped with the benchmark, read from a file, or generated
    once per caption."""
    s, q = cfg.sweep, cfg.sweep.questions
    sets = s.required_question_sets()
    if q.source in ("benchmark", "file"):
        questions, errors = provided_questions(items, shipped, sets) if q.source == "benchmark" else file_questions(items, q.file, sets)
        out.errors.append(errors)
        out.questions = questions
        return {b: questions for b in s.backbones}
    generators = question_generators(s)
    generated = {}
    for name in generators:
        generated[name], report = generated_questions(items, sets, cfg.backbones[name], cfg.prompts, s.store, s.compute, q.max_questions)
        out.reports.append(report)
        out.errors.append(report.errors)
    out.questions = pl.concat(list(generated.values()))
    return {b: generated[b if q.per_backbone else q.generator] for b in s.backbones}


def questions_step(items: pl.DataFrame, shipped: pl.DataFrame | None, cfg: ResolvedConfig, out_dir: str, timings: Timings) -> tuple[Scored, dict]:
    """Every item's questions (generated or shipped), written to questions.parquet: the step that
    runs once per sweep, windowed or not. Returns the run's Scored and questions per backbone."""
    out = Scored(questions=pl.from_arrow(schema.QUESTIONS.empty_table()), scores=pl.from_arrow(schema.SCORES.empty_table()))
    with timings("questions"):
        questions_by_backbone = obtain_questions(items, shipped, cfg, out)
        write_table(f"{out_dir}/questions.parquet", schema.conform(out.questions.to_arrow(), schema.QUESTIONS))
    return out, questions_by_backbone


def score_items_all_backbones(items: pl.DataFrame, shipped: pl.DataFrame | None, cfg: ResolvedConfig, out_dir: str, timings: Timings) -> Scored:
    """Questions, answers and scores for every backbone; writes questions, scores/ and records/."""
    s = cfg.sweep
    out, questions_by_backbone = questions_step(items, shipped, cfg, out_dir, timings)

    frames = []
    for name in s.backbones:  # one backbone at a time: its engine is loaded once and serves everything
        backbone = cfg.backbones[name]
        scored = answer_and_score(items, questions_by_backbone[name], name, cfg, timings)
        out.reports.append(scored.report)
        out.errors.append(scored.report.errors)
        with timings("scores"):
            write_table(f"{out_dir}/scores/{name}.parquet", scored.scores.to_arrow())
            if scored.records.height:
                write_table(f"{out_dir}/records/{name}.parquet", scored.records.to_arrow())
        scores = add_evidence_and_judge(items, scored.plan, scored.answers, scored.scores, backbone, cfg, out_dir, timings, out)
        frames.append(scores)
    if frames:
        out.scores = pl.concat(frames)
    return out


@dataclass
class BackboneScores:
    """One backbone's work on a set of items: its request plan, the answers, the answers stage's
    report (errors tied to items), the answer metrics' score rows and the per-question records."""

    plan: AnswerPlan
    answers: pl.DataFrame
    report: AnswerReport
    scores: pl.DataFrame
    records: pl.DataFrame


def answer_and_score(items: pl.DataFrame, questions: pl.DataFrame, name: str, cfg: ResolvedConfig, timings: Timings) -> BackboneScores:
    """Requests -> answers -> scores and records for one backbone over `items` (all of a sweep's,
    or one window of them): the step one pass and the windows share."""
    s = cfg.sweep
    backbone = cfg.backbones[name]
    with timings("requests"):
        plan = plan_answers(items, questions, backbone, cfg.prompts, s.required_question_sets(), needs_holistic(s.metrics))
    with timings("answers"):
        answers, report = run_answers(plan, backbone, cfg.prompts, s.store, s.compute)
    report.errors = errors_for_items(report.errors, plan, items)
    with timings("scores"):
        answer_metrics = [m for m in s.metrics if catalog.is_yes_no(m)]
        scores = score_items(items, plan, answers, backbone=name, metric_ids=answer_metrics, lam=s.lam, probability=s.probability, errors=report.errors)
        records = question_records(plan, answers, name)
    return BackboneScores(plan, answers, report, scores, records)


def add_evidence_and_judge(items: pl.DataFrame, plan, answers: pl.DataFrame, scores: pl.DataFrame, backbone, cfg: ResolvedConfig, out_dir: str, timings: Timings, out: Scored) -> pl.DataFrame:
    """Evidence checks (grounding, views, deltas) and the VLM judge for one backbone, after its
    answers and scores: their metric rows join the backbone's scores (rewritten if any)."""
    s = cfg.sweep
    extra = []
    evidence = run_evidence(items, plan, answers, scores, backbone, cfg, out_dir, timings)
    out.reports += evidence.reports
    out.errors += evidence.errors
    extra.append(evidence.scores)
    kinds = s.judge_kinds()
    if kinds:
        with timings("judge"):
            judged, report = run_judge(
                items, kinds, backbone, cfg.prompts, s.store, s.compute,
                metric_ids=list(s.metrics), max_new_tokens=s.judge.max_new_tokens, out_dir=out_dir,
            )
        out.reports.append(report)
        out.errors.append(report.errors)
        extra.append(judged)
    extra = [frame for frame in extra if frame.height]
    if not extra:
        return scores
    scores = pl.concat([scores, *extra])
    write_table(f"{out_dir}/scores/{backbone.name}.parquet", scores.to_arrow())
    return scores


# -- windows of items ------------------------------------------------------------------------


def windowed_reason(cfg: ResolvedConfig, n_items: int) -> str | None:
    """Why the sweep scores in one pass (None: it runs in windows of `window_items`)."""
    s = cfg.sweep
    if s.window_items is None or n_items <= s.window_items:
        return "fits one window"
    if s.evidence.enabled:
        return "evidence checks sample items across the whole sweep"
    if s.judge_kinds():
        return "the VLM judge adds its rows after every answer score"
    return None


def score_items_windowed(items: pl.DataFrame, shipped: pl.DataFrame | None, cfg: ResolvedConfig, out_dir: str, timings: Timings) -> Scored:
    """`score_items_all_backbones` in windows of `window_items` items (by item_id), writing the
    same files with the same rows in the same order.

    Questions are per caption (small) and obtained once for all items, as in one pass. Then per
    backbone and window: requests -> answers -> scores and records, so the driver holds one
    window's requests and answers. A request shared by two windows is answered once (the second
    window finds it in the content-keyed store), and a run killed mid-window resumes from the
    store like any other. Scores of all items are kept (metaeval needs them; a few rows per
    item); records go to a scratch file per window and are streamed into records/<backbone>.
    """
    s = cfg.sweep
    reason = windowed_reason(cfg, items.height)
    if reason is not None:
        if s.window_items is not None and items.height > s.window_items:
            log.info("sweep: %d items in one pass (window_items=%d): %s", items.height, s.window_items, reason)
        return score_items_all_backbones(items, shipped, cfg, out_dir, timings)
    out, questions_by_backbone = questions_step(items, shipped, cfg, out_dir, timings)
    # Windows are slices of the items in item_id order: records (sorted by item, question set,
    # question) are then the windows' records one after the other.
    by_id = items.sort("item_id", maintain_order=True)
    starts = range(0, by_id.height, s.window_items)
    scratch = f"{out_dir}/{WINDOWS_FOLDER}"
    frames = []
    for name in s.backbones:
        backbone = cfg.backbones[name]
        reports, masses, window_scores, record_urls = [], [], [], []
        for k, start in enumerate(starts):
            window = by_id.slice(start, s.window_items)
            log.info("sweep: backbone %s, window %d of %d (%d items)", name, k + 1, len(starts), window.height)
            questions = questions_by_backbone[name].join(window.select("caption").unique(), on="caption", how="semi", maintain_order="left")
            scored = answer_and_score(window, questions, name, cfg, timings)
            if k + 1 < len(starts):
                with timings("compact"):
                    compact_between_windows(answer_store(s.store, backbone))
            reports.append(scored.report)
            needed = pl.from_arrow(scored.plan.requests.select(["key", "kind"]))
            masses.append(needed.join(scored.answers, on="key", how="left").select(
                "key", "kind", answer_mass=pl.col("logp_yes").exp() + pl.col("logp_no").exp()))
            window_scores.append(scored.scores)
            if scored.records.height:
                with timings("scores"):
                    record_urls.append(f"{scratch}/{name}/records-{k:05d}.parquet")
                    write_table(record_urls[-1], scored.records.to_arrow())
            del scored, needed
        with timings("scores"):
            scores = in_one_pass_order(window_scores, items)
            write_table(f"{out_dir}/scores/{name}.parquet", scores.to_arrow())
            if record_urls:
                write_concatenated(f"{out_dir}/records/{name}.parquet", (read_table(url) for url in record_urls))
        merged = merge_window_reports(reports, pl.concat(masses))
        out.reports.append(merged)
        out.errors.append(merged.errors)
        frames.append(scores)
    remove_scratch(out_dir)
    if frames:
        out.scores = pl.concat(frames)
    return out


def in_one_pass_order(window_scores: list[pl.DataFrame], items: pl.DataFrame) -> pl.DataFrame:
    """The windows' score rows in the order one pass writes them: metric by metric (in the
    order the formulas emit them), items in input order within a metric."""
    scores = pl.concat(window_scores)
    metric_order = scores["metric"].unique(maintain_order=True)
    rank = pl.col("metric").replace_strict(metric_order, pl.int_range(metric_order.len(), eager=True), return_dtype=pl.Int64)
    position = items.select("item_id").with_row_index("_position")
    return (
        scores.with_columns(_rank=rank)
        .join(position, on="item_id", how="left", maintain_order="left")
        .sort("_rank", "_position", maintain_order=True)
        .drop("_rank", "_position")
    )


def merge_window_reports(reports: list[StageReport], masses: pl.DataFrame) -> StageReport:
    """One answers report for a backbone's windows: distinct keys as in one pass (a key needed by
    two windows is needed once: sent by the first, cached for the second), the answer mass
    summarised over distinct answered keys."""
    first = reports[0]
    # a key that failed in one window and was answered in a later one counts as answered
    distinct = masses.sort(pl.col("answer_mass").is_null(), maintain_order=True).unique(subset="key", keep="first", maintain_order=True)
    sent = sum(r.sent for r in reports)
    merged = AnswerReport(
        **{f.name: getattr(first, f.name) for f in fields(StageReport)},
        answer_mass=answer_mass.summarize(distinct.filter(pl.col("answer_mass").is_not_null()).select("kind", "answer_mass")),
    )
    merged.needed = distinct.height
    merged.sent = sent
    merged.cached = max(0, distinct.height - sent)
    merged.failed = sum(r.failed for r in reports)
    merged.seconds = sum(r.seconds for r in reports)
    merged.quarantined = [q for r in reports for q in r.quarantined]
    merged.errors = schema.concat_errors(r.errors for r in reports)
    return merged


def write_concatenated(url: str, tables: Iterable[pa.Table]) -> None:
    """One Parquet file of `tables` in order, written a table at a time (never all in memory)
    and made visible only when complete (a local temp file renamed; one upload elsewhere)."""
    import pyarrow.parquet as pq

    fs, path = filesystem(url)
    with local_atomic_file(path) if is_local(fs) else fs.open(path, "wb") as sink:
        writer = None
        try:
            for table in tables:
                if writer is None:
                    writer = pq.ParquetWriter(sink, table.schema, compression="zstd")
                writer.write_table(table)
        finally:
            if writer is not None:
                writer.close()


def remove_scratch(out_dir: str) -> None:
    """Delete the per-window scratch folder (also left by a killed run: the next one removes it)."""
    fs, path = filesystem(f"{out_dir}/{WINDOWS_FOLDER}")
    fs.invalidate_cache(path)
    if fs.exists(path):
        fs.rm(path, recursive=True)
