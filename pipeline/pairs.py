"""`jobs/score.py pairs=FILE`: score a CSV, JSONL or Parquet file of (image, caption) pairs.

A thin layer over the Python API (`pipeline.api.Scorer`): read the file, score it with the
shared answer store (so a rerun, or a run killed half way, computes only what is missing),
and write next to it (or to `out`):

    pair_scores.parquet / .csv   one row per input row: its columns + one column per metric,
                                 note_<metric>, error, error_detail
    pair_records.parquet         per (row, question): the question, p_v, p_t, commitment, agreement
    summary.txt, manifest.json   what ran, what was cached, what failed
    items.parquet, questions.parquet, scores/, records/, errors.parquet
                                 the sweep's run-folder tables (jobs/explore.py reads them)
"""
from __future__ import annotations

import os
import posixpath
import time
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from pipeline.api import Scorer
from pipeline.runtime import git_commit, library_versions
from pipeline.store.fs import absolute_path, exists, read_bytes, write_bytes_atomic, write_json, write_table

FORMATS = {".csv": "csv", ".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl", ".parquet": "parquet"}


class PairsFileError(ValueError):
    """The pairs file cannot be used at all (missing, unreadable, lacking a column)."""


@dataclass
class PairsJob:
    pairs: str
    out: str | None = None
    image: str = "image"  # column with an image path, URI or bytes (relative paths: from the file's folder)
    caption: str = "caption"
    backbone: str = "smoke"
    metrics: list[str] = field(default_factory=lambda: ["depict", "vqascore"])
    generator: str | None = None
    questions: str | None = None  # optional file of caption, question[, question_set, question_id, parents]
    root: str | None = None  # the answer store is <root>/store (default: outputs/, like the sweep)
    executor: str = "auto"
    strict: bool = False
    overrides: list[str] = field(default_factory=list)  # any other sweep config keys

    @property
    def out_dir(self) -> str:
        if self.out:
            return absolute_path(self.out)
        path = Path(absolute_path(self.pairs))
        return str(path.with_name(path.name.split(".")[0] + ".depict"))


def read_table_file(path: str, what: str) -> pl.DataFrame:
    """A CSV (every column read as text), JSON Lines or Parquet file, local or any fsspec URL."""
    suffix = next((s for s in FORMATS if path.lower().endswith(s)), None)
    if suffix is None:
        raise PairsFileError(f"{what} {path}: unknown format; expected one of {sorted(FORMATS)}")
    if not exists(path):
        raise PairsFileError(f"{what} {path}: no such file")
    data = read_bytes(path)
    try:
        if FORMATS[suffix] == "csv":
            return pl.read_csv(data, infer_schema=False)
        if FORMATS[suffix] == "jsonl":
            return pl.read_ndjson(data)
        return pl.read_parquet(data)
    except Exception as exc:  # polars raises several error types for malformed files
        raise PairsFileError(f"{what} {path}: cannot read as {FORMATS[suffix]}: {exc}") from exc


def read_pairs_file(path: str, image: str, caption: str) -> pl.DataFrame:
    """The pairs file with its image column checked and relative paths made absolute
    (relative to the file's folder, so a file and its images can move together)."""
    frame = read_table_file(path, "pairs file")
    for column, key in ((image, "image"), (caption, "caption")):
        if column not in frame.columns:
            raise PairsFileError(f"pairs file {path}: no column {column!r} (columns: {frame.columns}); set {key}=<column>")
    kind = frame.schema[image]
    if kind == pl.String:
        folder = posixpath.dirname(absolute_path(path))
        frame = frame.with_columns(
            pl.col(image).map_elements(lambda p: _resolve(folder, p), return_dtype=pl.String)
        )
    elif kind != pl.Binary:
        raise PairsFileError(f"pairs file {path}: column {image!r} has type {kind}; expected paths/URIs (text) or image bytes")
    return frame


