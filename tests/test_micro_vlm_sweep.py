"""The default run tests the method, not only the answers: `python jobs/sweep.py` (the large demo,
its questions written by builtin:micro-writer, a quarter of them about what their captions leave
open, scored by builtin:micro-vlm beside the world-truth `oracle`, with the VLM-as-judge baseline)
writes the world's question sets, meets named floors, and each plausible bug
inside a formula, or in how the pipeline pairs an answer with its item's image, makes one of them
fail.

The bugs are made in the production code the pipeline calls (tests/mutation.py edits one line of
the module and swaps the changed functions' code in place), then the sweep is rerun on the stored
answers (0 sent): only the formulas and the joins run again.

With random weights (sweep=smoke) these checks would pass or fail by chance; with the trained model
and the oracle they measure whether the pipeline asks, stores, joins and combines what it claims to.
The values measured with the shipped model are in MEASURED.
"""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import polars as pl
import pytest
from mutation import mutated

from operators.metrics import decomposed, holistic
from pipeline.config import load_config
from pipeline.micro_vlm_training import _demo_world_index, record_truths
from pipeline.micro_vlm_writing import question_match, writing_floors
from pipeline.sweep import run_sweep

pytestmark = pytest.mark.slow

FAST = ["compute.progress_bars=false", "bootstrap.n_resamples=200"]
RERUN = ["bootstrap.n_resamples=10", "backbones=[micro]", "benchmarks=[demo_large,demo_large_winoground]"]  # what the floors read

# Named floors the default run meets and each mutation below breaks (micro's answers).
FLOORS = {
    "depict_srcc": 0.85,  # DEPICT ranks demo_large's 192 pairs as the simulated raters do
    "soft_tifa_srcc": 0.35,  # Soft-TIFA, which expects Yes everywhere, still follows the ratings
    "agree_on_true_captions": 0.95,  # a caption true of its image is not marked down for what it leaves open
    "depict_winoground": 0.99,  # DEPICT wins every Winoground-style group
}
# Measured with the shipped model: the default run, then each mutation (scripts in the closing notes).
MEASURED = {"depict_srcc": 0.928, "soft_tifa_srcc": 0.566, "agree_on_true_captions": 0.991, "depict_winoground": 1.0}


def accuracy(records: pl.DataFrame, side: str) -> float:
    """Share of decided DEPICT questions whose answer on `side` (v: image, t: caption alone) is right."""
    rows = records.filter(pl.col("question_set") == "depict", pl.col(f"truth_{side}").is_not_null())
    said_yes = pl.col(f"logp_yes_{side}") > pl.col(f"logp_no_{side}")
    return rows.select((said_yes == pl.col(f"truth_{side}")).mean()).item()


def open_gap(records: pl.DataFrame) -> float:
    """Median distance from 0.5 of the caption-only P(yes) on questions the caption leaves open."""
    rows = records.filter(pl.col("question_set") == "depict", pl.col("truth_t").is_null())
    p_t = 1 / (1 + (pl.col("logp_no_t") - pl.col("logp_yes_t")).exp())
    return rows.select((p_t - 0.5).abs().median()).item()


def true_captions(run_dir: Path) -> pl.DataFrame:
    """Each item with whether its caption holds entirely on its own image (read from the item's
    image hash, computed at ingest: what the pipeline joins answers through is checked, not used)."""
    scenes, caption_of, _ = _demo_world_index()
    items = pl.read_parquet(run_dir / "items.parquet")
    holds = [all(f.holds(scenes[h]) for f in caption_of[c].facts) for h, c in zip(items["image_hash"], items["caption"], strict=True)]
    return items.select("item_id").with_columns(true_caption=pl.Series(holds))


def floors(result, backbone: str = "micro") -> dict[str, float]:
    """The named floors' values of a finished run, for one backbone."""
    run_dir = Path(result.run_dir)
    stats = result.statistics.filter(pl.col("backbone") == backbone, pl.col("subset") == "all")
    srcc = dict(stats.filter(pl.col("benchmark") == "demo_large", pl.col("statistic") == "srcc").select("metric", "value").iter_rows())
    groups = dict(stats.filter(pl.col("benchmark") == "demo_large_winoground", pl.col("statistic") == "group_acc")
                  .select("metric", "value").iter_rows())
    scores = pl.read_parquet(run_dir / "scores" / f"{backbone}.parquet").filter(pl.col("benchmark") == "demo_large")
    wide = scores.pivot(on="metric", index="item_id", values="score").join(true_captions(run_dir), on="item_id")
    return {
        "depict_srcc": srcc["depict"],
        "soft_tifa_srcc": srcc["soft_tifa_am"],
        "agree_on_true_captions": wide.filter(pl.col("true_caption"))["agree"].mean(),
        "depict_winoground": groups["depict"],
    }


