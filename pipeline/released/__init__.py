"""Readers for released per-item files, so published tables can be reproduced from them.

One module per source; each `load(...)` returns a `Released` bundle that
`pipeline.metaeval.evaluate_released` (and `jobs/metaeval.py released=<source>`) evaluates:
- `dsg`: DSG's per-question VQA answers (j-min/DSG `vqa_answers_release/*.csv`), scored with
  our DSG scorer (`operators.metrics.decomposed.dsg_scores`, DSG's dependency rule), against
  the TIFA160 Likert ratings (`tifa160-likert-anns.csv`);
- `tifa`: TIFA's `human_annotations_with_scores.json` (per-image human average and the
  scores of several metrics);
- `genai_bench`: a per-image score table (prompt id, generator, one column per metric)
  against GenAI-Bench's `genai_image.json` ratings.
Every bad row is recorded in `problems` (file, row, field) and skipped, never scored 0.
"""
from __future__ import annotations

from pipeline.released.release_files import Released

SOURCES = ("dsg", "tifa", "genai_bench")

__all__ = ["SOURCES", "Released", "load"]


def load(source: str, scores: str, human: str | None = None, **options) -> Released:
    """Load released files of `source` (one of SOURCES)."""
    if source == "dsg":
        from pipeline.released import dsg

        return dsg.load(scores, human, **options)
    if source == "tifa":
        from pipeline.released import tifa

        return tifa.load(scores, **options)
    if source == "genai_bench":
        from pipeline.released import genai_bench_scores

        return genai_bench_scores.load(scores, human, **options)
    raise ValueError(f"released source must be one of {SOURCES}, got {source!r}")
