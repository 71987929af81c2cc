"""Parsers for generated questions, DSG graphs and typed claims, and the generation prompts."""
from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st
from omegaconf import OmegaConf

from operators.parsing import (
    Claim,
    DsgQuestion,
    ParseError,
    parse_claims,
    parse_dsg,
    parse_questions,
    questions_rows,
    strip_thinking,
)
from operators.prompts import fill
from operators.schema import CLAIM_TYPES, QUESTIONS

PROMPTS = Path(__file__).resolve().parents[1] / "conf" / "prompts" / "v1.yaml"


def reason(call, *args, **kwargs) -> str:
    with pytest.raises(ParseError) as info:
        call(*args, **kwargs)
    return info.value.reason


# ------------------------------------------------------------------ questions

QWEN_STYLE = """<think>
The caption mentions a cat and a sofa. I should list [them] as questions.
</think>

```json
[
  "Is there a cat?",
  "Is the cat black?",
  "Is there a sofa?",
  "Is the cat on the sofa?"
]
```"""

EXPECTED = ["Is there a cat?", "Is the cat black?", "Is there a sofa?", "Is the cat on the sofa?"]


def test_questions_from_fenced_json_after_a_think_block():
    assert parse_questions(QWEN_STYLE) == EXPECTED


def test_questions_when_the_chat_template_opened_the_think_block():
    # Qwen3-style templates put "<think>" in the prompt: the output only closes it.
    text = 'Okay, the cat is black ["maybe"].\n</think>\n["Is there a cat?", "Is the cat black?"]'
    assert parse_questions(text) == ["Is there a cat?", "Is the cat black?"]


def test_questions_with_prose_around_the_list():
    text = 'Sure! Here are the questions [as JSON]:\n["Is there a cat?", "Is the cat black?"]\nLet me know if [1] helps.'
    assert parse_questions(text) == ["Is there a cat?", "Is the cat black?"]


@pytest.mark.parametrize(
    "text",
    [
        "1. Is there a cat?\n2. Is the cat black?",
        "1) Is there a cat?\n2) Is the cat black?",
        "Q1: Is there a cat?\nQ2: Is the cat black?",
        "Question 1: Is there a cat?\nQuestion 2 - Is the cat black?",
        "(1) Is there a cat?\n(2) Is the cat black?",
        "- Is there a cat?\n* Is the cat black?",
        "Here are the questions:\n\nIs there a cat?\nIs the cat black?\n",
        "Questions:\n1. Is there a cat\n2. Is the cat black.",  # missing question marks
        "**1.** **Is there a cat?**\n**2. Is the cat black?**",
    ],
)
def test_questions_from_numbered_or_bulleted_lines(text):
    assert parse_questions(text) == ["Is there a cat?", "Is the cat black?"]


def test_questions_get_a_question_mark_and_collapsed_spaces():
    assert parse_questions('["Is there  a\\ncat", "Is it black."]') == ["Is there a cat?", "Is it black?"]


def test_duplicate_questions_are_dropped_keeping_the_first_and_the_order():
    text = '["Is there a cat?", "Is the cat black?", "is there a  CAT?", "Is there a cat", "Is there a sofa?"]'
    assert parse_questions(text) == ["Is there a cat?", "Is the cat black?", "Is there a sofa?"]


def test_a_json_object_around_the_list_is_accepted():
    assert parse_questions('{"questions": ["Is there a cat?"]}') == ["Is there a cat?"]
    assert parse_claims('{"parts": [{"text": "cat", "type": "object"}]}') == [Claim("cat", "object")]


def test_questions_as_objects_are_accepted():
    assert parse_questions('[{"question": "Is there a cat?"}]') == ["Is there a cat?"]


def test_trailing_commas_are_repaired():
    assert parse_questions('["Is there a cat?", "Is the cat black?",\n]') == ["Is there a cat?", "Is the cat black?"]


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("[]", "empty"),
        ('["", "  "]', "empty"),
        ("", "empty_output"),
        ("<think>The cat is black, so I will", "unclosed_think"),
        ("<think>done</think>\n   ", "empty_output"),
        ("I cannot describe this image.", "no_list"),
        ("['Is there a cat?', 'Is the cat black?']", "no_list"),  # single quotes: not JSON, no lines
        ('["Is there a cat?", "Is the cat black?"', "bad_json"),  # truncated
        ('["Is there a cat?" "Is the cat black?"]', "bad_json"),  # missing comma
        ('["Is there a cat?", 3]', "bad_item"),
        ('[{"text": "Is there a cat?"}]', "bad_item"),
    ],
)
def test_bad_question_outputs(text, why):
    assert reason(parse_questions, text) == why


def test_bad_json_error_shows_where():
    with pytest.raises(ParseError) as info:
        parse_questions('Here: ["Is there a cat?" "Is the cat black?"]')
    assert info.value.reason == "bad_json"
    assert "Expecting ','" in info.value.snippet and "Is the cat black" in info.value.snippet


