"""VQAScore, merging a decomposed term with it (DEPICT), lambda sweeps, and score_all."""
from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest

from operators.metrics import (
    CLAIM_METRICS,
    DEPICT_METRICS,
    DSG_METRICS,
    MERGE_TERMS,
    holistic_scores,
    lambda_sweep,
    merge,
    score_all,
    to_arrow,
)
from operators.schema import METRIC_SCORES


def holistic_table(answers: dict[str, tuple[float | None, float | None]]) -> pl.DataFrame:
    return pl.DataFrame(
        [(item, yes, no) for item, (yes, no) in answers.items()],
        schema={"item_id": pl.String, "logp_yes": pl.Float64, "logp_no": pl.Float64},
        orient="row",
    )


def long_table(rows: list[tuple[str, str, float | None, str | None]]) -> pl.DataFrame:
    return pl.DataFrame(
        rows, schema={"item_id": pl.String, "metric": pl.String, "score": pl.Float64, "note": pl.String}, orient="row"
    )


def by_metric(scores: pl.DataFrame, item: str) -> dict[str, tuple[float | None, str | None]]:
    rows = scores.filter(pl.col("item_id") == item)
    return {row["metric"]: (row["score"], row["note"]) for row in rows.iter_rows(named=True)}


def test_vqascore_by_hand():
    # P(yes) = .6, P(no) = .2: normalized .6 / .8 = .75; raw = .6
    scores = holistic_scores(holistic_table({"a": (math.log(0.6), math.log(0.2))}), ["a"])
    got = by_metric(scores, "a")
    assert got["vqascore"] == (pytest.approx(0.75), None)
    assert got["vqascore_raw"] == (pytest.approx(0.6), None)


def test_vqascore_missing_and_absent_answers():
    table = holistic_table({"nan": (math.nan, -1.0), "null": (None, -1.0), "inf": (-1.0, -math.inf),
                            "positive": (0.5, -1.0), "rounding": (1e-9, -3.0)})
    scores = holistic_scores(table, ["nan", "null", "inf", "positive", "rounding", "absent"])
    assert scores.height == 12
    # a log-sum-exp that rounds to just above 0 is still an answer; raw p stays 1
    assert by_metric(scores, "rounding")["vqascore_raw"] == (1.0, None)
    for item in ("nan", "null", "inf", "positive"):
        score, note = by_metric(scores, item)["vqascore"]
        assert score is None and note.startswith("missing_answer"), item
    assert by_metric(scores, "absent") == {"vqascore": (None, "no_answer"), "vqascore_raw": (None, "no_answer")}


def test_duplicate_holistic_answers_are_an_error():
    table = holistic_table({"a": (-0.1, -2.0)})
    with pytest.raises(ValueError, match="holistic answers: duplicate rows for item_id 'a'"):
        holistic_scores(pl.concat([table, table]), ["a"])


DECOMPOSED = long_table([
    ("a", "agree", 0.86, None),
    ("b", "agree", 0.5, "all_undecided"),
    ("c", "agree", None, "missing_answer: 1 of 3 questions"),
    ("a", "soft_tifa_am", 0.1, None),
])
HOLISTIC = long_table([
    ("a", "vqascore", 0.7, None),
    ("b", "vqascore", 0.3, None),
    ("c", "vqascore", 0.4, None),
    ("d", "vqascore", None, "no_answer"),
    ("a", "vqascore_raw", 0.2, None),
])


def test_depict_is_agree_plus_vqascore_and_emitted_under_both_ids():
    merged = merge(DECOMPOSED, HOLISTIC, "agree")
    a = by_metric(merged, "a")
    # lam .5: .5*.7 + .5*.86 = .78
    assert a == {"agree+vqascore": (pytest.approx(0.78), None), "depict": (pytest.approx(0.78), None)}
    # lam .2: .2*.7 + .8*.86 = .14 + .688 = .828
    assert by_metric(merge(DECOMPOSED, HOLISTIC, "agree", lam=0.2), "a")["depict"][0] == pytest.approx(0.828)
    # b: .5*.3 + .5*.5 = .4, keeping agree's flag
    assert by_metric(merged, "b")["depict"] == (pytest.approx(0.4), "all_undecided")


