"""TIFA's released per-image scores (Yushi-Hu/tifa, `human_annotations/human_annotations_with_scores.json`).

Format, as released: one JSON object mapping an image key `<text_id>_<generator>` (e.g.
"coco_669925_mini_dalle") to {"text_id", "image_path", "text", "human_scores": [two 1-5
ratings], "human_avg", and one number per metric: "meteor", "bleu", "rouge", "spice",
"clipscore_vitb32", "tifa_vilt", "tifa_git-large", "tifa_ofa-large", "tifa_blip2-flant5xl",
"tifa_mplug-large"}. Items: one per key; human = `human_avg`; group = `text_id` (the prompt).
Metrics: every other numeric field. A record without a usable `human_avg` or `text_id` is
skipped, a non-numeric metric value leaves that score null; both are reported with the key
and field.

TIFA's notebook (`compute_correlation.ipynb`) prints `np.corrcoef` under the heading
"Spearman's Correlation": that number is plain Pearson, our `pearson` statistic; its
Kendall is scipy's tau-b, our `kendall`.
"""
from __future__ import annotations

import polars as pl

from pipeline.config import ProtocolSpec
from pipeline.released.release_files import Released, as_number, read_json

NOT_METRICS = frozenset({"text_id", "image_path", "text", "human_scores", "human_avg"})
PROTOCOL = ProtocolSpec(
    kind="correlation", statistics=["pearson", "kendall", "srcc", "plcc", "pairwise_acc"], primary_statistic="pearson"
)


def load(path: str, *, benchmark: str = "tifa160") -> Released:
    records = read_json(path, what="TIFA scores")
    if not isinstance(records, dict):
        raise ValueError(f"TIFA scores file {path}: expected an object of image key -> record, got {type(records).__name__}")
    problems: list[str] = []
    items, scores = [], []
    for key, record in records.items():
        if not isinstance(record, dict):
            problems.append(f"{path}: record {key!r} is not an object; skipped")
            continue
        human, text_id = as_number(record.get("human_avg")), record.get("text_id")
        if human is None or not isinstance(text_id, str) or not text_id:
            field = "human_avg" if human is None else "text_id"
            problems.append(f"{path}: record {key!r} field {field!r} missing or unusable ({record.get(field)!r}); skipped")
            continue
        items.append({"item_id": str(key), "group_id": text_id, "human": human, "benchmark": benchmark})
        for metric, value in record.items():
            if metric in NOT_METRICS:
                continue
            number = as_number(value)
            if number is None:
                problems.append(f"{path}: record {key!r} field {metric!r} is not a number ({value!r}); that score is null")
            scores.append({"item_id": str(key), "metric": metric, "score": number, "note": None if number is not None else "unusable value"})
    if not items:
        raise ValueError(f"TIFA scores file {path}: no usable records")
    item_frame = pl.DataFrame(items, schema={"item_id": pl.String, "group_id": pl.String, "human": pl.Float64, "benchmark": pl.String})
    score_frame = pl.DataFrame(scores, schema={"item_id": pl.String, "metric": pl.String, "score": pl.Float64, "note": pl.String})
    return Released(score_frame, item_frame, PROTOCOL, benchmark, problems, target="tifa_mplug-large")
