"""GenAI-Bench per-image metric scores against the benchmark's released human ratings.

Human file, as released (BaiqiL/GenAI-Bench-1600, zhiqiulin/GenAI-Bench-527):
`genai_image.json` maps a prompt id ("00000", five digits) to {"prompt", "models":
{generator: [three 1-5 ratings]}}; generators are the image folders (DALLE_3, SDXL_Turbo,
DeepFloyd_I_XL_v1, Midjourney_6, SDXL_2_1, SDXL_Base). Optional `genai_skills.json` maps a
skill tag to integer prompt ids (tags feed the skill breakdown).

Score file: the benchmark's evaluation code (linzhiqiu/t2v_metrics `genai_image_eval.py`)
saves each metric's scores as a torch tensor (prompts x generators x 1, in the order of
`genai_image.json`), which a Ray-free pipeline does not unpickle. This reader takes the same
numbers as a table (CSV or Parquet): columns `prompt_id` (as in `genai_image.json`; integers
are zero-padded to five digits), `generator`, and one column per metric. docs/reproducing.md
shows the two-line export from the tensors.

Items: one per (prompt, generator) rated in `genai_image.json`, id "<prompt_id>/<generator>";
human = mean rating; group = prompt. Scores of unknown (prompt, generator) pairs and
non-numeric ratings are reported and skipped.
"""
from __future__ import annotations

from pathlib import PurePosixPath

import fsspec
import polars as pl

from pipeline.config import ProtocolSpec
from pipeline.released.release_files import Released, as_number, read_json

KEY_COLUMNS = ("prompt_id", "generator")
PROTOCOL = ProtocolSpec(
    kind="correlation", statistics=["pairwise_acc", "srcc", "kendall", "pearson", "plcc"],
    breakdowns=["tags"], primary_statistic="srcc",
)  # fmt: skip


def _prompt_id(value: str) -> str:
    value = value.strip()
    return f"{int(value):05d}" if value.isdigit() else value


def read_ratings(path: str, skills: str | None = None, *, benchmark: str = "genai_bench") -> tuple[pl.DataFrame, list[str]]:
    data = read_json(path, what="GenAI-Bench ratings")
    if not isinstance(data, dict):
        raise ValueError(f"GenAI-Bench ratings file {path}: expected an object of prompt id -> entry")
    tags: dict[str, list[str]] = {}
    if skills:
        for tag, ids in read_json(skills, what="GenAI-Bench skills").items():
            for number in ids if isinstance(ids, list) else []:
                if isinstance(number, int):
                    tags.setdefault(f"{number:05d}", []).append(tag)
    rows, problems = [], []
    for prompt_id, entry in data.items():
        models = entry.get("models") if isinstance(entry, dict) else None
        if not isinstance(models, dict):
            problems.append(f"{path}: prompt {prompt_id!r} field 'models' missing or not an object; skipped")
            continue
        for generator, ratings in models.items():
            values = [as_number(r) for r in ratings] if isinstance(ratings, list) else [None]
            if not values or any(v is None or not 1 <= v <= 5 for v in values):
                problems.append(f"{path}: prompt {prompt_id!r} field 'models.{generator}' has unusable ratings {ratings!r}; skipped")
                continue
            rows.append({
                "item_id": f"{prompt_id}/{generator}", "group_id": prompt_id, "human": sum(values) / len(values),
                "benchmark": benchmark, "tags": sorted(tags.get(prompt_id, [])),
            })  # fmt: skip
    schema = {"item_id": pl.String, "group_id": pl.String, "human": pl.Float64, "benchmark": pl.String, "tags": pl.List(pl.String)}
    return pl.DataFrame(rows, schema=schema), problems


def read_scores(path: str) -> pl.DataFrame:
    """The score table in long form: item_id, metric, score, note."""
    suffix = PurePosixPath(path.split("?")[0]).suffix.lower()
    try:
        with fsspec.open(path, "rb") as handle:
            frame = pl.read_parquet(handle) if suffix in (".parquet", ".pq") else pl.read_csv(handle, schema_overrides={"prompt_id": pl.String})
    except FileNotFoundError as exc:
        raise FileNotFoundError(f"GenAI-Bench scores file not found: {path}") from exc
    missing = [c for c in KEY_COLUMNS if c not in frame.columns]
    if missing:
        raise ValueError(f"GenAI-Bench scores file {path}: missing column(s) {missing}; have {frame.columns}")
    metrics = [c for c in frame.columns if c not in KEY_COLUMNS]
    if not metrics:
        raise ValueError(f"GenAI-Bench scores file {path}: no metric columns besides {list(KEY_COLUMNS)}")
    frame = frame.with_columns(
        pl.col("prompt_id").cast(pl.String).map_elements(_prompt_id, return_dtype=pl.String),
        *(pl.col(m).cast(pl.Float64, strict=False) for m in metrics),
    )
    item_id = pl.concat_str([pl.col("prompt_id"), pl.col("generator").cast(pl.String).str.strip_chars()], separator="/")
    return frame.select(item_id.alias("item_id"), *metrics).unpivot(index="item_id", variable_name="metric", value_name="score").with_columns(note=pl.lit(None, dtype=pl.String))


def load(scores: str, human: str | None, *, skills: str | None = None, benchmark: str = "genai_bench") -> Released:
    if human is None:
        raise ValueError("released GenAI-Bench scores need human=<genai_image.json>")
    items, problems = read_ratings(human, skills, benchmark=benchmark)
    long = read_scores(scores)
    unknown = long.filter(~pl.col("item_id").is_in(items["item_id"].implode()))["item_id"].unique().sort()
    if unknown.len():
        problems.append(f"{scores}: {unknown.len()} (prompt, generator) pair(s) not rated in {human}, ignored (e.g. {unknown[0]!r})")
    protocol = PROTOCOL if skills else ProtocolSpec(**{**PROTOCOL.__dict__, "breakdowns": []})
    long = long.filter(pl.col("item_id").is_in(items["item_id"].implode()))
    target = "vqascore" if "vqascore" in set(long["metric"]) else None
    return Released(long, items, protocol, benchmark, problems, target=target)
