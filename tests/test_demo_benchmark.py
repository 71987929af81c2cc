"""The built-in demo benchmark: deterministic files, schemas, structure, synthetic ratings."""
from __future__ import annotations

import importlib
import io
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from omegaconf import OmegaConf
from PIL import Image

from operators import demo_world
from operators.hashing import digest
from operators.schema import CLAIM_TYPES, ITEMS, QUESTION_SETS, QUESTIONS
from pipeline.benchmarks import demo
from pipeline.config import BenchmarkSpec

PARTS = ("correlation", "winoground", "mcq")
CONF = Path(__file__).resolve().parents[1] / "conf" / "benchmarks"


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("demo"))
    demo.write_demo(path)
    return path


@pytest.fixture(scope="module")
def loaded(root):
    return {part: demo.load(root, part=part) for part in PARTS}


def items(loaded, part) -> pl.DataFrame:
    return pl.from_arrow(loaded[part].items)


def questions(loaded, part) -> pl.DataFrame:
    return pl.from_arrow(loaded[part].questions)


def files(root: str) -> dict[str, bytes]:
    out = {}
    for folder, _, names in os.walk(root):
        for name in names:
            path = os.path.join(folder, name)
            out[os.path.relpath(path, root)] = Path(path).read_bytes()
    return out


# ------------------------------------------------------------------ files


def test_two_writes_give_identical_bytes_and_tables(root, loaded, tmp_path):
    # A fresh interpreter with another hash seed: nothing may depend on set or dict hashing.
    other = str(tmp_path / "elsewhere")
    code = f"from pipeline.benchmarks.demo import write_demo; write_demo({other!r})"
    subprocess.run([sys.executable, "-c", code], check=True, env=os.environ | {"PYTHONHASHSEED": "12345"})
    assert files(other) == files(root)
    for part in PARTS:
        again = demo.load(other, part=part)
        assert again.questions.equals(loaded[part].questions)
        relative = [os.path.relpath(u, other) for u in again.items.column("image_uri").to_pylist()]
        assert relative == [os.path.relpath(u, root) for u in loaded[part].items.column("image_uri").to_pylist()]
        assert again.items.drop_columns("image_uri").equals(loaded[part].items.drop_columns("image_uri"))


def test_manifest_digest_is_pinned(root):
    # The manifest names every image by its content hash, so this pins every byte of the demo
    # on every machine. If you changed the demo on purpose, update the digest.
    assert digest(Path(root, demo.MANIFEST).read_bytes()) == "312ccb51cc3dbfdff46ebf5810a0978c"


def test_write_is_idempotent_and_repairs_an_incomplete_folder(tmp_path):
    root = str(tmp_path / "demo")
    demo.write_demo(root)
    before = {p: os.stat(os.path.join(root, p)).st_mtime_ns for p in files(root)}
    content = files(root)
    demo.write_demo(root)
    assert {p: os.stat(os.path.join(root, p)).st_mtime_ns for p in files(root)} == before

    # A crash before the manifest (the completion marker) was written, with one image lost.
    os.remove(os.path.join(root, demo.MANIFEST))
    lost = next(p for p in content if p.endswith(".png"))
    os.remove(os.path.join(root, lost))
    demo.write_demo(root)
    assert files(root) == content

    # A manifest from an older version of the demo is replaced.
    Path(root, demo.MANIFEST).write_text('{"version": 0}')
    demo.write_demo(root)
    assert files(root) == content


def test_images_are_pngs_that_show_their_scene(root):
    manifest = json.loads(Path(root, demo.MANIFEST).read_text())
    assert 0 < len(manifest["images"]) < 60
    for path, objects in manifest["images"].items():
        with Image.open(Path(root, path)) as img:
            assert img.format == "PNG" and img.size == (256, 256)
            rgb_img = img.convert("RGB")
        rgb = np.asarray(rgb_img)
        assert tuple(rgb[0, 0]) == demo.BACKGROUND and tuple(rgb[-1, -1]) == demo.BACKGROUND
        colours_seen = {colour for _, colour in rgb_img.getcolors()}
        assert colours_seen == {demo.BACKGROUND} | {demo.COLOURS[o["colour"]] for o in objects}
        for o in objects:  # every shape covers its cell's centre, in its colour
            centre = rgb[int((o["row"] + 0.5) * 256 / 3), int((o["col"] + 0.5) * 256 / 3)]
            assert tuple(centre) == demo.COLOURS[o["colour"]]


