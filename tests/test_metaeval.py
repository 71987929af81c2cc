"""The meta-evaluation entry points: tables, subsets, deltas, files and the CLI."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import fsspec
import numpy as np
import polars as pl
import pytest

from pipeline.config import ProtocolSpec
from pipeline.metaeval import (
    DELTAS_SCHEMA,
    STATISTICS_SCHEMA,
    evaluate,
    evaluate_files,
    format_table,
    is_advanced,
    write_result,
)
from pipeline.stats.correlation import plcc, srcc
from pipeline.stats.pairwise import pairwise_accuracy

REPO = Path(__file__).resolve().parents[1]
TAG_SETS = [["attribute"], ["counting", "attribute"], ["spatial relation"], ["negation"], []]


def _correlation_data(n_groups=40, per_group=6, seed=0):
    r = np.random.default_rng(seed)
    n = n_groups * per_group
    ids = [f"genai_bench/{i:05d}" for i in range(n)]
    human = r.integers(1, 6, size=(n, 3)).mean(axis=1)
    items = pl.DataFrame(
        dict(
            item_id=ids,
            benchmark=["genai_bench"] * n,
            group_id=[f"p{i // per_group}" for i in range(n)],
            human=human,
            tags=[TAG_SETS[(i // per_group) % 5] for i in range(n)],
        )
    )
    scores = pl.DataFrame(
        dict(
            item_id=ids,
            depict=human + r.normal(0, 0.5, n),
            vqascore=human + r.normal(0, 1.0, n),
            dsg=np.round(human + r.normal(0, 2.0, n)),
            mean_commitment=r.random(n),
        )
    )
    return items, scores


def _value(statistics, metric, statistic, subset="all", backbone="-"):
    row = statistics.filter(
        (pl.col("metric") == metric) & (pl.col("statistic") == statistic) & (pl.col("subset") == subset) & (pl.col("backbone") == backbone)
    )
    assert row.height == 1, row
    return row.row(0, named=True)


def test_correlation_statistics_match_the_stats_functions():
    items, scores = _correlation_data()
    result = evaluate(scores, items, ProtocolSpec(kind="correlation"), n_resamples=200)
    assert dict(result.statistics.schema) == STATISTICS_SCHEMA and dict(result.deltas.schema) == DELTAS_SCHEMA
    human, depict = items["human"].to_numpy(), scores["depict"].to_numpy()
    row = _value(result.statistics, "depict", "srcc")
    assert row["value"] == pytest.approx(srcc(depict, human).value)
    assert row["ci_low"] < row["value"] < row["ci_high"] and row["n"] == items.height
    assert row["benchmark"] == "genai_bench"
    assert _value(result.statistics, "depict", "plcc")["value"] == pytest.approx(plcc(depict, human).value)
    pairwise = pairwise_accuracy(depict, human)
    row = _value(result.statistics, "depict", "pairwise_acc")
    assert row["value"] == pytest.approx(pairwise.value) and row["note"] == f"epsilon={pairwise.epsilon:.6g}"
    assert row["ci_low"] is None
    assert "mean_commitment" not in set(result.statistics["metric"])  # a diagnostic, not a metric


def test_wide_and_long_scores_agree():
    items, scores = _correlation_data()
    long = scores.unpivot(index="item_id", variable_name="metric", value_name="score")
    protocol = ProtocolSpec(kind="correlation", statistics=["srcc"])
    wide_result = evaluate(scores, items, protocol, n_resamples=0)
    long_result = evaluate(long, items.to_arrow(), protocol, n_resamples=0)
    assert wide_result.statistics.equals(long_result.statistics)


def test_delta_against_the_strongest_baseline_is_significant_when_clearly_better():
    items, scores = _correlation_data(n_groups=80)
    result = evaluate(scores, items, ProtocolSpec(kind="correlation", statistics=["srcc"]), n_resamples=300)
    delta = result.deltas.filter(pl.col("subset") == "all").row(0, named=True)
    assert (delta["metric"], delta["baseline"], delta["statistic"]) == ("depict", "vqascore", "srcc")
    expected = _value(result.statistics, "depict", "srcc")["value"] - _value(result.statistics, "vqascore", "srcc")["value"]
    assert delta["delta"] == pytest.approx(expected)
    assert delta["ci_low"] > 0 and delta["significant"] is True and delta["n_groups"] == 80
    only_dsg = evaluate(scores, items, ProtocolSpec(kind="correlation", statistics=["srcc"]), baselines=["dsg"], n_resamples=0)
    assert only_dsg.deltas["baseline"].unique().to_list() == ["dsg"] and only_dsg.deltas["significant"].is_null().all()


def test_backbones_are_evaluated_separately():
    items, scores = _correlation_data()
    long = scores.unpivot(index="item_id", variable_name="metric", value_name="score")
    shuffled = long.with_columns(score=pl.col("score").shuffle(seed=1).over("metric"))
    both = pl.concat([long.with_columns(backbone=pl.lit("qwen")), shuffled.with_columns(backbone=pl.lit("noise"))])
    result = evaluate(both, items, ProtocolSpec(kind="correlation", statistics=["srcc"]), n_resamples=0)
    assert _value(result.statistics, "depict", "srcc", backbone="qwen")["value"] > 0.7
    assert abs(_value(result.statistics, "depict", "srcc", backbone="noise")["value"]) < 0.3


def test_tag_breakdown_and_skill_groups():
    assert is_advanced("Counting") and is_advanced("negation") and not is_advanced("spatial relation")
    items, scores = _correlation_data()
    result = evaluate(scores, items, ProtocolSpec(kind="correlation", statistics=["srcc"], breakdowns=["tags"]), n_resamples=0)
    subsets = set(result.statistics["subset"])
    assert subsets == {"all", "basic", "advanced", "tag=attribute", "tag=counting", "tag=negation", "tag=spatial relation"}
    per_group = 6 * 8  # 40 prompts cycle through 5 tag sets: 8 prompts each
    assert _value(result.statistics, "depict", "srcc", "advanced")["n"] == 2 * per_group  # counting+attribute, negation
    assert _value(result.statistics, "depict", "srcc", "basic")["n"] == 2 * per_group  # attribute, spatial relation
    assert _value(result.statistics, "depict", "srcc", "tag=attribute")["n"] == 2 * per_group
    chosen = items.filter(pl.col("tags").list.contains("negation"))["item_id"]
    sub = scores.filter(pl.col("item_id").is_in(chosen.implode())).join(items, on="item_id")
    assert _value(result.statistics, "depict", "srcc", "tag=negation")["value"] == pytest.approx(
        srcc(sub["depict"].to_numpy(), sub["human"].to_numpy()).value
    )


def test_missing_scores_and_unknown_items_are_reported_not_hidden():
    items, scores = _correlation_data()
    scores = scores.with_columns(dsg=pl.when(pl.int_range(pl.len()) < 3).then(None).otherwise(pl.col("dsg")))
    extra = pl.DataFrame(dict(item_id=["nowhere/1"], depict=[0.5], vqascore=[0.5], dsg=[1.0], mean_commitment=[0.1]))
    items = items.with_columns(human=pl.when(pl.col("item_id") == "genai_bench/00100").then(None).otherwise(pl.col("human")))
    result = evaluate(pl.concat([scores, extra]), items, ProtocolSpec(kind="correlation", statistics=["srcc"]), n_resamples=0)
    text = "\n".join(result.problems)
    assert "1 item_id(s) not in the items table" in text and "'nowhere/1'" in text
    assert "-/dsg: 4 item(s) without a score or human value" in text  # 3 null scores + 1 null human
    assert _value(result.statistics, "dsg", "srcc")["n"] == items.height - 4


def test_constant_metric_gives_nan_with_a_note():
    items, scores = _correlation_data()
    result = evaluate(scores.with_columns(dsg=pl.lit(0.5)), items, ProtocolSpec(kind="correlation", statistics=["srcc", "plcc"]))
    for statistic in ("srcc", "plcc"):
        row = _value(result.statistics, "dsg", statistic)
        assert np.isnan(row["value"]) and "constant" in row["note"]


def _winoground_data(n=60, seed=0):
    r = np.random.default_rng(seed)
    rows = []
    for g in range(n):
        for image in (0, 1):
            for caption in (0, 1):
                match = image == caption
                rows.append(
                    dict(
                        item_id=f"winoground/{g}_{image}{caption}", group_id=f"ex{g}", image_index=image, caption_index=caption,
                        correct=match, depict=float(match) * 0.3 + r.random() * 0.5, vqascore=float(r.random() < 0.5),
                    )
                )
    frame = pl.DataFrame(rows)
    return frame.drop("depict", "vqascore"), frame.select("item_id", "depict", "vqascore")


def test_winoground_protocol_end_to_end():
    items, scores = _winoground_data()
    # the ProtocolSpec default statistics are the correlation ones: the winoground set is used
    result = evaluate(scores, items, ProtocolSpec(kind="winoground"), n_resamples=300, benchmark="winoground")
    assert set(result.statistics["statistic"]) == {"text_acc", "image_acc", "group_acc"}
    group = _value(result.statistics, "depict", "group_acc")
    assert group["n"] == 60 and group["ci_low"] <= group["value"] <= group["ci_high"]
    delta = result.deltas.row(0, named=True)
    assert (delta["statistic"], delta["baseline"]) == ("group_acc", "vqascore") and delta["significant"] is True
    # binary vqascore ties a lot and a tie fails
    assert _value(result.statistics, "vqascore", "group_acc")["value"] < 0.2


def _mcq_data(n=40):
    rows = []
    templates = ["affirmative", "negation", "hybrid", "negation"]
    for g in range(n):
        for option in range(4):
            correct = option == g % 4
            rows.append(
                dict(
                    item_id=f"negbench/{g}_{option}", group_id=f"img{g}", caption_index=option, correct=correct,
                    template=templates[g % 4], depict=0.9 if correct else 0.1 * option, hard=1.0,  # hard: all tied
                )
            )
    frame = pl.DataFrame(rows)
    return frame.drop("depict", "hard"), frame.select("item_id", "depict", "hard")


@pytest.mark.parametrize("policy, hard_accuracy", [("expected", 0.25), ("strict", 0.0), ("first", 0.25)])
def test_multiple_choice_protocol_with_templates(policy, hard_accuracy):
    items, scores = _mcq_data()
    protocol = ProtocolSpec(kind="multiple_choice", statistics=["accuracy"], tie_policy=policy, breakdowns=["template"])
    result = evaluate(scores, items, protocol, n_resamples=0)
    assert set(result.statistics["subset"]) == {"all", "template=affirmative", "template=negation", "template=hybrid"}
    assert _value(result.statistics, "depict", "accuracy")["value"] == 1.0
    assert _value(result.statistics, "hard", "accuracy")["value"] == pytest.approx(hard_accuracy)
    # "first" credits ties to option 0, which is correct exactly in the affirmative groups
    expected_affirmative = {"expected": 0.25, "strict": 0.0, "first": 1.0}[policy]
    assert _value(result.statistics, "hard", "accuracy", "template=affirmative")["value"] == pytest.approx(expected_affirmative)
    assert _value(result.statistics, "hard", "accuracy", "template=negation")["n"] == 20


def test_multiple_choice_group_with_a_missing_score_is_excluded_and_reported():
    items, scores = _mcq_data()
    scores = scores.with_columns(depict=pl.when(pl.col("item_id") == "negbench/3_1").then(None).otherwise(pl.col("depict")))
    result = evaluate(scores, items, ProtocolSpec(kind="multiple_choice"), n_resamples=0)
    assert _value(result.statistics, "depict", "accuracy")["n"] == 39
    assert any("-/depict: 1 group(s) excluded (e.g. img3: 1 option(s) without a score)" in p for p in result.problems)


def test_protocol_errors():
    items, scores = _correlation_data()
    with pytest.raises(ValueError, match="missing column"):
        evaluate(scores, items.drop("group_id"), ProtocolSpec(kind="correlation"))
    with pytest.raises(ValueError, match="do not apply"):
        evaluate(scores, items, ProtocolSpec(kind="correlation", statistics=["group_acc"]))
    with pytest.raises(ValueError, match="kind"):
        evaluate(scores, items, ProtocolSpec(kind="ranking"))
    with pytest.raises(ValueError, match="several benchmarks"):
        evaluate(scores, items.with_columns(benchmark=pl.Series(["a", "b"] * (items.height // 2))), ProtocolSpec())


def test_evaluate_files_parquet_and_csv(tmp_path):
    items, scores = _correlation_data()
    scores.head(items.height - 2).write_parquet(tmp_path / "scores.parquet")
    items.with_columns(tags=pl.col("tags").list.join("|")).write_csv(tmp_path / "human.csv")
    result = evaluate_files(str(tmp_path / "scores.parquet"), str(tmp_path / "human.csv"), "correlation", n_resamples=0, metrics=["depict", "vqascore"])
    assert set(result.statistics["metric"]) == {"depict", "vqascore"}
    assert "advanced" in set(result.statistics["subset"])  # tags read from the "|"-separated CSV column
    assert any(p.startswith("2 item(s) in") and "human.csv have no row in" in p for p in result.problems)
    written = write_result(result, str(tmp_path / "out"))
    assert pl.read_parquet(tmp_path / "out" / "statistics.parquet").equals(result.statistics)
    assert len(written) == 4 and (tmp_path / "out" / "deltas.csv").exists()
    assert "depict" in format_table(result)


def test_evaluate_files_errors_name_the_file_and_column(tmp_path):
    items, scores = _correlation_data()
    scores.write_parquet(tmp_path / "scores.parquet")
    items.drop("human").write_parquet(tmp_path / "human.parquet")
    with pytest.raises(ValueError, match=r"human\.parquet: missing column\(s\) \['human'\]"):
        evaluate_files(str(tmp_path / "scores.parquet"), str(tmp_path / "human.parquet"), "correlation")
    with pytest.raises(FileNotFoundError, match="nope.parquet"):
        evaluate_files(str(tmp_path / "nope.parquet"), str(tmp_path / "human.parquet"), "correlation")
    with pytest.raises(ValueError, match="no scores for metric"):
        items.write_parquet(tmp_path / "human.parquet")
        evaluate_files(str(tmp_path / "scores.parquet"), str(tmp_path / "human.parquet"), "correlation", metrics=["clip"])


def test_evaluate_files_reads_fsspec_urls():
    # memory:// goes through the same fsspec path as s3://
    items, scores = _correlation_data(n_groups=10)
    for name, frame in (("scores.parquet", scores), ("human.parquet", items)):
        with fsspec.open(f"memory://metaeval-test/{name}", "wb") as handle:
            frame.write_parquet(handle)
    result = evaluate_files("memory://metaeval-test/scores.parquet", "memory://metaeval-test/human.parquet", "correlation", n_resamples=0)
    assert _value(result.statistics, "depict", "srcc")["n"] == items.height


def test_cli(tmp_path):
    items, scores = _correlation_data(n_groups=10)
    scores.write_parquet(tmp_path / "scores.parquet")
    items.write_parquet(tmp_path / "human.parquet")
    command = [
        sys.executable, str(REPO / "jobs" / "metaeval.py"), f"scores={tmp_path / 'scores.parquet'}",
        f"human={tmp_path / 'human.parquet'}", "kind=correlation", f"out={tmp_path / 'out'}",
        "metrics=[depict,vqascore]", "n_resamples=50",
    ]  # fmt: skip
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert "srcc" in done.stdout and "depict" in done.stdout
    table = pl.read_csv(tmp_path / "out" / "statistics.csv")
    assert set(table["metric"]) == {"depict", "vqascore"}
    usage = subprocess.run([sys.executable, str(REPO / "jobs" / "metaeval.py"), "scores=x"], capture_output=True, text=True, check=False)
    assert usage.returncode == 2 and "kind" in usage.stderr


def test_kendall_and_pearson_rows_with_group_intervals():
    from scipy import stats

    from pipeline.stats import bootstrap

    items, scores = _correlation_data()
    result = evaluate(scores, items, ProtocolSpec(kind="correlation"), n_resamples=200)
    human, dsg = items["human"].to_numpy(), scores["dsg"].to_numpy()  # rounded scores: ties
    groups, n_groups = bootstrap.group_codes(items["group_id"].to_numpy())
    for name, reference, build in (
        ("kendall", stats.kendalltau(dsg, human).statistic, bootstrap.kendall_statistic),
        ("pearson", stats.pearsonr(dsg, human).statistic, bootstrap.pearson_statistic),
    ):
        row = _value(result.statistics, "dsg", name)
        assert row["value"] == pytest.approx(reference, abs=1e-12)
        interval = bootstrap.group_interval(build(dsg, human, groups), n_groups, n_resamples=200, seed=0)
        assert (row["ci_low"], row["ci_high"]) == (interval.low, interval.high)
    assert {"kendall", "pearson"} <= set(result.statistics["statistic"])


def test_kendall_as_primary_statistic_gives_a_paired_delta():
    items, scores = _correlation_data()
    protocol = ProtocolSpec(kind="correlation", statistics=["kendall"], primary_statistic="kendall")
    result = evaluate(scores, items, protocol, n_resamples=200)
    delta = result.deltas.filter(pl.col("subset") == "all").row(0, named=True)
    assert delta["statistic"] == "kendall" and delta["ci_low"] < delta["delta"] < delta["ci_high"]


def test_winoground_delta_is_a_mean_of_per_group_differences():
    from scipy import stats

    from pipeline.stats import choice

    items, scores = _winoground_data()
    result = evaluate(scores, items, ProtocolSpec(kind="winoground"), n_resamples=300, benchmark="winoground")
    delta = result.deltas.row(0, named=True)
    frame = items.join(scores.unpivot(index="item_id", variable_name="metric", value_name="score"), on="item_id")
    a = choice.winoground(frame.filter(pl.col("metric") == "depict")).group
    b = choice.winoground(frame.filter(pl.col("metric") == "vqascore")).group
    assert delta["delta"] == float(np.mean(a - b))  # exact, not mean(a) - mean(b)
    reference = stats.bootstrap((a - b,), np.mean, n_resamples=300, batch=100, method="BCa", rng=np.random.default_rng(0))
    assert delta["ci_low"] == pytest.approx(reference.confidence_interval.low, abs=1e-9)
    assert delta["ci_high"] == pytest.approx(reference.confidence_interval.high, abs=1e-9)


@pytest.mark.parametrize("policy, n, phrase", [("exclude", 238, "excluded"), ("zero", 240, "scored 0")])
def test_no_question_policy_is_applied_and_recorded(policy, n, phrase):
    items, scores = _correlation_data()
    long = scores.unpivot(index="item_id", variable_name="metric", value_name="score").with_columns(note=pl.lit(None, dtype=pl.String))
    no_questions = (pl.col("metric") == "dsg") & pl.col("item_id").is_in(["genai_bench/00003", "genai_bench/00007"])
    long = long.with_columns(
        score=pl.when(no_questions).then(None).otherwise(pl.col("score")),
        note=pl.when(no_questions).then(pl.lit("no_questions")).otherwise(pl.col("note")),
    )
    result = evaluate(long, items, ProtocolSpec(kind="correlation", no_questions=policy), n_resamples=0)
    row = _value(result.statistics, "dsg", "srcc")
    assert row["n"] == n and f"2 item(s) without questions {phrase} (no_questions={policy})" in row["note"]
    assert _value(result.statistics, "depict", "srcc")["note"] is None
    with pytest.raises(ValueError, match="no_questions must be one of"):
        evaluate(long, items, ProtocolSpec(kind="correlation", no_questions="drop"), n_resamples=0)
