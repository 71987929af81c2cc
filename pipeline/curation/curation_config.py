"""What a curation run is told: inputs, shard columns, the decision rule's settings and the
windows, on top of a sweep configuration; validated before any work, and fingerprinted so that
a change in scoring settings (not in the rule) processes the shards again."""
from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from operators.hashing import digest
from pipeline.config import NO_QUESTIONS_FILE, ConfigError, ResolvedConfig, SweepConfig, load_config
from pipeline.curation.shards import CHANGE_DETECTION
from pipeline.store.fs import absolute_path


@dataclass
class ShardColumns:
    """Column names in Parquet shards (WebDataset: `caption` is the .json field read when a
    sample has no .txt member)."""

    image: str = "image"  # binary image bytes, a path/URI string, or a {bytes, path} struct
    caption: str = "caption"
    # Optional Parquet column holding a content hash of each referenced image (e.g. DataComp's
    # sha256): such images are not read at ingest. Trusted as given; ignored for embedded bytes.
    image_hash: str | None = None



@dataclass
class CurationConfig(SweepConfig):
    """A sweep configuration plus what curation needs: inputs, columns, the decision rule."""

    # Globs, folders or files, local or s3://...; one string is one pattern.
    inputs: Any = field(default_factory=list)
    columns: ShardColumns = field(default_factory=ShardColumns)
    # How a changed shard is recognised: stat = (size, ETag or mtime); content = (size, hash of the bytes).
    detect_changes: str = "stat"
    metric: str = "depict"  # the score the decision reads
    min_score: float | None = 0.5  # keep rows scoring at least this
    top_fraction: float | None = None  # keep the best fraction of each shard's scored rows
    decide_only: bool = False  # re-apply the rule to stored scores; no model work
    # Also process again the shards whose rows failed last time (e.g. images repaired since):
    # their answers come from the cache, so only the failed rows cost model work.
    retry_failed: bool = False
    # Windows: the night is processed in groups of whole shards, each read, scored, published
    # and recorded in the manifest before the next (null: no limit of that kind).
    window_shards: int | None = None
    window_gb: float | None = 2.0  # input bytes per window
    # input rows per window: what bounds the driver's memory (small-image shards fit a million
    # pairs in 2 GB). Parquet footers and local tar headers give exact counts, else estimated.
    window_pairs: int | None = 100_000
    output: str = "${root}/curation/${name}"
    # A file labelling input rows match / mismatch kind (pipeline/curation/truth.py): the run's
    # report then says how right each metric's keep decisions are. Not part of scoring.
    truth: str | None = None
    metrics: list[str] = field(default_factory=lambda: ["depict"])
    target: str = "${metric}"  # the sweep's meta-evaluation target; curation has none
    baselines: list[str] = field(default_factory=list)



def load_curation_config(args: Sequence[str] = (), conf_dir: Path | str | None = None, overrides: dict | None = None) -> ResolvedConfig:
    """Resolve `curation=<preset> key=value ...` (presets in conf/curation/) and validate it."""
    try:
        cfg = load_config(args, conf_dir, overrides, schema=CurationConfig, preset_key="curation")
    except ConfigError as exc:
        if exc.key == "target":  # target is ${metric} here: name the key the user wrote
            raise ConfigError("metric", str(exc).split(": ", 1)[1]) from None
        raise
    c: CurationConfig = cfg.sweep  # type: ignore[assignment]
    raw = c.inputs if isinstance(c.inputs, (list, tuple)) else [c.inputs] if c.inputs else []
    if not all(isinstance(p, str) and p.strip() for p in raw):
        raise ConfigError("inputs", f"expected globs, folders or files (strings), got {raw!r}")
    c.inputs = [_absolute(p) for p in raw]
    c.output = _absolute(c.output)
    if c.truth is not None:
        if not (isinstance(c.truth, str) and c.truth.strip()):
            raise ConfigError("truth", f"must name a file (shard, row, label columns) or be null, got {c.truth!r}")
        c.truth = _absolute(c.truth)
    validate_curation(cfg)
    return cfg