def test_shapes_have_the_expected_areas():
    r = 0.33 * 256 / 3
    areas = {s: int((demo.render(demo.scene(f"red {s} middle centre")) > 0).sum()) for s in demo.SHAPES}
    assert areas["circle"] == pytest.approx(math.pi * r * r, rel=0.02)
    # square: pixel centres k + 0.5 within 0.8 r = 22.528 of the centre 128 -> k = 105..150
    assert areas["square"] == 46 * 46
    assert areas["triangle"] == pytest.approx(0.5 * (1.9 * r) * (1.75 * r), rel=0.03)
    assert areas["star"] < areas["circle"]  # concave: its points do not fill the disc


def test_png_writer_round_trips_through_pillow():
    indices = np.arange(256 * 300, dtype=np.uint32).reshape(300, 256) % 5  # > 64 KiB: several deflate blocks
    with Image.open(io.BytesIO(demo.png_bytes(indices.astype(np.uint8)))) as img:
        assert img.mode == "P" and img.size == (256, 300)
        assert np.array_equal(np.asarray(img), indices)


# ----------------------------------------------------------------- schemas


@pytest.mark.parametrize("part", PARTS)
def test_items_and_questions_conform_to_the_schemas(loaded, part):
    result = loaded[part]
    assert result.problems == []
    assert result.items.schema == ITEMS
    assert result.questions.schema == QUESTIONS
    df = items(loaded, part)
    assert df["benchmark"].unique().to_list() == [demo.BENCHMARK_NAMES[part]]
    assert df["item_id"].is_unique().all()
    assert df["image_hash"].is_null().all()
    assert all(os.path.isabs(u) and os.path.isfile(u) for u in df["image_uri"])
    assert set(questions(loaded, part)["source"]) == {"benchmark"}


def test_item_ids_are_unique_across_parts(loaded):
    ids = pl.concat([items(loaded, p) for p in PARTS])["item_id"]
    assert ids.is_unique().all()
    local = ids.str.replace(r"^[^/]*/", "")  # ingest renames the prefix to the run's benchmark name
    assert local.is_unique().all()


@pytest.mark.parametrize("part", PARTS)
def test_every_caption_has_well_formed_questions_in_all_three_sets(loaded, part):
    qs = questions(loaded, part)
    for caption in items(loaded, part)["caption"].unique():
        for qset in QUESTION_SETS:
            rows = qs.filter((pl.col("caption") == caption) & (pl.col("question_set") == qset))
            ids = rows["question_id"].to_list()
            assert ids == [str(i) for i in range(1, len(ids) + 1)] and ids, (caption, qset)
            assert rows["question"].is_unique().all()
            if qset == "dsg":  # parents come earlier in the list
                assert all(int(p) < int(q) for q, ps in zip(ids, rows["parents"]) for p in ps)
            else:
                assert all(ps.len() == 0 for ps in rows["parents"])
            if qset == "claims":
                assert set(rows["claim_type"]) <= set(CLAIM_TYPES)
            else:
                assert rows["claim_type"].is_null().all()


def test_a_caption_shared_by_parts_has_the_same_questions(loaded):
    shared = pl.concat([questions(loaded, p) for p in PARTS]).unique()
    assert shared.select("caption", "question_set", "question_id").is_unique().all()


def rows_of(loaded, part, caption, qset):
    qs = questions(loaded, part).filter((pl.col("caption") == caption) & (pl.col("question_set") == qset))
    return [(r["question"], r["parents"], r["claim_type"]) for r in qs.iter_rows(named=True)]


