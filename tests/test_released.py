"""Readers of released per-item files (DSG answers, TIFA scores, GenAI-Bench scores), end to end.

Fixtures are written in exactly the public repositories' formats (column names, id schemes,
answer spellings, quoted comma-separated dependency ids).
"""
from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest
from scipy import stats

from jobs.metaeval import main as metaeval_main
from pipeline.metaeval import evaluate_released
from pipeline.released import dsg, genai_bench_scores, tifa
from pipeline.stats.pairwise import pairwise_accuracy

ANSWERS_HEADER = "dsg_prompt_split,qg_model,t2i_model,item_id,question,question_id,dependency_id,answer\n"
# tifa160_0: q2 "no" zeroes q3 (parent 2) and q4 (parents "1,2"); tifa160_1: an odd answer
# ("no bus") for the root; tifa160_2 has no rows at all, in both generators (DSG gives 0); tifa160_3 has an
# unreadable dependency id, which DSG's scorer answers by ignoring that image's dependencies.
ANSWER_ROWS = [
    'tifa160,dsg,mini-dalle,tifa160_0,Is there a tree?,1,0,yes',
    'tifa160,dsg,mini-dalle,tifa160_0,Are there lights?,2,1,no',
    'tifa160,dsg,mini-dalle,tifa160_0,Are the lights bright?,3,2,yes',
    'tifa160,dsg,mini-dalle,tifa160_0,Are the lights on the tree?,4,"1,2",yes',
    'tifa160,dsg,mini-dalle,tifa160_1,Is there a bus?,1,0,no bus',
    'tifa160,dsg,mini-dalle,tifa160_1,Is the bus red?,2,1,yes',
    'tifa160,dsg,sd2dot1,tifa160_0,Is there a tree?,1,0,yes',
    'tifa160,dsg,sd2dot1,tifa160_0,Are there lights?,2,1,yes',
    'tifa160,dsg,sd2dot1,tifa160_0,Are the lights bright?,3,2,yes',
    'tifa160,dsg,sd2dot1,tifa160_0,Are the lights on the tree?,4,"1,2",no',
    'tifa160,dsg,sd2dot1,tifa160_1,Is there a bus?,1,0,yes',
    'tifa160,dsg,sd2dot1,tifa160_1,Is the bus red?,2,1,yes',
    'tifa160,dsg,sd2dot1,tifa160_3,Is there a man?,1,0,no',
    'tifa160,dsg,sd2dot1,tifa160_3,Is the man outside?,2,"1, outside",yes',
    'drawtext,dsg,sd2dot1,drawtext_9,Is there a word?,1,0,yes',
]
LIKERT_HEADER = "dsg_prompt_split,t2i_model,item_id,source_id,worker_id,question,answer\n"
LIKERT = {
    ("mini-dalle", "tifa160_0"): [2, 3], ("mini-dalle", "tifa160_1"): [1, 2], ("mini-dalle", "tifa160_2"): [1, 1],
    ("sd2dot1", "tifa160_0"): [4, 5], ("sd2dot1", "tifa160_1"): [5, 5], ("sd2dot1", "tifa160_2"): [3, 2],
    ("sd2dot1", "tifa160_3"): [3, 4],
}  # fmt: skip
EXPECTED_DSG = {  # DSG's rule: score with dependencies, without
    "mini-dalle/tifa160_0": (0.25, 0.75),
    "mini-dalle/tifa160_1": (0.0, 0.5),
    "sd2dot1/tifa160_0": (0.75, 0.75),
    "sd2dot1/tifa160_1": (1.0, 1.0),
    "sd2dot1/tifa160_3": (0.5, 0.5),  # no dependencies for this image
}


@pytest.fixture
def dsg_files(tmp_path):
    answers = tmp_path / "mplug_dsg.csv"
    answers.write_text(ANSWERS_HEADER + "\n".join(ANSWER_ROWS) + "\n", encoding="utf-8")
    likert = tmp_path / "tifa160-likert-anns.csv"
    lines = [
        f"tifa160,{model},{item},partiprompt_{item[-1]},{4375840900 + w},How consistent is the image with the text description?,{r}"
        for (model, item), ratings in LIKERT.items()
        for w, r in enumerate(ratings)
    ]
    likert.write_text(LIKERT_HEADER + "\n".join(lines) + "\n", encoding="utf-8")
    return str(answers), str(likert)


