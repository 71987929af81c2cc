"""GenAI-Bench (Li et al. 2024): images from six generators rated 1-5 by three people each.

Releases (see docs/benchmarks.md):
- "1600": `BaiqiL/GenAI-Bench-1600` — `genai_image.json`, `genai_skills.json` and one folder
  per generator (`DALLE_3/00000.jpeg`, ...), prompt ids "00000".."01599".
- "527": `zhiqiulin/GenAI-Bench-527` — the same layout for the 527-prompt core used by the
  VQAScore paper, prompt ids "00001".."00527".
- format="parquet": the `BaiqiL/GenAI-Bench` Parquet export (columns Index, Prompt, Tags,
  HumanRatings and one embedded image per generator), images extracted on first load.

`genai_image.json` maps a prompt id to {"prompt", "models": {generator: [ratings]}}; the
image of (id, generator) is `<generator>/<id>.jpeg`. `genai_skills.json` maps a skill tag
to the integer ids of its prompts (`f"{id:05d}"` is the prompt id). One item per (prompt,
generator); human = mean rating; group = prompt; tags = the prompt's skills.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from typing import Any

from pipeline.benchmarks.common import LoadResult, Problem
from pipeline.benchmarks.io import BadOption, ProblemLog, items_table, iter_parquet, rating, require_image, text_value
from pipeline.store.folder import BadRecord, FileError, Folder, JsonObject, extract_image

LOADER = "genai_bench"  # the name benchmark configs give as `loader:`

GENERATORS = ("DALLE_3", "SDXL_Turbo", "DeepFloyd_I_XL_v1", "Midjourney_6", "SDXL_2_1", "SDXL_Base")
RELEASES = ("1600", "527")
RATING_RANGE = (1, 5)


def load(
    root: str,
    *,
    release: str = "1600",
    format: str = "json",
    benchmark: str | None = None,
    annotations: str = "genai_image.json",
    skills: str | None = "genai_skills.json",
    parquet: str = "data/*.parquet",
    extract_dir: str = "extracted_images",
) -> LoadResult:
    """Load one release from `root`; every bad record is reported and skipped.

    `skills=None` loads without tags. `benchmark` defaults to "genai_bench" (1600) or
    "genai_bench_527", so both releases can share a run without colliding item ids.
    """
    release = str(release)
    if release not in RELEASES:
        raise BadOption(f"genai_bench: release must be one of {RELEASES}, got {release!r}")
    benchmark = benchmark or ("genai_bench" if release == "1600" else f"genai_bench_{release}")
    folder = Folder(root)
    problems: list[Problem] = []
    if format == "json":
        rows = _load_json(folder, benchmark, annotations, skills, problems)
    elif format == "parquet":
        rows = _load_parquet(folder, benchmark, parquet, folder.sub(extract_dir), problems)
    else:
        raise BadOption(f"genai_bench: format must be 'json' or 'parquet', got {format!r}")
    return LoadResult(items=items_table(rows, benchmark), problems=problems)


def _load_json(folder: Folder, benchmark: str, annotations: str, skills: str | None, problems: list[Problem]):
    ann_folder, ann_path = folder.locate(annotations)
    data = ann_folder.read_json(ann_path)
    log = ProblemLog(ann_folder.uri(ann_path), problems)
    if not isinstance(data, JsonObject):
        raise FileError(f"{ann_folder.uri(ann_path)}: expected a JSON object of prompt id -> entry")
    log.duplicates(data, "prompt id")
    tags = _read_skills(folder, skills, set(data), problems) if skills else {}

    rows = []
    for prompt_id, entry in data.items():
        try:
            prompt, ratings_by_model = _prompt_entry(entry)
        except BadRecord as exc:
            log.bad(prompt_id, exc)
            continue
        if isinstance(ratings_by_model, JsonObject):
            log.duplicates(ratings_by_model, "generator", record=prompt_id)
        for model, ratings in ratings_by_model.items():
            try:
                human = _mean_rating(ratings, f"models.{model}")
                image_uri = require_image(folder, f"{model}/{prompt_id}.jpeg", f"models.{model}")
            except BadRecord as exc:
                log.bad(prompt_id, exc)
                continue
            rows.append(_row(benchmark, prompt_id, model, prompt, human, image_uri, tags.get(prompt_id, [])))
    return rows


def _load_parquet(folder: Folder, benchmark: str, pattern: str, extract: Folder, problems: list[Problem]):
    parquet_folder, paths = folder.glob(pattern)
    rows = []
    seen: set[str] = set()
    for path in paths:
        log = ProblemLog(parquet_folder.uri(path), problems)
        columns = ["Index", "Prompt", "Tags", "HumanRatings"]
        for index, row in iter_parquet(parquet_folder, path, columns, optional=GENERATORS):
            record = f"row {index}"
            try:
                if isinstance(row["Index"], bool) or not isinstance(row["Index"], int):
                    raise BadRecord("Index", f"not an integer: {row['Index']!r}")
                prompt_id = f"{row['Index']:05d}"
                record = f"row {index} (Index {row['Index']})"
                if prompt_id in seen:
                    raise BadRecord("Index", f"duplicate prompt id {prompt_id!r}: only its first copy is used")
                seen.add(prompt_id)
                prompt = text_value(row["Prompt"], "Prompt")
                tags = _parquet_tags(row["Tags"])
            except BadRecord as exc:
                log.bad(record, exc)
                continue
            ratings_by_model = row["HumanRatings"] or {}
            for model in (m for m in GENERATORS if m in row):
                field = f"HumanRatings.{model}"
                try:
                    human = _mean_rating(ratings_by_model.get(model), field)
                    image = row[model] or {}
                    image_uri = extract_image(extract, image.get("bytes"), image.get("path"))
                except BadRecord as exc:
                    log.add(record, exc.field or model, exc.message)
                    continue
                rows.append(_row(benchmark, prompt_id, model, prompt, human, image_uri, tags))
    return rows


def _prompt_entry(entry: Any) -> tuple[str, dict]:
    if not isinstance(entry, dict):
        raise BadRecord(None, f"expected an object with 'prompt' and 'models', got {type(entry).__name__}")
    prompt = text_value(entry.get("prompt"), "prompt")
    models = entry.get("models")
    if not isinstance(models, dict) or not models:
        raise BadRecord("models", f"expected an object of generator -> ratings, got {models!r}")
    return prompt, models


def _mean_rating(ratings: Any, field: str) -> float:
    if not isinstance(ratings, list) or not ratings:
        raise BadRecord(field, f"expected a non-empty list of ratings, got {ratings!r}")
    return statistics.fmean(rating(r, *RATING_RANGE, field) for r in ratings)


def _read_skills(folder: Folder, skills: str, prompt_ids: set[str], problems: list[Problem]) -> dict[str, list[str]]:
    """Prompt id -> sorted skill tags, from `{tag: [integer prompt ids]}`."""
    skills_folder, path = folder.locate(skills)
    data = skills_folder.read_json(path)
    log = ProblemLog(skills_folder.uri(path), problems)
    if not isinstance(data, JsonObject):
        raise FileError(f"{skills_folder.uri(path)}: expected a JSON object of skill tag -> prompt ids")
    log.duplicates(data, "skill tag")
    tags: dict[str, set[str]] = defaultdict(set)
    for tag, ids in data.items():
        if not isinstance(ids, list):
            log.add(tag, None, f"expected a list of prompt ids, got {type(ids).__name__}")
            continue
        for value in ids:
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                log.add(tag, None, f"prompt id {value!r} is not a non-negative integer")
            elif f"{value:05d}" not in prompt_ids:
                log.add(tag, None, f"prompt id {value} is not in the annotations")
            else:
                tags[f"{value:05d}"].add(tag)
    return {prompt_id: sorted(names) for prompt_id, names in tags.items()}


def _parquet_tags(tags: Any) -> list[str]:
    """{"basic": [...], "advanced": [...]} -> lower-case skills plus the basic/advanced group."""
    if tags is None:
        return []
    if not isinstance(tags, dict):
        raise BadRecord("Tags", f"expected a struct of basic/advanced skill lists, got {tags!r}")
    out: set[str] = set()
    for group in ("basic", "advanced"):
        names = tags.get(group) or []
        out.update(str(name).strip().lower() for name in names)
        if names:
            out.add(group)
    return sorted(out)


def _row(benchmark, prompt_id, model, prompt, human, image_uri, tags) -> dict[str, Any]:
    return {
        "item_id": f"{benchmark}/{prompt_id}/{model}",
        "image_uri": image_uri,
        "caption": prompt,
        "group_id": prompt_id,
        "human": human,
        "tags": list(tags),
    }