def test_other_terms_merge_under_their_own_id():
    merged = merge(DECOMPOSED, HOLISTIC, "soft_tifa_am", lam=0.5)
    # .5*.7 + .5*.1 = .4
    assert by_metric(merged, "a") == {"soft_tifa_am+vqascore": (pytest.approx(0.4), None)}
    raw = merge(DECOMPOSED, HOLISTIC, "agree", holistic_metric="vqascore_raw")
    # .5*.2 + .5*.86 = .53; not DEPICT, so no "depict" rows
    assert by_metric(raw, "a") == {"agree+vqascore_raw": (pytest.approx(0.53), None)}


def test_null_parts_give_null_merges_that_say_which_part():
    merged = merge(DECOMPOSED, HOLISTIC, "agree")
    assert by_metric(merged, "c")["depict"] == (None, "agree is null (missing_answer: 1 of 3 questions)")
    assert by_metric(merged, "d")["depict"] == (None, "agree is null (not scored); vqascore is null (no_answer)")
    assert sorted(merged["item_id"].unique()) == ["a", "b", "c", "d"]


def test_lambda_must_be_a_weight():
    for lam in (-0.1, 1.5, math.nan):
        with pytest.raises(ValueError, match="lambda must be in"):
            merge(DECOMPOSED, HOLISTIC, "agree", lam=lam)
    with pytest.raises(ValueError, match="lambda must be in"):
        lambda_sweep(DECOMPOSED, HOLISTIC, "agree", [0.0, 2.0])


def test_duplicate_long_rows_are_an_error():
    with pytest.raises(ValueError, match="decomposed scores: duplicate rows for item_id 'a', metric 'agree'"):
        merge(pl.concat([DECOMPOSED, DECOMPOSED]), HOLISTIC, "agree")


def test_lambda_sweep_matches_merge_and_its_ends():
    lams = np.linspace(0, 1, 11)
    sweep = lambda_sweep(DECOMPOSED, HOLISTIC, "agree", lams)
    assert sweep.columns == ["item_id", "lam", "score", "note"]
    assert sweep.height == 11 * 4
    for lam in lams:
        one = merge(DECOMPOSED, HOLISTIC, "agree", lam=lam).filter(pl.col("metric") == "depict")
        at = sweep.filter(pl.col("lam") == lam).drop("lam")
        assert at.join(one, on="item_id").select(
            ((pl.col("score") - pl.col("score_right")).abs() < 1e-15) | pl.col("score").is_null()
        ).to_series().all()
    a = sweep.filter(pl.col("item_id") == "a").sort("lam")
    assert a["score"][0] == pytest.approx(0.86)  # lam 0: the decomposed term alone
    assert a["score"][-1] == pytest.approx(0.7)  # lam 1: VQAScore alone


def test_score_all_emits_every_family_for_every_item():
    decomposed = pl.DataFrame({
        "item_id": ["a", "a"], "question_set": ["depict", "dsg"], "question_id": ["1", "1"],
        "parents": [[], ["0"]], "logp_yes_v": [math.log(0.1)] * 2, "logp_no_v": [math.log(0.9)] * 2,
        "logp_yes_t": [math.log(0.05)] * 2, "logp_no_t": [math.log(0.95)] * 2,
    })
    holistic = holistic_table({"a": (math.log(0.7), math.log(0.3))})
    claims = pl.DataFrame({"item_id": ["a"], "claim_id": ["1"], "claim_type": ["negation"],
                           "logp_yes": [math.log(0.8)], "logp_no": [math.log(0.2)]})
    grounding = pl.DataFrame({"item_id": ["a"], "claim_id": ["1"], "groundable": [True], "s": [0.9]})
    scores = score_all(["a", "b"], decomposed=decomposed, holistic=holistic, claims=claims, grounding=grounding)
    metrics = set(scores["metric"])
    expected = (set(DEPICT_METRICS) | set(DSG_METRICS) | {"vqascore", "vqascore_raw", "depict"}
                | {f"{term}+vqascore" for term in MERGE_TERMS} | set(CLAIM_METRICS) | {"grounding_only"})
    assert metrics == expected
    assert scores.group_by("metric").len()["len"].to_list() == [2] * len(expected)  # items a and b
    a = by_metric(scores, "a")
    assert a["depict"][0] == pytest.approx(0.78)  # .5*.7 + .5*(.1*.05 + .9*.95)
    assert a["dsg"][0] == 0.0 and a["claim_mean_am"][0] == pytest.approx(0.8)
    assert a["claim_mean_am+vqascore"][0] == pytest.approx(0.75)  # .5*.7 + .5*.8
    assert a["grounding_only+vqascore"][0] == pytest.approx(0.8)  # .5*.7 + .5*(1/1 * .9)
    assert by_metric(scores, "b")["depict"] == (None, "agree is null (no_questions); vqascore is null (no_answer)")
    assert to_arrow(scores).schema == METRIC_SCORES


