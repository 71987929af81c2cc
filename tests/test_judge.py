"""VLM-as-judge: strict parsing of holistic and decomposed judgements, image-aware generation,
and the judge stage with the scripted engine (valid and invalid outputs)."""
from __future__ import annotations

import json

import numpy as np
import polars as pl
import pyarrow as pa
import pytest
from PIL import Image

from operators import schema
from operators.answering import generate_image_batch
from operators.engines.spec import BackboneSpec
from operators.hashing import image_hash
from operators.judge_output import JudgeError, parse_decomposed, parse_holistic, parse_judgement
from pipeline.config import ComputeSpec, load_config
from pipeline.stages.judge import judge_scores, run_judge

CLAIM = {"claim": "There is a dog.", "type": "object", "boxes": [[100, 200, 400, 900]], "score": 0.8, "explanation": "A dog is on the left."}


def decomposed(**changes) -> str:
    claim = {**CLAIM, **changes.pop("claim", {})}
    body = {"claims": [claim, {"claim": "There is no cat.", "type": "negation", "boxes": [], "score": 0.9, "explanation": "No cat is visible."}], "overall": 0.85}
    body.update(changes)
    return json.dumps(body)


# ------------------------------------------------------------------------ holistic


@pytest.mark.parametrize(
    ("text", "score"),
    [
        ('{"score": 0.75}', 0.75),
        ('  {"score": 0.05}\n', 0.05),
        ('{"score": 1e-1}', 0.1),
        ('```json\n{"score": 0.95}\n```', 0.95),
        ('```\n{"score": 0.5}\n```', 0.5),
        ('<think>the dog is there, the cat too</think>\n{"score": 0.6}', 0.6),
        ('{"score": 1}'.replace("1", "0.9"), 0.9),
    ],
)
def test_holistic_valid(text, score):
    assert parse_holistic(text) == pytest.approx(score)


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ('The score is {"score": 0.7}', "bad_json"),
        ('{"score": 0.7} because the dog is there', "bad_json"),
        ('{"score": 0.7,}', "bad_json"),
        ("{'score': 0.7}", "bad_json"),
        ('{"score": 0.99}', "out_of_range"),
        ('{"score": 0.0}', "out_of_range"),
        ('{"score": NaN}', "out_of_range"),
        ('{"score": "0.7"}', "wrong_type"),
        ('{"score": true}', "wrong_type"),
        ('{"score": null}', "wrong_type"),
        ('{"rating": 0.7}', "missing_field"),
        ('{}', "missing_field"),
        ('{"score": 0.7, "reason": "fine"}', "unexpected_field"),
        ("[0.7]", "not_an_object"),
        ("0.7", "not_an_object"),
        ("", "empty_output"),
        ("<think>still thinking", "unclosed_think"),
        ('```json\n{"score": 0.7}', "bad_json"),
    ],
)
def test_holistic_invalid(text, reason):
    with pytest.raises(JudgeError) as err:
        parse_holistic(text)
    assert err.value.reason == reason


# ---------------------------------------------------------------------- decomposed


