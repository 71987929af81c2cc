"""Evidence checks for one backbone: ground claims, draw control boxes, render masked views,
answer the claims on every view and compute the deltas (docs/method.md, "Evidence checks"); plus the
grounding-only metric.

    claims (questions table) --plan_claim--> (image, phrase) queries --GroundingDINO-->
    boxes --rules--> s per claim (grounding_only) and evidence boxes E per claim
    E --controls--> R --masking--> 4 view images --answers stage--> s(V) --> deltas

Model work goes through the actor-pool stage runner (engine_stage.run_and_read), so
every unit is cached under a content key and a rerun computes nothing:
- detections: <store>/grounding/<detector>/, key = (detector fingerprint with thresholds,
  image hash, phrase);
- view images: <store>/views/ (recipe key -> PNG hash) and the PNGs themselves in
  <store>/images/<hh>/<hash>.png;
- view answers: the backbone's ordinary answer store, keyed by the view's image hash, so
  the full-image view reuses the claim's existing answer.

A detection that fails (unreadable image, detector error) is "no evidence found": its
claims get a null s (the metric reports invalid_grounding, never a 0) and no views.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np
import polars as pl
import pyarrow as pa

from operators import metrics, schema
from operators.engines.spec import BackboneSpec
from operators.grounding import DETECTIONS, Detections, normalise_phrase
from operators.grounding_rules import ClaimPlan, claim_support, plan_claim
from operators.hashing import content_key
from operators.metrics import catalog
from operators.requests import IMAGE_KIND
from operators.views import MASKED_VIEWS, VIEW_IMAGES, VIEWS, ControlRules, control_rng, draw_controls, pixel_box, view_key
from pipeline.config import DetectorSpec, EvidenceSpec, ResolvedConfig, SelectSpec
from pipeline.stages.answers import AnswerPlan, key_spec, run_answers
from pipeline.stages.engine_stage import PartSink, StageReport, run_and_read, status_table
from pipeline.stages.placement import ActorPool
from pipeline.stages.scores import metric_inputs
from pipeline.store.fs import write_table
from pipeline.store.parts import PartStore

log = logging.getLogger(__name__)

_BOXES = pa.list_(pa.list_(pa.float64()))
_INT_BOXES = pa.list_(pa.list_(pa.int32()))
# evidence/<backbone>/grounding.parquet: one row per grounded claim
GROUNDING_TABLE = pa.schema(
    [
        ("item_id", pa.string()),
        ("image_hash", pa.string()),
        ("question_set", pa.string()),
        ("claim_id", pa.string()),
        ("claim", pa.string()),
        ("claim_type", pa.string()),
        ("rule", pa.string()),
        ("phrases", pa.list_(pa.string())),
        ("relation", pa.string()),
        ("count", pa.int32()),
        ("groundable", pa.bool_()),  # null: the detection failed
        ("s", pa.float64()),
        ("note", pa.string()),
        ("evidence_boxes", _BOXES),  # pixels, xyxy
        ("width", pa.int32()),
        ("height", pa.int32()),
        ("phrase_boxes", pa.list_(_BOXES)),  # per phrase: every kept box, best first
        ("phrase_box_scores", pa.list_(pa.list_(pa.float64()))),
        ("phrase_text_scores", pa.list_(pa.list_(pa.float64()))),
    ]
)
# evidence/<backbone>/views.parquet: one row per claim selected for views
VIEWS_TABLE = pa.schema(
    [
        ("item_id", pa.string()),
        ("image_hash", pa.string()),
        ("question_set", pa.string()),
        ("claim_id", pa.string()),
        ("claim", pa.string()),
        ("eligible", pa.bool_()),
        ("reason", pa.string()),
        ("attempts", pa.int32()),
        ("evidence_boxes", _INT_BOXES),
        ("control_boxes", _INT_BOXES),
        ("fill", pa.string()),
        *[(f"hash_{v}", pa.string()) for v in VIEWS],
    ]
)
# evidence/<backbone>/deltas.parquet: s(V) = logp_yes - logp_no per view, and the deltas
DELTAS_TABLE = pa.schema(
    [
        ("item_id", pa.string()),
        ("question_set", pa.string()),
        ("claim_id", pa.string()),
        ("claim", pa.string()),
        ("claim_type", pa.string()),
        ("eligible", pa.bool_()),
        *[(f"s_{v}", pa.float64()) for v in VIEWS],
        ("d_sel", pa.float64()),
        ("d_rnd", pa.float64()),
        ("d_suff", pa.float64()),
        ("d_anchor", pa.float64()),
        ("note", pa.string()),
    ]
)
DELTAS = {  # delta -> (minuend view, subtrahend view)
    "d_sel": ("full", "minus_evidence"),
    "d_rnd": ("full", "minus_control"),
    "d_suff": ("only_evidence", "only_control"),
    "d_anchor": ("full", "only_evidence"),
}
_CLAIM = ["item_id", "question_set", "claim_id"]


@dataclass
class EvidenceResult:
    scores: pl.DataFrame  # operators.schema.SCORES rows of the grounding metrics
    reports: list[StageReport] = field(default_factory=list)
    errors: list[pa.Table] = field(default_factory=list)


# ----------------------------------------------------------------------- selection


def select_items(items: pl.DataFrame, scores: pl.DataFrame, spec: SelectSpec, target: str, seed: int) -> pl.Series:
    """Ids of the items that get views: all, a seeded sample, or those scoring below a threshold.

    A sample draws one stable number per item from (seed, item id), so adding items to a run
    never changes whether an existing item is in the sample. `below` skips null scores.
    """
    ids = items["item_id"]
    if spec.mode == "all":
        return ids
    if spec.mode == "sample":
        draw = pl.Series([int(content_key("evidence-sample", seed, i)[:13], 16) / 16**13 for i in ids], dtype=pl.Float64)
        if spec.fraction is not None:
            return ids.filter(draw < spec.fraction)
        return ids.filter(draw.rank("ordinal") <= spec.count)
    if spec.mode == "below":
        metric = spec.metric or target
        low = scores.filter((pl.col("metric") == metric) & (pl.col("score") < spec.threshold))
        return ids.filter(ids.is_in(low["item_id"].implode()))
    raise ValueError(f"unknown selection mode {spec.mode!r}")


# ------------------------------------------------------------------------ grounding


def detector_fingerprint(d: DetectorSpec) -> str:
    """Everything that can change a query's boxes (thresholds included); a `builtin:` detector's
    revision is its files' hash (or recipe version), so new shipped weights never reuse old boxes."""
    from operators.tiny_models import builtin_revision

    revision = builtin_revision(d.model_id) if d.model_id.startswith("builtin:") else d.revision
    return content_key(d.model_id, revision, d.dtype, repr(sorted((d.image_size or {}).items())), d.box_threshold, d.text_threshold, d.nms_iou, d.max_boxes)