def broken(values: dict[str, float]) -> set[str]:
    return {name for name, floor in FLOORS.items() if values[name] < floor}


@pytest.fixture(scope="module")
def default_run(ray_session, tmp_path_factory):
    root = tmp_path_factory.mktemp("default_run")
    cfg = load_config([f"root={root}", *FAST])
    # what `python jobs/sweep.py` runs
    assert cfg.sweep.name == "demo" and cfg.sweep.backbones == ["micro", "oracle"] and cfg.sweep.questions.open_share == 0.25
    assert list(cfg.benchmarks) == ["demo_large", "demo_large_winoground", "demo_large_mcq"]
    assert "judge_holistic" in cfg.sweep.metrics
    assert cfg.sweep.questions.source == "model" and cfg.sweep.questions.generator == "micro-writer"
    result = run_sweep(cfg)
    return root, result


def rerun(default_run, out: Path):
    root, _ = default_run
    result = run_sweep(load_config([f"root={out}", f"store={root}/store", *FAST, *RERUN]))
    sent = {r.stage: r.sent for r in result.reports}
    assert sent["questions"] == sent["answers"] == sent["judge"] == 0  # the stored generations, answers and verdicts, read again
    return result


def test_the_judge_metric_prints_as_numbers_with_intervals(default_run):
    """The judge baseline in the default's table: each backbone's holistic verdicts as numbers with
    their bootstrap intervals, every verdict valid, and the micro model's following the ratings."""
    _, result = default_run
    summary = (Path(result.run_dir) / "summary.txt").read_text()
    for backbone in ("micro", "oracle"):
        assert re.search(rf"\| {backbone} +\| judge_holistic +\| \d\.\d{{3}} \[\d\.\d{{3}}, \d\.\d{{3}}\]", summary), backbone
    stats = result.statistics.filter(pl.col("benchmark") == "demo_large", pl.col("statistic") == "srcc", pl.col("subset") == "all")
    judged = dict(stats.filter(pl.col("metric") == "judge_holistic").select("backbone", "value").iter_rows())
    assert judged["oracle"] >= 0.9 and judged["micro"] >= 0.6, judged  # measured: 0.946 and 0.784
    invalid = result.errors.filter(pl.col("stage") == "judge")  # kept with the text written, never a score
    assert set(invalid["source"]) <= {"micro"} and invalid["detail"].str.contains("| output: ", literal=True).all()
    assert invalid.height <= 4, invalid  # measured: 1 of 414 (the micro judge refused a caption it could read)


def judge_free(errors: pl.DataFrame) -> pl.DataFrame:
    """Error rows other than the judge's invalid verdicts and the metaeval's note of the items they leave out."""
    return errors.filter(pl.col("stage") != "judge", ~pl.col("detail").str.starts_with("micro/judge_holistic:"))


def test_the_default_writes_the_worlds_question_sets(default_run):
    """micro-writer's sets for the demo's own captions (content it never saw in training), read
    by the production parsers from the run's questions table, against the world's."""
    _, result = default_run
    questions = pl.read_parquet(Path(result.run_dir) / "questions.parquet")
    captions = pl.read_parquet(Path(result.run_dir) / "items.parquet")["caption"].unique().to_list()
    assert set(questions["source"]) == {"micro-writer"}
    match = question_match(questions, captions, ["depict", "dsg"])
    assert all(writing_floors(match).values()), match  # measured: parse 1.000 each, exact 0.995 (depict), 0.989 (dsg)
    sent = {r.stage: r.sent for r in result.reports}
    assert sent["questions"] == 2 * len(captions)  # one generation per caption and set


