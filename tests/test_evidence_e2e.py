"""Evidence checks end to end: config, item selection, and the smoke_evidence sweep (tiny VLM,
tiny GroundingDINO) writing claims, boxes, views, deltas and judge rows; a rerun sends nothing."""
from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from PIL import Image

from operators.grounding import DETECTIONS, Detections
from operators.grounding_rules import plan_claim
from operators.metrics import catalog, grounding_only
from operators.views import area, aspect, box_mask, iou
from pipeline.config import (
    ConfigError,
    DetectorSpec,
    EvidenceSpec,
    SelectSpec,
    SweepConfig,
    load_config,
)
from pipeline.stages.evidence import (
    DELTAS,
    GroundingWorker,
    detector_fingerprint,
    grounding_requests,
    plan_views,
    select_items,
    support_table,
    view_deltas,
)
from pipeline.store.parts import PartStore
from pipeline.sweep import run_sweep

FAST = ["compute.progress_bars=false", "bootstrap.n_resamples=50", "judge.max_new_tokens=8"]


# -------------------------------------------------------------------------- config


def test_defaults_are_off_and_follow_the_spec():
    s = SweepConfig()
    assert not s.evidence.enabled and not s.judge.enabled
    d = s.evidence.detector
    assert d.model_id == "IDEA-Research/grounding-dino-base"
    assert (d.box_threshold, d.text_threshold, d.nms_iou, d.max_boxes) == (0.30, 0.25, 0.5, 32)
    assert (s.evidence.area_tolerance, s.evidence.aspect_tolerance, s.evidence.max_control_iou, s.evidence.max_attempts) == (0.15, 0.20, 0.10, 200)
    assert s.evidence.question_set == "claims" and s.judge.kinds == ["holistic", "decomposed"]


def test_metric_ids():
    for metric in ("grounding_only", "grounding_only+vqascore", "judge_holistic", "judge_decomposed"):
        assert catalog.is_known(metric)
    assert not catalog.is_known("judge_holistic+vqascore")


def test_smoke_evidence_preset_loads(tmp_path):
    cfg = load_config(["sweep=smoke_evidence", f"root={tmp_path}"])
    assert cfg.sweep.evidence.enabled and cfg.sweep.judge.enabled
    assert cfg.sweep.evidence.detector.model_id == "builtin:tiny-grounding-dino"
    assert "claims" in cfg.sweep.required_question_sets()
    plain = load_config([f"root={tmp_path}"])  # the default preset is untouched
    assert plain.sweep.required_question_sets() == ["depict", "dsg"] and not plain.sweep.evidence.enabled


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("evidence.fill=paint", "evidence.fill"),
        ("evidence.question_set=captions", "evidence.question_set"),
        ("evidence.detector.box_threshold=2", "evidence.detector.box_threshold"),
        ("evidence.detector.max_boxes=0", "evidence.detector.max_boxes"),
        ("evidence.area_tolerance=1.5", "evidence.area_tolerance"),
        ("evidence.select.mode=random", "evidence.select.mode"),
        ("evidence.select.mode=sample", "evidence.select"),
        ("evidence.select.count=0", None),  # only checked in sample mode: no error
        ("judge.kinds=[pairwise]", "judge.kinds[0]"),
        ("judge.max_new_tokens=0", "judge.max_new_tokens"),
        ("metrics=[depict,judge_bogus]", "metrics[1]"),
        ("metrics=[depict,judge_holistic+vqascore]", "metrics[1]"),
    ],
)
def test_bad_values_name_their_key(tmp_path, override, key):
    args = ["sweep=smoke_evidence", f"root={tmp_path}", override]
    if override.startswith("metrics="):
        args += ["baselines=[]"]
    if key is None:
        load_config(args)
        return
    with pytest.raises(ConfigError) as err:
        load_config(args)
    assert err.value.key == key


def test_sample_and_below_selection_parameters_are_checked(tmp_path):
    base = ["sweep=smoke_evidence", f"root={tmp_path}", "evidence.select.mode=sample"]
    with pytest.raises(ConfigError, match="evidence.select.fraction"):
        load_config([*base, "evidence.select.fraction=1.5"])
    with pytest.raises(ConfigError, match="exactly one of fraction or count"):
        load_config([*base, "evidence.select.fraction=0.5", "evidence.select.count=3"])
    load_config([*base, "evidence.select.count=3"])
    with pytest.raises(ConfigError) as err:
        load_config(["sweep=smoke_evidence", f"root={tmp_path}", "evidence.select.mode=below", "evidence.select.metric=grounding_only"])
    assert err.value.key == "evidence.select.metric"


