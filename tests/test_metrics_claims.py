"""Claim means (arithmetic, geometric, harmonic, minimum) and the grounding-only score."""
from __future__ import annotations

import math
import warnings

import numpy as np
import polars as pl
import pytest
from scipy.stats import gmean, hmean

from operators.metrics import CLAIM_METRICS, claim_scores, grounding_only, to_arrow
from operators.schema import METRIC_SCORES


def claim_table(claims: dict[str, list[float]]) -> pl.DataFrame:
    """Claim answers whose q_i are the given probabilities."""
    rows = [
        (item, str(k), "object", math.log(q), math.log1p(-q))
        for item, qs in claims.items()
        for k, q in enumerate(qs, start=1)
    ]
    schema = {"item_id": pl.String, "claim_id": pl.String, "claim_type": pl.String,
              "logp_yes": pl.Float64, "logp_no": pl.Float64}
    return pl.DataFrame(rows, schema=schema, orient="row")


def grounding_table(claims: dict[str, list[tuple[bool | None, float | None]]]) -> pl.DataFrame:
    rows = [(item, str(k), groundable, s) for item, results in claims.items()
            for k, (groundable, s) in enumerate(results, start=1)]
    schema = {"item_id": pl.String, "claim_id": pl.String, "groundable": pl.Boolean, "s": pl.Float64}
    return pl.DataFrame(rows, schema=schema, orient="row")


def by_metric(scores: pl.DataFrame, item: str) -> dict[str, tuple[float | None, str | None]]:
    rows = scores.filter(pl.col("item_id") == item)
    return {row["metric"]: (row["score"], row["note"]) for row in rows.iter_rows(named=True)}


def test_claim_means_by_hand():
    # q = .8, .5, .2
    # am = 1.5 / 3 = .5; gm = (.8 * .5 * .2)^(1/3) = .08^(1/3) = .43089
    # hm = 3 / (1.25 + 2 + 5) = 3 / 8.25 = .36364; min = .2
    got = by_metric(claim_scores(claim_table({"a": [0.8, 0.5, 0.2]}), ["a"]), "a")
    assert got["claim_mean_am"] == (pytest.approx(0.5), None)
    assert got["claim_mean_gm"] == (pytest.approx(0.08 ** (1 / 3)), None)
    assert got["claim_mean_gm"][0] == pytest.approx(0.430887, rel=1e-5)
    assert got["claim_mean_hm"] == (pytest.approx(3 / 8.25), None)
    assert got["claim_mean_min"] == (pytest.approx(0.2), None)


def test_claim_means_match_scipy_on_random_items():
    rng = np.random.default_rng(3)
    claims = {f"i{i}": rng.uniform(0.01, 0.99, rng.integers(1, 9)).tolist() for i in range(200)}
    scores = claim_scores(claim_table(claims), list(claims))
    for item, qs in claims.items():
        got = by_metric(scores, item)
        assert got["claim_mean_am"][0] == pytest.approx(np.mean(qs), rel=1e-9)
        assert got["claim_mean_gm"][0] == pytest.approx(gmean(qs), rel=1e-9)
        assert got["claim_mean_hm"][0] == pytest.approx(hmean(qs), rel=1e-9)
        assert got["claim_mean_min"][0] == pytest.approx(min(qs), rel=1e-9)


def test_claim_that_underflows_to_zero():
    # logp_yes -800 vs logp_no 0: q = 0 in float64. hm = 2 / (1/1 + inf) = 0, min = 0,
    # gm = exp((-800 + 0) / 2) = exp(-400), tiny but computed in log space, not NaN.
    table = pl.DataFrame({"item_id": ["z", "z"], "claim_id": ["1", "2"],
                          "logp_yes": [-800.0, 0.0], "logp_no": [0.0, -800.0]})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = by_metric(claim_scores(table, ["z"]), "z")
    assert got["claim_mean_am"] == (pytest.approx(0.5), None)
    assert got["claim_mean_gm"] == (pytest.approx(math.exp(-400)), None)
    assert got["claim_mean_hm"] == (0.0, None)
    assert got["claim_mean_min"] == (0.0, None)


def test_claim_edge_cases():
    table = claim_table({"ok": [0.9], "bad": [0.9, 0.8, 0.7]}).with_columns(
        logp_no=pl.when((pl.col("item_id") == "bad") & (pl.col("claim_id") == "3")).then(None).otherwise(pl.col("logp_no"))
    )
    scores = claim_scores(table, ["ok", "bad", "none"])
    assert scores.height == 3 * len(CLAIM_METRICS)
    assert by_metric(scores, "bad") == {m: (None, "missing_answer: 1 of 3 claims") for m in CLAIM_METRICS}
    assert by_metric(scores, "none") == {m: (None, "no_claims") for m in CLAIM_METRICS}
    assert to_arrow(scores).schema == METRIC_SCORES
    with pytest.raises(ValueError, match="claim answers: duplicate rows for item_id 'ok', claim_id '1'"):
        claim_scores(pl.concat([table, table.filter(pl.col("item_id") == "ok")]), ["ok"])
    with pytest.raises(ValueError, match="claim answers: missing column.*logp_yes"):
        claim_scores(table.drop("logp_yes"), ["ok"])


def test_grounding_only_by_hand():
    # two groundable claims (s .8, .2) of four: (2/4) * exp((ln .8 + ln .2) / 2) = .5 * sqrt(.16) = .2
    # s = 0 is floored at 1e-6: (3/3) * (.9 * .4 * 1e-6)^(1/3) = (3.6e-7)^(1/3) = 7.1138e-3
    table = grounding_table({
        "half": [(True, 0.8), (False, None), (True, 0.2), (False, 0.7)],
        "floor": [(True, 0.9), (True, 0.4), (True, 0.0)],
    })
    scores = grounding_only(table, ["half", "floor"])
    assert by_metric(scores, "half") == {"grounding_only": (pytest.approx(0.2), None)}
    assert by_metric(scores, "floor")["grounding_only"][0] == pytest.approx(3.6e-7 ** (1 / 3))
    assert by_metric(scores, "floor")["grounding_only"][0] == pytest.approx(7.1138e-3, rel=1e-4)


def test_grounding_only_edge_cases():
    table = grounding_table({
        "none_groundable": [(False, None), (False, None)],
        "null_s": [(True, 0.5), (True, None), (False, None)],
        "out_of_range": [(True, 1.3)],
        "unknown_groundable": [(None, 0.5), (True, 0.5)],
    })
    scores = grounding_only(table, ["none_groundable", "null_s", "out_of_range", "unknown_groundable", "absent"])
    assert by_metric(scores, "none_groundable")["grounding_only"] == (None, "no_groundable_claims")
    assert by_metric(scores, "null_s")["grounding_only"] == (None, "invalid_grounding: 1 of 3 claims")
    assert by_metric(scores, "out_of_range")["grounding_only"] == (None, "invalid_grounding: 1 of 1 claims")
    assert by_metric(scores, "unknown_groundable")["grounding_only"] == (None, "invalid_grounding: 1 of 2 claims")
    assert by_metric(scores, "absent")["grounding_only"] == (None, "no_claims")
    with pytest.raises(ValueError, match="grounding results: duplicate rows for item_id 'null_s', claim_id '1'"):
        grounding_only(pl.concat([table, table.head(3).tail(1)]), ["null_s"])