def detection_key(fingerprint: str, image_hash: str, phrase: str) -> str:
    return content_key(fingerprint, "grounding", image_hash, normalise_phrase(phrase))


def claim_rows(plan: AnswerPlan, sets_and_items: list[tuple[str, pl.Series]]) -> pl.DataFrame:
    """The claims to ground: for each (question set, item ids), that set's questions of those items."""
    q = plan.questions
    empty = pl.DataFrame(schema={"item_id": pl.String, "image_hash": pl.String, "image_uri": pl.String, "question_set": pl.String, "claim_id": pl.String, "claim": pl.String, "claim_type": pl.String})
    if q is None or q.height == 0:
        return empty
    frames = [
        q.filter((pl.col("question_set") == qset) & pl.col("item_id").is_in(ids.implode()) & pl.col("image_hash").is_not_null())
        for qset, ids in sets_and_items
    ]
    if not frames:
        return empty
    claims = pl.concat(frames).unique(subset=["item_id", "question_set", "question_id"], keep="first", maintain_order=True)
    return claims.select("item_id", "image_hash", "image_uri", "question_set", pl.col("question_id").alias("claim_id"), pl.col("question").alias("claim"), "claim_type")


def grounding_requests(claims: pl.DataFrame, plans: list[ClaimPlan], detector: DetectorSpec) -> pa.Table:
    fingerprint = detector_fingerprint(detector)
    rows, seen = [], set()
    for r, p in zip(claims.iter_rows(named=True), plans):
        for phrase in p.phrases:
            key = detection_key(fingerprint, r["image_hash"], phrase)
            if key not in seen:
                seen.add(key)
                rows.append({"key": key, "image_hash": r["image_hash"], "image_uri": r["image_uri"], "phrase": phrase})
    table = pa.Table.from_pylist(rows, schema=pa.schema([("key", pa.string()), ("image_hash", pa.string()), ("image_uri", pa.string()), ("phrase", pa.string())]))
    return table.sort_by([("image_hash", "ascending"), ("phrase", "ascending")])


