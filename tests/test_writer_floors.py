"""The question-writing stage measured against the demo world: written by a model, keyed,
cached and parsed by the production code, every caption's sets must be the world's. Each
corruption of that path (a template asking for another format, a parser reading one format as
another, DSG parents dropped, generations joined to another caption) fails a named floor.

The writer here is the oracle backbone, which writes what a faithful writer writes, so a
failure is the pipeline's, never the model's. (A template asking for another format needs a
writer that reads the template's words; the oracle reads back which of the run's templates
filled a prompt, so that corruption is a test of the micro writer.)"""
from __future__ import annotations

import pytest
from mutation import mutated

from pipeline import micro_vlm_writing
from pipeline.config import load_config
from pipeline.stages import ingest, questions

pytestmark = pytest.mark.slow
SETS = ["depict", "dsg", "claims"]
FLOORS = micro_vlm_writing.FLOORS


def written(tmp_path, cfg=None):
    cfg = cfg or load_config([f"root={tmp_path}", "sweep=demo", "backbones=[oracle]", "benchmarks=[demo]",
                              "questions.source=model", "questions.generator=oracle", "compute.progress_bars=false"])
    items, _, _ = ingest.load_items(cfg.benchmarks)
    found, report = questions.generated_questions(items, SETS, cfg.backbones["oracle"], cfg.prompts, cfg.sweep.store,
                                                  cfg.sweep.compute, cfg.sweep.questions.max_questions)
    captions = items["caption"].unique(maintain_order=True).to_list()
    return micro_vlm_writing.question_match(found, captions, SETS), report


def below_floor(match: dict) -> list[str]:
    return [f"{qset} {name} {row[name]} < {FLOORS[name]}" for qset, row in match.items() for name in ("parse", "exact")
            if row[name] < FLOORS[name]]


def test_the_written_sets_are_the_worlds_and_a_rerun_writes_nothing(ray_session, tmp_path):
    match, report = written(tmp_path)
    assert not below_floor(match), match
    assert report.sent == 3 * match["depict"]["n"]
    _, again = written(tmp_path)
    assert again.sent == 0 and again.cached == report.sent


@pytest.mark.parametrize("old,new,floor", [
    ('return questions_rows("dsg", parse_dsg(', 'return questions_rows("dsg", parse_questions(', "dsg parse"),
    ('return questions_rows("claims", parse_claims(', 'return questions_rows("depict", parse_questions(', "claims parse"),
], ids=["dsg-read-as-a-list", "claims-read-as-questions"])
def test_a_parser_reading_one_format_as_another_fails_the_floor(ray_session, tmp_path, old, new, floor):
    with mutated(questions, old, new):
        match, _ = written(tmp_path)
    assert floor in " ".join(below_floor(match)), match


def test_dsg_parents_dropped_by_the_parser_fail_the_exact_floor(ray_session, tmp_path):
    from operators import parsing

    with mutated(parsing, "questions.append(DsgQuestion(qid, question, tuple(resolved)))", "questions.append(DsgQuestion(qid, question, ()))"):
        match, _ = written(tmp_path)
    assert below_floor(match) == [f"dsg exact {match['dsg']['exact']} < {FLOORS['exact']}"], match


def test_generations_joined_to_another_caption_fail_the_exact_floor(ray_session, tmp_path):
    with mutated(questions, 'out = located.select("_g", "caption")', 'out = located.select("_g", pl.col("caption").shift(1, fill_value=pl.col("caption").last()))'):
        match, _ = written(tmp_path)
    assert {line.split()[0] for line in below_floor(match)} == set(SETS), match
