"""The demo curation corpus: labels in the asked shares, every match true and every mismatch
false of its scene in the named way, drawn from the bench content slot, the same bytes for the
same seed, and written in both formats curation reads with its questions and truth apart."""
from __future__ import annotations

import collections
import json

import polars as pl
import pyarrow as pa
import pytest

from jobs.demo_corpus import main as demo_corpus_main
from operators import demo_corpus
from operators.demo_corpus import MATCH, MISMATCH_KINDS, SettingError, describe, describes, draw_corpus, label_counts
from operators.demo_world import No, Relation, Thing, caption_slot, png_bytes, render, scene, scene_slot
from operators.schema import QUESTIONS
from pipeline.config import ConfigError
from pipeline.curation.demo_corpus import write_demo_corpus
from pipeline.curation.shards import discover, read_shard
from pipeline.stages.questions import file_questions
from pipeline.store.folder import FileError

PAIRS = 120  # 60 matches and 15 of each kind: every kind's edit is seen several times


@pytest.fixture(scope="module")
def drawn():
    return draw_corpus(PAIRS, seed=0)


def test_label_counts_follow_the_shares_by_largest_remainder():
    assert label_counts(10, 0.5, dict.fromkeys("abc", 1.0)) == {MATCH: 5, "a": 2, "b": 2, "c": 1}
    assert label_counts(7, 0.3, {"a": 3.0, "b": 1.0}) == {MATCH: 5, "a": 2, "b": 0}  # 2 mismatches: 1.5 and 0.5, the tie to a
    assert label_counts(9, 1.0, {"a": 1.0, "b": 2.0}) == {MATCH: 0, "a": 3, "b": 6}
    assert label_counts(4, 0.0, {"a": 1.0}) == {MATCH: 4, "a": 0}


def test_every_pair_has_its_label_and_matches_are_true_mismatches_false(drawn):
    counts = collections.Counter(p.label for p in drawn)
    assert counts == label_counts(PAIRS, 0.5, demo_corpus.DEFAULT_KIND_SHARES)
    assert counts[MATCH] == 60 and all(counts[k] == 15 for k in MISMATCH_KINDS)
    for p in drawn:
        assert describes(p.true_caption, p.scene), p
        assert describes(p.caption, p.scene) == (p.label == MATCH), p
        assert (p.caption == p.true_caption) == (p.label == MATCH), p
    assert len({p.pair_id for p in drawn}) == PAIRS


def _nouns(clause) -> list[tuple]:
    if isinstance(clause, Relation):
        return [(clause.subject.shape, clause.subject.colour), (clause.object.shape, clause.object.colour)]
    return [(clause.shape, clause.colour)]


def _changed(p) -> list[tuple]:
    return [(a, b) for a, b in zip(p.true_caption.clauses, p.caption.clauses, strict=True) if a != b]


def test_each_mismatch_is_the_edit_its_kind_names(drawn):
    """One named change of a true caption, and nothing else."""
    by_kind = collections.defaultdict(list)
    for p in drawn:
        by_kind[p.label].append(p)
    for p in by_kind["swapped_attribute"]:  # the same words, the same shapes in place, two colours exchanged
        assert sorted(p.caption.text.split()) == sorted(p.true_caption.text.split()) and p.caption.text != p.true_caption.text
        before = [n for a, _ in _changed(p) for n in _nouns(a)]
        after = [n for _, b in _changed(p) for n in _nouns(b)]
        assert [s for s, _ in before] == [s for s, _ in after] and collections.Counter(c for _, c in before) == collections.Counter(c for _, c in after)
        assert sum(x != y for x, y in zip(before, after, strict=True)) == 2
    for p in by_kind["wrong_count"]:  # one thing, another number
        ((before, after),) = _changed(p)
        assert isinstance(before, Thing) and isinstance(after, Thing)
        assert (before.shape, before.colour) == (after.shape, after.colour) and before.count != after.count
        actual = sum(o.shape == after.shape and after.colour in (None, o.colour) for o in p.scene)
        assert after.count != actual
    for p in by_kind["flipped_negation"]:  # a thing stated <-> denied
        ((before, after),) = _changed(p)
        assert {type(before), type(after)} == {Thing, No}
        assert (before.shape, before.colour) == (after.shape, after.colour)
    for p in by_kind["other_caption"]:  # another scene's caption: no edit of this one's
        assert p.caption.text != p.true_caption.text
    assert any(isinstance(c, Relation) for p in by_kind["swapped_attribute"] for c in p.caption.clauses)


def test_draws_come_from_the_bench_slot_and_the_seed_fixes_them(drawn):
    assert {scene_slot(p.scene) for p in drawn} == {0}
    assert {caption_slot(p.caption.text) for p in drawn} | {caption_slot(p.true_caption.text) for p in drawn} == {0}
    again = draw_corpus(PAIRS, seed=0)
    assert again == drawn
    other = draw_corpus(PAIRS, seed=1)
    assert [p.caption.text for p in other] != [p.caption.text for p in drawn]
    assert scene(*describe(drawn[0].scene).split("; ")) == drawn[0].scene  # the truth file's scene text reads back


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"pairs": 0}, "pairs"),
        ({"pairs": 2.5}, "pairs"),
        ({"mismatch_share": 1.5}, "mismatch_share"),
        ({"kind_shares": {"typo": 1.0}}, "kinds.typo"),
        ({"kind_shares": {"wrong_count": -1.0}}, "kinds.wrong_count"),
        ({"kind_shares": {"wrong_count": 0.0}}, "kinds"),
        ({"kind_shares": {}}, "kinds"),
        ({"seed": "one"}, "seed"),
    ],
)
def test_bad_settings_name_the_key(kwargs, key):
    with pytest.raises(SettingError) as info:
        draw_corpus(**({"pairs": 4} | kwargs))
    assert info.value.key == key