def _ray_has_gpus() -> bool:
    import ray

    return ray.cluster_resources().get("GPU", 0) > 0


def run_grounding(requests: pa.Table, detector: DetectorSpec, store_url: str, compute) -> tuple[dict[str, Detections], StageReport]:
    """Detections for every query (missing ones computed); returns {key: Detections}."""
    store = PartStore(f"{store_url}/grounding/{detector.name}", DETECTIONS)
    gpus = detector.gpus if detector.gpus is not None else (1.0 if requests.num_rows and _ray_has_gpus() else 0.0)
    stored, report = run_and_read(
        stage="grounding",
        unit=detector.name,
        requests=requests,
        store=store,
        worker_cls=GroundingWorker,
        worker_kwargs={"detector": detector, "store_url": store.url},
        pool=ActorPool(size=detector.replicas, num_gpus=gpus, num_cpus=compute.cpus_per_engine, rows_per_batch=compute.rows_per_batch, rows_per_part=compute.rows_per_part,
                       threads=compute.threads_per_engine),
    )
    return {r["key"]: Detections.from_row(r) for r in pl.from_arrow(stored).iter_rows(named=True)}, report


class GroundingWorker:
    """Ray actor: one detector per replica; grounds a batch of (image, phrase) queries and
    stores the boxes before returning the batch's status."""

    def __init__(self, detector: DetectorSpec, store_url: str):
        from operators.grounding import GroundingDetector, Thresholds
        from operators.images import load_image

        self.spec = detector
        self.store = PartStore(store_url, DETECTIONS)
        self.parts = PartSink(self.store)  # background part writes; the rows go back with the statuses
        self.detector = GroundingDetector(
            detector.model_id,
            revision=detector.revision,
            thresholds=Thresholds(detector.box_threshold, detector.text_threshold, detector.nms_iou, detector.max_boxes),
            batch_size=detector.batch_size,
            image_size=detector.image_size,
            dtype=detector.dtype,
        )
        self.load_image = load_image  # checks the bytes against the request's image hash

    def __call__(self, batch: pa.Table) -> pa.Table:
        rows = batch.to_pylist()
        images, errors, todo = {}, [], []
        for row in rows:
            h = row["image_hash"]
            if h not in images:
                try:
                    images[h] = self.load_image(row["image_uri"], h)
                except Exception as exc:  # an unreadable image fails its queries, not the batch
                    images[h] = exc
            if isinstance(images[h], Exception):
                errors.append({"stage": "grounding", "key": row["key"], "source": row["image_uri"], "field": "image_uri", "reason": "unreadable_image", "detail": str(images[h])})
            else:
                todo.append(row)
        found = self._detect(todo, images, errors)
        stored = [d.row(key=r["key"], detector=self.spec.name, image_hash=r["image_hash"], phrase=r["phrase"]) for r, d in found]
        self.parts.write(pa.Table.from_pylist(stored, schema=DETECTIONS) if stored else DETECTIONS.empty_table())
        error_table = schema.error_table(errors)
        return status_table(batch.column("key"), error_table)

    def _detect(self, rows: list[dict], images: dict, errors: list[dict]) -> list[tuple[dict, Detections]]:
        """The whole batch at once; if that fails, one query at a time so only bad ones fail."""
        if not rows:
            return []
        try:
            return list(zip(rows, self.detector.detect([images[r["image_hash"]] for r in rows], [r["phrase"] for r in rows]), strict=True))
        except Exception as exc:
            if len(rows) == 1:
                errors.append({"stage": "grounding", "key": rows[0]["key"], "source": self.spec.name, "field": "phrase", "reason": "detector_error", "detail": f"{type(exc).__name__}: {exc}"[:2000]})
                return []
        return [found for row in rows for found in self._detect([row], images, errors)]


