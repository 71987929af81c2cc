"""The scoring half of the DAG, shared by the sweep and nightly curation:
items -> questions -> per-backbone requests -> answers -> scores and per-question records.

Both jobs call `score_items_all_backbones`, so they run the same stages against the same
answer cache: a pair scored by a sweep is never asked again by curation, and vice versa.
"""
from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import polars as pl
import pyarrow as pa

from operators import schema
from pipeline import store as st
from pipeline.config import (
    HOLISTIC_METRICS,
    ResolvedConfig,
    is_answer_metric,
    judge_kinds,
    required_question_sets,
)
from pipeline.stages import questions as qstage
from pipeline.stages.answers import plan_answers, run_answers
from pipeline.stages.engine_stage import StageReport
from pipeline.stages.evidence import run_evidence
from pipeline.stages.judge import run_judge
from pipeline.stages.scores import question_records, score_items


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
    return any(m in HOLISTIC_METRICS or m == "depict" or m.endswith("+vqascore") for m in metric_ids)


def obtain_questions(items: pl.DataFrame, shipped: pl.DataFrame | None, cfg: ResolvedConfig, out: Scored) -> dict[str, pl.DataFrame]:
    """Questions for every backbone: shipped with the benchmark, or generated once per caption."""
    s, q = cfg.sweep, cfg.sweep.questions
    sets = required_question_sets(s)
    if q.source == "benchmark":
        questions, errors = qstage.provided_questions(items, shipped, sets)
        out.errors.append(errors)
        out.questions = questions
        return {b: questions for b in s.backbones}
    generators = s.backbones if q.per_backbone else [q.generator]
    generated = {}
    for name in generators:
        generated[name], report = qstage.generated_questions(items, sets, cfg.backbones[name], cfg.prompts, s.store, s.compute, q.max_questions)
        out.reports.append(report)
        out.errors.append(report.errors)
    out.questions = pl.concat(list(generated.values()))
    return {b: generated[b if q.per_backbone else q.generator] for b in s.backbones}


def score_items_all_backbones(items: pl.DataFrame, shipped: pl.DataFrame | None, cfg: ResolvedConfig, out_dir: str, timings: Timings) -> Scored:
    """Questions, answers and scores for every backbone; writes questions, scores/ and records/."""
    s = cfg.sweep
    out = Scored(questions=pl.from_arrow(schema.QUESTIONS.empty_table()), scores=pl.from_arrow(schema.SCORES.empty_table()))
    with timings("questions"):
        questions_by_backbone = obtain_questions(items, shipped, cfg, out)
        st.write_table(f"{out_dir}/questions.parquet", schema.conform(out.questions.to_arrow(), schema.QUESTIONS))

    sets = required_question_sets(s)
    holistic = needs_holistic(s.metrics)
    frames = []
    for name in s.backbones:  # one backbone at a time: its engine is loaded once and serves everything
        backbone = cfg.backbones[name]
        with timings("requests"):
            plan = plan_answers(items, questions_by_backbone[name], backbone, cfg.prompts, sets, holistic)
        with timings("answers"):
            answers, report = run_answers(plan, backbone, cfg.prompts, s.store, s.compute)
        out.reports.append(report)
        out.errors.append(report.errors)
        with timings("scores"):
            scores = score_items(items, plan, answers, backbone=name, metric_ids=[m for m in s.metrics if is_answer_metric(m)], lam=s.lam, probability=s.probability)
            st.write_table(f"{out_dir}/scores/{name}.parquet", scores.to_arrow())
            records = question_records(plan, answers, name)
            if records.height:
                st.write_table(f"{out_dir}/records/{name}.parquet", records.to_arrow())
        scores = add_evidence_and_judge(items, plan, answers, scores, backbone, cfg, out_dir, timings, out)
        frames.append(scores)
    if frames:
        out.scores = pl.concat(frames)
    return out


def add_evidence_and_judge(items: pl.DataFrame, plan, answers: pl.DataFrame, scores: pl.DataFrame, backbone, cfg: ResolvedConfig, out_dir: str, timings: Timings, out: Scored) -> pl.DataFrame:
    """Evidence checks (grounding, views, deltas) and the VLM judge for one backbone, after its
    answers and scores: their metric rows join the backbone's scores (rewritten if any)."""
    s = cfg.sweep
    extra = []
    evidence = run_evidence(items, plan, answers, scores, backbone, cfg, out_dir, timings)
    out.reports += evidence.reports
    out.errors += evidence.errors
    extra.append(evidence.scores)
    kinds = judge_kinds(s)
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
    st.write_table(f"{out_dir}/scores/{backbone.name}.parquet", scores.to_arrow())
    return scores