# ------------------------------------------------------------------------ selection


ITEMS = pl.DataFrame({"item_id": [f"b/{i}" for i in range(200)]})


def test_select_all_and_sample():
    assert select_items(ITEMS, pl.DataFrame(), SelectSpec(), "depict", 0).to_list() == ITEMS["item_id"].to_list()
    half = select_items(ITEMS, pl.DataFrame(), SelectSpec(mode="sample", fraction=0.5), "depict", 0)
    assert 70 < half.len() < 130
    assert half.to_list() == select_items(ITEMS, pl.DataFrame(), SelectSpec(mode="sample", fraction=0.5), "depict", 0).to_list()
    assert half.to_list() != select_items(ITEMS, pl.DataFrame(), SelectSpec(mode="sample", fraction=0.5), "depict", 1).to_list()
    # stable per item: a smaller run keeps exactly the sampled items it contains
    fewer = select_items(ITEMS.head(50), pl.DataFrame(), SelectSpec(mode="sample", fraction=0.5), "depict", 0)
    assert fewer.to_list() == [i for i in half.to_list() if i in set(ITEMS.head(50)["item_id"])]
    ten = select_items(ITEMS, pl.DataFrame(), SelectSpec(mode="sample", count=10), "depict", 0)
    assert ten.len() == 10 and ten.n_unique() == 10
    assert select_items(ITEMS.head(5), pl.DataFrame(), SelectSpec(mode="sample", count=10), "depict", 0).len() == 5


def test_select_below_a_threshold_of_the_target_metric():
    scores = pl.DataFrame({
        "item_id": ["b/0", "b/1", "b/2", "b/3", "b/0"],
        "metric": ["depict", "depict", "depict", "depict", "vqascore"],
        "score": [0.2, 0.7, None, 0.49, 0.9],
    })
    assert select_items(ITEMS.head(4), scores, SelectSpec(mode="below", threshold=0.5), "depict", 0).to_list() == ["b/0", "b/3"]
    assert select_items(ITEMS.head(4), scores, SelectSpec(mode="below", metric="vqascore", threshold=0.95), "depict", 0).to_list() == ["b/0"]


# ------------------------------------------------------------- views and failures


def grounded_row(claim_id, groundable, s, evidence, note=None, item="b/0"):
    return {"item_id": item, "image_hash": "h0", "question_set": "claims", "claim_id": claim_id, "claim": f"claim {claim_id}",
            "groundable": groundable, "s": s, "note": note, "evidence_boxes": evidence, "width": 100, "height": 100}


def test_plan_views_records_why_a_claim_is_ineligible():
    grounded = pl.DataFrame([
        grounded_row("1", True, 0.9, [[10.2, 10.0, 30.0, 30.0]]),
        grounded_row("2", None, None, [], note="detection_failed: unreadable_image: x"),
        grounded_row("3", False, None, [], note="action_claim"),
        grounded_row("4", True, 0.0, []),  # nothing found: no evidence to mask
        grounded_row("5", True, 0.8, [[2.0, 2.0, 98.0, 98.0]]),  # covers the image: no control fits
    ])
    views = plan_views(grounded, EvidenceSpec()).sort("claim_id")
    assert views["eligible"].to_list() == [True, False, False, False, False]
    reasons = views["reason"].to_list()
    assert reasons[1].startswith("detection_failed") and reasons[2] == "ungroundable: action_claim" and reasons[3] == "no_evidence"
    assert reasons[4].startswith("no_control_box") and views["attempts"][4] == 200
    first = views.row(0, named=True)
    assert first["evidence_boxes"] == [[10, 10, 30, 30]]  # rounded outwards to whole pixels
    (control,) = first["control_boxes"]
    # a control avoids every evidence box of the item (claim 5's big box too: a small control
    # inside it overlaps it by less than 0.10 IoU)
    assert iou(tuple(control), (10, 10, 30, 30)) < 0.10 and iou(tuple(control), (2, 2, 98, 98)) < 0.10
    assert all(first[f"key_{v}"] for v in ("minus_evidence", "minus_control", "only_evidence", "only_control"))
    assert all(views[f"key_{v}"][1:].null_count() == 4 for v in ("minus_evidence", "only_control"))


