"""Vectorised request keys must equal today's per-row keys byte for byte: a changed key would
silently invalidate every stored answer (the cache is addressed by these keys)."""
import random

import polars as pl
import pyarrow as pa
import pytest

from operators.hashing import content_key, content_keys
from operators.requests import KeySpec, plan_holistic, plan_questions, unique_requests

SPEC = KeySpec(backbone="b", fingerprint="fp", prompt_ids={"image": "v1:i", "caption": "v1:c", "holistic": "v1:h", "claim": "v1:k"})

TRICKY = [None, "", " ", "a", "\x00", "\x1f", "a\x1fb", "\x00\x1f", "un café", "日本語のキャプション", "🐈‍⬛ emoji", "e\u0301", "tab\tnew\nline", "x" * 5000]


def test_content_key_itself_is_unchanged():
    # pinned values of the per-row key (stores written by earlier versions hold these)
    assert content_key("fp", "v1:i", "image", "h1", None, "Is there a cat?") == "ef0a9637856ab6a2626d4fc0a8a694fb"
    assert content_key("fp", "v1:c", "caption", None, "un café 日本 🐈", "") == "a3e5251af889db5e788085541f388602"


def test_content_keys_equal_per_row_keys_on_varied_inputs():
    rng = random.Random(7)
    rows = [(rng.choice(TRICKY), rng.choice(TRICKY), rng.choice(TRICKY)) for _ in range(3000)]
    rows += [(a, b, c) for a in TRICKY[:6] for b in TRICKY[:6] for c in TRICKY[:6]]
    cols = list(zip(*rows))
    expected = [content_key("fp", "v1:i", "image", *row) for row in rows]
    # polars, Arrow (string and large_string, chunked) and plain lists give the same keys
    assert content_keys([pl.Series(c, dtype=pl.String) for c in cols], ("fp", "v1:i", "image")) == expected
    assert content_keys([pa.array(c, pa.string()) for c in cols], ("fp", "v1:i", "image")) == expected
    chunked = [pa.chunked_array([pa.array(c[:100], pa.large_string()), pa.array(c[100:], pa.large_string())]) for c in cols]
    assert content_keys(chunked, ("fp", "v1:i", "image")) == expected
    assert content_keys([list(c) for c in cols], ("fp", "v1:i", "image")) == expected
    # prefix parts that are None or numbers are hashed as content_key hashes them
    assert content_keys([cols[0]], (None, 3, 0.5)) == [content_key(None, 3, 0.5, a) for a in cols[0]]
    assert content_keys([pl.Series([None, None], dtype=pl.Null)], ("p",)) == [content_key("p", None)] * 2


def test_content_keys_refuse_non_text_and_ragged_columns():
    with pytest.raises(TypeError, match="text columns"):
        content_keys([pa.array([1, 2])])
    with pytest.raises(ValueError, match="different lengths"):
        content_keys([["a"], ["a", "b"]])


def test_plan_keys_equal_per_row_spec_keys():
    rng = random.Random(3)
    texts = [t for t in TRICKY if t]  # captions and questions are non-empty after ingest
    n = 400
    items = pl.DataFrame(
        {
            "item_id": [f"x/{i}" for i in range(n)],
            "image_hash": [rng.choice(["h1", "h2", "ĥ3", None]) for _ in range(n)],
            "image_uri": [f"/i/{i}" for i in range(n)],
            "caption": [rng.choice(texts) for _ in range(n)],
        }
    )
    captions = items["caption"].unique().to_list()
    questions = pl.DataFrame(
        {
            "caption": [c for c in captions for _ in range(3)],
            "question_set": ["depict", "dsg", "claims"] * len(captions),
            "question_id": ["1", "1", "1"] * len(captions),
            "question": [rng.choice(texts) for _ in range(3 * len(captions))],
            "parents": [[] for _ in range(3 * len(captions))],
            "claim_type": [None] * (3 * len(captions)),
        },
        schema_overrides={"parents": pl.List(pl.String), "claim_type": pl.String},
    )
    plan = plan_questions(items, questions, SPEC, ["depict", "dsg", "claims"])
    kind = {"depict": "image", "dsg": "image", "claims": "claim"}
    for r in plan.iter_rows(named=True):
        assert r["key_v"] == SPEC.key(kind[r["question_set"]], r["image_hash"], None, r["question"])
        expected_t = SPEC.key("caption", None, r["caption"], r["question"]) if r["question_set"] == "depict" else None
        assert r["key_t"] == expected_t
    holistic = plan_holistic(items, SPEC)
    assert holistic["key_h"].to_list() == [SPEC.key("holistic", h, c, c) for h, c in zip(items["image_hash"], items["caption"])]
    assert unique_requests(SPEC, plan, holistic).num_rows == len(set(plan["key_v"]) | set(plan["key_t"].drop_nulls()) | set(holistic["key_h"]))


def test_empty_plans_need_no_prompt_id():
    spec = KeySpec(backbone="b", fingerprint="fp", prompt_ids={})
    empty = pl.DataFrame(schema={"item_id": pl.String, "image_hash": pl.String, "image_uri": pl.String, "caption": pl.String})
    assert plan_holistic(empty, spec)["key_h"].len() == 0
