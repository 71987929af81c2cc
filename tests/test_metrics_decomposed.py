"""Yes-probability conventions and the decomposed metrics (agreement, Soft-TIFA, DSG)."""
from __future__ import annotations

import math
import time
import warnings

import numpy as np
import polars as pl
import pyarrow as pa
import pytest
from scipy.special import expit, log_expit

from operators.metrics import (
    DEPICT_METRICS,
    DSG_METRICS,
    decomposed_scores,
    depict_scores,
    dsg_scores,
    holistic_scores,
    log_yes_probability,
    log_yes_probability_expr,
    resolve_conventions,
    score_all,
    to_arrow,
    yes_probability,
    yes_probability_expr,
)
from operators.schema import METRIC_SCORES


def answer_logps(p: float) -> tuple[float, float]:
    """Log-probabilities whose normalized (and raw) reading is p."""
    return math.log(p) if p > 0 else -math.inf, math.log1p(-p) if p < 1 else -math.inf


def depict_table(questions: dict[str, list[tuple[float, float]]]) -> pl.DataFrame:
    """Decomposed answers from {item: [(p_v, p_t), ...]} (depict question set)."""
    records = []
    for item, pairs in questions.items():
        for k, (p_v, p_t) in enumerate(pairs, start=1):
            yes_v, no_v = answer_logps(p_v)
            yes_t, no_t = answer_logps(p_t)
            records.append(
                {"item_id": item, "question_set": "depict", "question_id": str(k), "parents": [],
                 "logp_yes_v": yes_v, "logp_no_v": no_v, "logp_yes_t": yes_t, "logp_no_t": no_t}
            )
    return pl.DataFrame(records, schema=DECOMPOSED_SCHEMA)


def dsg_table(questions: dict[str, list[tuple[str, list[str] | None, float]]]) -> pl.DataFrame:
    """Decomposed answers from {item: [(question_id, parents, p_v), ...]} (dsg question set)."""
    records = []
    for item, rows in questions.items():
        for question_id, parents, p_v in rows:
            yes_v, no_v = answer_logps(p_v)
            records.append(
                {"item_id": item, "question_set": "dsg", "question_id": question_id, "parents": parents,
                 "logp_yes_v": yes_v, "logp_no_v": no_v, "logp_yes_t": None, "logp_no_t": None}
            )
    return pl.DataFrame(records, schema=DECOMPOSED_SCHEMA)


DECOMPOSED_SCHEMA = {
    "item_id": pl.String, "question_set": pl.String, "question_id": pl.String, "parents": pl.List(pl.String),
    "logp_yes_v": pl.Float64, "logp_no_v": pl.Float64, "logp_yes_t": pl.Float64, "logp_no_t": pl.Float64,
}


def by_metric(scores: pl.DataFrame, item: str) -> dict[str, tuple[float | None, str | None]]:
    rows = scores.filter(pl.col("item_id") == item)
    return {row["metric"]: (row["score"], row["note"]) for row in rows.iter_rows(named=True)}


# --- probability conventions -------------------------------------------------------------


def test_conventions_match_scipy_and_each_other():
    rng = np.random.default_rng(0)
    yes, no = rng.uniform(-40, 0, 500), rng.uniform(-40, 0, 500)
    frame = pl.DataFrame({"y": yes, "n": no})
    for convention, expected, expected_log in (
        ("normalized", expit(yes - no), log_expit(yes - no)),
        ("raw", np.exp(yes), yes),
    ):
        got = frame.select(p=yes_probability_expr("y", "n", convention), lp=log_yes_probability_expr("y", "n", convention))
        np.testing.assert_allclose(got["p"].to_numpy(), expected, rtol=1e-12)
        np.testing.assert_allclose(got["lp"].to_numpy(), expected_log, rtol=1e-12)
        np.testing.assert_allclose(yes_probability(yes, no, convention), expected, rtol=1e-12)
        np.testing.assert_allclose(log_yes_probability(yes, no, convention), expected_log, rtol=1e-12)