def test_the_default_runs_answers_agree_with_the_demo_worlds_truth(default_run):
    _, result = default_run
    assert judge_free(result.errors).height == 0, result.errors
    written = pl.read_parquet(Path(result.run_dir) / "records" / "micro.parquet")
    records = record_truths(written, known_only=True)  # a question the writer got wrong has no truth
    assert records.height >= 0.97 * written.height, (records.height, written.height)
    assert records["logp_yes_v"].null_count() == 0 and records["truth_t"].null_count() > 0  # open questions asked
    assert accuracy(records, "v") >= 0.95, accuracy(records, "v")
    assert accuracy(records, "t") >= 0.95, accuracy(records, "t")
    assert open_gap(records) <= 0.15, open_gap(records)
    oracle = record_truths(pl.read_parquet(Path(result.run_dir) / "records" / "oracle.parquet"), known_only=True)
    assert accuracy(oracle, "v") == accuracy(oracle, "t") == 1.0 and open_gap(oracle) == 0.0
    summary = (Path(result.run_dir) / "summary.txt").read_text()
    assert "LOW" not in summary and "WARNING" not in summary  # the model answers yes or no


def test_the_default_run_meets_every_floor(default_run):
    _, result = default_run
    values = floors(result)
    assert not broken(values), values
    stats = result.statistics.filter(pl.col("benchmark") == "demo_large", pl.col("statistic") == "srcc", pl.col("subset") == "all")
    row = stats.filter(pl.col("backbone") == "micro", pl.col("metric") == "depict").row(0, named=True)
    summary = (Path(result.run_dir) / "summary.txt").read_text()
    assert f"| micro    | depict                    | {row['value']:.3f} [{row['ci_low']:.3f}," in summary


def test_depict_handles_negated_captions_where_fixed_yes_baselines_cannot(default_run):
    """The method's claim on NegBench-style items: a caption that says something is absent
    implies the answer No, which DEPICT reads from p_t and Soft-TIFA (expecting Yes) cannot."""
    _, result = default_run
    mcq = result.statistics.filter(pl.col("benchmark") == "demo_large_mcq", pl.col("statistic") == "accuracy",
                                   pl.col("subset") == "all", pl.col("backbone") == "micro")
    accuracy_of = dict(mcq.select("metric", "value").iter_rows())
    assert accuracy_of["depict"] >= 0.85, accuracy_of
    assert accuracy_of["depict"] - max(accuracy_of["soft_tifa_am"], accuracy_of["hard_fixed_yes"]) >= 0.4, accuracy_of


def test_caption_only_prompts_given_the_image_break_the_caption_floor(ray_session, tmp_path, monkeypatch):
    """The mutation: each caption-only request goes out with an image of an item of its caption
    (as if the planner kept the first item's image on the deduplicated request), so p_t reads
    the picture instead of the words."""
    from operators.engines.hf import HFEngine
    from operators.images import decode_image
    from pipeline.stages import executor, ingest

    cfg = load_config([f"root={tmp_path}", *FAST, "benchmarks=[demo]", "backbones=[micro]", "bootstrap.n_resamples=10"])
    items = ingest.load_items(cfg.benchmarks)[0]
    image_of = dict(items.group_by("caption", maintain_order=True).agg(pl.col("image_uri").first()).iter_rows())
    answer = HFEngine.score_yes_no

    def shown_the_image(self, prompts):
        def with_image(prompt):
            if prompt.image is not None:
                return prompt
            uri = image_of[re.search(r'"(.*)"', prompt.user).group(1)]  # the caption the template quotes
            return dataclasses.replace(prompt, image=decode_image(Path(uri).read_bytes(), uri), image_id=uri)
        return answer(self, [with_image(p) for p in prompts])

    monkeypatch.setattr(HFEngine, "score_yes_no", shown_the_image)
    with executor.running_locally(executor.LocalExecutor()):
        result = run_sweep(cfg)
    records = record_truths(pl.read_parquet(Path(result.run_dir) / "records" / "micro.parquet"), known_only=True)
    assert accuracy(records, "v") >= 0.9  # 1.00: the image requests are untouched
    assert accuracy(records, "t") < 0.8, accuracy(records, "t")  # 0.21 (1.000 unmutated)



COMMITMENT = "commitment=(2.0 * p_t - 1.0).abs(),\n        )"
MERGE = 'score = lam * pl.col("hol_score") + (1.0 - lam) * pl.col("term_score")'
SIDES = ('    p_v = yes_probability_expr("logp_yes_v", "logp_no_v", convention)\n'
         '    p_t = yes_probability_expr("logp_yes_t", "logp_no_t", convention)\n')