def test_negation_caption_questions(loaded):
    caption = "a blue star and no circle"
    assert [q for q, _, _ in rows_of(loaded, "correlation", caption, "depict")] == [
        "Is there a star?", "Is there a blue star?", "Is there a circle?",  # the last expects No
    ]
    assert rows_of(loaded, "correlation", caption, "dsg") == [
        ("Is there a star?", [], None), ("Is the star blue?", ["1"], None), ("Is there no circle?", [], None),
    ]
    assert rows_of(loaded, "correlation", caption, "claims") == [
        ("There is a star.", [], "object"), ("There is a blue star.", [], "attribute"), ("There is no circle.", [], "negation"),
    ]


def test_relation_and_count_caption_questions(loaded):
    assert rows_of(loaded, "correlation", "a red circle above a blue square", "dsg") == [
        ("Is there a circle?", [], None),
        ("Is the circle red?", ["1"], None),
        ("Is there a square?", [], None),
        ("Is the square blue?", ["3"], None),
        ("Is the red circle above the blue square?", ["2", "4"], None),
    ]
    assert rows_of(loaded, "correlation", "two red circles", "dsg") == [
        ("Is there a circle?", [], None), ("Are the circles red?", ["1"], None), ("Are there exactly two red circles?", ["2"], None),
    ]
    assert [t for _, _, t in rows_of(loaded, "correlation", "two red circles", "claims")] == ["object", "attribute", "count"]


# --------------------------------------------------------------- structure


def test_correlation_part(loaded):
    df = items(loaded, "correlation")
    assert df.height == 24
    assert (df["group_id"] == df["caption"]).all()
    groups = df.group_by("group_id").agg(pl.len(), pl.col("human").max().alias("best"), pl.col("human").min().alias("worst"))
    assert groups.height == 8 and (groups["len"] == 3).all()
    assert (groups["best"] >= 4.4).all() and (groups["worst"] < groups["best"]).all()
    exact = df.filter(pl.col("item_id").str.ends_with("-0"))  # each caption's exact match: rated above its edits
    assert exact.join(groups, on="group_id").select((pl.col("human") == pl.col("best")).all()).item()
    assert df["human"].is_between(1.0, 5.0).all()
    assert df.select(pl.col("image_index", "caption_index", "correct", "template").is_null().all()).row(0) == (True,) * 4
    text = " ".join(df["caption"].unique())
    for phrase in ("two ", "three ", "left of", "above", "no "):
        assert phrase in text


def reference_ratings(cap, scene_, raters, error):
    """The raters' model written out again: each rater draws, per fact in caption order, whether
    they misjudge it, from one generator seeded with the caption and the scene's objects."""
    import math
    import random

    key = ";".join(sorted(f"{o.colour} {o.shape} {o.row} {o.col}" for o in scene_))
    rng = random.Random(f"raters/{cap.text}/{key}")
    out = []
    for _ in range(raters):
        judged = [f.holds(scene_) != (rng.random() < error[f.kind]) for f in cap.facts]
        out.append(math.floor(1 + 4 * sum(judged) / len(judged) + 0.5))
    return out


def test_ratings_are_the_raters_mean_and_follow_the_stated_model(loaded):
    human = dict(items(loaded, "correlation").select(pl.col("item_id").str.replace("demo/", ""), "human").iter_rows())
    for p, prompt in enumerate(demo.CORRELATION, start=1):
        for v, scene_ in enumerate(prompt.scenes):
            ratings = reference_ratings(prompt.caption, scene_, demo_world.RATERS, demo_world.RATER_ERROR)
            assert human[f"c{p:02d}-{v}"] == pytest.approx(sum(ratings) / len(ratings))


