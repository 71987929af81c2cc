"""What a faithful writer and judge write about the demo world: the production parsers read it
back to exactly the world's rows, and the judge's texts say what the scene shows."""
from __future__ import annotations

import json

import pytest

from operators import demo_generations, demo_world
from operators.judge_output import parse_decomposed, parse_holistic
from operators.parsing import ParseError, parse_claims, parse_dsg, parse_questions, questions_rows

PARSERS = {"depict": parse_questions, "dsg": parse_dsg, "claims": parse_claims}
W = demo_world


@pytest.fixture(scope="module")
def drawn():
    items = W.drawn_items()
    return list(zip(W.item_captions(items), W.item_scenes(items)))


@pytest.mark.parametrize("share", [0.0, 0.25, 0.5])
def test_every_written_question_set_parses_back_to_the_worlds_rows(drawn, share):
    for caption, _ in drawn:
        for qset, parse in PARSERS.items():
            want = [r for r in caption.question_rows(share) if r["question_set"] == qset]
            got = questions_rows(qset, parse(demo_generations.question_text(caption, qset, share)), caption=caption.text, source="benchmark")
            assert got == want, (caption.text, qset)


def test_a_dsg_text_carries_each_questions_parents():
    cap = W.caption(W.Relation(W.Thing("circle", "red"), "above", W.Thing("square")))
    graph = json.loads(demo_generations.question_text(cap, "dsg", 0.0))
    assert graph == [["1", "Is there a circle?", []], ["2", "Is the circle red?", ["1"]], ["3", "Is there a square?", []],
                     ["4", "Is the red circle above the square?", ["2", "3"]]]


def test_the_holistic_judge_scores_the_share_of_true_facts_on_its_scale():
    scene = W.scene("red circle top left", "blue square bottom right")
    assert demo_generations.judge_text(W.caption(W.Thing("circle", "red")), scene, "holistic") == '{"score": 0.95}'
    half = W.caption(W.Thing("circle", "red"), W.Thing("star"))  # circle, red circle: true; star: false
    assert parse_holistic(demo_generations.judge_text(half, scene, "holistic")) == round(0.05 + 0.9 * 2 / 3, 2)
    assert parse_holistic(demo_generations.judge_text(W.caption(W.Thing("star", "green")), scene, "holistic")) == 0.05


def test_the_decomposed_judge_points_at_the_objects_each_claim_is_about():
    scene = W.scene("red circle top left", "blue square bottom right", "red circle middle centre")
    cap = W.caption(W.Thing("circle", "red", count=2), W.No("square"), W.Relation(W.Thing("circle"), "above", W.Thing("square")))
    verdict = parse_decomposed(demo_generations.judge_text(cap, scene, "decomposed"))
    by_claim = {c.claim: c for c in verdict.claims}
    circles = [tuple(demo_generations.grid_box(scene[i])) for i in (0, 2)]  # reading order: top left, then middle
    square = tuple(demo_generations.grid_box(scene[1]))
    assert by_claim["There are exactly two red circles."].boxes == tuple(circles) and by_claim["There are exactly two red circles."].score == 0.95
    assert by_claim["There is no square."].boxes == (square,) and by_claim["There is no square."].score == 0.05  # what contradicts it
    assert by_claim["The circle is above the square."].boxes == (*circles, square)  # reading order, not the scene's list
    assert verdict.overall == parse_holistic(demo_generations.judge_text(cap, scene, "holistic"))


def test_boxes_on_the_judges_grid_hold_the_drawn_shape():
    pixels = W.render(W.scene("green star middle right"))
    x0, y0, x1, y1 = W.object_box("star", 1, 2)
    assert (pixels[y0:y1, x0:x1] > 0).any() and (pixels > 0).sum() == (pixels[y0:y1, x0:x1] > 0).sum()
    gx0, gy0, gx1, gy1 = demo_generations.grid_box(W.SceneObject("star", "green", 1, 2))
    assert 0 <= gx0 < gx1 <= 1000 and 0 <= gy0 < gy1 <= 1000 and gx0 > 666 and 333 < gy0 < gy1 < 667


def test_the_refusal_is_no_answer_to_any_parser():
    for parse in PARSERS.values():
        with pytest.raises(ParseError):
            parse(demo_generations.REFUSAL)


def test_captions_with_a_word_outside_the_world_are_told_apart():
    assert demo_generations.knows("a picture with no star and two red circles")
    assert not demo_generations.knows("a red dog") and not demo_generations.knows("a red circle, and a star")
