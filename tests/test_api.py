"""The Python API (pipeline.api.Scorer): input forms, error rows instead of exceptions, the
in-process executor, and equality with the sweep through the shared answer store."""
from __future__ import annotations

import io

import numpy as np
import polars as pl
import pytest
from PIL import Image

from pipeline import PairErrors, Scorer
from pipeline.api import to_pairs, user_questions
from pipeline.config import load_config
from pipeline.stages.engine_stage import StageReport
from pipeline.sweep import run_sweep

QUESTIONS = {"a red circle": ["Is there a circle?", "Is the circle red?"], "a blue square": ["Is there a square?", "Is the square blue?"]}


def _png(tmp_path, name: str, color: str) -> str:
    path = tmp_path / name
    Image.new("RGB", (48, 40), color).save(path)
    return str(path)


# -------------------------------------------------------------------------- inputs (no model)


def test_pairs_are_zipped_broadcast_or_crossed(tmp_path):
    url = str(tmp_path / "images")
    zipped = to_pairs(["a.png", "b.png"], ["x", "y"], cross=False, image_column="image", caption_column="caption", images_url=url)
    assert zipped.frame.select("image", "caption").rows() == [("a.png", "x"), ("b.png", "y")]
    broadcast = to_pairs("a.png", ["x", "y", "z"], cross=False, image_column="image", caption_column="caption", images_url=url)
    assert broadcast.frame["caption"].to_list() == ["x", "y", "z"] and set(broadcast.frame["image"]) == {"a.png"}
    crossed = to_pairs(["a.png", "b.png"], ["x", "y"], cross=True, image_column="image", caption_column="caption", images_url=url)
    assert crossed.frame.select("image", "caption").rows() == [("a.png", "x"), ("a.png", "y"), ("b.png", "x"), ("b.png", "y")]
    with pytest.raises(ValueError, match="2 images and 3 captions"):
        to_pairs(["a.png", "b.png"], ["x", "y", "z"], cross=False, image_column="image", caption_column="caption", images_url=url)


def test_bytes_and_pil_images_are_stored_by_content_and_bad_values_become_errors(tmp_path):
    url = str(tmp_path / "images")
    img = Image.new("RGB", (8, 8), "red")
    buffer = io.BytesIO()
    img.save(buffer, format="PNG")
    pairs = to_pairs([buffer.getvalue(), img, None, 3.5, "a.png"], ["c", "c", "c", "c", 7], cross=False, image_column="image", caption_column="caption", images_url=url)
    uris = pairs.frame["image_uri"].to_list()
    assert uris[0] == uris[1] and uris[0].startswith(url)  # same PNG bytes: one stored file
    reasons = {e["item_id"]: e["reason"] for e in pairs.errors}
    assert reasons == {"2": "missing_image", "3": "bad_image_type", "4": "bad_caption_type"}
    assert uris[2] is None and uris[3] is None and uris[4] is None


def test_a_frame_keeps_its_columns_and_names_missing_ones():
    frame = pl.DataFrame({"path": ["a.png"], "text": ["x"], "id": ["k1"]})
    pairs = to_pairs(frame, None, cross=False, image_column="path", caption_column="text", images_url="/tmp/unused")
    assert pairs.frame["caption"].to_list() == ["x"] and pairs.extra["id"].to_list() == ["k1"]
    with pytest.raises(ValueError, match="no column 'caption'"):
        to_pairs(frame, None, cross=False, image_column="path", caption_column="caption", images_url="/tmp/unused")


def test_a_pandas_frame_is_accepted():
    pd = pytest.importorskip("pandas")
    pairs = to_pairs(pd.DataFrame({"image": ["a.png", None], "caption": ["x", "y"]}), None, cross=False, image_column="image", caption_column="caption", images_url="/tmp/unused")
    assert pairs.frame["caption"].to_list() == ["x", "y"] and [e["reason"] for e in pairs.errors] == ["missing_image"]


def test_user_questions_from_a_dict_or_a_frame():
    q = user_questions(QUESTIONS)
    assert q.filter(pl.col("caption") == "a red circle")["question_id"].to_list() == ["1", "2"]
    assert set(q["question_set"]) == {"depict"} and set(q["source"]) == {"user"}
    frame = user_questions(pl.DataFrame({"caption": ["c", "c"], "question": ["q1?", "q2?"]}))
    assert frame["question_id"].to_list() == ["1", "2"]
    with pytest.raises(ValueError, match="lacks column"):
        user_questions(pl.DataFrame({"caption": ["c"]}))


# -------------------------------------------------------------------------- in-process scoring


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    folder = tmp_path_factory.mktemp("api-images")
    corrupt = folder / "corrupt.png"
    corrupt.write_bytes(b"\x89PNG\r\n\x1a\n not really")
    return {"red": _png(folder, "red.png", "red"), "blue": _png(folder, "blue.png", "blue"), "corrupt": str(corrupt), "missing": str(folder / "nope.png")}


@pytest.fixture(scope="module")
def scorer(tmp_path_factory, tiny_vlm_dir):
    return Scorer("smoke", metrics=["depict", "agree", "vqascore"], root=tmp_path_factory.mktemp("api-root"), executor="auto")


