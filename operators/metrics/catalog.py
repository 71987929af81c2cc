"""Every metric a run can request, one row each: the single list of metric ids.

The formula modules beside this one compute the rows of their family; configs are validated,
stages chosen and report tables labelled from these rows, so adding a metric is its row here
plus its formula (docs/DESIGN.md, "Recipes"). Merges are not rows: any `mergeable` metric
is also requested as `<id>+vqascore` (lam * VQAScore + (1 - lam) * the metric), and the row
`depict` names the merge `agree+vqascore` (docs/method.md, "DEPICT score").

Pure data and small lookups: nothing here imports polars, so configs can be checked cheaply.
"""
from __future__ import annotations

from dataclasses import dataclass

# What a metric is computed from, i.e. which stage produces its rows.
YES_NO = "yes_no"  # stored yes/no answers, by the scores stage (operators.metrics.score_all)
DETECTIONS = "detections"  # detector boxes, by the evidence stage (grounding)
JUDGE = "judge"  # judge generations, by the judge stage
ANSWER_KINDS = (YES_NO, DETECTIONS, JUDGE)

MERGE_PARTNER = "vqascore"  # the holistic metric every merge blends in
MERGE_LABEL = "VQA"  # how a merge's partner reads in a label: "Soft-TIFA-AM+VQA"


@dataclass(frozen=True)
class Metric:
    """One requestable metric id and what the pipeline needs to know about it."""

    id: str
    family: str  # the formula that computes it: depict, dsg, holistic, claims, grounding, judge, merge
    question_set: str | None  # the question set it reads (operators.schema.QUESTION_SETS), None: none
    answer_kind: str  # one of ANSWER_KINDS
    mergeable: bool  # `<id>+vqascore` is a metric too
    label: str  # how report tables name it
    description: str
    judge_kind: str | None = None  # judge metrics: the judge kind whose generations it reads (operators.judge_output)
    merge_of: str | None = None  # a name for this merge id, e.g. depict is agree+vqascore


METRICS: tuple[Metric, ...] = (
    Metric("depict", "merge", "depict", YES_NO, False, "DEPICT",
           "lam * VQAScore + (1 - lam) * Agree, lam 0.5 unless the sweep sets lam: the method's score", merge_of="agree+vqascore"),
    Metric("agree", "depict", "depict", YES_NO, True, "Agree",
           "commitment-weighted agreement of image and caption-only answers"),
    Metric("agree_unweighted", "depict", "depict", YES_NO, True, "Agree (unweighted)",
           "mean agreement of image and caption-only answers"),
    Metric("soft_tifa_am", "depict", "depict", YES_NO, True, "Soft-TIFA-AM",
           "arithmetic mean of P(yes | image) (the fixed-yes assumption)"),
    Metric("soft_tifa_gm", "depict", "depict", YES_NO, True, "Soft-TIFA-GM",
           "geometric mean of P(yes | image) (the fixed-yes assumption)"),
    Metric("hard_fixed_yes", "depict", "depict", YES_NO, True, "Hard fixed-yes",
           "share of questions answered yes on the image"),
    Metric("mean_commitment", "depict", "depict", YES_NO, False, "Mean commitment",
           "diagnostic: how firmly the caption alone settles its questions"),
    Metric("dsg", "dsg", "dsg", YES_NO, True, "DSG",
           "DSG questions, hard answers, children of a 'no' parent scored 0"),
    Metric("dsg_nodep", "dsg", "dsg", YES_NO, True, "DSG (no dependencies)",
           "DSG questions, hard answers, dependency graph ignored"),
    Metric("vqascore", "holistic", None, YES_NO, False, "VQAScore",
           "P(yes) for the whole caption on the image, sigmoid(lp_yes - lp_no)"),
    Metric("vqascore_raw", "holistic", None, YES_NO, False, "VQAScore (raw)",
           "P(yes) for the whole caption on the image, exp(lp_yes)"),
    Metric("claim_mean_am", "claims", "claims", YES_NO, True, "Claim mean (AM)",
           "arithmetic mean of typed claims' P(true | image)"),
    Metric("claim_mean_gm", "claims", "claims", YES_NO, True, "Claim mean (GM)",
           "geometric mean of typed claims' P(true | image)"),
    Metric("claim_mean_hm", "claims", "claims", YES_NO, True, "Claim mean (HM)",
           "harmonic mean of typed claims' P(true | image)"),
    Metric("claim_mean_min", "claims", "claims", YES_NO, True, "Claim mean (min)",
           "least likely typed claim's P(true | image)"),
    Metric("grounding_only", "grounding", "claims", DETECTIONS, True, "Grounding only",
           "detector support of the typed claims, (M/N) * geometric mean of s"),
    Metric("judge_holistic", "judge", None, JUDGE, False, "Judge (holistic)",
           "VLM-as-judge rubric score of the whole caption", judge_kind="holistic"),
    Metric("judge_decomposed", "judge", None, JUDGE, False, "Judge (decomposed)",
           "VLM-as-judge per-claim JSON, its overall score", judge_kind="decomposed"),
)
BY_ID: dict[str, Metric] = {m.id: m for m in METRICS}

