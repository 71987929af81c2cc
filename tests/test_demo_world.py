"""The demo world's sampler: seeded, balanced, truthful, and disjoint from the benchmark's items."""
from __future__ import annotations

import collections

import pytest

from operators import demo_world
from pipeline.benchmarks import demo


def _draws(seed: int, split: str, n: int = 300) -> list[demo_world.WorldRequest]:
    sampler = demo_world.WorldSampler(seed, split)
    return [sampler.request(kind) for _ in range(n) for kind in demo_world.REQUEST_KINDS]


def test_same_seed_same_draws_and_splits_differ():
    assert _draws(3, "train", 50) == _draws(3, "train", 50)
    assert _draws(3, "train", 50) != _draws(4, "train", 50)
    assert _draws(3, "train", 50) != _draws(3, "heldout", 50)
    with pytest.raises(ValueError, match="unknown split"):
        demo_world.WorldSampler(0, "benchmark")


def test_no_draw_is_a_benchmark_scene_or_caption():
    scenes, captions = demo_world.benchmark_scenes(), demo_world.benchmark_captions()
    assert len(scenes) > 40 and len(captions) > 40
    for r in _draws(0, "train", 600):
        assert r.scene is None or frozenset(r.scene) not in scenes
        assert r.caption is None or r.caption not in captions


def test_truths_follow_the_world_and_answers_are_balanced():
    counts = collections.Counter()
    for r in _draws(1, "heldout", 600):
        counts[r.kind, r.fact_type, r.answer] += 1
        if r.kind == "holistic":
            assert r.caption and r.question is None
        elif r.kind == "caption":
            assert r.scene is None and r.caption and r.question.endswith("?")
            assert r.answer == (r.fact_type != "negation")
        else:
            assert r.scene and r.caption is None and r.form in ("depict", "dsg")
    for kind in demo_world.REQUEST_KINDS:
        yes = sum(v for (k, _, a), v in counts.items() if k == kind and a)
        total = sum(v for (k, _, _), v in counts.items() if k == kind)
        assert 0.4 < yes / total < 0.6, (kind, yes, total)
    for fact_type in demo_world.FACT_TYPES.values():  # image requests: every type, both answers
        assert counts["image", fact_type, True] > 30 and counts["image", fact_type, False] > 30


def test_caption_requests_of_one_template():
    """Hybrid captions (a thing stated beside a thing denied) on request: both kinds of question,
    truths as for any caption; the template is a caption request's option only."""
    sampler = demo_world.WorldSampler(2)
    draws = [sampler.request("caption", template="hybrid") for _ in range(200)]
    assert {demo_world.Caption(tuple(_clauses(r.caption))).template for r in draws} == {"hybrid"}
    assert not any(r.caption.startswith("a picture with") for r in draws)  # the negation template's words
    asked = collections.Counter(r.fact_type for r in draws)
    assert asked["negation"] > 50 and asked["existence"] > 30  # denied things and stated ones
    assert all(r.answer == (r.fact_type != "negation") for r in draws)
    assert not any(p.startswith("no ") for p in sampler.request("caption", template="affirmative").caption.split(" and "))
    for kind, template in (("image", "hybrid"), ("caption", "mixed")):
        with pytest.raises(ValueError, match="template"):
            sampler.request(kind, template=template)
    # the multiple-choice part's short form: one thing stated, one denied, no relations
    short = [sampler.request("caption", template="hybrid", negbench_form=True) for _ in range(100)]
    assert all(len(r.caption.split(" and ")) == 2 and r.caption.split(" and ")[1].startswith("no ") for r in short)
    assert all(r.answer == (r.fact_type != "negation") for r in short)
    assert {r.fact_type for r in short} >= {"negation", "existence", "attribute"}
    with pytest.raises(ValueError, match="named template"):
        sampler.request("caption", negbench_form=True)
    with pytest.raises(ValueError, match="spatial"):
        sampler.request("caption", "spatial", template="hybrid", negbench_form=True)
    # combinations no caption can give raise at once, rather than drawing forever
    for options in ({"template": "affirmative", "answer": False}, {"template": "negation", "fact_type": "count"},
                    {"fact_type": "negation", "answer": True}):
        with pytest.raises(ValueError, match="implies"):
            sampler.request("caption", **options)


def _clauses(text: str) -> list:
    """A caption's clauses parsed back from its text: enough to name its template."""
    return [demo_world.No("x") if part.startswith("no ") else demo_world.Thing("x") for part in text.split(" and ")]