def _absolute(path: str) -> str:
    """Local paths become absolute (Ray workers run elsewhere); a trailing slash is kept."""
    absolute = absolute_path(path)
    if "://" in path or not path.endswith("/") or absolute == "/":
        return absolute
    return absolute + "/"


def validate_curation(cfg: ResolvedConfig) -> None:
    c: CurationConfig = cfg.sweep  # type: ignore[assignment]
    if not c.decide_only and not c.inputs:
        raise ConfigError("inputs", "no input shards configured (e.g. inputs=[s3://bucket/incoming/*.parquet])")
    if c.questions.source == "file" and not c.decide_only and not (isinstance(c.questions.file, str) and c.questions.file.strip()):
        raise ConfigError("questions.file", NO_QUESTIONS_FILE)
    if c.questions.source == "benchmark":
        raise ConfigError("questions.source", "curation reads no benchmark, so none ships questions: use model (a generator "
                                              "writes them) or file (questions.file=PATH, QUESTIONS rows keyed by caption)")
    if len(c.backbones) != 1:
        raise ConfigError("backbones", f"curation scores with exactly one backbone, got {list(c.backbones)}")
    if c.metric not in c.metrics:
        raise ConfigError("metric", f"{c.metric!r} is not among the computed metrics {list(c.metrics)}")
    if c.min_score is not None and not math.isfinite(c.min_score):
        raise ConfigError("min_score", f"must be a finite number or null, got {c.min_score}")
    if c.top_fraction is not None and not 0.0 < c.top_fraction <= 1.0:
        raise ConfigError("top_fraction", f"must be in (0, 1] or null, got {c.top_fraction}")
    if c.window_shards is not None and c.window_shards < 1:
        raise ConfigError("window_shards", f"must be at least 1 or null, got {c.window_shards}")
    if c.window_gb is not None and not c.window_gb > 0:
        raise ConfigError("window_gb", f"must be positive or null, got {c.window_gb}")
    if c.window_pairs is not None and (isinstance(c.window_pairs, bool) or not isinstance(c.window_pairs, int) or c.window_pairs < 1):
        raise ConfigError("window_pairs", f"must be a whole number of at least 1 or null, got {c.window_pairs!r}")
    if c.detect_changes not in CHANGE_DETECTION:
        raise ConfigError("detect_changes", f"must be one of {CHANGE_DETECTION}, got {c.detect_changes!r}")
    for key in ("image", "caption"):
        if not getattr(c.columns, key).strip():
            raise ConfigError(f"columns.{key}", "must name a column")
    if c.columns.image_hash is not None and not (isinstance(c.columns.image_hash, str) and c.columns.image_hash.strip()):
        raise ConfigError("columns.image_hash", "must name a column, or be null")



def scoring_fingerprint(cfg: ResolvedConfig) -> str:
    """Hash of everything that changes a shard's stored scores (not the decision rule): a
    shard processed under another fingerprint is processed again (cached answers are free)."""
    s: CurationConfig = cfg.sweep  # type: ignore[assignment]
    q = s.questions
    backbone = cfg.backbones[s.backbones[0]]
    parts = {
        "backbone": [backbone.name, backbone.fingerprint()],
        "metrics": sorted(s.metrics),
        "lam": s.lam,
        "probability": s.probability,
        "prompts": {name: cfg.prompts.prompt_id(name) for name in sorted(cfg.prompts.templates)},
        "questions": {
            "source": q.source,
            "sets": sorted(s.required_question_sets()),
            "max_questions": q.max_questions,
            "generator": [q.generator, cfg.backbones[q.generator].fingerprint()] if q.source == "model" and not q.per_backbone else None,
        },
        "columns": [s.columns.image, s.columns.caption] + ([s.columns.image_hash] if s.columns.image_hash else []),
    }
    if q.source == "file":  # only then: the other sources' fingerprints stay what they were
        # the file by its path, not its bytes: a night that adds questions for new captions to
        # the same file does not score every processed shard again (docs/curation.md)
        parts["questions"]["file"] = q.file
    return digest(json.dumps(parts, sort_keys=True).encode())[:16]

