"""A run folder -> the explorer's data: one list per (benchmark, backbone) and per-item details.

Reads only what the run wrote (items, scores/, records/, evidence/, judge/, errors,
manifest); nothing is recomputed but the display quantities of `operators.metrics.decomposed.question_table`.
Lists are columnar (small to ship, quick to sort in the browser); details are grouped in
chunks so a large run is loaded a chunk at a time, on demand.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import polars as pl

from operators.metrics.decomposed import question_table
from pipeline.store.fs import exists, filesystem, join_url, read_json, read_table

CHUNK = 50  # items per detail file
SET_ORDER = {"depict": 0, "dsg": 1, "claims": 2}  # DEPICT's own questions first


@dataclass
class Run:
    """The tables of one run folder (absent ones are empty frames)."""

    url: str
    name: str
    items: pl.DataFrame
    scores: dict[str, pl.DataFrame]  # backbone -> SCORES rows
    records: dict[str, pl.DataFrame]  # backbone -> records + p_v, p_t, commitment, agreement
    grounding: dict[str, pl.DataFrame] = field(default_factory=dict)
    views: dict[str, pl.DataFrame] = field(default_factory=dict)
    deltas: dict[str, pl.DataFrame] = field(default_factory=dict)
    judge: dict[str, pl.DataFrame] = field(default_factory=dict)
    errors: pl.DataFrame = field(default_factory=pl.DataFrame)
    store: str | None = None  # where view images live (<store>/images)
    metric_order: list[str] = field(default_factory=list)


def _read(url: str) -> pl.DataFrame | None:
    return pl.from_arrow(read_table(url)) if exists(url) else None


def _backbones(run: str) -> list[str]:
    fs, path = filesystem(join_url(run, "scores"))
    if not fs.exists(path):
        return []
    return sorted(p.rsplit("/", 1)[-1][: -len(".parquet")] for p in fs.ls(path, detail=False) if p.endswith(".parquet"))


def read_run(url: str) -> Run:
    """Load a run folder written by jobs/sweep.py, jobs/score.py or the API (out_dir=)."""
    items = _read(join_url(url, "items.parquet"))
    if items is None:
        raise FileNotFoundError(f"{url}: no items.parquet; is this a run folder (outputs/runs/<name>)?")
    manifest = read_json(join_url(url, "manifest.json")) if exists(join_url(url, "manifest.json")) else {}
    sweep = (manifest.get("config") or {}).get("sweep") or {}
    probability = sweep.get("probability", "normalized")
    run = Run(
        url=url, name=sweep.get("run_name") or url.rstrip("/").rsplit("/", 1)[-1], items=items, scores={}, records={},
        store=sweep.get("store") or manifest.get("store"), metric_order=list(sweep.get("metrics") or []),
    )
    for backbone in _backbones(url):
        run.scores[backbone] = _read(join_url(url, "scores", f"{backbone}.parquet"))
        records = _read(join_url(url, "records", f"{backbone}.parquet"))
        run.records[backbone] = question_table(records, probability) if records is not None else pl.DataFrame()
        for name, target in (("grounding", run.grounding), ("views", run.views), ("deltas", run.deltas)):
            frame = _read(join_url(url, "evidence", backbone, f"{name}.parquet"))
            if frame is not None:
                target[backbone] = frame
        judged = _read(join_url(url, "judge", f"{backbone}.parquet"))
        if judged is not None:
            run.judge[backbone] = judged
    errors = _read(join_url(url, "errors.parquet"))
    run.errors = errors if errors is not None else pl.DataFrame(schema={"item_id": pl.String})
    return run


def view_id(benchmark: str, backbone: str) -> str:
    safe = lambda s: "".join(c if c.isalnum() or c in "-_." else "_" for c in s)  # noqa: E731
    return f"{safe(benchmark)}__{safe(backbone)}"


def _clean(value):
    """JSON-safe: NaN/inf -> None, floats rounded (the page shows 3 decimals)."""
    if isinstance(value, float):
        return round(value, 5) if math.isfinite(value) else None
    if isinstance(value, list):
        return [_clean(v) for v in value]
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    return value


def human_column(items: pl.DataFrame) -> str | None:
    """The human signal of a benchmark: a rating, else correctness (Winoground, multiple choice)."""
    if items["human"].drop_nulls().len():
        return "human"
    if items["correct"].drop_nulls().len():
        return "correct"
    return None


def view_list(run: Run, benchmark: str, backbone: str, images: dict[str, dict]) -> dict:
    """The columnar list of one view: ids, captions, thumbnails, human signal, every metric."""
    items = run.items.filter(pl.col("benchmark") == benchmark)
    scores = run.scores[backbone].filter(pl.col("benchmark") == benchmark)
    present = scores["metric"].unique().to_list()
    metrics = [m for m in run.metric_order if m in present] + sorted(m for m in present if m not in run.metric_order)
    wide = items.select("item_id")
    for metric in metrics:
        wide = wide.join(scores.filter(pl.col("metric") == metric).select("item_id", pl.col("score").alias(metric)), on="item_id", how="left", maintain_order="left")
    human = human_column(items)
    errors = run.errors.filter(pl.col("item_id").is_in(items["item_id"].implode())) if run.errors.height else run.errors
    n_errors = dict(errors.group_by("item_id").len().iter_rows()) if errors.height else {}
    ids = items["item_id"].to_list()
    human_values = None
    if human == "human":
        human_values = items["human"].to_list()
    elif human == "correct":
        human_values = [None if v is None else float(v) for v in items["correct"].to_list()]
    tags = items["tags"].to_list()
    templates = items["template"].to_list()
    return _clean({
        "view": view_id(benchmark, backbone), "benchmark": benchmark, "backbone": backbone, "metrics": metrics,
        "human": human, "chunk_size": CHUNK,
        "tags": sorted({t for ts in tags for t in (ts or [])}), "templates": sorted({t for t in templates if t}),
        "items": {
            "id": ids, "caption": items["caption"].to_list(),
            "thumb": [images.get(h, {}).get("thumb") for h in items["image_hash"].to_list()],
            "human": human_values, "tags": [ts or [] for ts in tags], "template": templates,
            "errors": [n_errors.get(i, 0) for i in ids],
            "scores": {m: wide[m].to_list() for m in metrics},
        },
    })


def view_details(run: Run, benchmark: str, backbone: str, images: dict[str, dict], view_images: dict[str, str]) -> list[dict]:
    """Per-item details of one view, in list order, as chunks of CHUNK items each.

    Every table is filtered, sorted and grouped once (not per item): a 20k-item view
    takes seconds."""
    items = run.items.filter(pl.col("benchmark") == benchmark)
    ids = items["item_id"].implode()
    scores = _grouped(run.scores[backbone].filter(pl.col("item_id").is_in(ids)), ["metric", "score", "note"])
    records = run.records.get(backbone, pl.DataFrame())
    questions = {}
    if records.height:
        order = pl.col("question_set").replace_strict(SET_ORDER, default=len(SET_ORDER), return_dtype=pl.Int64)
        cols = [c for c in ("question_set", "question_id", "question", "parents", "claim_type", "p_v", "p_t", "commitment", "agreement") if c in records.columns]
        mine = records.filter(pl.col("item_id").is_in(ids)).sort("item_id", order, pl.col("question_id").cast(pl.Int64, strict=False), "question_id")
        questions = _grouped(mine, cols)
    claims = _claims(run, backbone, items["item_id"], view_images)
    judge = run.judge.get(backbone)
    judged = _grouped(
        judge.filter(pl.col("item_id").is_in(ids)).with_columns(pl.col("raw_text").str.slice(0, 600)), ["kind", "valid", "score", "reason", "judgement", "raw_text"]
    ) if judge is not None and judge.height else {}
    errors = _grouped(run.errors.filter(pl.col("item_id").is_in(ids)), ["stage", "field", "reason", "detail"]) if run.errors.height else {}
    chunks: list[dict] = []
    for n, item in enumerate(items.iter_rows(named=True)):
        if n % CHUNK == 0:
            chunks.append({})
        iid = item["item_id"]
        image = images.get(item["image_hash"], {})
        chunks[-1][iid] = {
            "id": iid, "caption": item["caption"], "group": item["group_id"], "human": _clean(item["human"]), "correct": item["correct"],
            "tags": item["tags"] or [], "template": item["template"], "image_uri": item["image_uri"],
            "image": image.get("full"), "width": image.get("width"), "height": image.get("height"), "image_error": image.get("error"),
            "scores": scores.get(iid, []), "questions": questions.get(iid, []), "claims": _clean(claims.get(iid, [])),
            "judge": judged.get(iid, []), "errors": errors.get(iid, []),
        }
    return chunks


def _grouped(frame: pl.DataFrame, columns: list[str]) -> dict[str, list[dict]]:
    """item_id -> its rows (as dicts of `columns`, floats JSON-safe), in the frame's order."""
    out: dict[str, list[dict]] = {}
    frame = frame.select("item_id", *columns)
    floats = [c for c, t in frame.schema.items() if t.is_float()]
    frame = frame.with_columns([pl.when(pl.col(c).is_finite()).then(pl.col(c).round(5)).alias(c) for c in floats])
    for row in frame.iter_rows(named=True):
        out.setdefault(row.pop("item_id"), []).append(row)
    return out