def ground_claims(claims: pl.DataFrame, detector: DetectorSpec, store_url: str, compute) -> tuple[pl.DataFrame, StageReport]:
    """Plan, detect and score every claim: GROUNDING_TABLE rows."""
    plans = [plan_claim(r["claim"], r["claim_type"]) for r in claims.iter_rows(named=True)]
    requests = grounding_requests(claims, plans, detector)
    detections, report = run_grounding(requests, detector, store_url, compute)
    failed = {r["key"]: f"{r['reason']}: {r['detail']}" for r in report.errors.to_pylist()}
    return support_table(claims, plans, detections, failed, detector_fingerprint(detector)), report


def support_table(claims: pl.DataFrame, plans: list[ClaimPlan], detections: dict[str, Detections], failed: dict[str, str], fingerprint: str) -> pl.DataFrame:
    """Apply each claim's rule to its phrases' detections. A phrase without detections (the
    query failed) leaves the claim's groundable and s null: no evidence, not a false claim."""
    rows = []
    for r, p in zip(claims.iter_rows(named=True), plans):
        keys = [detection_key(fingerprint, r["image_hash"], phrase) for phrase in p.phrases]
        found = [detections.get(k) for k in keys]
        row = {k: r[k] for k in ("item_id", "image_hash", "question_set", "claim_id", "claim", "claim_type")} | {
            "rule": p.rule, "phrases": list(p.phrases), "relation": p.relation, "count": p.count,
        }
        if any(d is None for d in found):
            reason = next((failed[k] for k, d in zip(keys, found) if d is None and k in failed), "detection_missing")
            rows.append(row | {"groundable": None, "s": None, "note": f"detection_failed: {reason}"[:500], "evidence_boxes": []})
            continue
        support = claim_support(p, dict(zip(p.phrases, found)))
        rows.append(
            row
            | {
                "groundable": support.groundable, "s": support.s, "note": support.note, "evidence_boxes": support.evidence.tolist(),
                "width": found[0].width if found else None, "height": found[0].height if found else None,
                "phrase_boxes": [d.boxes.tolist() for d in found],
                "phrase_box_scores": [d.box_scores.tolist() for d in found],
                "phrase_text_scores": [d.text_scores.tolist() for d in found],
            }
        )
    table = pa.Table.from_pylist(rows, schema=GROUNDING_TABLE) if rows else GROUNDING_TABLE.empty_table()
    return pl.from_arrow(table)


# ---------------------------------------------------------------------------- views


def control_rules(e: EvidenceSpec) -> ControlRules:
    return ControlRules(e.area_tolerance, e.aspect_tolerance, e.max_control_iou, e.max_attempts)


def _pixel_boxes(boxes, width: int, height: int) -> list[tuple[int, int, int, int]]:
    return list(dict.fromkeys(pixel_box(b, width, height) for b in boxes or []))


def plan_views(grounded: pl.DataFrame, e: EvidenceSpec) -> pl.DataFrame:
    """Per claim: eligibility, evidence and control boxes, and the recipe key of each masked view.

    The evidence boxes E' a control must avoid are those of every claim of the same item
    (same image, same caption), so a control never lands on another claim's evidence.
    """
    rules = control_rules(e)
    rows = []
    for (_item,), claims in grounded.group_by("item_id", maintain_order=True):
        claims = claims.to_dicts()
        image_evidence = [b for c in claims if c["width"] for b in _pixel_boxes(c["evidence_boxes"], c["width"], c["height"])]
        for c in claims:
            row = {k: c[k] for k in ("item_id", "image_hash", "question_set", "claim_id", "claim")} | {"fill": e.fill, "attempts": 0, "evidence_boxes": [], "control_boxes": []}
            if c["groundable"] is None:
                rows.append(row | {"eligible": False, "reason": c["note"]})
                continue
            if not c["groundable"]:
                rows.append(row | {"eligible": False, "reason": f"ungroundable: {c['note']}"})
                continue
            evidence = _pixel_boxes(c["evidence_boxes"], c["width"], c["height"]) if c["width"] else []
            draw = draw_controls(evidence, image_evidence, c["width"], c["height"], control_rng(c["image_hash"], c["claim"], e.seed), rules)
            row |= {"eligible": draw.eligible, "reason": draw.reason, "attempts": draw.attempts, "evidence_boxes": [list(b) for b in evidence], "control_boxes": [list(b) for b in draw.boxes or ()]}
            if draw.eligible:
                for view in MASKED_VIEWS:
                    boxes = evidence if view.endswith("evidence") else list(draw.boxes)
                    row[f"key_{view}"] = view_key(c["image_hash"], view, boxes, e.fill, e.blur_sigma)
            rows.append(row)
    key_columns = {f"key_{view}": pl.String for view in MASKED_VIEWS}
    if not rows:
        empty = pl.from_arrow(VIEWS_TABLE.empty_table()).select(pl.exclude("^hash_.*$"))
        return empty.with_columns([pl.lit(None, dtype).alias(name) for name, dtype in key_columns.items()])
    frame = pl.DataFrame(rows, schema_overrides={"evidence_boxes": pl.List(pl.List(pl.Int32)), "control_boxes": pl.List(pl.List(pl.Int32))}, infer_schema_length=None)
    return frame.with_columns([pl.lit(None, dtype).alias(name) for name, dtype in key_columns.items() if name not in frame.columns])