def test_an_empty_selection_flows_through_every_step():
    from pipeline.stages.evidence import GROUNDING_TABLE, render_requests

    views = plan_views(pl.from_arrow(GROUNDING_TABLE.empty_table()), EvidenceSpec())
    assert views.height == 0 and "key_only_control" in views.columns
    claims = pl.DataFrame(schema={"item_id": pl.String, "question_set": pl.String, "claim_id": pl.String, "image_uri": pl.String, "claim_type": pl.String})
    assert render_requests(views, claims, EvidenceSpec()).num_rows == 0
    long = pl.DataFrame(schema={"item_id": pl.String, "question_set": pl.String, "claim_id": pl.String, "view": pl.String, "key": pl.String})
    answers = pl.DataFrame(schema={"key": pl.String, "logp_yes": pl.Float64, "logp_no": pl.Float64})
    assert view_deltas(views, claims, long, answers).columns[-1] == "note"


def test_deltas_are_null_with_a_note_when_a_view_answer_is_missing():
    views = pl.DataFrame({"item_id": ["b/0", "b/0"], "question_set": ["claims"] * 2, "claim_id": ["1", "2"], "claim": ["a", "b"],
                          "eligible": [True, False], "reason": [None, "no_evidence"]})
    claims = views.select("item_id", "question_set", "claim_id", claim_type=pl.lit("object"))
    long = pl.DataFrame({"item_id": ["b/0"] * 5, "question_set": ["claims"] * 5, "claim_id": ["1"] * 5,
                         "view": ["full", "minus_evidence", "minus_control", "only_evidence", "only_control"],
                         "key": ["k0", "k1", "k2", "k3", None]})
    answers = pl.DataFrame({"key": ["k0", "k1", "k2", "k3"], "logp_yes": [-0.1, -1.0, -0.2, -0.5], "logp_no": [-2.0, -0.5, -1.9, -1.0]})
    deltas = view_deltas(views, claims, long, answers).sort("claim_id")
    first = deltas.row(0, named=True)
    assert first["d_sel"] == pytest.approx(1.9 - (-0.5)) and first["d_rnd"] == pytest.approx(1.9 - 1.7)
    assert first["d_anchor"] == pytest.approx(1.9 - 0.5) and first["d_suff"] is None and first["note"] == "missing_view_answer"
    assert deltas.row(1, named=True)["note"] == "no_evidence" and deltas.row(1, named=True)["s_full"] is None


def test_a_shipped_detectors_boxes_are_keyed_by_its_weights(monkeypatch):
    """New weights in the package never reuse the boxes the old ones found."""
    from operators import tiny_models
    from pipeline.config import DetectorSpec

    spec = DetectorSpec(name="micro-grounding-dino", model_id="builtin:micro-grounding-dino")
    before = detector_fingerprint(spec)
    assert tiny_models.builtin_revision(spec.model_id).startswith("weights-")
    monkeypatch.setattr(tiny_models, "builtin_revision", lambda model_id: "weights-retrained")
    assert detector_fingerprint(spec) != before


