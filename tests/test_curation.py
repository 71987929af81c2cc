"""Curation pieces without Ray: shard discovery and reading, the decision rule, config, outputs."""
from __future__ import annotations

import io
import math
import os
import tarfile
import time

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from curation_shards import caption, image_bytes, pair_rows, tar_samples, write_parquet, write_tar
from hypothesis import given, settings
from hypothesis import strategies as hst

from operators.hashing import image_hash
from operators.images import read_image_bytes
from pipeline.config import ConfigError
from pipeline.curation.curation_config import load_curation_config, scoring_fingerprint
from pipeline.curation.manifest import Manifest
from pipeline.curation.publish import filtered_rows
from pipeline.curation.report import histogram_png
from pipeline.curation.rule import Rule, apply_rule
from pipeline.curation.shards import Shard, ShardError, current_version, discover, read_shard, shard_pairs
from pipeline.store.folder import Folder


def pairs_of(path, fmt, images_dir, **kwargs):
    kwargs = {"image_column": "image", "caption_column": "caption", **kwargs}
    return shard_pairs("s", str(path), fmt, images=Folder(str(images_dir)), **kwargs).to_pylist()


# -- reading Parquet shards ------------------------------------------------------------------------


def test_embedded_bytes_are_written_as_one_pack_per_shard(tmp_path):
    rows = pair_rows(range(3))
    rows[1]["image"] = None
    rows.append(dict(rows[0], caption="the first image again"))
    path = write_parquet(tmp_path / "a.parquet", rows)
    pairs = pairs_of(path, "parquet", tmp_path / "images")
    assert [p["row"] for p in pairs] == [0, 1, 2, 3]
    assert [p["caption"] for p in pairs] == [caption(0), caption(1), caption(2), "the first image again"]
    (pack,) = [p for p in (tmp_path / "images").rglob("*") if p.is_file()]  # one file for the shard
    assert pack.parent.parent.name == "packs" and pack.suffix == ".tar"
    with tarfile.open(pack) as tar:  # a plain tar, members named by content hash, each image once
        assert sorted(tar.getnames()) == sorted(f"{image_hash(image_bytes(i))}.png" for i in (0, 2))
    for p, i in ((pairs[0], 0), (pairs[2], 2), (pairs[3], 0)):
        assert p["image_hash"] == image_hash(image_bytes(i))
        assert p["image_uri"].startswith(f"{pack}#bytes=")
        assert read_image_bytes(p["image_uri"]) == image_bytes(i)
        assert p["reason"] is None
    assert pairs[3]["image_uri"] == pairs[0]["image_uri"]
    assert pairs[1]["image_uri"] is None
    assert (pairs[1]["field"], pairs[1]["reason"]) == ("image", "missing_image")
    assert str(path) in pairs[1]["detail"] and "row 1" in pairs[1]["detail"]
    again = pairs_of(path, "parquet", tmp_path / "images")  # the same images make the same pack, written once
    assert [p["image_uri"] for p in again] == [p["image_uri"] for p in pairs]
    assert [p for p in (tmp_path / "images").rglob("*") if p.is_file()] == [pack]


def test_relative_image_paths_are_relative_to_the_shard(tmp_path):
    path = write_parquet(tmp_path / "day" / "a.parquet", pair_rows([5, 6], image="path", folder=tmp_path / "day"))
    pairs = pairs_of(path, "parquet", tmp_path / "images")
    assert [p["image_uri"] for p in pairs] == [str(tmp_path / "day" / "images" / "5.png"), str(tmp_path / "day" / "images" / "6.png")]
    assert not (tmp_path / "images").exists()  # nothing to extract


def test_hugging_face_image_structs_are_read(tmp_path):
    path = write_parquet(tmp_path / "a.parquet", pair_rows([7], image="struct"))
    (pair,) = pairs_of(path, "parquet", tmp_path / "images")
    assert read_image_bytes(pair["image_uri"]) == image_bytes(7)