def _scores(released, metric):
    frame = released.scores.filter(pl.col("metric") == metric)
    return dict(zip(frame["item_id"], frame["score"]))


def test_dsg_answers_scored_with_dependencies_by_dsg_rule(dsg_files):
    released = dsg.load(*dsg_files)
    with_dependencies, without = _scores(released, "dsg"), _scores(released, "dsg_nodep")
    for item, (dep, nodep) in EXPECTED_DSG.items():
        assert with_dependencies[item] == pytest.approx(dep) and without[item] == pytest.approx(nodep), item
    assert with_dependencies["mini-dalle/tifa160_2"] is None  # no questions: the policy decides
    assert "drawtext_9" not in " ".join(released.scores["item_id"])  # another split, not read
    assert any("1 answer(s) neither 'yes' nor 'no' scored 0" in p and "line 6" in p for p in released.problems)
    assert any("unreadable dependency_id scored without dependencies" in p for p in released.problems)


def test_strict_rule_reports_the_row_and_scores_null(dsg_files):
    rows, problems = dsg.read_answers(dsg_files[0], answer_rule="strict")
    assert any("unusable answer (e.g. line 6: 'no bus')" in p for p in problems)
    assert any("unusable dependency_id (e.g. line 15: '1, outside')" in p for p in problems)
    released = dsg.load(*dsg_files, answer_rule="strict")
    scores = _scores(released, "dsg")
    assert scores["mini-dalle/tifa160_1"] is None and scores["sd2dot1/tifa160_3"] is None
    assert scores["mini-dalle/tifa160_0"] == pytest.approx(0.25)


def test_dsg_end_to_end_with_the_no_question_policy(dsg_files):
    zero = evaluate_released("dsg", *dsg_files, n_resamples=0)
    row = zero.statistics.filter((pl.col("metric") == "dsg") & (pl.col("statistic") == "kendall"))
    assert row["n"][0] == 7  # the two images without questions count, scored 0
    assert "2 item(s) without questions scored 0 (no_questions=zero)" in row["note"][0]
    human = {f"{m}/{i}": np.mean(r) for (m, i), r in LIKERT.items()}
    ids = sorted(human)
    metric = [EXPECTED_DSG.get(i, (0.0, 0.0))[0] for i in ids]
    assert row["value"][0] == pytest.approx(stats.kendalltau(metric, [human[i] for i in ids]).statistic)

    excluded = evaluate_released("dsg", *dsg_files, n_resamples=0, no_questions="exclude")
    row = excluded.statistics.filter((pl.col("metric") == "dsg") & (pl.col("statistic") == "srcc"))
    assert row["n"][0] == 5 and "2 item(s) without questions excluded (no_questions=exclude)" in row["note"][0]