def test_merge_terms_for_computes_only_the_merges_asked_for():
    from operators.metrics import merge_terms_for

    assert merge_terms_for(["depict", "agree", "vqascore"]) == ("agree",)
    assert merge_terms_for(["agree+vqascore", "dsg+vqascore", "dsg"]) == ("agree", "dsg")
    assert merge_terms_for(["claim_mean_am+vqascore"]) == ("claim_mean_am",)
    assert merge_terms_for(["depict"], holistic_metric="judge") == ()  # depict is agree's merge with vqascore only
    assert merge_terms_for([]) == ()
    decomposed = pl.DataFrame({
        "item_id": ["a", "b"], "question_set": ["depict"] * 2, "question_id": ["1"] * 2, "parents": [[], []],
        "logp_yes_v": [math.log(0.3), math.log(0.6)], "logp_no_v": [math.log(0.7), math.log(0.4)],
        "logp_yes_t": [math.log(0.9), math.log(0.2)], "logp_no_t": [math.log(0.1), math.log(0.8)],
    })
    holistic = holistic_table({"a": (math.log(0.7), math.log(0.3)), "b": (math.log(0.2), math.log(0.8))})
    wanted = ["depict", "soft_tifa_gm+vqascore", "vqascore"]
    every = score_all(["a", "b"], decomposed=decomposed, holistic=holistic, question_sets=["depict"])
    some = score_all(["a", "b"], decomposed=decomposed, holistic=holistic, question_sets=["depict"], merge_terms=merge_terms_for(wanted))
    pick = lambda t: t.filter(pl.col("metric").is_in(wanted)).sort("metric", "item_id")  # noqa: E731
    assert pick(some).equals(pick(every)) and pick(some).height == 6
    merged = set(some.filter(pl.col("metric").str.contains(r"\+|^depict$"))["metric"])
    assert merged == {"agree+vqascore", "depict", "soft_tifa_gm+vqascore"}  # no other merge was computed


def test_score_all_with_some_tables_and_options():
    holistic = holistic_table({"a": (math.log(0.7), math.log(0.3))})
    only_holistic = score_all(["a"], holistic=holistic)
    assert set(only_holistic["metric"]) == {"vqascore", "vqascore_raw"}
    assert score_all(["a"]).height == 0
    decomposed = pl.DataFrame({
        "item_id": ["a"], "question_set": ["depict"], "question_id": ["1"], "parents": [[]],
        "logp_yes_v": [math.log(0.3)], "logp_no_v": [math.log(0.1)],
        "logp_yes_t": [math.log(0.9)], "logp_no_t": [math.log(0.1)],
    })
    scores = score_all(["a"], decomposed=decomposed, holistic=holistic, lam=0.0, probability="raw",
                       question_sets=["depict"], merge_terms=["soft_tifa_am"])
    a = by_metric(scores, "a")
    assert "dsg" not in a and "depict" not in a
    assert a["soft_tifa_am+vqascore"][0] == pytest.approx(0.3)  # lam 0, raw p_v = .3
    with pytest.raises(ValueError, match="cannot merge unknown"):
        score_all(["a"], decomposed=decomposed, holistic=holistic, merge_terms=["faith"])
    with pytest.raises(ValueError, match="lambda must be in"):
        score_all(["a"], decomposed=decomposed, lam=1.1)