def test_image_truths_recomputed_from_the_pixels_facts():
    """An image request's answer is the fact's truth on its scene, re-derived here from the
    caption-free question text through the benchmark's own question forms."""
    sampler = demo_world.WorldSampler(5)
    for _ in range(200):
        r = sampler.request("image")
        facts = [f for f in _all_facts(r.scene) if demo_world.fact_question(f, r.form) == r.question]
        assert facts, r
        assert {demo_world.image_truth(f, r.form, r.scene) for f in facts} == {r.answer}


def _all_facts(scene):
    """Every fact of every type and form whose question could be asked about these shapes."""
    out = []
    for shape in demo_world.SHAPES:
        for colour in (*demo_world.COLOURS, None):
            out += [demo_world.Fact("present", shape), demo_world.Fact("absent", shape, colour)]
            if colour:
                out += [demo_world.Fact("colour", shape, colour), demo_world.Fact("colour", shape, colour, plural=True)]
            out += [demo_world.Fact("count", shape, colour, count=n) for n in demo_world.NUMBER_WORDS]
            for relation in demo_world.RELATIONS:
                for other in demo_world.SHAPES:
                    for other_colour in (*demo_world.COLOURS, None):
                        out.append(demo_world.Fact("spatial", shape, colour, relation=relation, other=(other, other_colour)))
    return out


def test_sampled_scenes_render_with_the_benchmarks_rasteriser():
    scene = demo_world.WorldSampler(2).scene()
    assert demo.render is demo_world.render and demo.png_bytes(demo.render(scene))[:8] == b"\x89PNG\r\n\x1a\n"


# ------------------------------------------------------------------ the large demo's drawn items


def test_each_split_draws_only_its_own_content_slots():
    for split in ("train", "heldout", "bench"):
        sampler = demo_world.WorldSampler(0, split)
        for r in _draws(0, split, 100) + [sampler.open_request() for _ in range(50)]:
            assert r.scene is None or demo_world.split_of_slot(demo_world.scene_slot(r.scene)) == split
            assert r.caption is None or demo_world.split_of_slot(demo_world.caption_slot(r.caption)) == split
    bench = demo_world.WorldSampler(0, "bench")
    scenes = [bench.scene() for _ in range(200)]
    assert all(demo_world.reserved_scene(s) for s in scenes)
    assert all(demo_world.reserved_caption(bench.caption(s).text) for s in scenes[:50])
    # the rule is a content hash: order-free for scenes, word-order-free for captions (swapped pairs go together)
    a, b = demo_world.scene("red circle top left", "blue square bottom right"), demo_world.scene("blue square bottom right", "red circle top left")
    assert demo_world.scene_slot(a) == demo_world.scene_slot(b)
    assert demo_world.caption_slot("a red circle above a blue square") == demo_world.caption_slot("a blue square above a red circle")
    everything = [demo_world.scene(f"{c} {s} top left") for c in demo_world.COLOURS for s in demo_world.SHAPES]
    slots = collections.Counter(demo_world.split_of_slot(demo_world.scene_slot(s)) for s in everything)
    assert slots["train"] > slots["heldout"] > 0 and slots["bench"] > 0  # a share each, not all or none


def request_key(r: demo_world.WorldRequest) -> tuple:
    return r.kind, None if r.scene is None else frozenset(r.scene), r.caption, r.question


def test_no_heldout_request_repeats_a_training_request_verbatim():
    train = demo_world.WorldSampler(0, "train")
    seen = {request_key(train.request(kind)) for _ in range(3000) for kind in demo_world.REQUEST_KINDS}
    seen |= {request_key(train.open_request()) for _ in range(3000)}
    held = demo_world.WorldSampler(0, "heldout")
    heldout = [held.request(kind) for _ in range(300) for kind in demo_world.REQUEST_KINDS] + [held.open_request() for _ in range(300)]
    assert len(seen) > 8000
    assert sum(request_key(r) in seen for r in heldout) == 0
    # the same check between two training streams finds repeats: the check can see one
    other = demo_world.WorldSampler(1, "train")
    assert sum(request_key(other.request("caption")) in seen for _ in range(600)) > 10