def test_normalized_is_share_of_yes_and_raw_is_exp():
    # P(yes) = 0.3, P(no) = 0.1: normalized 0.3 / (0.3 + 0.1) = 0.75; raw exp(log 0.3) = 0.3.
    assert yes_probability([math.log(0.3)], [math.log(0.1)], "normalized")[0] == pytest.approx(0.75)
    assert yes_probability([math.log(0.3)], [math.log(0.1)], "raw")[0] == pytest.approx(0.3)


def test_extreme_logps_give_limits_not_nan():
    frame = pl.DataFrame({"y": [-1e4, 0.0, -1e4], "n": [0.0, -1e4, -1e4]})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = frame.select(p=yes_probability_expr("y", "n"), lp=log_yes_probability_expr("y", "n"))
        numpy_p = yes_probability(frame["y"].to_numpy(), frame["n"].to_numpy())
    assert got["p"].to_list() == [0.0, 1.0, 0.5]
    assert got["lp"].to_list() == pytest.approx([-1e4, 0.0, math.log(0.5)])
    assert numpy_p.tolist() == [0.0, 1.0, 0.5]
    # raw: exp(-1e4) underflows to 0; a logp rounded just above 0 still reads as p = 1
    assert yes_probability([-1e4, 1e-9], [0.0, 0.0], "raw").tolist() == [0.0, 1.0]
    assert pl.select(yes_probability_expr(pl.lit(1e-9), pl.lit(0.0), "raw")).item() == 1.0


def test_unknown_convention_is_rejected():
    with pytest.raises(ValueError, match="unknown probability convention 'softmax'"):
        yes_probability_expr("y", "n", "softmax")
    with pytest.raises(ValueError, match="unknown probability convention"):
        yes_probability([0.0], [0.0], "Normalized")
    with pytest.raises(ValueError, match="unknown probability convention"):
        depict_scores(depict_table({"a": [(0.5, 0.5)]}), ["a"], probability="sigmoid")


def test_resolve_conventions_default_and_overrides():
    assert resolve_conventions({"soft_tifa_am": "raw"}, ["agree", "soft_tifa_am"]) == {
        "agree": "normalized", "soft_tifa_am": "raw"}
    assert resolve_conventions({"default": "raw", "agree": "normalized"}, ["agree", "dsg"]) == {
        "agree": "normalized", "dsg": "raw"}
    with pytest.raises(ValueError, match="unknown metric.*soft_tifa"):
        resolve_conventions({"soft_tifa": "raw"}, ["agree"])


# --- depict question set -----------------------------------------------------------------

HAND = {"x": [(0.8, 0.9), (0.3, 0.2), (0.6, 0.5)]}


def test_depict_metrics_by_hand():
    # q1: p_v .8, p_t .9: a = .8*.9 + .2*.1 = .74, w = |1.8 - 1| = .8
    # q2: p_v .3, p_t .2: a = .3*.2 + .7*.8 = .62, w = |.4 - 1| = .6
    # q3: p_v .6, p_t .5: a = .6*.5 + .4*.5 = .50, w = 0
    got = by_metric(depict_scores(depict_table(HAND), ["x"]), "x")
    expected = {
        "agree": (0.8 * 0.74 + 0.6 * 0.62) / (0.8 + 0.6 + 0.0),  # .964 / 1.4 = .68857
        "agree_unweighted": (0.74 + 0.62 + 0.50) / 3,  # .62
        "soft_tifa_am": (0.8 + 0.3 + 0.6) / 3,  # .56667
        "soft_tifa_gm": (0.8 * 0.3 * 0.6) ** (1 / 3),  # .144^(1/3) = .52415
        "hard_fixed_yes": 2 / 3,  # .8 > .5, .3 <= .5, .6 > .5
        "mean_commitment": (0.8 + 0.6 + 0.0) / 3,  # .46667
    }
    assert set(got) == set(DEPICT_METRICS)
    for metric, value in expected.items():
        assert got[metric][0] == pytest.approx(value, rel=1e-12), metric
        assert got[metric][1] is None, metric
    assert got["agree"][0] == pytest.approx(0.688571428571, rel=1e-9)
    assert got["soft_tifa_gm"][0] == pytest.approx(0.524148278, rel=1e-8)