def test_local_scoring_gives_error_rows_and_a_second_call_sends_nothing(scorer, images):
    import ray

    ray_was_running = ray.is_initialized()
    inputs = [images["red"], images["blue"], images["missing"], images["corrupt"], images["red"]]
    captions = ["a red circle", "a blue square", "a red circle", "a red circle", ""]
    scores, records = scorer(images=inputs, texts=captions, questions=QUESTIONS, records=True)
    assert scorer.last.executor == "local"
    assert ray.is_initialized() == ray_was_running  # small inputs never start Ray
    assert scores["row"].to_list() == [0, 1, 2, 3, 4]
    assert scores["error"].to_list() == [None, None, "unreadable_image", "unreadable_image", "empty_caption"]
    assert "file not found" in scores["error_detail"][2] and "nope.png" in scores["error_detail"][2]
    good = scores.head(2)
    assert all(0.0 <= v <= 1.0 for m in ("depict", "agree", "vqascore") for v in good[m].to_list())
    assert scores.slice(2)["depict"].null_count() == 3  # never a silent 0
    # per-question records: two questions per scored pair, with p_v, p_t, commitment, agreement
    assert records.filter(pl.col("question_set") == "depict").group_by("row").len().sort("row")["len"].to_list() == [2, 2]
    p_t = records["p_t"].to_numpy()
    assert np.allclose(records["commitment"].to_numpy(), np.abs(2 * p_t - 1))
    sent_first = scorer.last.sent
    assert sent_first > 0

    again = scorer(images=inputs, texts=captions, questions=QUESTIONS)
    assert scorer.last.sent == 0
    assert all(r.cached == r.needed for r in scorer.last.reports if r.stage != "ingest")
    assert again.select("depict", "agree", "vqascore").equals(scores.select("depict", "agree", "vqascore"))
    assert scorer._local.engine_loads == 1  # the model is loaded once per scorer


def test_strict_mode_raises_naming_the_rows(scorer, images):
    with pytest.raises(PairErrors, match=r"row 1: unreadable_image"):
        scorer.score([images["red"], images["corrupt"]], "a red circle", questions=QUESTIONS, strict=True)


def test_generated_questions_use_the_same_engine(scorer, images):
    """No questions passed: the backbone generates them (random weights: unparseable, so
    the pair gets an error row and null scores, never an exception or a 0)."""
    scores = scorer.score(images["blue"], "a small green triangle")
    stages = {r.stage for r in scorer.last.reports}
    assert "questions" in stages
    assert scores["vqascore"].null_count() == 0  # the holistic term needs no questions
    assert scorer._local.engine_loads == 1


def test_evidence_metrics_cannot_run_in_process(tmp_path):
    s = Scorer("smoke", metrics=["grounding_only"], root=tmp_path, executor="local", overrides=["evidence.detector.model_id=builtin:tiny-grounding-dino"])
    with pytest.raises(ValueError, match="evidence checks"):
        s.score("x.png", "a cat", questions={"a cat": ["Is there a cat?"]})


# -------------------------------------------------------------------------- the same numbers as the sweep


@pytest.mark.slow
def test_scores_equal_the_sweep_and_the_cache_is_shared_both_ways(ray_session, tmp_path, tiny_vlm_dir):
    data = tmp_path / "datasets"
    common = ["sweep=smoke", f"data_root={data}", "benchmarks=[demo]", "benchmark_overrides.demo.limit_groups=2", "compute.progress_bars=false", "bootstrap.n_resamples=20"]
    cfg = load_config([f"root={tmp_path / 'a'}", *common])
    result = run_sweep(cfg)
    items = pl.read_parquet(f"{result.run_dir}/items.parquet")
    questions = pl.read_parquet(f"{result.run_dir}/questions.parquet")
    swept = pl.read_parquet(f"{result.run_dir}/scores/smoke.parquet")
    metrics = list(cfg.sweep.metrics)

    def as_wide(scores: pl.DataFrame) -> np.ndarray:
        return scores.select(metrics).to_numpy()

    expected = swept.pivot(on="metric", index="item_id", values="score").join(items.select("item_id"), on="item_id", how="right")
    # 1. a fresh store: computed independently, in process
    fresh = Scorer("smoke", metrics=metrics, root=tmp_path / "b")
    got = fresh.score(items.select(pl.col("image_uri").alias("image"), "caption", "item_id"), questions=questions)
    assert fresh.last.executor == "local" and fresh.last.sent > 0
    assert got["item_id"].to_list() == expected["item_id"].to_list()
    assert np.allclose(as_wide(got), as_wide(expected), rtol=0, atol=1e-6)
    # 2. the sweep's store: nothing is asked again, the numbers are the sweep's own
    shared = Scorer("smoke", metrics=metrics, root=tmp_path / "a", executor="ray")  # the large-input path
    cached = shared.score(items.select(pl.col("image_uri").alias("image"), "caption"), questions=questions)
    assert shared.last.executor == "ray" and shared.last.sent == 0
    assert np.array_equal(as_wide(cached), as_wide(expected), equal_nan=True)
    # 3. and a sweep on the API's store sends nothing either
    rerun = run_sweep(load_config([f"root={tmp_path / 'b'}", *common]))
    answers = [r for r in rerun.reports if isinstance(r, StageReport) and r.stage == "answers"]
    assert answers and all(r.sent == 0 and r.cached == r.needed for r in answers)