def _claims(run: Run, backbone: str, ids: pl.Series, view_images: dict[str, str]) -> dict[str, list[dict]]:
    """Grounded claims per item: boxes (pixels of the original image), s, views and deltas."""
    grounding = run.grounding.get(backbone)
    if grounding is None or grounding.height == 0:
        return {}
    grounding = grounding.filter(pl.col("item_id").is_in(ids.implode()))
    views = run.views.get(backbone)
    deltas = run.deltas.get(backbone)
    key = ["item_id", "question_set", "claim_id"]
    view_rows = {tuple(r[k] for k in key): r for r in views.iter_rows(named=True)} if views is not None else {}
    delta_rows = {tuple(r[k] for k in key): r for r in deltas.iter_rows(named=True)} if deltas is not None else {}
    out: dict[str, list[dict]] = {}
    for r in grounding.sort("item_id", pl.col("claim_id").cast(pl.Int64, strict=False)).iter_rows(named=True):
        k = tuple(r[c] for c in key)
        claim = {
            "claim_id": r["claim_id"], "claim": r["claim"], "claim_type": r["claim_type"], "rule": r["rule"],
            "groundable": r["groundable"], "s": r["s"], "note": r["note"], "boxes": r["evidence_boxes"] or [],
            "width": r["width"], "height": r["height"],
        }
        v = view_rows.get(k)
        if v is not None:
            claim["control_boxes"] = v["control_boxes"] or []
            claim["views"] = {name[len("hash_"):]: view_images.get(v[name]) for name in v if name.startswith("hash_") and v[name]}
            claim["view_reason"] = v["reason"]
        d = delta_rows.get(k)
        if d is not None:
            claim["deltas"] = {n: d[n] for n in d if n.startswith(("d_", "s_"))}
        out.setdefault(r["item_id"], []).append(claim)
    return out


def run_errors(run: Run) -> list[dict]:
    """Errors not tied to an item (questions, answers, metaeval): counted by stage and reason."""
    if not run.errors.height:
        return []
    counts = run.errors.group_by("stage", "reason").agg(n=pl.len(), example=pl.col("detail").first()).sort("stage", "reason")
    return _clean(counts.to_dicts())