def test_negation_question_rewards_matching_no():
    # Caption "a kitchen with no cat", question "Is there a cat?": the caption implies "no"
    # (p_t = .05), the image says "no" (p_v = .1).
    # a = .1*.05 + .9*.95 = .005 + .855 = .86; w = |.1 - 1| = .9; agree = .86
    # Soft-TIFA assumes every answer should be "yes": am = p_v = .1
    table = depict_table({"kitchen": [(0.1, 0.05)]})
    got = by_metric(depict_scores(table, ["kitchen"]), "kitchen")
    assert got["agree"][0] == pytest.approx(0.86)
    assert got["soft_tifa_am"][0] == pytest.approx(0.1)
    assert got["hard_fixed_yes"][0] == 0.0
    # with S_hol = .7: depict = .5*.7 + .5*.86 = .78
    holistic = pl.DataFrame({"item_id": ["kitchen"], "logp_yes": [math.log(0.7)], "logp_no": [math.log(0.3)]})
    merged = by_metric(score_all(["kitchen"], decomposed=table, holistic=holistic), "kitchen")
    assert merged["depict"][0] == pytest.approx(0.78)
    assert merged["depict"][0] > 0.75 > 0.1 == pytest.approx(merged["soft_tifa_am"][0])


def test_all_weights_zero_falls_back_to_mean_agreement_and_says_so():
    # p_t = .5 everywhere: every w = 0. a = p_v*.5 + (1 - p_v)*.5 = .5 for each question.
    got = by_metric(depict_scores(depict_table({"u": [(0.9, 0.5), (0.2, 0.5)]}), ["u"]), "u")
    assert got["agree"] == (pytest.approx(0.5), "all_weights_zero")
    assert got["agree_unweighted"] == (pytest.approx(0.5), None)
    assert got["mean_commitment"] == (0.0, None)


def test_all_undecided_is_flagged_on_a_valid_score():
    # p_t .55 and .45: w = .1 each (< .2). a1 = .9*.55 + .1*.45 = .54; a2 = .2*.45 + .8*.55 = .53
    # agree = (.1*.54 + .1*.53) / .2 = .535
    table = depict_table({"u": [(0.9, 0.55), (0.2, 0.45)]})
    assert by_metric(depict_scores(table, ["u"]), "u")["agree"] == (pytest.approx(0.535), "all_undecided")
    # the threshold is a parameter: below .05 nothing is undecided here
    assert by_metric(depict_scores(table, ["u"], undecided_below=0.05), "u")["agree"] == (pytest.approx(0.535), None)
    with pytest.raises(ValueError, match="undecided_below must be in"):
        depict_scores(table, ["u"], undecided_below=2.0)
    # one committed question is enough to drop the flag
    mixed = depict_table({"m": [(0.9, 0.55), (0.9, 0.95)]})
    assert by_metric(depict_scores(mixed, ["m"]), "m")["agree"][1] is None


def test_geometric_mean_of_a_zero_probability_is_zero_without_warnings():
    # logp_yes = -800 vs logp_no = 0: p_v = sigmoid(-800) = 0.0 in float64.
    table = depict_table({"z": [(0.5, 0.9)]}).with_columns(logp_yes_v=pl.lit(-800.0), logp_no_v=pl.lit(0.0))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = by_metric(depict_scores(table, ["z"]), "z")
        raw = by_metric(depict_scores(table, ["z"], probability="raw"), "z")
    assert got["soft_tifa_gm"] == (0.0, None)
    assert got["soft_tifa_am"] == (0.0, None)
    assert raw["soft_tifa_gm"] == (0.0, None)  # exp(-800) underflows to 0 too


def test_convention_changes_the_probabilities_read():
    # logp_yes = log .3, logp_no = log .1: normalized p_v = .75, raw p_v = .3
    table = depict_table({"c": [(0.5, 0.5)]}).with_columns(
        logp_yes_v=pl.lit(math.log(0.3)), logp_no_v=pl.lit(math.log(0.1)))
    normalized = by_metric(depict_scores(table, ["c"]), "c")
    raw = by_metric(depict_scores(table, ["c"], probability="raw"), "c")
    mixed = by_metric(depict_scores(table, ["c"], probability={"soft_tifa_am": "raw"}), "c")
    assert normalized["soft_tifa_am"][0] == pytest.approx(0.75)
    assert normalized["hard_fixed_yes"][0] == 1.0
    assert raw["soft_tifa_am"][0] == pytest.approx(0.3)
    assert raw["hard_fixed_yes"][0] == 0.0
    assert mixed["soft_tifa_am"][0] == pytest.approx(0.3)
    assert mixed["hard_fixed_yes"][0] == 1.0


