"""tests/mutation.py edits the production code every caller runs, and puts it back."""
from __future__ import annotations

import math

import polars as pl
import pytest
from mutation import mutated

from operators.metrics import decomposed
from operators.metrics.decomposed import depict_scores  # imported by name: the mutant must reach it too

COMMITMENT = "commitment=(2.0 * p_t - 1.0).abs(),\n        )"


def answers() -> pl.DataFrame:
    # one item: a decided question answered right (p_v 0.9, p_t 0.99) and an open one (p_t 0.5, p_v 0.9)
    rows = [("q1", 0.9, 0.99), ("q2", 0.9, 0.5)]
    return pl.DataFrame({
        "item_id": ["a", "a"], "question_set": ["depict", "depict"], "question_id": [q for q, _, _ in rows],
        "logp_yes_v": [math.log(v) for _, v, _ in rows], "logp_no_v": [math.log(1 - v) for _, v, _ in rows],
        "logp_yes_t": [math.log(t) for _, _, t in rows], "logp_no_t": [math.log(1 - t) for _, _, t in rows],
    })


def agree() -> float:
    return depict_scores(answers(), ["a"]).filter(pl.col("metric") == "agree")["score"].item()


def test_a_mutation_reaches_callers_that_imported_by_name_and_is_undone():
    right = agree()
    assert right == pytest.approx(0.9 * 0.99 + 0.1 * 0.01)  # the open question weighs 0
    with mutated(decomposed, COMMITMENT, COMMITMENT.replace("p_t", "p_v")):
        wrong = agree()
    assert wrong == pytest.approx(((0.9 * 0.99 + 0.1 * 0.01) + 0.5) / 2)  # both weigh 0.8: the open one counts
    assert agree() == right


def test_a_mutation_must_name_one_place_and_change_code():
    with pytest.raises(AssertionError, match="occurs 2 times"):
        with mutated(decomposed, "commitment=(2.0 * p", "x"):
            pass
    with pytest.raises(AssertionError, match="changed no function"):
        with mutated(decomposed, "DEPICT_METRICS = ids(\"depict\")", "DEPICT_METRICS = ids(\"depict\") "):
            pass
