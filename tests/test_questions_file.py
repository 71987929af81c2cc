"""questions.source=file: questions read from a QUESTIONS file, matched by caption, with
errors that name the file, the row and the field, and curation's settings around it."""
from __future__ import annotations

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from operators.schema import QUESTIONS
from pipeline.config import ConfigError, check_questions_file, load_config
from pipeline.curation.curation_config import load_curation_config, scoring_fingerprint
from pipeline.stages.questions import file_questions, read_questions_file
from pipeline.store.folder import FileError

ROWS = [
    {"caption": "a red circle", "question_set": "depict", "question_id": "1", "question": "Is there a circle?"},
    {"caption": "a red circle", "question_set": "depict", "question_id": "2", "question": "Is there a red circle?"},
    {"caption": "a red circle", "question_set": "dsg", "question_id": "1", "question": "Is there a circle?", "parents": []},
    {"caption": "a red circle", "question_set": "dsg", "question_id": "2", "question": "Is the circle red?", "parents": ["1"]},
    {"caption": "no star", "question_set": "depict", "question_id": "1", "question": "Is there a star?"},
    {"caption": "unused caption", "question_set": "depict", "question_id": "1", "question": "Is it?"},
]


def write(path, rows, schema=QUESTIONS) -> str:
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)
    return str(path)


def items(*pairs: tuple[str, str]) -> pl.DataFrame:
    return pl.DataFrame({"caption": [c for c, _ in pairs], "benchmark": [b for _, b in pairs]})


def test_the_items_captions_questions_are_read_and_a_caption_without_is_an_error_per_shard(tmp_path):
    url = write(tmp_path / "q.parquet", ROWS)
    questions, errors = file_questions(items(("a red circle", "s1"), ("no star", "s1"), ("two stars", "s1"), ("two stars", "s2")), url, ["depict", "dsg"])
    assert questions.columns == QUESTIONS.names
    assert sorted(questions.select("caption", "question_set", "question_id").rows()) == [
        ("a red circle", "depict", "1"), ("a red circle", "depict", "2"), ("a red circle", "dsg", "1"), ("a red circle", "dsg", "2"),
        ("no star", "depict", "1"),
    ]
    assert set(questions["source"]) == {"file"}  # the file has no source column of its own
    assert questions.filter(pl.col("question_set") == "dsg")["parents"].to_list() == [[], ["1"]]
    errors = pl.from_arrow(errors)
    assert sorted(errors.select("benchmark", "reason").rows()) == [("s1", "no_questions"), ("s1", "no_questions"), ("s1", "no_questions"), ("s2", "no_questions"), ("s2", "no_questions")]
    two_stars = errors.filter(pl.col("detail").str.contains("two stars"))
    assert two_stars.height == 4 and set(two_stars["source"]) == {url}
    assert f"the questions file {url} has no 'dsg' questions for caption 'no star'" in errors["detail"].to_list()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda rows: [{k: v for k, v in r.items() if k != "question_id"} for r in rows], r"lacks column\(s\) \['question_id'\]"),
        (lambda rows: rows[:1] + [rows[1] | {"question": "  "}] + rows[2:], r"row 1, question: empty"),
        (lambda rows: rows + [rows[0] | {"question_set": "vibes"}], r"row 6, question_set: not one of"),
        (lambda rows: rows + [rows[0] | {"question": "Is there a ball?"}], r"row 6, question_id: repeated"),
        (lambda rows: rows[:3] + [rows[3] | {"parents": ["7"]}] + rows[4:], r"row 3, parents: names a question id"),
        (lambda rows: rows + [{"caption": "x", "question_set": "claims", "question_id": "1", "question": "There is x.", "claim_type": "mood"}],
         r"row 6, claim_type: not one of"),
    ],
)
def test_a_bad_questions_file_names_the_file_row_and_field(tmp_path, change, message):
    rows = change([dict(r) for r in ROWS])
    fields = [f for f in QUESTIONS if any(f.name in r for r in rows)]
    url = write(tmp_path / "q.parquet", rows, pa.schema(fields))
    with pytest.raises(FileError, match=message) as info:
        read_questions_file(url)
    assert str(info.value).startswith(url)


def test_a_missing_or_unreadable_questions_file_is_named(tmp_path):
    with pytest.raises(FileError, match="questions file not found"):
        read_questions_file(str(tmp_path / "none.parquet"))
    (tmp_path / "bad.parquet").write_bytes(b"not parquet")
    with pytest.raises(FileError, match="not a readable Parquet file"):
        read_questions_file(str(tmp_path / "bad.parquet"))


def test_source_file_needs_a_file_before_any_work(tmp_path):
    base = ["curation=smoke", "inputs=[a.parquet]", "questions.source=file"]
    with pytest.raises(ConfigError) as info:
        load_curation_config(base)
    assert info.value.key == "questions.file"
    load_curation_config([*base, "decide_only=true"])  # deciding again scores nothing: no questions needed
    cfg = load_curation_config([*base, f"questions.file={tmp_path}/q.parquet"])
    with pytest.raises(ConfigError, match="no such file") as info:
        check_questions_file(cfg)
    write(tmp_path / "q.parquet", ROWS)
    check_questions_file(cfg)
    sweep = load_config(["questions.source=file", "backbones=[micro]"])
    with pytest.raises(ConfigError) as info:
        check_questions_file(sweep)
    assert info.value.key == "questions.file"
    with pytest.raises(ConfigError, match="'model', 'benchmark', 'file'") as info:
        load_config(["questions.source=web"])
    assert info.value.key == "questions.source"


def test_curation_refuses_benchmark_questions_and_fingerprints_the_file_by_path(tmp_path):
    with pytest.raises(ConfigError) as info:
        load_curation_config(["curation=smoke", "inputs=[a.parquet]", "questions.source=benchmark"])
    assert info.value.key == "questions.source"
    base = ["curation=demo", "inputs=[a.parquet]"]
    first = scoring_fingerprint(load_curation_config([*base, f"questions.file={tmp_path}/a.parquet"]))
    assert scoring_fingerprint(load_curation_config([*base, f"questions.file={tmp_path}/a.parquet", f"truth={tmp_path}/t.parquet"])) == first
    assert scoring_fingerprint(load_curation_config([*base, f"questions.file={tmp_path}/b.parquet"])) != first