def test_missing_answers_null_the_affected_scores_only():
    pairs = [(0.8, 0.9)] * 5
    table = depict_table({"m": pairs, "ok": pairs})
    broken = table.with_columns(
        logp_yes_v=pl.when((pl.col("item_id") == "m") & (pl.col("question_id") == "2")).then(None)
        .when((pl.col("item_id") == "m") & (pl.col("question_id") == "4")).then(float("nan"))
        .otherwise(pl.col("logp_yes_v"))
    )
    scores = depict_scores(broken, ["m", "ok"])
    got = by_metric(scores, "m")
    for metric in ("agree", "agree_unweighted", "soft_tifa_am", "soft_tifa_gm", "hard_fixed_yes"):
        assert got[metric] == (None, "missing_answer: 2 of 5 questions"), metric
    assert got["mean_commitment"] == (pytest.approx(0.8), None)  # caption-only answers are all there
    assert by_metric(scores, "ok")["agree"][0] == pytest.approx(0.74)


def test_infinite_caption_answer_nulls_agreement_but_not_soft_tifa():
    table = depict_table({"t": [(0.8, 0.9), (0.3, 0.2)]}).with_columns(
        logp_no_t=pl.when(pl.col("question_id") == "1").then(math.inf).otherwise(pl.col("logp_no_t")))
    got = by_metric(depict_scores(table, ["t"]), "t")
    assert got["agree"] == (None, "missing_answer: 1 of 2 questions")
    assert got["mean_commitment"] == (None, "missing_answer: 1 of 2 questions")
    assert got["soft_tifa_am"] == (pytest.approx(0.55), None)


def test_items_without_questions_get_null_rows():
    table = pl.concat([depict_table(HAND), dsg_table({"only_dsg": [("1", ["0"], 0.9)]})])
    scores = decomposed_scores(table, ["x", "only_dsg", "nothing"])
    assert scores.height == 3 * len(DEPICT_METRICS + DSG_METRICS)
    assert by_metric(scores, "nothing") == {m: (None, "no_questions") for m in DEPICT_METRICS + DSG_METRICS}
    assert all(by_metric(scores, "only_dsg")[m] == (None, "no_questions") for m in DEPICT_METRICS)
    assert all(by_metric(scores, "x")[m] == (None, "no_questions") for m in DSG_METRICS)


def test_unrequested_items_are_not_scored_and_order_follows_the_request():
    table = depict_table({"a": HAND["x"], "b": HAND["x"], "c": HAND["x"]})
    scores = depict_scores(table, ["c", "a", "c"])
    assert scores.filter(pl.col("metric") == "agree")["item_id"].to_list() == ["c", "a"]


def test_duplicate_question_rows_are_an_error():
    table = depict_table(HAND)
    with pytest.raises(ValueError, match="item_id 'x'.*question_set 'depict'.*question_id '2'"):
        depict_scores(pl.concat([table, table.filter(pl.col("question_id") == "2")]), ["x"])
    # the same question id in another question set is a different question
    assert depict_scores(pl.concat([table, table.with_columns(question_set=pl.lit("dsg"))]), ["x"]).height == len(DEPICT_METRICS)


def test_bad_tables_are_reported_by_column():
    table = depict_table(HAND)
    with pytest.raises(ValueError, match="decomposed answers: missing column.*logp_no_t"):
        depict_scores(table.drop("logp_no_t"), ["x"])
    with pytest.raises(ValueError, match="decomposed answers: column 'logp_yes_v'"):
        depict_scores(table.with_columns(logp_yes_v=pl.lit("high")), ["x"])
    with pytest.raises(ValueError, match="null item id"):
        depict_scores(table, ["x", None])