def render_requests(views: pl.DataFrame, claims: pl.DataFrame, e: EvidenceSpec) -> pa.Table:
    """One row per distinct view image to render."""
    uris = claims.select("item_id", "image_uri").unique(subset="item_id")
    frame = views.filter(pl.col("eligible")).join(uris, on="item_id", how="left")
    parts = [
        frame.select(
            key=pl.col(f"key_{view}"), source_hash="image_hash", image_uri="image_uri", view=pl.lit(view),
            boxes=pl.col("evidence_boxes" if view.endswith("evidence") else "control_boxes"),
        )
        for view in MASKED_VIEWS
    ]
    out = pl.concat(parts).unique(subset="key", keep="first", maintain_order=True) if parts and frame.height else pl.DataFrame(schema={"key": pl.String, "source_hash": pl.String, "image_uri": pl.String, "view": pl.String, "boxes": pl.List(pl.List(pl.Int32))})
    out = out.with_columns(fill=pl.lit(e.fill), sigma=pl.lit(e.blur_sigma, pl.Float64)).sort("source_hash", "view", "key")
    return out.to_arrow()


class ViewWorker:
    """Ray actor: renders masked views, writes each PNG once under <store>/images/, and stores
    recipe key -> image hash before returning the batch's status."""

    def __init__(self, store_url: str, views_url: str):
        from operators.images import load_image
        from pipeline.store.folder import Folder

        self.images = Folder(f"{store_url}/images")
        self.store = PartStore(views_url, VIEW_IMAGES)
        self.parts = PartSink(self.store)  # background part writes; the rows go back with the statuses
        self.load_image = load_image  # checks the bytes against the request's image hash

    def __call__(self, batch: pa.Table) -> pa.Table:
        from operators.views import png_bytes, render_view
        from pipeline.store.folder import content_address

        sources, blur_caches, out, errors = {}, {}, [], []
        for row in batch.to_pylist():
            h = row["source_hash"]
            try:
                if h not in sources:
                    sources[h] = np.asarray(self.load_image(row["image_uri"], h))
                cache = blur_caches.setdefault((h, row["sigma"]), {})  # blur each source once per batch
                pixels = render_view(sources[h], row["view"], [tuple(b) for b in row["boxes"]], row["fill"], row["sigma"], cache)
                data = png_bytes(pixels)
                path, digest = content_address(self.images, data)  # <store>/images/<hh>/<hash>.png
                self.images.write_content(path, data)  # once; a copy damaged since is written again
                out.append({"key": row["key"], "source_hash": h, "view": row["view"], "image_hash": digest, "image_uri": self.images.uri(path), "width": pixels.shape[1], "height": pixels.shape[0]})
            except Exception as exc:  # one bad source image fails its views only
                errors.append({"stage": "views", "key": row["key"], "source": row["image_uri"], "field": "image_uri", "reason": "view_failed", "detail": f"{type(exc).__name__}: {exc}"[:2000]})
        self.parts.write(pa.Table.from_pylist(out, schema=VIEW_IMAGES) if out else VIEW_IMAGES.empty_table())
        error_table = schema.error_table(errors)
        return status_table(batch.column("key"), error_table)