def test_raters_who_never_err_rate_the_share_of_true_facts(monkeypatch):
    # Hand-checked: 1 + 4 * (true facts / facts), rounded. Facts are listed in the comments.
    monkeypatch.setattr(demo_world, "RATER_ERROR", dict.fromkeys(demo_world.RATER_ERROR, 0.0))
    hand = {
        (0, 0): 5,  # a red circle: circle yes, red circle yes
        (0, 1): 3,  # blue circle: circle yes, red circle no
        (0, 2): 1,  # green square + yellow star: neither
        (1, 1): 4,  # three red circles: circle, red circle yes; exactly two no (1 + 8/3 = 3.67)
        (1, 2): 2,  # two blue circles: circle yes; red, count no (1 + 4/3 = 2.33)
        (4, 1): 4,  # red circle below the blue square: 4 of 5 (only "above" fails: 4.2)
    }
    for (p, v), expected in hand.items():
        prompt = demo.CORRELATION[p]
        assert prompt.caption.rater_ratings(prompt.scenes[v]) == [expected] * demo_world.RATERS


def test_raters_misjudge_facts_at_the_stated_rates():
    sampler = demo_world.WorldSampler(0, "heldout")
    wrong = total = 0
    for _ in range(600):
        scene_ = sampler.scene()
        cap = sampler.caption(scene_)
        if len(cap.facts) != 1:  # one fact: a rating of 5 or 1 says how the rater judged it
            continue
        fact = cap.facts[0]
        for rating in cap.rater_ratings(scene_):
            wrong += (rating == 5) != fact.holds(scene_)
            total += 1
    rate = wrong / total
    assert total > 500 and min(demo_world.RATER_ERROR.values()) - 0.03 < rate < max(demo_world.RATER_ERROR.values()) + 0.03


def test_manifest_facts_and_raters_explain_each_rating(root):
    manifest = json.loads(Path(root, demo.MANIFEST).read_text())
    for row in manifest["parts"]["correlation"]:
        assert len(row["raters"]) == demo_world.RATERS and all(r in (1, 2, 3, 4, 5) for r in row["raters"])
        assert row["human"] == pytest.approx(sum(row["raters"]) / len(row["raters"]))
        held = [holds for _, holds in row["facts"]]
        assert abs(row["human"] - (1 + 4 * sum(held) / len(held))) <= 2.5  # raters err, but not wildly


def test_winoground_part(loaded):
    df = items(loaded, "winoground")
    assert df.height == 24 and df["group_id"].n_unique() == 6
    assert df["human"].is_null().all()
    for _, g in df.group_by("group_id"):
        assert sorted(zip(g["image_index"], g["caption_index"])) == [(0, 0), (0, 1), (1, 0), (1, 1)]
        assert (g["correct"] == (g["image_index"] == g["caption_index"])).all()
        # the image depends only on image_index, the caption only on caption_index
        assert g.group_by("image_index").agg(pl.col("image_uri").n_unique())["image_uri"].to_list() == [1, 1]
        assert g.group_by("caption_index").agg(pl.col("caption").n_unique())["caption"].to_list() == [1, 1]
        assert g["image_uri"].n_unique() == 2 and g["caption"].n_unique() == 2
        # swapped pairs: the same words (up to plurals), in another order
        c0, c1 = (g.filter(pl.col("caption_index") == i)["caption"][0] for i in (0, 1))
        assert c0 != c1
        assert sorted(w.removesuffix("s") for w in c0.split()) == sorted(w.removesuffix("s") for w in c1.split())


def test_winoground_captions_describe_their_own_image_only():
    for example in demo.WINOGROUND:
        for i in (0, 1):
            assert example.captions[i].share_true(example.scenes[i]) == 1.0
            assert example.captions[i].share_true(example.scenes[1 - i]) < 1.0


def expected_template(caption: str) -> str:
    if caption.startswith("a picture with no"):
        return "negation"
    return "hybrid" if " and no " in caption else "affirmative"