def test_a_failed_detection_is_no_evidence_not_a_false_claim(tmp_path, tiny_gdino_dir):
    """The grounding actor's work, called in-process on a batch with an unreadable image."""
    good = tmp_path / "good.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (80, 120, 3), dtype=np.uint8)).save(good)
    bad = tmp_path / "bad.png"
    bad.write_bytes(b"not a png")
    claims = pl.DataFrame({
        "item_id": ["b/0", "b/0", "b/1"], "image_hash": ["g", "g", "x"], "image_uri": [str(good), str(good), str(bad)],
        "question_set": ["claims"] * 3, "claim_id": ["1", "2", "1"],
        "claim": ["There is a dog.", "The dog is running.", "There is a dog."], "claim_type": ["object", "action", "object"],
    })
    detector = DetectorSpec(name="tiny", model_id=tiny_gdino_dir, image_size={"shortest_edge": 96, "longest_edge": 128})
    plans = [plan_claim(r["claim"], r["claim_type"]) for r in claims.iter_rows(named=True)]
    requests = grounding_requests(claims, plans, detector)
    assert requests.num_rows == 2  # (good, dog) and (bad, dog); the action claim asks nothing
    store = str(tmp_path / "store")
    status = pl.from_arrow(GroundingWorker(detector, store)(requests))
    assert status.filter(~pl.col("ok"))["reason"].to_list() == ["unreadable_image"]
    stored = PartStore(store, DETECTIONS).read()
    assert stored.num_rows == 1  # a failure is never stored, so a rerun retries it
    detections = {r["key"]: Detections.from_row(r) for r in stored.to_pylist()}
    failed = {r["key"]: f"{r['reason']}: {r['detail']}" for r in status.filter(~pl.col("ok")).iter_rows(named=True)}
    grounded = support_table(claims, plans, detections, failed, detector_fingerprint(detector))
    rows = {(r["item_id"], r["claim_id"]): r for r in grounded.iter_rows(named=True)}
    assert rows[("b/0", "1")]["groundable"] is True and 0 <= rows[("b/0", "1")]["s"] <= 1
    assert rows[("b/0", "2")]["groundable"] is False and rows[("b/0", "2")]["note"] == "action_claim"
    failed_row = rows[("b/1", "1")]
    assert failed_row["groundable"] is None and failed_row["s"] is None and failed_row["note"].startswith("detection_failed: unreadable_image")
    scores = grounding_only(grounded.select("item_id", "claim_id", "groundable", "s"), ["b/0", "b/1"]).sort("item_id")
    assert scores["score"][0] == pytest.approx(0.5 * max(rows[("b/0", "1")]["s"], 1e-6))
    assert scores["score"][1] is None and scores["note"][1].startswith("invalid_grounding")


# -------------------------------------------------------------------------- the sweep


@pytest.fixture(scope="module")
def evidence_run(ray_session, tmp_path_factory, tiny_vlm_dir):
    root = tmp_path_factory.mktemp("evidence")
    cfg = load_config(["sweep=smoke_evidence", f"root={root}", *FAST, "evidence.select.mode=sample", "evidence.select.count=5"])
    return cfg, run_sweep(cfg)


def read(result, name):
    return pl.read_parquet(f"{result.run_dir}/{name}")


@pytest.mark.slow
def test_claims_and_boxes(evidence_run):
    cfg, result = evidence_run
    questions = read(result, "questions.parquet").filter(pl.col("question_set") == "claims")
    assert questions.height > 0 and questions["claim_type"].null_count() == 0
    grounding = read(result, "evidence/smoke/grounding.parquet")
    items = read(result, "items.parquet")
    claims = items.join(questions, on="caption").filter(pl.col("question_set") == "claims")
    assert grounding.filter(pl.col("question_set") == "claims").height == claims.height  # every claim of every item
    groundable = grounding.filter(pl.col("groundable"))
    assert groundable.height > 0 and groundable["s"].is_between(0, 1).all()
    for row in groundable.iter_rows(named=True):
        for boxes, scores in zip(row["phrase_boxes"], row["phrase_box_scores"]):
            assert len(boxes) == len(scores) <= 32 and all(s > 0.30 for s in scores)
            assert all(0 <= b[0] <= b[2] <= row["width"] and 0 <= b[1] <= b[3] <= row["height"] for b in boxes)
    assert list(Path(cfg.sweep.store, "grounding", "tiny-grounding-dino").glob("part-*.parquet"))
    scores = read(result, "scores/smoke.parquet")
    assert set(cfg.sweep.metrics) == set(scores["metric"])
    assert scores.filter(pl.col("metric").is_in(["grounding_only", "grounding_only+vqascore", "claim_mean_am"]))["score"].null_count() == 0