def test_arrow_input_and_output_schema():
    table = pl.concat([depict_table(HAND), dsg_table({"x": [("1", ["0"], 0.9)]})])
    from_polars = decomposed_scores(table, ["x", "y"])
    from_arrow = decomposed_scores(table.to_arrow(), pa.array(["x", "y"]))
    assert from_polars.equals(from_arrow)
    arrow = to_arrow(from_polars)
    assert arrow.schema == METRIC_SCORES
    assert arrow.num_rows == 2 * len(DEPICT_METRICS + DSG_METRICS)


# --- dsg question set --------------------------------------------------------------------


def test_dsg_by_hand():
    # q1 root (parent "0"), p .9 -> y 1
    # q2 parent 1, p .2 -> y 0
    # q3 parent 2, p .7 -> y 1, but parent q2 said no -> 0
    # q4 parent 1, p .6 -> y 1, parent q1 said yes -> stays 1
    # nodep = 3/4; dsg = (1 + 0 + 0 + 1) / 4 = .5
    table = dsg_table({"d": [("1", ["0"], 0.9), ("2", ["1"], 0.2), ("3", ["2"], 0.7), ("4", ["1"], 0.6)]})
    got = by_metric(dsg_scores(table, ["d"]), "d")
    assert got == {"dsg": (0.5, None), "dsg_nodep": (0.75, None)}


def test_dsg_with_its_parents_ignored_fails_the_hand_computed_item():
    """The mutation the demo cannot show (its answerers never credit a detail of a missing thing):
    the production code with the graph's rule removed scores the hand-built item as nodep."""
    from mutation import mutated

    from operators.metrics import decomposed

    table = dsg_table({"d": [("1", ["0"], 0.9), ("2", ["1"], 0.2), ("3", ["2"], 0.7), ("4", ["1"], 0.6)]})
    with mutated(decomposed, 'dep=(pl.col("yes") & ~pl.col("blocked")).cast(pl.Float64).mean(),', 'dep=pl.col("yes").cast(pl.Float64).mean(),'):
        ignored = by_metric(dsg_scores(table, ["d"]), "d")
    assert ignored["dsg"] == (0.75, None) != by_metric(dsg_scores(table, ["d"]), "d")["dsg"]


def test_dsg_uses_the_parents_original_answers():
    # Official rule (j-min/DSG calc_vqa_score): parents are read from the unfiltered answers.
    # q1 root says no; q2 (parent 1) says yes -> zeroed; q3 (parent 2) says yes and q2's
    # ORIGINAL answer is yes -> q3 keeps 1. dsg = (0 + 0 + 1)/3; chaining would give 0.
    table = dsg_table({"d": [("1", [], 0.1), ("2", ["1"], 0.9), ("3", ["2"], 0.9)]})
    got = by_metric(dsg_scores(table, ["d"]), "d")
    assert got["dsg"] == (pytest.approx(1 / 3), None)
    assert got["dsg_nodep"] == (pytest.approx(2 / 3), None)


def test_dsg_parent_edge_cases():
    table = dsg_table({
        # several parents: any "no" zeroes the child (q3); "0" beside real parents is ignored (q4)
        "multi": [("1", None, 0.9), ("2", ["0"], 0.3), ("3", ["1", "2"], 0.9), ("4", ["0", "1"], 0.9)],
        # a parent id that is not a question of the item is ignored and reported
        "unknown": [("1", ["0"], 0.9), ("2", ["7"], 0.9), ("3", ["7", "1"], 0.2)],
    })
    scores = dsg_scores(table, ["multi", "unknown"])
    # multi: y = 1, 0, 1, 1; q3 has parent 2 = no -> 0. dsg = 2/4, nodep = 3/4
    assert by_metric(scores, "multi") == {"dsg": (0.5, None), "dsg_nodep": (0.75, None)}
    # unknown: y = 1, 1, 0; no known parent said no. dsg = nodep = 2/3
    got = by_metric(scores, "unknown")
    assert got["dsg"] == (pytest.approx(2 / 3), "unknown_parent: 2 of 3 questions (ignored)")
    assert got["dsg_nodep"] == (pytest.approx(2 / 3), None)