def run_pairs(job: PairsJob) -> tuple[pl.DataFrame, str]:
    """Score the file; returns the per-row scores and the summary text (also written)."""
    pairs = read_pairs_file(absolute_path(job.pairs), job.image, job.caption)
    questions = read_table_file(job.questions, "questions file") if job.questions else None
    scorer = Scorer(
        job.backbone, metrics=job.metrics, generator=job.generator, root=job.root, executor=job.executor, overrides=job.overrides
    )
    out = job.out_dir
    start = time.perf_counter()
    scores, records = scorer.score(
        pairs, image_column=job.image, caption_column=job.caption, questions=questions, records=True, strict=job.strict, out_dir=out
    )
    scores = scores.rename({"image": job.image, "caption": job.caption})  # the file's own column names
    write_table(f"{out}/pair_scores.parquet", scores.to_arrow())
    write_bytes_atomic(f"{out}/pair_scores.csv", _flat(scores).write_csv().encode())
    write_table(f"{out}/pair_records.parquet", records.to_arrow())
    summary = summary_text(job, scorer, scores, out)
    write_bytes_atomic(f"{out}/summary.txt", summary.encode())
    write_json(
        f"{out}/manifest.json",
        {
            "pairs": job.pairs, "out": out, "backbone": job.backbone, "metrics": job.metrics, "store": scorer.store,
            "executor": scorer.last.executor, "config": scorer.cfg.to_dict(), "stages": [r.as_row() for r in scorer.last.reports],
            "rows": scores.height, "errors": int(scores["error"].is_not_null().sum()),
            "seconds": round(time.perf_counter() - start, 3), "git_commit": git_commit(), "versions": library_versions(),
            "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        },
    )
    scorer.close()
    return scores, summary


def summary_text(job: PairsJob, scorer: Scorer, scores: pl.DataFrame, out: str) -> str:
    last = scorer.last
    n_bad = int(scores["error"].is_not_null().sum())
    lines = [f"pairs: {job.pairs}   ({scores.height} rows, {scores.height - n_bad} scored, {n_bad} with errors; backbone {job.backbone}, {last.executor} executor)"]
    notes = {b.note for b in scorer.cfg.backbones.values() if b.note}
    lines += [f"NOTE: {n}" for n in sorted(notes)]
    lines += ["", f"{'stage':<10} {'unit':<16} {'needed':>8} {'cached':>8} {'sent':>8} {'failed':>7} {'seconds':>8}"]
    for r in last.reports:
        lines.append(f"{r.stage:<10} {r.unit:<16} {r.needed:>8} {r.cached:>8} {r.sent:>8} {r.failed:>7} {r.seconds:>8.1f}")
    lines.append("")
    for metric in job.metrics:
        values = scores[metric].drop_nulls().drop_nans() if metric in scores.columns else pl.Series([], dtype=pl.Float64)
        if values.len():
            lines.append(f"{metric:<24} n={values.len():<6} mean {values.mean():.3f}  median {values.median():.3f}  min {values.min():.3f}  max {values.max():.3f}")
        else:
            lines.append(f"{metric:<24} n=0")
    if n_bad:
        counts = scores.filter(pl.col("error").is_not_null()).group_by("error").len().sort("error")
        lines.append("errors: " + ", ".join(f"{r['error']}: {r['len']}" for r in counts.iter_rows(named=True)) + "  (see error_detail)")
    else:
        lines.append("errors: none")
    lines += ["", f"outputs: {out}/  (pair_scores.parquet/.csv, pair_records.parquet, summary.txt, manifest.json)",
              f"explore: python jobs/explore.py run={out}", f"answer cache: {scorer.store}/"]
    return "\n".join(lines)


def _flat(frame: pl.DataFrame) -> pl.DataFrame:
    """CSV cannot hold lists or bytes: lists joined with ';', bytes dropped."""
    frame = frame.with_columns([pl.col(c).list.join(";") for c, t in frame.schema.items() if isinstance(t, pl.List) and t.inner == pl.String])
    return frame.select([c for c, t in frame.schema.items() if t not in (pl.Binary,) and not isinstance(t, (pl.List, pl.Struct))])


def _resolve(folder: str, path: str | None) -> str | None:
    if path is None or not path.strip() or "://" in path or path.startswith("/"):
        return path
    if "://" in folder:
        return f"{folder}/{path}"
    return posixpath.normpath(posixpath.join(folder, os.path.expanduser(path)))
