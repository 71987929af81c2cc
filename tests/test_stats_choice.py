"""Winoground and multiple-choice accuracy: ties under each policy, bad groups reported."""
from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from pipeline.stats.choice import multiple_choice, winoground


def _winoground(examples: dict[str, tuple]) -> pl.DataFrame:
    """examples: group -> scores (s00, s01, s10, s11), s<image><caption>; None = missing."""
    rows = []
    for group, scores in examples.items():
        for (image, caption), score in zip([(0, 0), (0, 1), (1, 0), (1, 1)], scores):
            rows.append(dict(group_id=group, image_index=image, caption_index=caption, score=score))
    return pl.DataFrame(rows, schema_overrides={"score": pl.Float64})


def test_winoground_hand_computed():
    frame = _winoground(
        {
            "all_right": (0.9, 0.1, 0.2, 0.8),
            "text_tie": (0.9, 0.9, 0.2, 0.95),  # image 0 cannot separate the captions: text fails
            "image_only": (0.9, 0.1, 0.85, 0.8),  # image 1 prefers caption 0; captions still pick images
            "text_only": (0.9, 0.1, 0.95, 0.96),  # caption 0 prefers image 1
        }
    )
    result = winoground(frame)
    assert result.group_ids == ["all_right", "image_only", "text_only", "text_tie"]
    np.testing.assert_array_equal(result.text, [1, 0, 1, 0])
    np.testing.assert_array_equal(result.image, [1, 1, 0, 1])
    np.testing.assert_array_equal(result.group, [1, 0, 0, 0])
    assert result.accuracy("text_acc") == 0.5 and result.accuracy("image") == 0.75 and result.accuracy("group") == 0.25


def test_winoground_all_tied_fails_everything():
    result = winoground(_winoground({"flat": (0.5, 0.5, 0.5, 0.5)}))
    assert (result.text[0], result.image[0], result.group[0]) == (0, 0, 0)


def test_winoground_bad_groups_are_excluded_and_reported():
    frame = _winoground({"ok": (0.9, 0.1, 0.2, 0.8), "missing": (0.9, None, 0.2, 0.8), "nan": (0.9, np.nan, 0.2, 0.8)})
    frame = pl.concat([frame, pl.DataFrame(dict(group_id=["short"], image_index=[0], caption_index=[0], score=[0.3]))])
    dup = frame.filter(pl.col("group_id") == "ok").with_columns(group_id=pl.lit("dup"))
    frame = pl.concat([frame, dup, dup.head(1)])
    result = winoground(frame)
    assert result.group_ids == ["ok"]
    assert set(result.excluded) == {"missing", "nan", "short", "dup"}
    assert "without a score" in result.excluded["missing"] and "appears 2 times" in result.excluded["dup"]
    assert "got 1 option" in result.excluded["short"]


def _mcq() -> pl.DataFrame:
    return pl.DataFrame(
        dict(
            group_id=["tie3"] * 4 + ["tie2_first"] * 4 + ["clean"] * 4 + ["wrong"] * 4,
            caption_index=[0, 1, 2, 3] * 4,
            correct=[False, True, False, False] + [True, False, False, False] + [False, False, True, False] + [True, False, False, False],
            score=[0.5, 0.5, 0.5, 0.1] + [0.3, 0.3, 0.2, 0.1] + [0.1, 0.2, 0.9, 0.3] + [0.1, 0.4, 0.2, 0.3],
            template=["negation"] * 4 + ["affirmative"] * 4 + ["negation"] * 4 + ["hybrid"] * 4,
        )
    )


@pytest.mark.parametrize(
    "policy, credits",
    [
        ("expected", [1 / 3, 1 / 2, 1, 0]),  # tie3, tie2_first, clean, wrong
        ("strict", [0, 0, 1, 0]),
        ("first", [0, 1, 1, 0]),  # tie3: option 0 is listed first, the correct one is 1
    ],
)
def test_multiple_choice_tie_policies(policy, credits):
    result = multiple_choice(_mcq(), policy)
    assert result.group_ids == ["clean", "tie2_first", "tie3", "wrong"]
    expected = dict(zip(["tie3", "tie2_first", "clean", "wrong"], credits))
    np.testing.assert_allclose(result.credit, [expected[g] for g in result.group_ids])
    assert result.accuracy == pytest.approx(np.mean(credits))
    assert result.n_tied == 2 and result.tie_policy == policy


def test_multiple_choice_by_template():
    result = multiple_choice(_mcq(), "expected")
    by_template = result.by_template()
    assert by_template["negation"] == (pytest.approx((1 / 3 + 1) / 2), 2)
    assert by_template["affirmative"] == (0.5, 1) and by_template["hybrid"] == (0.0, 1)


def test_multiple_choice_bad_groups_are_excluded_and_reported():
    frame = pl.concat(
        [
            _mcq(),
            pl.DataFrame(
                dict(
                    group_id=["no_correct"] * 2 + ["two_correct"] * 2 + ["missing"] * 2 + ["single"],
                    caption_index=[0, 1, 0, 1, 0, 1, 0],
                    correct=[False, False, True, True, True, False, True],
                    score=[0.1, 0.2, 0.1, 0.2, None, 0.2, 0.9],
                    template=[None] * 7,
                ),
                schema_overrides={"score": pl.Float64, "template": pl.String},
            ),
        ]
    )
    result = multiple_choice(frame)
    assert result.n == 4
    assert result.excluded == {
        "missing": "1 option(s) without a score",
        "no_correct": "0 options marked correct (need exactly 1)",
        "single": "only 1 option",
        "two_correct": "2 options marked correct (need exactly 1)",
    }


def test_multiple_choice_input_errors():
    with pytest.raises(ValueError, match="tie_policy"):
        multiple_choice(_mcq(), "random")
    with pytest.raises(ValueError, match="missing column"):
        multiple_choice(_mcq().drop("correct"))