def run_views(requests: pa.Table, store_url: str, compute, workers: int, unit: str) -> tuple[pl.DataFrame, StageReport]:
    """Render the missing view images; returns key, image_hash, image_uri of every requested view."""
    store = PartStore(f"{store_url}/views", VIEW_IMAGES)
    rendered, report = run_and_read(
        columns=["key", "image_hash", "image_uri"],
        stage="views",
        unit=unit,
        requests=requests,
        store=store,
        worker_cls=ViewWorker,
        worker_kwargs={"store_url": store_url, "views_url": store.url},
        pool=ActorPool(size=workers, num_gpus=0.0, num_cpus=1.0, rows_per_batch=compute.rows_per_batch, rows_per_part=compute.rows_per_part),
    )
    return pl.from_arrow(rendered), report


def view_answer_plan(views: pl.DataFrame, claims: pl.DataFrame, rendered: pl.DataFrame, backbone: BackboneSpec, prompts) -> tuple[pl.DataFrame, pa.Table]:
    """(item, claim, view) -> answer key, and the distinct requests: the claim asked on each view.

    The full view is the original image, so its key is the claim's ordinary answer key.
    """
    spec = key_spec(backbone, prompts)
    source = claims.select(*_CLAIM, "image_uri")
    eligible = views.filter(pl.col("eligible")).join(source, on=_CLAIM, how="left")
    lookup = {r["key"]: (r["image_hash"], r["image_uri"]) for r in rendered.iter_rows(named=True)}
    rows = []
    for r in eligible.iter_rows(named=True):
        kind = IMAGE_KIND[r["question_set"]]
        for view in VIEWS:
            image = (r["image_hash"], r["image_uri"]) if view == "full" else lookup.get(r[f"key_{view}"])
            key = spec.key(kind, image[0], None, r["claim"]) if image else None
            rows.append({**{k: r[k] for k in _CLAIM}, "view": view, "key": key, "kind": kind, "image_hash": image and image[0], "image_uri": image and image[1], "text": r["claim"]})
    long = pl.DataFrame(rows, schema={**{k: pl.String for k in _CLAIM}, "view": pl.String, "key": pl.String, "kind": pl.String, "image_hash": pl.String, "image_uri": pl.String, "text": pl.String})
    requests = (
        long.filter(pl.col("key").is_not_null())
        .unique(subset="key", keep="first", maintain_order=True)
        .with_columns(backbone=pl.lit(backbone.name), prompt_id=pl.col("kind").replace_strict(spec.prompt_ids, default=None), caption=pl.lit(None, pl.String))
        .sort("image_hash", "kind", "text")
    )
    return long, schema.conform(requests.to_arrow(), schema.REQUESTS, what="view requests")


def view_deltas(views: pl.DataFrame, claims: pl.DataFrame, long: pl.DataFrame, answers: pl.DataFrame) -> pl.DataFrame:
    """DELTAS_TABLE: s(V) = logp_yes - logp_no on each view and the four deltas per claim."""
    scored = long.join(answers, on="key", how="left").with_columns(s=pl.col("logp_yes") - pl.col("logp_no"))
    wide = scored.pivot(on="view", index=_CLAIM, values="s") if scored.height else pl.DataFrame(schema={k: pl.String for k in _CLAIM})
    for view in VIEWS:
        if view not in wide.columns:
            wide = wide.with_columns(pl.lit(None, pl.Float64).alias(view))
    wide = wide.rename({v: f"s_{v}" for v in VIEWS})
    out = views.select(*_CLAIM, "claim", "eligible", "reason").join(claims.select(*_CLAIM, "claim_type"), on=_CLAIM, how="left").join(wide, on=_CLAIM, how="left")
    out = out.with_columns([(pl.col(f"s_{a}") - pl.col(f"s_{b}")).alias(name) for name, (a, b) in DELTAS.items()])
    complete = pl.all_horizontal([pl.col(f"s_{v}").is_not_null() for v in VIEWS])
    note = pl.when(~pl.col("eligible")).then(pl.col("reason")).when(~complete).then(pl.lit("missing_view_answer")).otherwise(None)
    return pl.from_arrow(schema.conform(out.with_columns(note=note).to_arrow(), DELTAS_TABLE, what="deltas"))


# --------------------------------------------------------------------------- metric


