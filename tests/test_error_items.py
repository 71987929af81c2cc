"""Every error row of the answers stage names the items it affects.

The stage works on deduplicated requests, so its `prompt_too_long` / `engine_error` rows carried
only a request key: the item showed `missing_answer`, its errors list was empty and a data team
could not tell which rows of a shard failed, or why."""
from __future__ import annotations

import polars as pl
import pyarrow as pa
import pytest
from PIL import Image

from operators import schema
from pipeline import Scorer
from pipeline.stages.answers import AnswerPlan
from pipeline.stages.scores import errors_for_items, with_error_notes


def _plan() -> AnswerPlan:
    questions = pl.DataFrame(
        {"item_id": ["demo/a", "demo/a", "demo/b"], "key_v": ["v1", "v2", "v3"], "key_t": ["t1", "t2", "t1"]}
    )
    holistic = pl.DataFrame({"item_id": ["demo/a", "demo/b"], "key_h": ["h1", "h2"]})
    return AnswerPlan(questions=questions, holistic=holistic, requests=schema.REQUESTS.empty_table())


def _errors(rows: list[dict]) -> pa.Table:
    return schema.error_table(rows)


def test_error_rows_keep_every_field_whatever_the_first_row_holds():
    """Before: the table took its columns from the first row, so a first row without `item_id`
    dropped the item of every row after it."""
    table = schema.error_table([
        {"stage": "answers", "key": "k1", "reason": "engine_error"},
        {"stage": "ingest", "item_id": "demo/a", "field": "image_uri", "reason": "unreadable_image", "detail": "truncated"},
    ])
    assert table.schema == schema.ERRORS
    assert table.to_pylist()[1]["item_id"] == "demo/a" and table.to_pylist()[1]["detail"] == "truncated"
    assert schema.error_table([]).num_rows == 0


def test_a_shared_request_fans_out_to_every_item_that_uses_it():
    items = pl.DataFrame({"item_id": ["demo/a", "demo/b"], "benchmark": ["demo", "demo"]})
    errors = _errors([
        {"stage": "answers", "key": "t1", "reason": "prompt_too_long", "detail": "900 > 512"},  # caption request of both items
        {"stage": "answers", "key": "h2", "reason": "engine_error", "detail": "boom"},
        {"stage": "answers", "key": "zz", "reason": "engine_error", "detail": "no item uses it"},
        {"stage": "ingest", "item_id": "demo/c", "benchmark": "other", "reason": "unreadable_image"},
    ])
    out = pl.from_arrow(errors_for_items(errors, _plan(), items))
    got = sorted((r["key"] or "", r["item_id"] or "", r["benchmark"] or "", r["reason"]) for r in out.iter_rows(named=True))
    assert got == [
        ("", "demo/c", "other", "unreadable_image"),  # already placed: untouched
        ("h2", "demo/b", "demo", "engine_error"),
        ("t1", "demo/a", "demo", "prompt_too_long"),  # one caption request, two items
        ("t1", "demo/b", "demo", "prompt_too_long"),
        ("zz", "", "", "engine_error"),  # a key no item uses is kept, not dropped
    ]
    assert out.schema == pl.from_arrow(schema.ERRORS.empty_table()).schema


def test_a_null_score_note_leads_with_the_real_cause():
    scores = pl.DataFrame({
        "item_id": ["demo/a", "demo/b", "demo/b"],
        "metric": ["depict", "depict", "vqascore"],
        "score": [None, 0.7, None],
        "note": ["missing_answer: 1 of 2 questions", None, "missing_answer: logp_yes or logp_no is null, not finite or positive"],
    })
    errors = _errors([
        {"stage": "answers", "item_id": "demo/a", "key": "t1", "reason": "prompt_too_long", "detail": "900 > 512"},
        {"stage": "answers", "item_id": "demo/b", "key": "h2", "reason": "engine_error", "detail": "boom"},
    ])
    notes = with_error_notes(scores, errors)["note"].to_list()
    assert notes == [
        "prompt_too_long (900 > 512): missing_answer: 1 of 2 questions",
        None,  # a score that exists keeps its note
        "engine_error (boom): missing_answer: logp_yes or logp_no is null, not finite or positive",
    ]


@pytest.mark.slow
def test_a_too_long_caption_is_named_on_its_own_row(tmp_path, tiny_vlm_dir):
    """End to end through the API: the row with a 2,000-word caption says `prompt_too_long` with
    the token count, in its error, its note and the run's errors table; the other row scores."""
    image = tmp_path / "red.png"
    Image.new("RGB", (48, 40), "red").save(image)
    long_caption = " ".join(["a red circle"] * 700)
    questions = {"a red circle": ["Is there a circle?"], long_caption: ["Is there a circle?"]}
    scorer = Scorer(
        "smoke", metrics=["depict", "vqascore"], root=tmp_path / "root", executor="local",
        overrides=["backbone_overrides.smoke.max_prompt_tokens=400"],
    )
    out_dir = tmp_path / "run"
    scores = scorer([str(image), str(image)], ["a red circle", long_caption], questions=questions, out_dir=str(out_dir))
    assert scores["error"].to_list() == [None, "prompt_too_long"]
    assert "max_prompt_tokens 400" in scores["error_detail"][1]
    assert scores["depict"][0] is not None and scores["depict"][1] is None
    assert scores["note_depict"][1].startswith("prompt_too_long (") and scores["note_vqascore"][1].startswith("prompt_too_long (")
    assert "missing_answer" in scores["note_depict"][1]
    errors = pl.read_parquet(out_dir / "errors.parquet").filter(pl.col("reason") == "prompt_too_long")
    assert errors.height >= 1 and set(errors["item_id"].to_list()) == {"1"}