def test_dsg_files_errors_name_the_file_and_column(tmp_path, dsg_files):
    bad = tmp_path / "bad.csv"
    bad.write_text("qg_model,t2i_model,item_id,answer\ndsg,sd2dot1,tifa160_0,yes\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"bad.csv: missing column\(s\) \['dsg_prompt_split'"):
        dsg.load(str(bad), dsg_files[1])
    other = tmp_path / "mplug_tifa.csv"
    other.write_text(ANSWERS_HEADER + "tifa160,tifa,sd2dot1,tifa160_0,Is there a tree?,1,0,yes\n", encoding="utf-8")
    with pytest.raises(ValueError, match="qg_model holds \\['tifa'\\]"):
        dsg.load(str(other), dsg_files[1])


def test_cli_released_dsg(tmp_path, dsg_files, capsys):
    code = metaeval_main(
        ["released=dsg", f"scores={dsg_files[0]}", f"human={dsg_files[1]}", "n_resamples=20", f"out={tmp_path / 'out'}"]
    )
    assert code == 0
    printed = capsys.readouterr().out
    assert "kendall" in printed and "pearson" in printed and "dsg_nodep" in printed
    statistics = pl.read_csv(tmp_path / "out" / "statistics.csv")
    assert set(statistics["statistic"]) == {"srcc", "kendall", "pearson", "plcc", "pairwise_acc"}


def _tifa_file(tmp_path):
    rng = np.random.default_rng(0)
    records = {}
    for p in range(12):
        for generator in ("mini_dalle", "stable_diffusion_v1_5"):
            ratings = [int(v) for v in rng.integers(1, 6, 2)]
            records[f"coco_{p}_{generator}"] = {
                "text_id": f"coco_{p}", "image_path": f"coco_{p}_{generator}.jpg", "text": f"prompt {p}",
                "human_scores": ratings, "human_avg": float(np.mean(ratings)),
                "clipscore_vitb32": float(rng.normal(30, 2)), "tifa_mplug-large": float(rng.choice([0.5, 0.75, 1.0])),
            }  # fmt: skip
    records["coco_3_mini_dalle"]["tifa_mplug-large"] = "n/a"
    records["coco_99_mini_dalle"] = {"text_id": "coco_99", "human_scores": [], "human_avg": None}
    path = tmp_path / "human_annotations_with_scores.json"
    path.write_text(json.dumps(records), encoding="utf-8")
    return str(path), records


def test_tifa_scores_pearson_and_kendall_as_the_notebook(tmp_path):
    path, records = _tifa_file(tmp_path)
    result = evaluate_released("tifa", path, n_resamples=0)
    assert any("'coco_99_mini_dalle' field 'human_avg'" in p for p in result.problems)
    assert any("'coco_3_mini_dalle' field 'tifa_mplug-large' is not a number" in p for p in result.problems)
    usable = {k: r for k, r in records.items() if r.get("human_avg") is not None}
    human = [r["human_avg"] for r in usable.values()]
    clip = [r["clipscore_vitb32"] for r in usable.values()]
    value = result.statistics.filter((pl.col("metric") == "clipscore_vitb32") & (pl.col("statistic") == "pearson"))["value"][0]
    assert value == pytest.approx(np.corrcoef(human, clip)[0, 1], abs=1e-12)
    value = result.statistics.filter((pl.col("metric") == "clipscore_vitb32") & (pl.col("statistic") == "kendall"))["value"][0]
    assert value == pytest.approx(stats.kendalltau(human, clip).statistic, abs=1e-12)
    assert tifa.load(path).target == "tifa_mplug-large"


def test_genai_bench_scores_against_released_ratings(tmp_path):
    rng = np.random.default_rng(1)
    generators = ("DALLE_3", "SDXL_Turbo", "Midjourney_6")
    ratings = {f"{p:05d}": {"prompt": f"prompt {p}", "models": {g: [int(v) for v in rng.integers(1, 6, 3)] for g in generators}} for p in range(1, 21)}
    ratings["00004"]["models"]["SDXL_Turbo"] = [6, 2, 1]  # out of range: reported, skipped
    (tmp_path / "genai_image.json").write_text(json.dumps(ratings), encoding="utf-8")
    (tmp_path / "genai_skills.json").write_text(json.dumps({"counting": [1, 2, 3], "attribute": [4, 5]}), encoding="utf-8")
    lines = ["prompt_id,generator,vqascore,clipscore"]
    for prompt_id in ratings:
        for g in generators:
            lines.append(f"{int(prompt_id)},{g},{rng.random():.6f},{rng.random():.6f}")
    lines.append("999,DALLE_3,0.5,0.5")
    (tmp_path / "scores.csv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    released = genai_bench_scores.load(str(tmp_path / "scores.csv"), str(tmp_path / "genai_image.json"), skills=str(tmp_path / "genai_skills.json"))
    assert any("models.SDXL_Turbo" in p and "00004" in p for p in released.problems)
    assert any("2 (prompt, generator) pair(s) not rated" in p for p in released.problems)  # 00004/SDXL_Turbo, 00999
    result = evaluate_released(
        "genai_bench", str(tmp_path / "scores.csv"), str(tmp_path / "genai_image.json"),
        reader_options={"skills": str(tmp_path / "genai_skills.json")}, n_resamples=0,
    )  # fmt: skip
    joined = released.items.join(released.scores.filter(pl.col("metric") == "vqascore"), on="item_id")
    expected = pairwise_accuracy(joined["score"].to_numpy(), joined["human"].to_numpy()).value
    row = result.statistics.filter((pl.col("metric") == "vqascore") & (pl.col("statistic") == "pairwise_acc") & (pl.col("subset") == "all"))
    assert row["value"][0] == pytest.approx(expected, abs=1e-15) and row["n"][0] == 59
    assert {"advanced", "tag=counting"} <= set(result.statistics["subset"])