def test_only_the_named_kinds_are_drawn():
    pairs = draw_corpus(20, mismatch_share=0.5, kind_shares={"wrong_count": 1.0, "flipped_negation": 4.0}, seed=2)
    assert collections.Counter(p.label for p in pairs) == {MATCH: 10, "flipped_negation": 8, "wrong_count": 2}


def test_written_corpus_is_both_formats_with_questions_and_truth_apart(tmp_path):
    out = tmp_path / "corpus"
    written = write_demo_corpus(str(out), pairs=12, pairs_per_shard=5, seed=3)
    assert written.counts == label_counts(12, 0.5, demo_corpus.DEFAULT_KIND_SHARES) and written.shards == 3
    parquet, tars = discover([f"{out}/parquet/"]), discover([f"{out}/webdataset/"])
    assert [s.uri.rsplit("/", 1)[1] for s in parquet] == ["pairs-0000.parquet", "pairs-0001.parquet", "pairs-0002.parquet"]
    assert [s.format for s in tars] == ["webdataset"] * 3
    truth = pl.read_parquet(out / "truth.parquet")
    drawn = draw_corpus(12, seed=3)
    for p_shard, t_shard in zip(parquet, tars, strict=True):
        rows = read_shard(p_shard.uri, "parquet")
        samples = read_shard(t_shard.uri, "webdataset")
        stem = p_shard.uri.rsplit("/", 1)[1].removesuffix(".parquet")
        labels = truth.filter(pl.col("shard") == stem).sort("row")
        assert labels["row"].to_list() == list(range(rows.num_rows))
        assert rows.column("caption").to_pylist() == samples.column("txt").to_pylist() == labels["caption"].to_list()
        assert rows.column("pair_id").to_pylist() == samples.column("__key__").to_pylist() == labels["pair_id"].to_list()
        assert rows.column("image").to_pylist() == samples.column("png").to_pylist()
        by_id = {p.pair_id: p for p in drawn}
        for pair_id, image, label in zip(labels["pair_id"], rows.column("image").to_pylist(), labels["label"], strict=True):
            assert image == png_bytes(render(by_id[pair_id].scene)) and label == by_id[pair_id].label
    assert "label" not in read_shard(parquet[0].uri, "parquet").column_names  # the truth stays out of the inputs
    manifest = json.loads((out / "corpus.json").read_text())
    assert manifest["counts"] == written.counts and manifest["seed"] == 3

    questions = pl.read_parquet(out / "questions.parquet")
    assert pa.schema(questions.to_arrow().schema).names == QUESTIONS.names
    items = pl.DataFrame({"caption": truth["caption"], "benchmark": ["corpus"] * truth.height})
    read, errors = file_questions(items, str(out / "questions.parquet"), ["depict", "dsg"])
    assert errors.num_rows == 0 and set(read["caption"]) == set(truth["caption"])
    first = drawn[0].caption
    depict = read.filter((pl.col("caption") == first.text) & (pl.col("question_set") == "depict"))["question"].to_list()
    assert depict == [f.depict_question() for f in first.facts]  # a mismatch's questions ask what it says


def test_rewriting_a_corpus_leaves_no_shard_of_the_larger_one_and_other_folders_are_refused(tmp_path):
    out = tmp_path / "corpus"
    write_demo_corpus(str(out), pairs=9, pairs_per_shard=3)
    write_demo_corpus(str(out), pairs=4, pairs_per_shard=3)
    assert sorted(p.name for p in (out / "parquet").iterdir()) == ["pairs-0000.parquet", "pairs-0001.parquet"]
    assert pl.read_parquet(out / "truth.parquet").height == 4
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    with pytest.raises(FileError, match="notes.txt"):
        write_demo_corpus(str(tmp_path / "mine"), pairs=4)
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"
    with pytest.raises(ConfigError) as info:
        write_demo_corpus(str(tmp_path / "x"), pairs=4, open_share=0.9)
    assert info.value.key == "open_share"


def test_the_job_writes_the_corpus_and_refuses_unknown_keys(tmp_path, capsys):
    assert demo_corpus_main([f"out={tmp_path}/c", "pairs=6", "pairs_per_shard=4", "kinds.wrong_count=1"]) == 0
    printed = capsys.readouterr().out
    assert "6 pairs (match 3, wrong_count 3)" in printed and f"truth={tmp_path}/c/truth.parquet" in printed
    assert demo_corpus_main([f"out={tmp_path}/d", "pair=6"]) == 2
    assert "'pair'" in capsys.readouterr().err
    assert demo_corpus_main(["pairs=6"]) == 2