@pytest.mark.slow
def test_views_respect_the_control_rules_and_mask_only_the_boxes(evidence_run):
    cfg, result = evidence_run
    views = read(result, "evidence/smoke/views.parquet")
    assert views["item_id"].n_unique() == 5  # the sampled items only
    eligible = views.filter(pl.col("eligible"))
    assert eligible.height > 0
    items = read(result, "items.parquet")
    uri = dict(items.select("image_hash", "image_uri").iter_rows())
    for row in eligible.iter_rows(named=True):
        same_item = [tuple(b) for r in views.filter(pl.col("item_id") == row["item_id"]).iter_rows(named=True) for b in r["evidence_boxes"]]
        for ev, control in zip(row["evidence_boxes"], row["control_boxes"]):
            assert abs(area(tuple(control)) / area(tuple(ev)) - 1) <= 0.15
            assert abs(aspect(tuple(control)) / aspect(tuple(ev)) - 1) <= 0.20
            assert all(iou(tuple(control), other) < 0.10 for other in same_item)
        source = np.asarray(Image.open(uri[row["image_hash"]]).convert("RGB"))
        path = Path(cfg.sweep.store, "images", row["hash_minus_evidence"][:2], row["hash_minus_evidence"] + ".png")
        masked = np.asarray(Image.open(io.BytesIO(path.read_bytes())).convert("RGB"))
        outside = ~box_mask([tuple(b) for b in row["evidence_boxes"]], *source.shape[:2])
        np.testing.assert_array_equal(masked[outside], source[outside])
        for view in ("minus_control", "only_evidence", "only_control"):
            h = row[f"hash_{view}"]
            assert Path(cfg.sweep.store, "images", h[:2], h + ".png").exists()


@pytest.mark.slow
def test_deltas_follow_the_formulas(evidence_run):
    _, result = evidence_run
    deltas = read(result, "evidence/smoke/deltas.parquet").filter(pl.col("eligible"))
    assert deltas.height > 0 and deltas["note"].null_count() == deltas.height
    for name, (a, b) in DELTAS.items():
        np.testing.assert_allclose(deltas[name].to_numpy(), (deltas[f"s_{a}"] - deltas[f"s_{b}"]).to_numpy())
    records = read(result, "records/smoke.parquet").filter(pl.col("question_set") == "claims")
    full = deltas.join(records, left_on=["item_id", "claim_id"], right_on=["item_id", "question_id"])
    assert full.height == deltas.height  # s(I) is the claim's ordinary answer, not a new request
    np.testing.assert_allclose(full["s_full"].to_numpy(), (full["logp_yes_v"] - full["logp_no_v"]).to_numpy())


@pytest.mark.slow
def test_the_summary_prints_the_deltas_the_run_wrote(evidence_run):
    from pipeline.reports.evidence import delta_summary
    from pipeline.sweep import summary_text

    cfg, result = evidence_run
    text = summary_text(cfg, result)
    block = text[text.index("evidence deltas"):]
    summary = delta_summary(read(result, "evidence/smoke/deltas.parquet"), cfg.sweep.bootstrap.n_resamples, cfg.sweep.bootstrap.seed)
    row = next(line for line in block.splitlines() if line.startswith("smoke "))
    assert row.split()[1] == str(summary["claims"]) and f"{summary['d_sel'][0]:.2f}" in row


@pytest.mark.slow
def test_random_weight_judge_gives_error_rows_never_scores(evidence_run):
    _, result = evidence_run
    judge = read(result, "judge/smoke.parquet")
    items = read(result, "items.parquet")
    assert judge.height == 2 * items.height and judge["valid"].sum() == 0 and judge["raw_text"].null_count() == 0
    scores = read(result, "scores/smoke.parquet").filter(pl.col("metric").str.starts_with("judge_"))
    assert scores["score"].null_count() == scores.height
    assert scores["note"].str.starts_with("invalid_judge_output").all()
    errors = result.errors.filter(pl.col("reason") == "invalid_judge_output")
    assert errors.height == judge["key"].n_unique()


@pytest.mark.slow
def test_rerun_sends_nothing(evidence_run):
    cfg, first = evidence_run
    stages = {"answers", "grounding", "views", "judge"}
    assert {r.stage for r in first.reports} >= stages
    names = ("scores/smoke.parquet", "evidence/smoke/grounding.parquet", "evidence/smoke/views.parquet", "evidence/smoke/deltas.parquet", "judge/smoke.parquet")
    before = {name: read(first, name) for name in names}  # the rerun writes over the same run folder
    again = run_sweep(cfg)
    for report in again.reports:
        if report.stage in stages:
            assert report.sent == 0 and report.cached == report.needed, report
    for name in names:
        assert read(again, name).equals(before[name]), name