def test_mcq_part(loaded):
    df = items(loaded, "mcq")
    assert df.height == 32 and df["group_id"].n_unique() == 8
    assert df["human"].is_null().all() and df["image_index"].is_null().all()
    templates = set()
    for _, g in df.group_by("group_id"):
        assert sorted(g["caption_index"]) == [0, 1, 2, 3]
        assert g["correct"].sum() == 1
        assert g["image_uri"].n_unique() == 1 and g["caption"].n_unique() == 4
        correct = g.filter(pl.col("correct"))["caption"][0]
        assert g["template"].unique().to_list() == [expected_template(correct)]
        templates.add(expected_template(correct))
    assert templates == {"affirmative", "negation", "hybrid"}
    assert set(df.filter(pl.col("correct"))["caption_index"]) == {0, 1, 2, 3}  # not always first


def test_mcq_correct_captions_hold_and_distractors_do_not():
    for row in demo.MCQ:
        assert row.correct.share_true(row.scene) == 1.0
        assert all(d.share_true(row.scene) < 1.0 for d in row.distractors)


# ------------------------------------------------------------ bad records and config


def test_bad_manifest_rows_are_reported_and_skipped(root, tmp_path, monkeypatch):
    copy = tmp_path / "edited"
    for rel, data in files(root).items():
        (copy / rel).parent.mkdir(parents=True, exist_ok=True)
        (copy / rel).write_bytes(data)
    manifest = json.loads((copy / demo.MANIFEST).read_text())
    rows = manifest["parts"]["correlation"]
    del rows[0]["caption"]
    rows[1]["image"] = "../outside.png"
    rows[2]["human"] = 7
    (copy / demo.MANIFEST).write_text(json.dumps(manifest))
    monkeypatch.setattr(demo, "write_demo", lambda root, drawn=False, open_share=0.0: None)  # keep the edited manifest
    result = demo.load(str(copy))
    assert result.items.num_rows == 21
    assert [(p.record, p.field) for p in result.problems] == [
        ("parts.correlation[0]", "caption"), ("parts.correlation[1]", "image"), ("parts.correlation[2]", "human"),
    ]
    assert all(p.file.endswith(demo.MANIFEST) for p in result.problems)


def test_unknown_part_is_refused(root):
    with pytest.raises(ValueError, match="unknown part"):
        demo.load(root, part="tifa")


def test_a_drawn_option_that_is_not_a_bool_is_refused(root):
    """`benchmark_overrides.demo.options.drawn=nope` is refused, not read as a truthy string that loads the large demo."""
    with pytest.raises(ValueError, match="drawn must be true or false, got 'nope'"):
        demo.load(root, drawn="nope")


EXPECTED_PROTOCOLS = {
    "demo": ("correlation", "correlation", ["srcc", "plcc", "pairwise_acc"], ["tags"], "srcc"),
    "demo_winoground": ("winoground", "winoground", ["text_acc", "image_acc", "group_acc"], [], "group_acc"),
    "demo_mcq": ("mcq", "multiple_choice", ["accuracy"], ["template"], "accuracy"),
}


@pytest.mark.parametrize("name", sorted(EXPECTED_PROTOCOLS))
def test_benchmark_configs(name, root):
    cfg = OmegaConf.merge(OmegaConf.structured(BenchmarkSpec), OmegaConf.load(CONF / f"{name}.yaml"))
    part, kind, statistics, breakdowns, primary = EXPECTED_PROTOCOLS[name]
    assert cfg.name == name and cfg.loader == "demo"
    assert OmegaConf.to_container(cfg)["root"] == "${data_root}/demo"
    assert OmegaConf.to_container(cfg.options) == {"part": part, "open_share": "${open_share}"}
    assert (cfg.protocol.kind, list(cfg.protocol.statistics), list(cfg.protocol.breakdowns), cfg.protocol.primary_statistic) == (
        kind, statistics, breakdowns, primary,
    )
    if name == "demo_mcq":
        assert cfg.protocol.tie_policy == "expected"
    loader = importlib.import_module(f"pipeline.benchmarks.{cfg.loader}")
    options = {**OmegaConf.to_container(cfg.options), "open_share": 0.0}
    assert loader.load(root, **options).items.column("benchmark")[0].as_py() == name