def test_too_many_questions_is_an_error_after_removing_duplicates():
    many = json.dumps([f"Is there cat number {i}?" for i in range(33)])
    assert reason(parse_questions, many) == "too_many"
    assert len(parse_questions(many, max_items=40)) == 33
    looping = json.dumps(["Is there a cat?", "Is the cat black?"] * 30)  # a model stuck in a loop
    assert parse_questions(looping) == ["Is there a cat?", "Is the cat black?"]
    assert reason(parse_questions, json.dumps(["Is there a cat?", "Is there a dog?"]), max_items=1) == "too_many"


def test_strip_thinking_keeps_text_before_an_unclosed_block():
    assert strip_thinking('["Is there a cat?"] <think>hmm') == '["Is there a cat?"] '
    assert strip_thinking("<think>a</think> x <think>b</think> y") == " y"


# "<" is left out: a question quoting "<think>" would be cut by the think-block stripping.
word = st.text(st.characters(codec="utf-8", exclude_categories=("Cc", "Cs", "Z"), exclude_characters="<"), min_size=1, max_size=12)
question_text = st.lists(word, min_size=1, max_size=5).map(" ".join)


@given(st.lists(question_text.map(lambda s: s + "?"), min_size=1, max_size=32, unique_by=str.casefold))
def test_any_json_list_of_distinct_questions_round_trips_in_any_wrapping(questions):
    text = json.dumps(questions)
    assert parse_questions(text) == questions
    assert parse_questions(f"<think>\nthinking [x]\n</think>\nHere you go:\n```json\n{text}\n```\nDone.") == questions


# ------------------------------------------------------------------------ DSG

DSG_OBJECTS = """```json
[
  {"id": "1", "question": "Is there a dog?", "parents": []},
  {"id": "2", "question": "Is the dog brown?", "parents": ["1"]},
  {"id": "3", "question": "Is there a ball?", "parents": []},
  {"id": "4", "question": "Is the dog chasing the ball?", "parents": ["1", "3"]},
]
```"""

DSG_EXPECTED = [
    DsgQuestion("1", "Is there a dog?", ()),
    DsgQuestion("2", "Is the dog brown?", ("1",)),
    DsgQuestion("3", "Is there a ball?", ()),
    DsgQuestion("4", "Is the dog chasing the ball?", ("1", "3")),
]


def test_dsg_objects_with_a_trailing_comma_in_a_fence():
    assert parse_dsg(DSG_OBJECTS) == DSG_EXPECTED


def test_dsg_short_lists_with_integer_ids():
    text = '[[1, "Is there a dog?", []], [2, "Is the dog brown?", [1]], [3, "Is there a ball?"], [4, "Is the dog chasing the ball", [1, 3]]]'
    assert parse_dsg(text) == DSG_EXPECTED


def test_dsg_parent_zero_means_none_and_a_single_parent_may_be_bare():
    text = '[{"id": "1", "question": "Is there a dog?", "parents": ["0"]}, {"id": "2", "question": "Is the dog brown?", "parents": 1}]'
    assert parse_dsg(text) == DSG_EXPECTED[:2]


def test_dsg_duplicate_question_is_dropped_and_its_children_follow_the_kept_one():
    text = json.dumps([
        ["1", "Is there a dog?", []],
        ["2", "Is there a dog?", []],
        ["3", "Is the dog brown?", ["2", "1"]],
    ])
    assert parse_dsg(text) == [DsgQuestion("1", "Is there a dog?", ()), DsgQuestion("3", "Is the dog brown?", ("1",))]


@pytest.mark.parametrize(
    ("entries", "why"),
    [
        ([["1", "Is there a dog?", ["5"]]], "unknown_parent"),
        ([["1", "Is there a dog?", ["1"]]], "cycle"),
        ([["1", "Is there a dog?", ["2"]], ["2", "Is the dog brown?", ["1"]]], "cycle"),
        ([["1", "Is there a dog?", ["3"]], ["2", "Is it brown?", ["1"]], ["3", "Is it big?", ["2"]]], "cycle"),
        ([["1", "Is there a dog?", []], ["1", "Is the dog brown?", []]], "duplicate_id"),
        ([["1"]], "bad_item"),
        (["Is there a dog?"], "bad_item"),
        ([{"id": "", "question": "Is there a dog?"}], "bad_item"),
        ([{"id": True, "question": "Is there a dog?"}], "bad_item"),
        ([{"id": "1", "question": "  "}], "bad_item"),
        ([], "empty"),
    ],
)
def test_bad_dsg_outputs(entries, why):
    assert reason(parse_dsg, json.dumps(entries)) == why


def test_dsg_cycle_error_names_the_cycle():
    with pytest.raises(ParseError) as info:
        parse_dsg(json.dumps([["1", "Is there a dog?", ["2"]], ["2", "Is the dog brown?", ["1"]]]))
    assert "1" in info.value.snippet and "2" in info.value.snippet and "->" in info.value.snippet


def test_dsg_malformed_outer_list_is_bad_json_not_an_inner_list():
    text = '[{"id": "1", "question": "Is there a dog?", "parents": []} {"id": "2", "question": "Is it brown?", "parents": ["1"]}]'
    assert reason(parse_dsg, text) == "bad_json"