def test_decomposed_valid_reads_every_field():
    judged = parse_decomposed("```json\n" + decomposed() + "\n```")
    assert judged.overall == 0.85 and len(judged.claims) == 2
    dog, cat = judged.claims
    assert (dog.claim, dog.type, dog.boxes, dog.score) == ("There is a dog.", "object", ((100, 200, 400, 900),), 0.8)
    assert cat.boxes == () and cat.type == "negation"
    score, canonical = parse_judgement("decomposed", decomposed())
    assert score == 0.85 and json.loads(canonical)["claims"][0]["boxes"] == [[100, 200, 400, 900]]


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        (decomposed(overall=1.2), "out_of_range"),
        (decomposed(overall="high"), "wrong_type"),
        (decomposed(claim={"score": -0.1}), "out_of_range"),
        (decomposed(claim={"score": "0.8"}), "wrong_type"),
        (decomposed(claim={"boxes": [[100, 200, 1200, 900]]}), "out_of_range"),
        (decomposed(claim={"boxes": [[400, 200, 100, 900]]}), "bad_box"),
        (decomposed(claim={"boxes": [[100, 200, 400]]}), "wrong_type"),
        (decomposed(claim={"boxes": {"x0": 1}}), "wrong_type"),
        (decomposed(claim={"type": "colour"}), "unknown_type"),
        (decomposed(claim={"type": 3}), "wrong_type"),
        (decomposed(claim={"explanation": "  "}), "empty_text"),
        (decomposed(claims=[]), "empty"),
        (decomposed(claims="dog"), "wrong_type"),
        (decomposed(claims=["There is a dog."]), "wrong_type"),
        (decomposed(claims=[CLAIM] * 33), "too_many"),
        (json.dumps({"claims": [CLAIM]}), "missing_field"),
        (json.dumps({"claims": [{k: v for k, v in CLAIM.items() if k != "explanation"}], "overall": 0.5}), "missing_field"),
        (json.dumps({"claims": [CLAIM | {"confidence": 1}], "overall": 0.5}), "unexpected_field"),
        (decomposed()[:-5], "bad_json"),
    ],
)
def test_decomposed_invalid(text, reason):
    with pytest.raises(JudgeError) as err:
        parse_decomposed(text)
    assert err.value.reason == reason


def test_unknown_kind_is_a_programming_error():
    with pytest.raises(ValueError, match="unknown judge kind"):
        parse_judgement("pairwise", "{}")


# ------------------------------------------------------------ generation on images


class RecordingEngine:
    def __init__(self):
        self.prompts = []

    def generate(self, prompts, max_new_tokens):
        self.prompts += list(prompts)
        if any("EXPLODE" in p.user for p in prompts):
            raise RuntimeError("boom")
        return [f"out-{max_new_tokens}" for _ in prompts]


def test_generate_image_batch_shows_the_image_and_isolates_failures():
    loads = []

    def loader(uri, image_hash):
        loads.append(uri)
        if uri == "/bad.png":
            raise OSError("cannot identify image file")
        return f"IMAGE<{uri}>"

    rows = [
        {"key": "k1", "backbone": "b", "kind": "judge_holistic", "image_hash": "h1", "image_uri": "/a.png", "caption": "a dog"},
        {"key": "k2", "backbone": "b", "kind": "judge_decomposed", "image_hash": "h1", "image_uri": "/a.png", "caption": "a dog"},
        {"key": "k3", "backbone": "b", "kind": "judge_holistic", "image_hash": "h2", "image_uri": "/bad.png", "caption": "a cat"},
        {"key": "k4", "backbone": "b", "kind": "judge_holistic", "image_hash": "h3", "image_uri": "/c.png", "caption": "EXPLODE"},
    ]
    templates = {"judge_holistic": "H: {caption}", "judge_decomposed": "D: {caption}"}
    engine = RecordingEngine()
    generations, errors = generate_image_batch(engine, pa.Table.from_pylist(rows), templates, loader, max_new_tokens=7)
    assert generations.column("key").to_pylist() == ["k1", "k2"]
    assert generations.column("text").to_pylist() == ["out-7", "out-7"]
    assert loads.count("/a.png") == 1  # one decode per image per batch
    assert engine.prompts[0].user == "H: a dog" and engine.prompts[0].image == "IMAGE</a.png>" and engine.prompts[0].image_id == "h1"
    reasons = dict(zip(errors.column("key").to_pylist(), errors.column("reason").to_pylist()))
    assert reasons == {"k3": "unreadable_image", "k4": "engine_error"}
    assert set(errors.column("stage").to_pylist()) == {"judge"}


# -------------------------------------------------------------------- the stage


HOLISTIC_OK = '```json\n{"score": 0.75}\n```'