V, T = '"logp_yes_v", "logp_no_v"', '"logp_yes_t", "logp_no_t"'
SWAPPED = SIDES.replace(V, "<v>").replace(T, V).replace("<v>", T)  # p_v read from the caption-only answer, p_t from the image's
MUTATIONS = {
    # name: (module, production text, the bug, the floor it must break); measured values after the arrows
    # (with the 4-layer writer, whose unmutated values were depict_srcc 0.929, soft_tifa_srcc 0.570)
    "p_v and p_t swapped in DEPICT's formula": (decomposed, SIDES, SWAPPED, "agree_on_true_captions"),  # 0.991 -> 0.891
    "commitment read from p_v": (decomposed, COMMITMENT, COMMITMENT.replace("p_t", "p_v"), "agree_on_true_captions"),  # -> 0.891
    "commitment dropped (uniform weights)": (decomposed, COMMITMENT, "commitment=pl.lit(1.0),\n        )", "agree_on_true_captions"),  # -> 0.891
    "holistic merge weight inverted": (holistic, MERGE, MERGE.replace('pl.col("hol_score")', '(1.0 - pl.col("hol_score"))'),
                                       "depict_srcc"),  # 0.929 -> -0.364
    "Soft-TIFA reads p_t": (decomposed, "            p_v=p_v,\n", "            p_v=p_t,\n", "soft_tifa_srcc"),  # 0.570 -> -0.060
}
# The holistic merge dropped (DEPICT = its decomposed term alone) is not among them: with the
# shipped model the term alone already wins every Winoground-style group and ranks the pairs within
# 0.01 of the merge (agree 0.922, DEPICT 0.929), so no meaning floor can see it;
# tests/test_metrics_holistic.py's hand-computed merges catch it (4 of its tests fail).
# DSG's parents are not among them: both backbones answer a question about a thing's detail No
# when the thing is missing, so the graph changes no demo score (dsg = dsg_nodep on all 192
# pairs) and ignoring it cannot show here; tests/test_metrics_decomposed.py catches it by hand.


@pytest.mark.parametrize("name", sorted(MUTATIONS))
def test_a_bug_inside_a_formula_breaks_its_floor(default_run, tmp_path, name):
    module, text, bug, floor = MUTATIONS[name]
    with mutated(module, text, bug):
        values = floors(rerun(default_run, tmp_path))
    assert floor in broken(values), (name, values)


def test_answers_joined_to_another_items_image_break_the_ranking(default_run, tmp_path):
    """The planner pairs each (item, question) with the wrong image of its caption (the image
    hashes reversed within each caption's items): every answer is real and stored, but belongs
    to a sibling's image. The items' own hashes (ingest) stay right, and the ratings follow them."""
    from operators import requests

    plan = 'plan = items.select("item_id", "image_hash", "image_uri", "caption").join(qs, on="caption", how="inner")'
    bug = plan.replace('"image_hash", "image_uri"', 'pl.col("image_hash").reverse().over("caption"), "image_uri"')
    with mutated(requests, plan, bug):
        values = floors(rerun(default_run, tmp_path))
    assert "depict_srcc" in broken(values), values  # 0.929 -> 0.663


def test_answers_computed_in_parts_of_8_are_the_bits_of_parts_of_64(default_run, tmp_path):
    """The same request key gives the same log-probabilities whatever `compute.rows_per_part` cut
    the work into (the hf engine answers each prompt in shapes of its own on a CPU). Until a
    preflight measured it, the manifest says how to."""
    import json

    _, result = default_run
    small = run_sweep(load_config([f"root={tmp_path}", *FAST, "compute.rows_per_part=8", "backbones=[micro]", "benchmarks=[demo_large_mcq]"]))
    assert {r.stage: r.sent for r in small.reports}["answers"] > 400  # its own store: all answers afresh

    def answers(run) -> pl.DataFrame:
        records = pl.read_parquet(Path(run.run_dir) / "records" / "micro.parquet").filter(pl.col("item_id").str.starts_with("demo_large_mcq/"))
        return records.select("item_id", "question_set", "question_id", pl.col("^logp_.*$")).sort("item_id", "question_set", "question_id")

    assert answers(small).equals(answers(result))
    record = json.loads((Path(small.run_dir) / "manifest.json").read_text())["invariance"]["micro"]
    assert record["not_measured"].startswith("never measured: depict preflight backbones=[micro]")