@pytest.mark.parametrize(
    ("columns", "message"),
    [({"caption_column": "text"}, "missing column 'text'"), ({"image_column": "url2"}, "missing column 'url2'")],
)
def test_a_missing_column_fails_the_shard_naming_file_and_column(tmp_path, columns, message):
    path = write_parquet(tmp_path / "a.parquet", pair_rows([1]))
    with pytest.raises(ShardError, match=message) as info:
        pairs_of(path, "parquet", tmp_path / "images", **columns)
    assert str(path) in str(info.value)


def test_wrong_column_types_and_reserved_names_fail_the_shard(tmp_path):
    table = pa.table({"image": [1, 2], "caption": ["a", "b"]})
    pq.write_table(table, tmp_path / "ints.parquet")
    with pytest.raises(ShardError, match="image column 'image' has type int64"):
        pairs_of(tmp_path / "ints.parquet", "parquet", tmp_path / "images")
    path = write_parquet(tmp_path / "a.parquet", pair_rows([1]))
    with pytest.raises(ShardError, match=r"\['url'\]"):
        pairs_of(path, "parquet", tmp_path / "images", reserved=["url", "score_depict"])
    (tmp_path / "junk.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(ShardError, match="not a readable Parquet file"):
        pairs_of(tmp_path / "junk.parquet", "parquet", tmp_path / "images")


# -- reading WebDataset tars ----------------------------------------------------------------------


def test_webdataset_samples_become_rows_and_pairs(tmp_path):
    samples = tar_samples([1, 2], caption_in="txt") + tar_samples([3], caption_in="json")
    samples.append({"key": "no_image", "txt": "a caption without an image"})
    samples.append({"key": "bad_json", "png": image_bytes(9), "json": {"text": "caption under another name"}})
    path = write_tar(tmp_path / "a.tar", samples)
    table = read_shard(str(path), "webdataset")
    assert table.column_names == ["__key__", "png", "txt", "json"]
    assert table.schema.field("png").type == pa.binary() and table.schema.field("txt").type == pa.string()
    assert table.column("__key__").to_pylist() == ["sample000001", "sample000002", "sample000003", "no_image", "bad_json"]
    assert table.column("png")[0].as_py() == image_bytes(1)

    pairs = pairs_of(path, "webdataset", tmp_path / "images")
    assert [p["caption"] for p in pairs[:3]] == [caption(1), caption(2), caption(3)]  # .txt is stripped
    assert all(p["reason"] is None for p in pairs[:3])
    assert (pairs[3]["field"], pairs[3]["reason"]) == ("image", "missing_image")
    assert (pairs[4]["field"], pairs[4]["reason"]) == ("json.caption", "bad_record")
    assert "bad_json" in pairs[4]["detail"] and str(path) in pairs[4]["detail"]


def test_webdataset_repeated_members_and_bad_text_are_bad_rows(tmp_path):
    path = tmp_path / "a.tar"
    members = [("k1.png", image_bytes(1)), ("k1.txt", b"one"), ("k1.txt", b"again"), ("k2.png", image_bytes(2)), ("k2.txt", b"\xff\xfe")]
    with tarfile.open(path, "w") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    pairs = pairs_of(path, "webdataset", tmp_path / "images")
    assert [p["reason"] for p in pairs] == ["bad_record", "bad_record"]
    assert "appears twice" in pairs[0]["detail"] and "not UTF-8" in pairs[1]["detail"]
    (tmp_path / "junk.tar").write_bytes(os.urandom(3000))
    with pytest.raises(ShardError, match="not a readable tar file"):
        read_shard(str(tmp_path / "junk.tar"), "webdataset")


# -- discovery and versions -----------------------------------------------------------------------


def test_discovery_of_folders_globs_and_files(tmp_path):
    a = write_parquet(tmp_path / "in" / "day1" / "part-0.parquet", pair_rows([1]))
    b = write_parquet(tmp_path / "in" / "day2" / "part-0.parquet", pair_rows([2]))
    c = write_tar(tmp_path / "in" / "day2" / "part-1.tar", tar_samples([3]))
    (tmp_path / "in" / "README.md").write_text("not a shard")
    write_parquet(tmp_path / "in" / "_tmp" / "partial.parquet", pair_rows([4]))  # an upload in progress
    write_parquet(tmp_path / "in" / ".hidden.parquet", pair_rows([4]))

    found = discover([str(tmp_path / "in") + "/"])
    assert [s.uri for s in found] == [str(a), str(b), str(c)]
    assert [s.format for s in found] == ["parquet", "parquet", "webdataset"]
    assert found[0].size == a.stat().st_size
    # same file names on different days: distinct output names
    assert found[0].shard_id.startswith("part-0-") and found[0].shard_id != found[1].shard_id
    assert [s.uri for s in discover([str(tmp_path / "in" / "*" / "*.parquet"), str(c)])] == [str(a), str(b), str(c)]
    assert discover([str(tmp_path / "in" / "*.nothing")]) == []
    assert discover([str(tmp_path / "empty") + "/"]) == []
    with pytest.raises(ShardError, match="input shard not found"):
        discover([str(tmp_path / "in" / "missing.parquet")])
    with pytest.raises(ShardError, match="not a shard"):
        discover([str(tmp_path / "in" / "*.md")])


def test_a_rewritten_shard_gets_a_new_version(tmp_path):
    path = write_parquet(tmp_path / "a.parquet", pair_rows([1]))
    (stat_before,) = discover([str(path)])
    (content_before,) = discover([str(path)], detect_changes="content")
    assert stat_before.version.startswith("mtime:") and content_before.version.startswith("blake2b:")
    os.utime(path, (time.time() + 5, time.time() + 5))  # touched, same bytes
    (stat_after,) = discover([str(path)])
    (content_after,) = discover([str(path)], detect_changes="content")
    assert stat_after.version != stat_before.version
    assert content_after.version == content_before.version
    write_parquet(path, pair_rows([2]))
    (content_changed,) = discover([str(path)], detect_changes="content")
    assert content_changed.version != content_before.version
    assert current_version(content_changed, "content") == (content_changed.size, content_changed.version)


def test_manifest_knows_what_was_processed(tmp_path):
    shard = Shard(uri="/x/a.parquet", size=10, version="mtime:1", format="parquet")
    manifest = Manifest.load(str(tmp_path))
    assert not manifest.is_current(shard, "fp")
    manifest.record(shard, fingerprint="fp", rows=3)
    manifest.save()
    again = Manifest.load(str(tmp_path))
    assert again.is_current(shard, "fp")
    assert not again.is_current(shard, "other-fingerprint")
    assert not again.is_current(Shard(uri="/x/a.parquet", size=11, version="mtime:1", format="parquet"), "fp")
    assert not again.is_current(Shard(uri="/x/a.parquet", size=10, version="mtime:2", format="parquet"), "fp")
    assert again.shard("/x/a.parquet") == shard


@pytest.fixture
def s3_bucket(moto_s3):
    moto_s3.mkdir("incoming")
    return moto_s3


def test_shards_on_s3_are_found_by_glob_versioned_by_etag_and_read(tmp_path, s3_bucket):
    local = write_parquet(tmp_path / "part-0.parquet", pair_rows([1, 2]))
    tar = write_tar(tmp_path / "part-1.tar", tar_samples([3]))
    s3_bucket.put(str(local), "incoming/2024-05-01/part-0.parquet")
    s3_bucket.put(str(tar), "incoming/2024-05-01/part-1.tar")
    found = discover(["s3://incoming/*/*.parquet", "s3://incoming/2024-05-01/"])
    assert [s.uri for s in found] == ["s3://incoming/2024-05-01/part-0.parquet", "s3://incoming/2024-05-01/part-1.tar"]
    assert all(s.version.startswith("etag:") for s in found)
    pairs = pairs_of(found[0].uri, "parquet", tmp_path / "images")
    assert [read_image_bytes(p["image_uri"]) for p in pairs] == [image_bytes(1), image_bytes(2)]
    assert read_shard(found[1].uri, "webdataset").column("txt").to_pylist() == [caption(3) + "\n"]
    s3_bucket.put(str(write_parquet(tmp_path / "other.parquet", pair_rows([9]))), "incoming/2024-05-01/part-0.parquet")
    (changed,) = discover(["s3://incoming/*/*.parquet"])
    assert changed.version != found[0].version


# -- the decision rule ----------------------------------------------------------------------------


def rows(scores) -> pl.DataFrame:
    return pl.DataFrame({"row": range(len(scores)), "score_depict": scores}, schema={"row": pl.Int64, "score_depict": pl.Float64})


def test_min_score_keeps_scores_at_or_above_and_never_a_missing_score():
    decided = apply_rule(rows([0.2, 0.5, 0.7, None, float("nan"), 0.49999]), Rule("depict", min_score=0.5))
    assert decided["keep"].to_list() == [False, True, True, False, False, False]


def test_top_fraction_keeps_the_best_per_shard_and_ties_at_the_cut():
    scores = [0.1, 0.9, 0.5, 0.7, None, 0.3, 0.7, 0.2, 0.6, 0.8, 0.4]  # 10 scored
    # 30% of 10 = 3 rows: 0.9, 0.8 and one 0.7; its tie 0.7 is kept too
    decided = apply_rule(rows(scores), Rule("depict", top_fraction=0.3))
    assert decided.filter("keep")["score_depict"].sort().to_list() == [0.7, 0.7, 0.8, 0.9]
    # 0.25 of 10 = 2.5 -> 3 rows (ceil), same set; 0.2 -> exactly 2 rows
    assert apply_rule(rows(scores), Rule("depict", top_fraction=0.25))["keep"].sum() == 4
    assert apply_rule(rows(scores), Rule("depict", top_fraction=0.2))["keep"].to_list() == [
        False, True, False, False, False, False, False, False, False, True, False
    ]
    both = apply_rule(rows(scores), Rule("depict", min_score=0.75, top_fraction=0.3))
    assert both.filter("keep")["score_depict"].sort().to_list() == [0.8, 0.9]
    assert apply_rule(rows([None, None]), Rule("depict", top_fraction=0.5))["keep"].to_list() == [False, False]
    with pytest.raises(ValueError, match="no stored scores for metric 'vqascore'"):
        apply_rule(rows([0.5]), Rule("vqascore", min_score=0.1))


@settings(max_examples=60, deadline=None)
@given(
    hst.lists(hst.one_of(hst.none(), hst.floats(0, 1)), min_size=0, max_size=40),
    hst.floats(0.01, 1.0),
)
def test_top_fraction_properties(scores, fraction):
    decided = apply_rule(rows(scores), Rule("depict", top_fraction=fraction))
    kept = decided.filter("keep")["score_depict"]
    dropped = decided.filter(~pl.col("keep") & pl.col("score_depict").is_not_null())["score_depict"]
    n_scored = sum(s is not None for s in scores)
    assert len(kept) >= min(n_scored, math.ceil(round(fraction * n_scored, 9)))
    assert len(kept) == 0 or len(dropped) == 0 or kept.min() > dropped.max()  # everything kept beats everything dropped
    assert decided.filter(pl.col("score_depict").is_null())["keep"].sum() == 0
    # the decision does not depend on row order
    shuffled = np.random.default_rng(0).permutation(len(scores)).tolist()
    again = apply_rule(rows([scores[i] for i in shuffled]), Rule("depict", top_fraction=fraction))
    assert sorted(again.filter("keep")["score_depict"].to_list()) == sorted(kept.to_list())


def test_filtered_rows_keep_every_original_column_in_order(tmp_path):
    source = pa.table({"image": [b"a", b"b", b"c"], "caption": ["x", "y", "z"], "meta": [{"w": 1}, {"w": 2}, {"w": 3}]})
    decisions = pa.table({"row": [0, 1, 2], "score_depict": [0.9, 0.1, 0.8], "score_vqascore": [0.5, 0.6, 0.7], "keep": [True, False, True]})
    out = filtered_rows(source, decisions, "s.parquet")
    assert out.column_names == ["image", "caption", "meta", "score_depict", "score_vqascore"]
    assert out.select(["image", "caption", "meta"]).equals(source.take([0, 2]))
    assert out.column("score_vqascore").to_pylist() == [0.5, 0.7]
    with pytest.raises(ShardError, match="has 2 rows but 3 were scored"):
        filtered_rows(source.slice(0, 2), decisions, "s.parquet")


# -- configuration ------------------------------------------------------------------------------


def test_presets_resolve_and_a_single_input_string_is_one_pattern(tmp_path):
    cfg = load_curation_config([f"root={tmp_path}", "inputs=s3://bucket/incoming/"])
    c = cfg.sweep
    assert c.inputs == ["s3://bucket/incoming/"]
    assert c.output == f"{tmp_path}/curation/nightly"
    assert c.questions.source == "model" and c.backbones == [c.questions.generator]
    smoke = load_curation_config(["curation=smoke", f"root={tmp_path}", "inputs=[in/a.parquet, in/]", "metric=vqascore"]).sweep
    assert smoke.inputs == [os.path.abspath("in/a.parquet"), os.path.abspath("in") + "/"]
    assert smoke.target == "vqascore"  # the sweep's target follows the decision metric


@pytest.mark.parametrize(
    ("args", "key"),
    [
        ([], "inputs"),
        (["inputs=[a.parquet]", "backbones=[zero-cost,smoke]"], "backbones"),
        (["inputs=[a.parquet]", "metric=dsg"], "metric"),
        (["inputs=[a.parquet]", "top_fraction=0"], "top_fraction"),
        (["inputs=[a.parquet]", "top_fraction=1.5"], "top_fraction"),
        (["inputs=[a.parquet]", "detect_changes=sometimes"], "detect_changes"),
        (["inputs=[a.parquet]", "min_score=abc"], "curation.min_score"),
        (["inputs=[a.parquet]", "conf=conf/curate/nightly.yaml"], "curation.conf"),
    ],
)
def test_bad_configuration_names_the_key(args, key):
    with pytest.raises(ConfigError) as info:
        load_curation_config(["curation=smoke", *args])
    assert info.value.key == key


def test_fingerprint_follows_scoring_settings_not_the_decision(tmp_path):
    base = ["curation=smoke", "inputs=[a.parquet]"]
    fp = scoring_fingerprint(load_curation_config(base))
    assert scoring_fingerprint(load_curation_config([*base, "min_score=0.9", "top_fraction=0.1"])) == fp
    assert scoring_fingerprint(load_curation_config([*base, "metrics=[depict]"])) != fp
    assert scoring_fingerprint(load_curation_config([*base, "backbones=[smoke]"])) != fp
    assert scoring_fingerprint(load_curation_config([*base, "columns.caption=text"])) != fp


def test_histogram_is_a_png():
    png = histogram_png([0.1, 0.4, 0.45, 0.8], Rule("depict", min_score=0.5), [])
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 1000


def test_an_image_error_of_a_request_is_placed_on_every_row_showing_that_image():
    """Model stages report image errors per request (no shard, no row); the shards' errors
    tables get one copy per row with that image, so each failed row has its cause beside it."""
    from operators import schema
    from pipeline.curation.rows import locate_image_errors

    errors = pl.from_arrow(schema.conform(pa.Table.from_pylist([
        {"stage": "answers", "key": "k1", "source": "/img/u.png", "field": "image_uri", "reason": "unreadable_image", "detail": "changed since it was hashed"},
        {"stage": "answers", "key": "k2", "source": "/img/u.png", "field": "image_uri", "reason": "unreadable_image", "detail": "changed since it was hashed"},
        {"stage": "ingest", "benchmark": "s1", "item_id": "s1/3", "source": "/in/s1.parquet", "field": "caption", "reason": "empty_caption", "detail": "empty"},
    ]), schema.ERRORS))
    pairs = pl.DataFrame({
        "shard_id": ["s1", "s1", "s2", "s2"], "item_id": ["s1/0", "s1/1", "s2/0", "s2/1"],
        "image_uri": ["/img/u.png", "/img/v.png", "/img/u.png", None],
    })
    located = locate_image_errors(errors, pairs).sort("item_id", "key")
    assert located.columns == errors.columns
    assert located.select("benchmark", "item_id", "key").rows() == [("s1", "s1/0", "k1"), ("s1", "s1/0", "k2"), ("s2", "s2/0", "k1"), ("s2", "s2/0", "k2")]
    assert set(located["detail"]) == {"changed since it was hashed"}
    assert locate_image_errors(errors.filter(pl.col("stage") == "ingest"), pairs).height == 0
