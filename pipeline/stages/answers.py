"""Answers: one backbone's unique yes/no requests, computed once and cached for good."""
from __future__ import annotations

from dataclasses import dataclass, field, fields

import polars as pl
import pyarrow as pa

from operators import answer_mass, schema
from operators.answering import ANSWER_TEMPLATES
from operators.engines.spec import BackboneSpec
from operators.requests import KeySpec, plan_holistic, plan_questions, unique_requests
from pipeline.config import ComputeSpec, PromptSet
from pipeline.stages.engine_stage import StageReport, run_and_read
from pipeline.stages.engine_workers import AnswerWorker
from pipeline.stages.placement import engine_pool
from pipeline.store.parts import PartStore


@dataclass
class AnswerPlan:
    """Which request answers which (item, question): what scoring joins answers through."""

    questions: pl.DataFrame | None  # operators.requests.plan_questions
    holistic: pl.DataFrame | None  # operators.requests.plan_holistic
    requests: pa.Table  # operators.schema.REQUESTS, one row per distinct key


def key_spec(backbone: BackboneSpec, prompts: PromptSet) -> KeySpec:
    return KeySpec(
        backbone=backbone.name,
        fingerprint=backbone.fingerprint(),
        prompt_ids={kind: prompts.prompt_id(template) for kind, (template, _) in ANSWER_TEMPLATES.items() if template in prompts.templates},
    )


def plan_answers(items: pl.DataFrame, questions: pl.DataFrame, backbone: BackboneSpec, prompts: PromptSet, sets: list[str], holistic: bool) -> AnswerPlan:
    spec = key_spec(backbone, prompts)
    qplan = plan_questions(items, questions, spec, sets) if sets else None
    hplan = plan_holistic(items, spec) if holistic else None
    return AnswerPlan(questions=qplan, holistic=hplan, requests=unique_requests(spec, qplan, hplan))


def answer_store(store_url: str, backbone: BackboneSpec) -> PartStore:
    return PartStore(f"{store_url}/answers/{backbone.name}", schema.ANSWERS)


@dataclass
class AnswerReport(StageReport):
    """A StageReport plus the answer-mass summary of the answers this unit needed."""

    answer_mass: pl.DataFrame | None = field(default=None, repr=False)  # kind, n, median, p5

    def mass_lines(self) -> list[str]:
        """The run summary's answer-mass lines (and warning) for this unit."""
        if self.answer_mass is None or self.answer_mass.height == 0:
            return []
        return answer_mass.summary_lines(self.unit, self.answer_mass)


def run_answers(plan: AnswerPlan, backbone: BackboneSpec, prompts: PromptSet, store_url: str, compute: ComputeSpec) -> tuple[pl.DataFrame, StageReport]:
    """Compute the missing answers; return every needed answer (key, logp_yes, logp_no).

    Every needed key is either returned or has an error row in the report (run_and_read).
    The report also summarises the answer mass of those answers per request kind. It is
    computed from the two log-probabilities (the stored `answer_mass` is the same sum), so answers
    cached before that column existed are summarised too.
    """
    store = answer_store(store_url, backbone)
    stored, report = run_and_read(
        columns=["key", "logp_yes", "logp_no"],
        stage="answers",
        unit=backbone.name,
        requests=plan.requests,
        store=store,
        worker_cls=AnswerWorker,
        worker_kwargs={"backbone": backbone, "templates": prompts.templates, "store_url": store.url},
        pool=engine_pool(backbone, compute),
    )
    answers = pl.from_arrow(stored)
    needed = pl.from_arrow(plan.requests.select(["key", "kind"]))
    masses = answers.join(needed, on="key").select("kind", answer_mass=pl.col("logp_yes").exp() + pl.col("logp_no").exp())
    report = AnswerReport(**{f.name: getattr(report, f.name) for f in fields(StageReport)}, answer_mass=answer_mass.summarize(masses))
    return answers, report