def test_dsg_missing_answer_and_convention():
    table = dsg_table({"d": [("1", ["0"], 0.9), ("2", ["1"], 0.9)]})
    missing = table.with_columns(logp_no_v=pl.when(pl.col("question_id") == "1").then(None).otherwise(pl.col("logp_no_v")))
    assert by_metric(dsg_scores(missing, ["d"]), "d")["dsg"] == (None, "missing_answer: 1 of 2 questions")
    # logp_yes = log .4, logp_no = log .1: normalized .8 (yes), raw .4 (no)
    odd = table.with_columns(logp_yes_v=pl.lit(math.log(0.4)), logp_no_v=pl.lit(math.log(0.1)))
    assert by_metric(dsg_scores(odd, ["d"]), "d")["dsg"][0] == 1.0
    assert by_metric(dsg_scores(odd, ["d"], probability="raw"), "d")["dsg"][0] == 0.0


# --- vectorised scores against a slow per-item reference ---------------------------------


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))


def reference_scores(questions: list[dict]) -> dict[str, tuple[float | None, str | None]]:
    """One item's depict-set metrics, question by question (normalized convention)."""
    if not questions:
        return {metric: (None, "no_questions") for metric in DEPICT_METRICS}
    n = len(questions)
    finite = lambda *xs: all(x is not None and math.isfinite(x) for x in xs)  # noqa: E731
    bad_v = sum(not finite(q["logp_yes_v"], q["logp_no_v"]) for q in questions)
    bad_t = sum(not finite(q["logp_yes_t"], q["logp_no_t"]) for q in questions)
    bad_vt = sum(not finite(q["logp_yes_v"], q["logp_no_v"], q["logp_yes_t"], q["logp_no_t"]) for q in questions)
    out = {}
    if bad_vt:
        out["agree"] = out["agree_unweighted"] = (None, f"missing_answer: {bad_vt} of {n} questions")
    else:
        p_v = [_sigmoid(q["logp_yes_v"] - q["logp_no_v"]) for q in questions]
        p_t = [_sigmoid(q["logp_yes_t"] - q["logp_no_t"]) for q in questions]
        a = [v * t + (1 - v) * (1 - t) for v, t in zip(p_v, p_t)]
        w = [abs(2 * t - 1) for t in p_t]
        if sum(w) == 0:
            out["agree"] = (sum(a) / n, "all_weights_zero")
        else:
            out["agree"] = (sum(x * y for x, y in zip(w, a)) / sum(w), "all_undecided" if max(w) < 0.2 else None)
        out["agree_unweighted"] = (sum(a) / n, None)
    if bad_v:
        for metric in ("soft_tifa_am", "soft_tifa_gm", "hard_fixed_yes"):
            out[metric] = (None, f"missing_answer: {bad_v} of {n} questions")
    else:
        p_v = [_sigmoid(q["logp_yes_v"] - q["logp_no_v"]) for q in questions]
        out["soft_tifa_am"] = (sum(p_v) / n, None)
        out["soft_tifa_gm"] = (math.prod(p_v) ** (1 / n), None)
        out["hard_fixed_yes"] = (sum(p > 0.5 for p in p_v) / n, None)
    if bad_t:
        out["mean_commitment"] = (None, f"missing_answer: {bad_t} of {n} questions")
    else:
        out["mean_commitment"] = (sum(abs(2 * _sigmoid(q["logp_yes_t"] - q["logp_no_t"]) - 1) for q in questions) / n, None)
    return out


def reference_dsg(questions: list[dict]) -> dict[str, tuple[float | None, str | None]]:
    """One item's DSG scores the way the official scorer loops over qid2dependency."""
    if not questions:
        return {metric: (None, "no_questions") for metric in DSG_METRICS}
    n = len(questions)
    bad = sum(not all(q[c] is not None and math.isfinite(q[c]) for c in ("logp_yes_v", "logp_no_v")) for q in questions)
    if bad:
        return {metric: (None, f"missing_answer: {bad} of {n} questions") for metric in DSG_METRICS}
    qid2scores = {q["question_id"]: float(_sigmoid(q["logp_yes_v"] - q["logp_no_v"]) > 0.5) for q in questions}
    filtered, unknown = dict(qid2scores), 0
    for q in questions:
        parents = [p for p in (q["parents"] or []) if p != "0"]
        unknown += any(p not in qid2scores for p in parents)
        if any(qid2scores.get(p) == 0 for p in parents):
            filtered[q["question_id"]] = 0.0
    note = f"unknown_parent: {unknown} of {n} questions (ignored)" if unknown else None
    return {"dsg": (sum(filtered.values()) / n, note), "dsg_nodep": (sum(qid2scores.values()) / n, None)}


