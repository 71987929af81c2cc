"""The shipped micro VLM as a question writer, through the production questions stage
(pipeline/stages/questions.py: keyed generations, cached, parsed by the production parsers).

A caption with a word the writer was never taught must come back as an error row naming that
caption, never as an empty question set: a caption with no questions would score as perfectly
faithful (nothing asked, nothing wrong). The writer was taught to say it cannot read such a
caption (operators/demo_generations.py `REFUSAL`), which no parser accepts."""
from __future__ import annotations

import dataclasses

import polars as pl
import pytest

from operators.demo_generations import REFUSAL
from pipeline.config import load_config
from pipeline.stages import questions

pytestmark = pytest.mark.slow
KNOWN = "a red circle left of a blue square"
UNSEEN = ["a purple hexagon", "a red circle and a dog", "two blue zorbles"]  # a word outside the world in each


def test_a_caption_with_an_unseen_word_is_an_error_row_not_an_empty_question_set(ray_session, tmp_path):
    cfg = load_config([f"root={tmp_path}", "backbones=[micro]", "compute.progress_bars=false"])
    # micro.yaml does not offer micro as a question writer (its writing is under the floors of
    # pipeline/micro_vlm_writing.py); its refusals are what this test reads
    writer = dataclasses.replace(cfg.backbones["micro"], writes_questions=True)
    captions = [KNOWN, *UNSEEN]
    items = pl.DataFrame({"item_id": [f"t/{i}" for i in range(len(captions))], "benchmark": ["t"] * len(captions), "caption": captions})
    found, report = questions.generated_questions(items, ["depict", "dsg", "claims"], writer, cfg.prompts, cfg.sweep.store,
                                                  cfg.sweep.compute, cfg.sweep.questions.max_questions)
    assert set(found["caption"]) == {KNOWN} and set(found.filter(pl.col("caption") == KNOWN)["question_set"]) == {"depict", "dsg", "claims"}
    errors = pl.from_arrow(report.errors)
    assert errors.height == 3 * len(UNSEEN) and set(errors["reason"]) == {"unparseable_generation"}
    for caption in UNSEEN:  # each set of each such caption: its own row, naming the caption and what was written
        mine = errors.filter(pl.col("detail").str.contains(f"caption: {caption!r}", literal=True))
        assert sorted(mine["field"]) == ["claims", "dsg", "questions"] and mine["detail"].str.contains(REFUSAL[:40], literal=True).all()