def test_open_questions_are_left_open_by_their_caption_and_decided_by_images():
    sampler = demo_world.WorldSampler(2, "train")
    kinds, truths = collections.Counter(), collections.Counter()
    for _ in range(400):
        r = sampler.open_request()
        fact = r.facts[0]
        assert r.answer is None and r.kind == "caption" and r.question == fact.depict_question()
        kinds[fact.kind] += 1
        scene_ = sampler.scene()
        truths[fact.holds(scene_)] += 1
    assert set(kinds) == {"colour", "count", "spatial"} and min(kinds.values()) > 40, kinds
    assert truths[True] > 0 and truths[False] > 0


def test_an_open_fact_is_neither_stated_nor_denied():
    cap = demo_world.caption(demo_world.Thing("circle"), demo_world.Relation(demo_world.Thing("square", "red"), "above", demo_world.Thing("star")),
                             demo_world.No("triangle"))
    open_facts = cap.open_facts()
    questions = {f.depict_question() for f in open_facts}
    assert "Is there a red circle?" in questions  # the circle's colour is not given
    assert "Is the circle left of the star?" in questions  # nothing relates the circle and the star
    assert "Are there exactly two stars?" in questions  # "a star" may be one of two
    assert "Is the red square above the star?" not in questions  # stated
    assert not any("triangle" in q for q in questions)  # denied
    assert not any(f.kind == "colour" and f.shape == "square" for f in open_facts)  # its colour is stated
    assert all(cap.implies(f) is None for f in open_facts)
    assert [cap.implies(f) for f in cap.facts] == [f.kind != "absent" for f in cap.facts]


def test_open_questions_join_each_set_at_the_requested_share_with_their_parents():
    captions = demo_world.item_captions(demo_world.drawn_items())
    stated = sum(len(c.facts) for c in captions)
    assert sum(len(c.open_questions(0.0)) for c in captions) == 0
    realized = {}
    for share in (0.1, 0.25, 0.5):
        added = sum(len(c.open_questions(share)) for c in captions)
        realized[share] = added / (stated + added)
    # what the captions leave open caps the share: near the request at 0.1, below it beyond
    assert 0.04 < realized[0.1] < 0.12 and 0.16 < realized[0.25] <= 0.25 and realized[0.25] < realized[0.5] <= 0.5
    cap = demo_world.caption(demo_world.Thing("circle"), demo_world.Thing("square", "red"))
    rows = cap.question_rows(0.5)
    depict = [r["question"] for r in rows if r["question_set"] == "depict"]
    assert depict[:3] == ["Is there a circle?", "Is there a square?", "Is there a red square?"] and len(depict) == 6
    dsg = {r["question_id"]: (r["question"], list(r["parents"])) for r in rows if r["question_set"] == "dsg"}
    by_text = {q: i for i, (q, _) in dsg.items()}
    for question, parents in dsg.values():
        if question.startswith("Is the circle") and " the " in question[12:]:  # a relation: both things first
            assert set(parents) == {by_text["Is there a circle?"], by_text["Is there a red square?"]}
    with pytest.raises(ValueError, match="between 0 and 0.5"):
        cap.open_questions(0.6)


def test_a_question_set_asks_each_question_once():
    """Two facts can read as one question: "a blue triangle" and "three blue triangles" both state
    that a blue triangle is there. The set asks it once (the parsers keep the first of a repeated
    question, so a repeat is a question no writer can match, and a metric would count it twice)."""
    cap = demo_world.caption(demo_world.Relation(demo_world.Thing("triangle", "yellow"), "left of", demo_world.Thing("triangle", "blue")),
                             demo_world.Thing("triangle", "blue", 3))
    rows = cap.question_rows(0.25)
    assert [r["question"] for r in rows if r["question_set"] == "depict"] == [
        "Is there a triangle?", "Is there a yellow triangle?", "Is there a blue triangle?",
        "Is the yellow triangle left of the blue triangle?", "Are there exactly three blue triangles?"]
    assert [r["question"] for r in rows if r["question_set"] == "claims"] == [
        "There is a triangle.", "There is a yellow triangle.", "There is a blue triangle.",
        "The yellow triangle is left of the blue triangle.", "There are exactly three blue triangles."]
    assert "Are the triangles blue?" in [r["question"] for r in rows if r["question_set"] == "dsg"]  # a question of its own there
    sampler = demo_world.WorldSampler(0, "heldout")
    for _ in range(500):
        rows = sampler.caption(sampler.scene()).question_rows(0.25)
        for qset in ("depict", "dsg", "claims"):
            questions = [r["question"] for r in rows if r["question_set"] == qset]
            assert len(questions) == len(set(questions)), (qset, questions)
            assert [r["question_id"] for r in rows if r["question_set"] == qset] == [str(i) for i in range(1, len(questions) + 1)]


