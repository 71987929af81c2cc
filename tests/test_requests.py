import polars as pl

from operators.requests import KeySpec, plan_holistic, plan_questions, unique_requests

SPEC = KeySpec(backbone="b", fingerprint="fp", prompt_ids={"image": "v1:i", "caption": "v1:c", "holistic": "v1:h", "claim": "v1:k"})


def items():
    # one caption shown with three images; a second caption on one image; image "h1" shared
    return pl.DataFrame(
        {
            "item_id": ["x/1", "x/2", "x/3", "x/4"],
            "image_hash": ["h1", "h2", "h3", "h1"],
            "image_uri": ["/i/1", "/i/2", "/i/3", "/i/1"],
            "caption": ["a cat", "a cat", "a cat", "a dog"],
        }
    )


def questions():
    return pl.DataFrame(
        {
            "caption": ["a cat", "a cat", "a dog", "a cat"],
            "question_set": ["depict", "depict", "depict", "dsg"],
            "question_id": ["1", "2", "1", "1"],
            "question": ["Is there a cat?", "Is there a dog?", "Is there a dog?", "Is there a cat?"],
            "parents": [[], [], [], []],
            "claim_type": [None, None, None, None],
        },
        schema_overrides={"parents": pl.List(pl.String)},
    )


def test_caption_only_requests_are_unique_caption_question_pairs():
    plan = plan_questions(items(), questions(), SPEC, ["depict", "dsg"])
    assert plan.height == 3 * 2 + 1 * 1 + 3 * 1  # depict: 3 items x 2 + 1 item x 1; dsg: 3 items x 1
    requests = unique_requests(SPEC, plan, None).to_pylist()
    caption_only = [r for r in requests if r["kind"] == "caption"]
    assert {(r["caption"], r["text"]) for r in caption_only} == {("a cat", "Is there a cat?"), ("a cat", "Is there a dog?"), ("a dog", "Is there a dog?")}
    assert len(caption_only) == 3  # not items x questions (7)
    assert all(r["image_hash"] is None for r in caption_only)


def test_image_requests_dedup_by_image_and_question_across_sets_and_items():
    plan = plan_questions(items(), questions(), SPEC, ["depict", "dsg"])
    image = [r for r in unique_requests(SPEC, plan, None).to_pylist() if r["kind"] == "image"]
    # (h1, cat?) is asked by depict and dsg for x/1; (h1, dog?) by x/1 and x/4: each once
    pairs = [(r["image_hash"], r["text"]) for r in image]
    assert len(pairs) == len(set(pairs))
    assert set(pairs) == {(h, q) for h in ("h1", "h2", "h3") for q in ("Is there a cat?", "Is there a dog?")}


def test_keys_join_back_and_depend_on_everything_that_matters():
    plan = plan_questions(items(), questions(), SPEC, ["depict"])
    keys = set(unique_requests(SPEC, plan, None).column("key").to_pylist())
    assert set(plan["key_v"]) | set(plan["key_t"]) == keys
    # the same caption-only pair has the same key on every item
    t = plan.filter(pl.col("question_id") == "1").filter(pl.col("caption") == "a cat")["key_t"]
    assert t.n_unique() == 1
    other = KeySpec(backbone="b", fingerprint="fp2", prompt_ids=SPEC.prompt_ids)
    assert SPEC.key("image", "h1", None, "q") != other.key("image", "h1", None, "q")
    assert SPEC.key("image", "h1", None, "q") != SPEC.key("caption", None, "h1", "q")


def test_requests_of_one_image_are_adjacent_and_holistic_is_per_image_caption():
    plan = plan_questions(items(), questions(), SPEC, ["depict"])
    hplan = plan_holistic(items(), SPEC)
    assert hplan["key_h"].n_unique() == 4
    rows = unique_requests(SPEC, plan, hplan).to_pylist()
    hashes = [r["image_hash"] for r in rows]
    seen, last = set(), object()
    for h in hashes:
        if h != last:
            assert h not in seen, "requests of one image must be contiguous"
            seen.add(h)
            last = h
    assert sum(r["kind"] == "holistic" for r in rows) == 4
    assert all(r["prompt_id"] == SPEC.prompt_ids[r["kind"]] for r in rows)


def test_caption_only_requests_of_one_caption_are_adjacent():
    # the hf engine shares the prefix (header, instruction, quoted caption) of requests in one call
    qs = questions().vstack(questions().head(1).with_columns(caption=pl.lit("a dog"), question=pl.lit("Is there a bird?"), question_id=pl.lit("2")))
    rows = unique_requests(SPEC, plan_questions(items(), qs, SPEC, ["depict"]), None).to_pylist()
    captions = [r["caption"] for r in rows if r["kind"] == "caption"]
    assert captions == ["a cat", "a cat", "a dog", "a dog"]  # by question alone: dog (bird), cat, cat, dog


def test_claims_are_answered_on_the_image_only():
    qs = questions().with_columns(pl.lit("claims").alias("question_set"), pl.lit("object").alias("claim_type"))
    plan = plan_questions(items(), qs.unique(subset=["caption", "question_id"]), SPEC, ["claims"])
    assert plan["key_t"].null_count() == plan.height
    kinds = {r["kind"] for r in unique_requests(SPEC, plan, None).to_pylist()}
    assert kinds == {"claim"}


def test_every_row_key_is_spec_key_with_and_without_repeated_tuples():
    # depict repeats (h1, "Is there a dog?") across items; the holistic plan of distinct items repeats nothing
    plan = plan_questions(items(), questions(), SPEC, ["depict", "dsg"])
    for r in plan.iter_rows(named=True):
        assert r["key_v"] == SPEC.key("image", r["image_hash"], None, r["question"])
        caption_answered = r["question_set"] == "depict"  # DSG is answered on the image only
        assert r["key_t"] == (SPEC.key("caption", None, r["caption"], r["question"]) if caption_answered else None)
    for frame in (items(), items().slice(0, 3)):  # (h1, "a cat") once; x/4 is (h1, "a dog")
        for r in plan_holistic(frame.reverse(), SPEC).iter_rows(named=True):
            assert r["key_h"] == SPEC.key("holistic", r["image_hash"], r["caption"], r["caption"])
    repeated = pl.concat([items(), items()]).with_columns(item_id=pl.Series([f"y/{i}" for i in range(8)]))
    hol = plan_holistic(repeated, SPEC)
    assert hol["key_h"].to_list() == [SPEC.key("holistic", h, c, c) for h, c in zip(repeated["image_hash"], repeated["caption"], strict=True)]