# What a sweep computes when its config names no metrics, and what it compares.
DEFAULT_METRICS = (
    "depict", "agree", "agree_unweighted", "agree_unweighted+vqascore", "soft_tifa_am", "soft_tifa_gm",
    "soft_tifa_am+vqascore", "hard_fixed_yes", "dsg", "dsg_nodep", "vqascore", "vqascore_raw", "mean_commitment",
)
DEFAULT_TARGET = "depict"
DEFAULT_BASELINES = ("dsg", "soft_tifa_am", "vqascore")


def ids(family: str | None = None, *, answer_kind: str | None = None, mergeable: bool | None = None) -> tuple[str, ...]:
    """Row ids in catalog order, optionally only those of one family / answer kind / mergeability."""
    return tuple(
        m.id for m in METRICS
        if (family is None or m.family == family)
        and (answer_kind is None or m.answer_kind == answer_kind)
        and (mergeable is None or m.mergeable == mergeable)
    )


MERGE_TERMS = ids(mergeable=True)


def merged_id(term: str, partner: str = MERGE_PARTNER) -> str:
    return f"{term}+{partner}"


def names_of_merge(merge: str) -> list[str]:
    """Other ids a merge id is also emitted under (`agree+vqascore` is also `depict`)."""
    return [m.id for m in METRICS if m.merge_of == merge]


def all_ids() -> tuple[str, ...]:
    """Every id a run may request: the rows, then each mergeable row merged with VQAScore."""
    return (*ids(), *(merged_id(term) for term in MERGE_TERMS))


def _row(metric: str) -> Metric | None:
    """The row of a metric id, or of the term of a merge id (None when unknown)."""
    if metric in BY_ID:
        return BY_ID[metric]
    term, plus, partner = metric.partition("+")
    row = BY_ID.get(term)
    return row if plus and partner == MERGE_PARTNER and row is not None and row.mergeable else None


def is_known(metric: str) -> bool:
    return _row(metric) is not None


def question_set(metric: str) -> str | None:
    """The question set a metric needs (None for holistic and judge metrics, or an unknown id)."""
    row = _row(metric)
    return row.question_set if row else None


def answer_kind(metric: str) -> str | None:
    row = _row(metric)
    return row.answer_kind if row else None


def is_yes_no(metric: str) -> bool:
    """Computed from yes/no answers by the scores stage (not by the grounding or judge stages)."""
    return answer_kind(metric) == YES_NO


def needs_detections(metric: str) -> bool:
    """Read from detector boxes: requesting it runs grounding."""
    return answer_kind(metric) == DETECTIONS


def judge_kind(metric: str) -> str | None:
    """The judge kind a judge metric reads (None for every other metric)."""
    row = BY_ID.get(metric)
    return row.judge_kind if row else None


def reads_holistic(metric: str) -> bool:
    """Needs the holistic (whole-caption) answers: VQAScore itself or any merge with it."""
    row = _row(metric)
    return row is not None and (row.family in ("holistic", "merge") or metric != row.id)


def label(metric: str) -> str:
    """The report tables' name for a metric id (the id itself when unknown)."""
    row = _row(metric)
    if row is None:
        return metric
    return row.label if row.id == metric else f"{row.label}+{MERGE_LABEL}"