def grounding_scores(items: pl.DataFrame, grounded: pl.DataFrame, plan: AnswerPlan, answers: pl.DataFrame, *, metric_ids: list[str], lam: float, backbone: str) -> pl.DataFrame:
    """SCORES rows of the requested grounding metrics (grounding_only and its merge)."""
    wanted = [m for m in metric_ids if catalog.needs_detections(m)]
    if not wanted:
        return pl.from_arrow(schema.SCORES.empty_table())
    results = grounded.filter(pl.col("question_set") == "claims").select("item_id", "claim_id", "groundable", "s")
    holistic = metric_inputs(plan, answers)["holistic"] if any("+" in m for m in wanted) else None
    long = metrics.score_all(items["item_id"], grounding=results, holistic=holistic, lam=lam, merge_terms=catalog.ids(answer_kind=catalog.DETECTIONS))
    scored = long.filter(pl.col("metric").is_in(wanted)).join(items.select("item_id", "benchmark"), on="item_id", how="left")
    return pl.from_arrow(schema.conform(scored.with_columns(backbone=pl.lit(backbone)).to_arrow(), schema.SCORES, what="scores"))


# ----------------------------------------------------------------------- the stage


def run_evidence(items: pl.DataFrame, plan: AnswerPlan, answers: pl.DataFrame, scores: pl.DataFrame, backbone: BackboneSpec, cfg: ResolvedConfig, out_dir: str, timings) -> EvidenceResult:
    """Grounding (and the grounding metrics), then views and deltas when evidence is enabled.

    Writes evidence/<backbone>/grounding.parquet, views.parquet and deltas.parquet.
    """
    s, e = cfg.sweep, cfg.sweep.evidence
    result = EvidenceResult(scores=pl.from_arrow(schema.SCORES.empty_table()))
    if not s.needs_grounding():
        return result
    folder = f"{out_dir}/evidence/{backbone.name}"
    selected = select_items(items, scores, e.select, s.target, e.seed) if e.enabled else pl.Series("item_id", [], pl.String)
    targets = [("claims", items["item_id"])] if any(catalog.needs_detections(m) for m in s.metrics) else []
    if e.enabled:
        targets.append((e.question_set, selected))

    with timings("grounding"):
        claims = claim_rows(plan, targets)
        grounded, report = ground_claims(claims, e.detector, s.store, s.compute)
        result.reports.append(report)
        result.errors.append(report.errors)
        write_table(f"{folder}/grounding.parquet", grounded.to_arrow())
        result.scores = grounding_scores(items, grounded, plan, answers, metric_ids=list(s.metrics), lam=s.lam, backbone=backbone.name)
    log.info("grounding %s: %d claims, %d groundable, %d failed", backbone.name, grounded.height, grounded["groundable"].sum() or 0, grounded["groundable"].null_count())
    if not e.enabled:
        return result

    with timings("views"):
        in_scope = pl.col("question_set") == e.question_set
        viewed = grounded.filter(in_scope & pl.col("item_id").is_in(selected.implode()))
        views = plan_views(viewed, e)
        rendered, report = run_views(render_requests(views, claims, e), s.store, s.compute, e.view_workers, unit=f"{backbone.name}/images")
        result.reports.append(report)
        result.errors.append(report.errors)
        long, requests = view_answer_plan(views, claims, rendered, backbone, cfg.prompts)
        view_answers, report = run_answers(AnswerPlan(questions=None, holistic=None, requests=requests), backbone, cfg.prompts, s.store, s.compute)
        report.stage, report.unit = "views", f"{backbone.name}/answers"
        result.reports.append(report)
        result.errors.append(report.errors)
        hashes = long.pivot(on="view", index=_CLAIM, values="image_hash") if long.height else pl.DataFrame(schema={k: pl.String for k in _CLAIM})
        hashes = hashes.rename({v: f"hash_{v}" for v in VIEWS if v in hashes.columns})
        views_out = views.join(hashes, on=_CLAIM, how="left")
        write_table(f"{folder}/views.parquet", schema.conform(views_out.to_arrow(), VIEWS_TABLE, what="views"))
        deltas = view_deltas(views, claims, long, view_answers)
        write_table(f"{folder}/deltas.parquet", deltas.to_arrow())
    log.info("views %s: %d claims selected, %d eligible", backbone.name, views.height, views["eligible"].sum() or 0)
    return result