@pytest.fixture()
def judge_setup(tmp_path):
    uris = []
    for i, colour in enumerate([(200, 30, 30), (30, 30, 200)]):
        path = tmp_path / f"img{i}.png"
        Image.fromarray(np.full((32, 48, 3), colour, np.uint8)).save(path)
        uris.append(str(path))
    hashes = [image_hash(open(u, "rb").read()) for u in uris]
    items = pl.DataFrame({
        "item_id": ["d/a", "d/b", "d/c", "d/d"],
        "benchmark": ["d"] * 4,
        "image_uri": [uris[0], uris[1], uris[0], uris[0]],
        "image_hash": [hashes[0], hashes[1], hashes[0], hashes[0]],
        "caption": ["a red square", "a red square", "a broken caption", "a red square"],  # d repeats a's pair
    })
    rules = [
        {"contains": 'Description: "a broken caption"', "text": "I think the image shows a red square. Score: 0.8"},
        {"contains": "one claim at a time", "text": decomposed()},
        {"contains": "how faithfully the image shows", "text": HOLISTIC_OK},
    ]
    backbone = BackboneSpec(name="judge-test", model_id="none", engine="scripted", engine_options={"generations": rules})
    cfg = load_config([f"root={tmp_path}", "sweep=smoke_evidence"])
    return items, backbone, cfg.prompts, tmp_path


def test_judge_stage_scores_valid_outputs_and_keeps_invalid_ones_as_errors(ray_session, judge_setup):
    items, backbone, prompts, root = judge_setup
    compute = ComputeSpec(progress_bars=False, rows_per_part=4)
    kwargs = dict(metric_ids=["judge_holistic", "judge_decomposed"], max_new_tokens=None, out_dir=str(root / "run"))
    scores, report = run_judge(items, ["holistic", "decomposed"], backbone, prompts, str(root / "store"), compute, **kwargs)
    assert report.needed == 6 and report.sent == 6  # 3 distinct (image, caption) pairs x 2 kinds
    by = {(r["item_id"], r["metric"]): r for r in scores.iter_rows(named=True)}
    assert scores.height == 8
    for item in ("d/a", "d/b", "d/d"):
        assert by[(item, "judge_holistic")]["score"] == 0.75 and by[(item, "judge_holistic")]["note"] is None
        assert by[(item, "judge_decomposed")]["score"] == 0.85
    for metric in ("judge_holistic", "judge_decomposed"):
        bad = by[("d/c", metric)]
        assert bad["score"] is None and bad["note"].startswith("invalid_judge_output: bad_json")
    errors = pl.from_arrow(report.errors)
    assert errors.height == 2 and set(errors["reason"]) == {"invalid_judge_output"} and set(errors["item_id"]) == {"d/c"}
    assert all("Score: 0.8" in d for d in errors["detail"])
    table = pl.read_parquet(root / "run" / "judge" / "judge-test.parquet")
    assert table.height == 8
    invalid = table.filter(~pl.col("valid"))
    assert invalid["raw_text"].to_list() == ["I think the image shows a red square. Score: 0.8"] * 2 and invalid["score"].null_count() == 2
    assert json.loads(table.filter(pl.col("valid") & (pl.col("kind") == "decomposed"))["judgement"][0])["overall"] == 0.85

    again, rerun = run_judge(items, ["holistic", "decomposed"], backbone, prompts, str(root / "store"), compute, **kwargs)
    assert rerun.sent == 0 and rerun.cached == 6
    assert again.sort("item_id", "metric").equals(scores.sort("item_id", "metric"))


def test_judge_metrics_are_reported_only_when_requested():
    judged = pl.DataFrame({
        "item_id": ["d/a", "d/a"], "benchmark": ["d", "d"], "backbone": ["b", "b"], "kind": ["holistic", "decomposed"],
        "valid": [True, False], "score": [0.75, None], "reason": [None, "invalid_judge_output: bad_json: x"],
    })
    assert judge_scores(judged, ["vqascore"]).height == 0
    only = judge_scores(judged, ["judge_decomposed"])
    assert only.columns == schema.SCORES.names
    assert only.rows() == [("d/a", "d", "b", "judge_decomposed", None, "invalid_judge_output: bad_json: x")]
    assert judge_scores(judged, ["judge_holistic", "judge_decomposed"]).height == 2