def test_drawn_items_are_reserved_distinct_from_the_fixed_ones_and_true_to_their_roles():
    correlation, winoground, mcq = demo_world.drawn_items()
    assert (len(correlation), len(winoground), len(mcq)) == tuple(demo_world.DRAWN_SIZES.values())
    assert demo_world.drawn_items() == (correlation, winoground, mcq)  # the same on every call and machine
    fixed_scenes, fixed_captions = demo_world.benchmark_scenes(), demo_world.benchmark_captions()
    for s in demo_world.item_scenes((correlation, winoground, mcq)):
        assert demo_world.reserved_scene(s) and frozenset(s) not in fixed_scenes
    for c in demo_world.item_captions((correlation, winoground, mcq)):
        assert demo_world.reserved_caption(c.text) and c.text not in fixed_captions
    assert len({p.caption.text for p in correlation}) == len(correlation)

    def true_of(cap, s):
        return all(f.holds(s) for f in cap.facts)

    ratings = set()
    for p in correlation:  # the first scene is the caption's; the others break one or more facts
        assert true_of(p.caption, p.scenes[0]) and len(p.caption.facts) >= 2
        assert all(p.caption.share_true(s) < 1 for s in p.scenes[1:]) and len(set(map(frozenset, p.scenes))) == 3
        ratings |= {p.caption.rating(s) for s in p.scenes}
    assert len(ratings) >= 6  # graded, not match / no match
    for e in winoground:  # caption i describes image i only; the two captions use the same words
        (c0, c1), (s0, s1) = e.captions, e.scenes
        assert true_of(c0, s0) and true_of(c1, s1) and not true_of(c0, s1) and not true_of(c1, s0)
        assert sorted(c0.text.split()) == sorted(c1.text.split())
    templates = collections.Counter()
    for r in mcq:  # one true caption, three false ones: one of each template
        assert true_of(r.correct, r.scene) and not any(true_of(d, r.scene) for d in r.distractors)
        assert [d.template for d in r.distractors] == ["affirmative", "negation", "hybrid"]
        templates[r.correct.template] += 1
    assert set(templates) == {"affirmative", "negation", "hybrid"}


def test_the_large_demo_loads_the_fixed_items_then_the_drawn_ones(tmp_path):
    small = {part: demo.load(str(tmp_path / "small"), part=part) for part in ("correlation", "winoground", "mcq")}
    large = {part: demo.load(str(tmp_path / "large"), part=part, drawn=True) for part in ("correlation", "winoground", "mcq")}
    drawn = {"correlation": 3 * demo_world.DRAWN_SIZES["correlation"], "winoground": 4 * demo_world.DRAWN_SIZES["winoground"], "mcq": 4 * demo_world.DRAWN_SIZES["mcq"]}
    for part, result in large.items():
        ids = result.items["item_id"].to_pylist()
        fixed = small[part].items["item_id"].to_pylist()
        assert ids[:len(fixed)] == fixed and len(ids) == len(fixed) + drawn[part] and not result.problems
        assert all(i.split("/")[1].startswith("g") for i in ids[len(fixed):])
        assert set(result.questions["caption"].to_pylist()) == set(result.items["caption"].to_pylist())
    assert {"c01-0", "c08-2"} <= {i.split("/")[1] for i in large["correlation"].items["item_id"].to_pylist()}


def test_the_open_questions_follow_a_rule_a_writer_can_learn():
    # one question per kind and thing first: the colour (the first colour the caption does not
    # name), then "exactly two", then one relation per unrelated pair; the rest after
    cap = demo_world.caption(demo_world.Thing("circle"), demo_world.Thing("square", "red"))
    asked = [f.depict_question() for f in cap.open_questions(0.5)]
    assert asked == ["Is there a blue circle?", "Are there exactly two circles?", "Are there exactly two red squares?"]
    priority = [f.depict_question() for f in cap.open_priority()]
    assert priority[3:5] == ["Is the circle above the red square?", "Is the red square above the circle?"]
    assert sorted(priority) == sorted(f.depict_question() for f in cap.open_facts())  # an order, not a choice
    assert len(cap.open_questions(0.25)) == 1 and len(cap.open_questions(0.1)) == 0  # 3 stated: 1.0 and 0.33, half up
