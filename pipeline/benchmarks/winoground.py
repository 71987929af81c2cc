"""Winoground (Thrush et al. 2022): 400 examples of two images and two captions that swap words.

Two official forms of `facebook/winoground` (see docs/benchmarks.md):
- format="jsonl": `data/examples.jsonl`, one example per line with `id`, `caption_0`,
  `caption_1`, `image_0`, `image_1` (file stems: `ex_0_img_0` is `images/ex_0_img_0.png`),
  `tag`, `secondary_tag`, `num_main_preds`, `collapsed_tag`; images from `data/images.zip`.
- format="parquet": the Hugging Face Parquet export, the same columns with each image
  embedded as {bytes, path}; the images are written once, content-addressed, under
  `extract_dir` (local or s3://) so that every item's `image_uri` names a real file.

Each example gives 4 items, one per (image i, caption c), with `correct` = (i == c); the
group is the example id. Tags: the example's `collapsed_tag` and `secondary_tag` (if any).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any

from pipeline.benchmarks.common import LoadResult, Problem
from pipeline.benchmarks.io import BadOption, ProblemLog, items_table, iter_jsonl, iter_parquet, require_image, text_value
from pipeline.store.folder import BadRecord, Folder, extract_image

LOADER = "winoground"  # the name benchmark configs give as `loader:`

IMAGE_EXTENSION = ".png"
PARQUET_COLUMNS = ["id", "image_0", "image_1", "caption_0", "caption_1"]
TAG_COLUMNS = ["tag", "secondary_tag", "num_main_preds", "collapsed_tag"]


def load(
    root: str,
    *,
    benchmark: str = "winoground",
    format: str = "jsonl",
    examples: str = "data/examples.jsonl",
    images: str = "data/images",
    parquet: str = "default/test/*.parquet",
    extract_dir: str = "extracted_images",
) -> LoadResult:
    """Load Winoground from `root` in either official form; bad examples are reported and skipped."""
    folder = Folder(root)
    problems: list[Problem] = []
    if format == "jsonl":
        examples_folder, path = folder.locate(examples)
        log = ProblemLog(examples_folder.uri(path), problems)
        image_folder = folder.sub(images)
        records = ((f"line {n}", _json_line(line)) for n, line in iter_jsonl(examples_folder.read_text(path)))
        rows = _rows(benchmark, records, lambda ex, i: _image_file(image_folder, ex, i), log)
    elif format == "parquet":
        parquet_folder, paths = folder.glob(parquet)
        extract = folder.sub(extract_dir)
        rows = []
        for path in paths:
            log = ProblemLog(parquet_folder.uri(path), problems)
            records = (
                (f"row {index}", row)
                for index, row in iter_parquet(parquet_folder, path, PARQUET_COLUMNS, optional=TAG_COLUMNS)
            )
            seen = {row["group_id"] for row in rows}
            rows += _rows(benchmark, records, lambda ex, i: _embedded_image(extract, ex, i), log, seen)
    else:
        raise BadOption(f"winoground: format must be 'jsonl' or 'parquet', got {format!r}")
    return LoadResult(items=items_table(rows, benchmark), problems=problems)


def _rows(
    benchmark: str,
    records: Iterable[tuple[str, dict[str, Any] | BadRecord]],
    image_uri: Callable[[dict[str, Any], int], str],
    log: ProblemLog,
    seen: set[str] | None = None,
) -> list[dict[str, Any]]:
    """The 4 items of every valid example; `image_uri(example, i)` resolves image i."""
    seen = set() if seen is None else seen
    rows = []
    for record, example in records:
        try:
            if isinstance(example, BadRecord):
                raise example
            example_id = _example_id(example)
            record = f"{record} (id {example_id})"
            if example_id in seen:
                raise BadRecord("id", f"duplicate example id {example_id}: only its first copy is used")
            captions = [text_value(example.get(f"caption_{c}"), f"caption_{c}") for c in (0, 1)]
            images = [image_uri(example, i) for i in (0, 1)]
        except BadRecord as exc:
            log.bad(record, exc)
            continue
        seen.add(example_id)
        tags = [t for t in (example.get("collapsed_tag"), example.get("secondary_tag")) if isinstance(t, str) and t]
        for i in (0, 1):
            for c in (0, 1):
                rows.append(
                    {
                        "item_id": f"{benchmark}/{example_id}/i{i}_c{c}",
                        "image_uri": images[i],
                        "caption": captions[c],
                        "group_id": example_id,
                        "image_index": i,
                        "caption_index": c,
                        "correct": i == c,
                        "tags": tags,
                    }
                )
    return rows


def _json_line(line: str) -> dict[str, Any] | BadRecord:
    try:
        example = json.loads(line)
    except json.JSONDecodeError as exc:
        return BadRecord(None, f"not valid JSON: {exc}")
    return example if isinstance(example, dict) else BadRecord(None, "expected a JSON object")


def _example_id(example: dict[str, Any]) -> str:
    value = example.get("id")
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise BadRecord("id", f"expected a non-negative integer, got {value!r}")
    return str(value)


def _image_file(folder: Folder, example: dict[str, Any], i: int) -> str:
    stem = text_value(example.get(f"image_{i}"), f"image_{i}")
    return require_image(folder, stem + IMAGE_EXTENSION, f"image_{i}")


def _embedded_image(folder: Folder, example: dict[str, Any], i: int) -> str:
    image = example.get(f"image_{i}")
    if not isinstance(image, dict):
        raise BadRecord(f"image_{i}", f"expected an embedded image {{bytes, path}}, got {type(image).__name__}")
    try:
        return extract_image(folder, image.get("bytes"), image.get("path"))
    except BadRecord as exc:
        raise BadRecord(f"image_{i}", exc.message) from None