def test_dsg_without_json_is_no_list():
    assert reason(parse_dsg, "1 | Is there a dog?\n2 | Is the dog brown?") == "no_list"


def test_dsg_cap():
    entries = [[str(i), f"Is there dog {i}?", []] for i in range(1, 34)]
    assert reason(parse_dsg, json.dumps(entries)) == "too_many"
    assert len(parse_dsg(json.dumps(entries), max_items=33)) == 33


# --------------------------------------------------------------------- claims


def test_claims_objects_lists_aliases_and_case():
    text = (
        "<think>types...</think>Claims:\n"
        '[{"claim": "There is a dog.", "type": "object"}, {"text": "The dog is brown.", "type": "Attribute"},'
        ' ["There are two balls.", " COUNT "], ["There is no cat.", "negation"], ["there is a  dog.", "other"]]'
    )
    assert parse_claims(text) == [
        Claim("There is a dog.", "object"),
        Claim("The dog is brown.", "attribute"),
        Claim("There are two balls.", "count"),
        Claim("There is no cat.", "negation"),
    ]


def test_unknown_claim_type_names_the_type():
    with pytest.raises(ParseError) as info:
        parse_claims('[["There is a dog.", "object"], ["The dog is happy.", "emotion"]]')
    assert info.value.reason == "unknown_type"
    assert "'emotion'" in info.value.snippet


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ('[{"claim": "There is a dog."}]', "bad_item"),  # no type
        ('[["There is a dog."]]', "bad_item"),
        ('[["", "object"]]', "bad_item"),
        ('[[3, "object"]]', "bad_item"),
        ('["There is a dog."]', "bad_item"),
        ("[]", "empty"),
        ("There is a dog (object).", "no_list"),
    ],
)
def test_bad_claim_outputs(text, why):
    assert reason(parse_claims, text) == why


def test_every_schema_claim_type_is_accepted():
    text = json.dumps([[f"Claim number {i}.", kind] for i, kind in enumerate(CLAIM_TYPES)])
    assert [c.type for c in parse_claims(text)] == list(CLAIM_TYPES)


# ------------------------------------------------------------------- table rows


def test_questions_rows_number_from_one_and_renumber_dsg_parents():
    dsg = [DsgQuestion("a", "Is there a dog?"), DsgQuestion("7", "Is there a ball?"), DsgQuestion("x", "Is the dog near the ball?", ("7", "a"))]
    rows = questions_rows("dsg", dsg, caption="a dog near a ball", source="gen")
    assert [(r["question_id"], r["parents"]) for r in rows] == [("1", []), ("2", []), ("3", ["2", "1"])]
    table = pa.Table.from_pylist(rows, schema=QUESTIONS)
    assert table.column("caption").to_pylist() == ["a dog near a ball"] * 3
    assert table.column("source").to_pylist() == ["gen"] * 3


def test_questions_rows_for_depict_and_claims():
    depict = questions_rows("depict", ["Is there a dog?", "Is there a cat?"])
    assert depict == [
        {"question_set": "depict", "question_id": "1", "question": "Is there a dog?", "parents": [], "claim_type": None},
        {"question_set": "depict", "question_id": "2", "question": "Is there a cat?", "parents": [], "claim_type": None},
    ]
    claims = questions_rows("claims", [Claim("There is no cat.", "negation")], caption="c", source="s")
    assert claims == [{"question_set": "claims", "question_id": "1", "question": "There is no cat.", "parents": [], "claim_type": "negation", "caption": "c", "source": "s"}]


def test_questions_rows_refuses_mismatched_input():
    with pytest.raises(TypeError):
        questions_rows("dsg", ["Is there a dog?"])
    with pytest.raises(ValueError):
        questions_rows("tifa", ["Is there a dog?"])


# -------------------------------------------------------------------- prompts

GENERATION = {"generate_questions": parse_questions, "generate_dsg": parse_dsg, "generate_claims": parse_claims}


@pytest.mark.parametrize("key", sorted(GENERATION))
def test_generation_prompt_fills_with_a_caption_and_leaves_no_braces(key):
    template = OmegaConf.to_container(OmegaConf.load(PROMPTS))[key]
    caption = "two red circles and no square"
    filled = fill(template, caption=caption)
    assert filled == template.format(caption=caption)  # fills the same however it is filled
    assert "{" not in filled and "}" not in filled
    assert f'"{caption}"' in filled


@pytest.mark.parametrize("key", sorted(GENERATION))
def test_generation_prompt_example_is_in_the_format_its_parser_reads(key):
    template = OmegaConf.to_container(OmegaConf.load(PROMPTS))[key]
    example = GENERATION[key](template)  # the worked example is the prompt's first JSON list
    assert len(example) >= 6
    if key == "generate_dsg":
        assert any(q.parents for q in example)
    if key == "generate_claims":
        assert {"object", "attribute", "count", "negation"} <= {c.type for c in example}