def random_answers(n_items: int, seed: int) -> pl.DataFrame:
    rng = np.random.default_rng(seed)
    records = []
    for i in range(n_items):
        for question_set in ("depict", "dsg"):
            if rng.random() < 0.05:
                continue  # some items have no questions of a set
            k = int(rng.integers(1, 14))
            for q in range(1, k + 1):
                logps = rng.normal(-1.5, 2.0, 4).clip(max=0.0).tolist()
                if rng.random() < 0.02:
                    logps[rng.integers(0, 4)] = [None, math.nan, math.inf, -math.inf][rng.integers(0, 4)]
                if rng.random() < 0.03:
                    logps[2], logps[3] = -0.6931471805599453, -0.6931471805599453  # p_t = .5, w = 0
                parents = [str(p) for p in rng.choice(np.arange(0, k + 3), size=rng.integers(0, 3), replace=False)]
                records.append((f"item{i}", question_set, str(q), parents, *logps))
    columns = list(DECOMPOSED_SCHEMA)
    return pl.DataFrame(records, schema=DECOMPOSED_SCHEMA, orient="row").select(columns)


def test_vectorised_scores_match_the_per_item_reference():
    table = random_answers(2000, seed=7)
    item_ids = [f"item{i}" for i in range(0, 2010)]  # the last ten have no rows at all
    scores = decomposed_scores(table, item_ids)
    assert scores.height == len(item_ids) * len(DEPICT_METRICS + DSG_METRICS)
    got = {(row[0], row[1]): (row[2], row[3]) for row in scores.iter_rows()}
    grouped = {}
    for row in table.iter_rows(named=True):
        grouped.setdefault((row["item_id"], row["question_set"]), []).append(row)
    checked = 0
    for item in item_ids:
        expected = reference_scores(grouped.get((item, "depict"), []))
        expected |= reference_dsg(grouped.get((item, "dsg"), []))
        for metric, (score, note) in expected.items():
            got_score, got_note = got[(item, metric)]
            assert got_note == note, (item, metric)
            if score is None:
                assert got_score is None, (item, metric)
            else:
                assert got_score == pytest.approx(score, rel=1e-9, abs=1e-300), (item, metric)
            checked += 1
    assert checked == len(item_ids) * len(DEPICT_METRICS + DSG_METRICS)


def test_scoring_a_benchmark_is_fast():
    # GenAI-Bench scale: 9,600 items x ~6 questions, both question sets, plus holistic answers.
    rng = np.random.default_rng(1)
    counts = rng.integers(1, 12, 9600)
    n = int(counts.sum())
    items = np.repeat(np.array([f"g{i}" for i in range(9600)]), counts)
    question_ids = np.concatenate([np.arange(1, c + 1) for c in counts]).astype(str)
    depict = pl.DataFrame({
        "item_id": items, "question_set": "depict", "question_id": question_ids,
        "parents": pl.Series([["0"]] * n, dtype=pl.List(pl.String)),
        **{c: rng.uniform(-5, 0, n) for c in ("logp_yes_v", "logp_no_v", "logp_yes_t", "logp_no_t")},
    })
    table = pl.concat([depict, depict.with_columns(question_set=pl.lit("dsg"))])
    holistic = pl.DataFrame({"item_id": [f"g{i}" for i in range(9600)],
                             "logp_yes": rng.uniform(-5, 0, 9600), "logp_no": rng.uniform(-5, 0, 9600)})
    ids = holistic["item_id"]
    score_all(ids[:10], decomposed=table, holistic=holistic)  # warm up polars
    start = time.perf_counter()
    scores = score_all(ids, decomposed=table, holistic=holistic)
    elapsed = time.perf_counter() - start
    assert scores.filter(pl.col("metric") == "depict")["score"].null_count() == 0
    assert elapsed < 1.0, f"score_all took {elapsed:.2f}s"
    assert holistic_scores(holistic, ids).height == 2 * 9600
