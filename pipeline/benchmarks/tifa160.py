"""TIFA160 (Hu et al. 2023): 160 prompts x 5 generators = 800 images rated 1-5 for faithfulness.

Files (see docs/benchmarks.md):
- `human_annotations.json` (Yushi-Hu/tifa, folder human_annotations/): image key ->
  {"text_id", "image_path", "text", "human_scores": [ratings], "human_avg"}; the key is
  `<text_id>_<generator>` and `image_path` the image's file name.
- the images (`annotated_images/` in the released zip).
- optional, `human="likert"`: DSG's `tifa160-likert-anns.csv` (google/DSG, dsg/data/), five
  raters per image; columns item_id, t2i_model (or model_type), source_id, worker_id,
  answer. Its (source_id, t2i_model) names the image `<source_id>_<generator>`, with DSG's
  generator names mapped to TIFA's (sd1dot5 -> stable_diffusion_v1_5, ...).

One item per image; human = mean of the chosen ratings; group = prompt (text_id).
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from typing import Any

from pipeline.benchmarks.common import LoadResult, Problem
from pipeline.benchmarks.io import BadOption, ProblemLog, items_table, parse_number, rating, read_csv, require_image, text_value
from pipeline.store.folder import BadRecord, FileError, Folder, JsonObject

LOADER = "tifa160"  # the name benchmark configs give as `loader:`

RATING_RANGE = (1, 5)
HUMAN_SIGNALS = ("tifa", "likert")
# DSG's generator names -> the suffix of TIFA's image keys.
DSG_GENERATORS = {
    "mini-dalle": "mini_dalle",
    "vq-diffusion": "vq_diffusion",
    "sd1dot1": "stable_diffusion_v1_1",
    "sd1dot5": "stable_diffusion_v1_5",
    "sd2dot1": "stable_diffusion_v2_1",
}


def load(
    root: str,
    *,
    benchmark: str = "tifa160",
    annotations: str = "human_annotations.json",
    images: str = "annotated_images",
    human: str = "tifa",
    likert: str = "tifa160-likert-anns.csv",
) -> LoadResult:
    """Load TIFA160 from `root`; `human` picks TIFA's own ratings or DSG's five-rater Likert."""
    if human not in HUMAN_SIGNALS:
        raise BadOption(f"tifa160: human must be one of {HUMAN_SIGNALS}, got {human!r}")
    folder = Folder(root)
    image_folder = folder.sub(images)
    problems: list[Problem] = []
    ann_folder, ann_path = folder.locate(annotations)
    data = ann_folder.read_json(ann_path)
    if not isinstance(data, JsonObject):
        raise FileError(f"{ann_folder.uri(ann_path)}: expected a JSON object of image key -> entry")
    log = ProblemLog(ann_folder.uri(ann_path), problems)
    log.duplicates(data, "image key")

    entries: dict[str, dict[str, Any]] = {}
    for key, entry in data.items():
        try:
            entries[key] = _entry(entry, image_folder, with_ratings=human == "tifa")
        except BadRecord as exc:
            log.bad(key, exc)

    if human == "likert":
        likert_folder, likert_path = folder.locate(likert)
        ratings = _likert_ratings(likert_folder, likert_path, set(data), problems)
        likert_log = ProblemLog(likert_folder.uri(likert_path), problems)
        for key in list(entries):
            if key in ratings:
                entries[key]["human"] = statistics.fmean(ratings[key])
            else:
                likert_log.add(key, None, "no valid Likert rating for this image: it is skipped")
                del entries[key]

    rows = [
        {
            "item_id": f"{benchmark}/{key}",
            "image_uri": entry["image_uri"],
            "caption": entry["text"],
            "group_id": entry["text_id"],
            "human": entry["human"],
        }
        for key, entry in entries.items()
    ]
    return LoadResult(items=items_table(rows, benchmark), problems=problems)


def _entry(entry: Any, image_folder: Folder, with_ratings: bool) -> dict[str, Any]:
    if not isinstance(entry, dict):
        raise BadRecord(None, f"expected an object, got {type(entry).__name__}")
    out = {
        "text_id": text_value(entry.get("text_id"), "text_id"),
        "text": text_value(entry.get("text"), "text"),
        "image_uri": require_image(image_folder, text_value(entry.get("image_path"), "image_path"), "image_path"),
        "human": None,
    }
    if with_ratings:
        scores = entry.get("human_scores")
        if not isinstance(scores, list) or not scores:
            raise BadRecord("human_scores", f"expected a non-empty list of ratings, got {scores!r}")
        out["human"] = statistics.fmean(rating(s, *RATING_RANGE, "human_scores") for s in scores)
        stated = entry.get("human_avg")
        if stated is not None and not (
            isinstance(stated, (int, float)) and math.isclose(stated, out["human"], abs_tol=1e-6)
        ):
            raise BadRecord("human_avg", f"{stated!r} is not the mean of human_scores {scores}")
    return out


def _likert_ratings(folder: Folder, path: str, keys: set[str], problems: list[Problem]) -> dict[str, list[float]]:
    """Image key -> its Likert ratings (one per worker)."""
    header, rows = read_csv(folder, path, ["source_id", "worker_id", "answer"])
    model_column = next((c for c in ("t2i_model", "model_type") if c in header), None)
    if model_column is None:
        raise FileError(f"{folder.uri(path)}: needs a t2i_model (or model_type) column; found {header}")
    log = ProblemLog(folder.uri(path), problems)
    ratings: dict[str, list[float]] = defaultdict(list)
    seen: set[tuple[str, str]] = set()
    for record, row in rows:
        try:
            model = row[model_column]
            if model not in DSG_GENERATORS:
                raise BadRecord(model_column, f"unknown generator {model!r}; expected one of {sorted(DSG_GENERATORS)}")
            key = f"{text_value(row['source_id'], 'source_id')}_{DSG_GENERATORS[model]}"
            if key not in keys:
                raise BadRecord("source_id", f"image {key!r} is not in the TIFA annotations")
            worker = text_value(row["worker_id"], "worker_id")
            if (key, worker) in seen:
                raise BadRecord(
                    "worker_id", f"worker {worker} rated image {key!r} twice: only the first rating is used"
                )
            value = rating(parse_number(row["answer"], "answer"), *RATING_RANGE, "answer")
        except BadRecord as exc:
            log.bad(record, exc)
            continue
        seen.add((key, worker))
        ratings[key].append(value)
    return ratings
