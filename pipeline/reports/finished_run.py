"""A finished sweep run, read back from its directory (local path or s3:// prefix).

Reports never rerun a model: everything they show comes from the files a sweep wrote
(docs/DESIGN.md, "Files"). `open_run` reads them once into a typed `Run`; per-question
records, which can be large, are read lazily per backbone. What the run holds decides
what the reports show: backbones are those with a scores file, benchmarks those with
items. A malformed file raises naming the file and the missing columns; a row with a
missing key field is skipped and listed in `Run.problems`, never read as a 0. A run that is
not marked finished, or whose files are not the ones its manifest lists, is refused
(`pipeline.store.run_folder.RunNotFinished`): reports never mix two runs.
"""
from __future__ import annotations

import math
import posixpath
import re
from dataclasses import dataclass, field, fields

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from operators import schema
from pipeline.config import ProtocolSpec
from pipeline.metaeval import DELTAS_SCHEMA, DIAGNOSTIC_METRICS, STATISTICS_SCHEMA
from pipeline.store.run_folder import Outputs, read_manifest, require_finished

_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([bBmM]?)")


@dataclass(frozen=True)
class BackboneInfo:
    name: str
    family: str = ""
    size: str = ""
    note: str = ""

    @property
    def size_value(self) -> float:
        """Parameters in billions parsed from `size` ("27B", "E4B" -> 4, "350M" -> 0.35); inf if unknown."""
        match = _SIZE.search(self.size)
        if not match:
            return math.inf
        value = float(match.group(1))
        return value / 1000 if match.group(2).lower() == "m" else value


@dataclass(frozen=True)
class BenchmarkInfo:
    name: str
    protocol: ProtocolSpec

    @property
    def kind(self) -> str:
        return self.protocol.kind

    @property
    def primary(self) -> str:
        return self.protocol.primary_statistic


@dataclass
class Run:
    url: str
    name: str
    backbones: dict[str, BackboneInfo]  # with a scores file, in sweep order
    benchmarks: dict[str, BenchmarkInfo]  # with items, in sweep order
    metrics: list[str]  # every metric the sweep computed (diagnostics excluded)
    target: str
    baselines: list[str]
    lam: float
    n_resamples: int
    seed: int
    items: pl.DataFrame
    scores: pl.DataFrame
    statistics: pl.DataFrame
    deltas: pl.DataFrame
    errors: pl.DataFrame
    problems: list[str] = field(default_factory=list)
    outputs: Outputs | None = field(default=None, repr=False)
    manifest: dict = field(default_factory=dict, repr=False)  # manifest.json as read (config, git_commit, ...)
    _records: dict[str, pl.DataFrame | None] = field(default_factory=dict, repr=False)
    _questions: pl.DataFrame | None = field(default=None, repr=False)

    def path(self, *parts: str) -> str:
        return "/".join([self.url, *parts])

    def records(self, backbone: str) -> pl.DataFrame | None:
        """Per-(item, question) answers of `backbone`, or None if the run stored none."""
        if backbone not in self._records:
            outputs = self.outputs or Outputs(self.url, {})
            rel = f"records/{backbone}.parquet"
            frame = None
            if outputs.exists(rel):
                frame = _read(outputs, rel, ["item_id", "caption", "question_set", "question", "logp_yes_t", "logp_no_t"])
            self._records[backbone] = frame
        return self._records[backbone]

    def questions(self) -> pl.DataFrame:
        """The run's questions (`questions.parquet`: caption, question_set, question_id, question)."""
        if self._questions is None:
            self._questions = _read(self.outputs or Outputs(self.url, {}), "questions.parquet", ["caption", "question_set", "question_id", "question"])
        return self._questions

    def ladder_order(self) -> list[str]:
        """Backbones grouped by family (families in sweep order), smallest first within one."""
        families = list(dict.fromkeys(b.family for b in self.backbones.values()))
        return sorted(self.backbones, key=lambda n: (families.index(self.backbones[n].family), self.backbones[n].size_value, n))


def open_run(url: str) -> Run:
    """Read the run directory at `url` (a local path or any fsspec URL such as s3://...)."""
    url = url.rstrip("/")
    if "://" not in url:
        url = posixpath.abspath(url)
    manifest_url = f"{url}/manifest.json"
    manifest = read_manifest(url)
    require_finished(url, manifest)
    outputs = Outputs(url, manifest)
    config = manifest.get("config") or {}
    sweep = config.get("sweep") or {}
    problems: list[str] = []
    if manifest.get("outputs") is None:
        problems.append(f"{manifest_url} lists no outputs (written before runs recorded them): its files could not be checked to belong to one run")

    items = _read(outputs, "items.parquet", ["item_id", "benchmark", "group_id"])
    items = _drop_null_keys(items, ["item_id", "benchmark"], f"{url}/items.parquet", problems)
    scores = _read_scores(outputs, problems)
    statistics = _read_optional(outputs, "statistics.parquet", STATISTICS_SCHEMA, problems)
    deltas = _read_optional(outputs, "deltas.parquet", DELTAS_SCHEMA, problems)
    errors = _table(outputs, "errors.parquet") if outputs.exists("errors.parquet") else pl.from_arrow(schema.ERRORS.empty_table())

    backbone_cfg = config.get("backbones") or {}
    present = list(dict.fromkeys(scores["backbone"].to_list()))
    ordered = [b for b in sweep.get("backbones", []) if b in present] + sorted(set(present) - set(sweep.get("backbones", [])))
    backbones = {name: _backbone_info(name, backbone_cfg.get(name) or {}) for name in ordered}

    benchmark_cfg = config.get("benchmarks") or {}
    in_items = list(dict.fromkeys(items["benchmark"].to_list()))
    benchmarks = {}
    for name in [b for b in sweep.get("benchmarks", []) if b in in_items] + sorted(set(in_items) - set(sweep.get("benchmarks", []))):
        if name not in benchmark_cfg:
            problems.append(f"{manifest_url}: benchmark {name!r} has items but no protocol in config.benchmarks; left out")
            continue
        benchmarks[name] = BenchmarkInfo(name, _protocol(benchmark_cfg[name].get("protocol") or {}))

    bootstrap = sweep.get("bootstrap") or {}
    return Run(
        url=url,
        name=str(sweep.get("run_name") or posixpath.basename(url)),
        backbones=backbones,
        benchmarks=benchmarks,
        metrics=[m for m in sweep.get("metrics", []) if m not in DIAGNOSTIC_METRICS],
        target=sweep.get("target", "depict"),
        baselines=list(sweep.get("baselines", [])),
        lam=float(sweep.get("lam", 0.5)),
        n_resamples=int(bootstrap.get("n_resamples", 2000)),
        seed=int(bootstrap.get("seed", 0)),
        items=items,
        scores=scores,
        statistics=statistics,
        deltas=deltas,
        errors=errors,
        problems=problems,
        outputs=outputs,
        manifest=manifest,
    )


def _backbone_info(name: str, cfg: dict) -> BackboneInfo:
    return BackboneInfo(name=name, family=str(cfg.get("family") or ""), size=str(cfg.get("size") or ""), note=str(cfg.get("note") or ""))


def _protocol(cfg: dict) -> ProtocolSpec:
    known = {f.name for f in fields(ProtocolSpec)}
    return ProtocolSpec(**{k: v for k, v in cfg.items() if k in known})


def _table(outputs: Outputs, rel: str) -> pl.DataFrame:
    """One Parquet file of the run, checked against the manifest before it is parsed."""
    return pl.from_arrow(pq.read_table(pa.BufferReader(outputs.read(rel))))


def _read(outputs: Outputs, rel: str, required: list[str]) -> pl.DataFrame:
    url = outputs.url(rel)
    frame = _table(outputs, rel)
    missing = [c for c in required if c not in frame.columns]
    if missing:
        raise ValueError(f"{url}: missing column(s) {missing}; have {frame.columns}")
    return frame


def _drop_null_keys(frame: pl.DataFrame, keys: list[str], url: str, problems: list[str]) -> pl.DataFrame:
    """Rows with a null key field are reported (file, row, field) and skipped."""
    bad = frame.with_row_index("_row").filter(pl.any_horizontal(pl.col(k).is_null() for k in keys))
    for row in bad.head(5).iter_rows(named=True):
        empty = [k for k in keys if row[k] is None]
        problems.append(f"{url}: row {row['_row']} has no {', '.join(empty)}; skipped")
    if bad.height > 5:
        problems.append(f"{url}: {bad.height - 5} more row(s) with a missing key field skipped")
    return frame.filter(pl.all_horizontal(pl.col(k).is_not_null() for k in keys)) if bad.height else frame


def _read_scores(outputs: Outputs, problems: list[str]) -> pl.DataFrame:
    names = outputs.names("scores", ".parquet")
    if not names:
        raise FileNotFoundError(f"{outputs.url('scores')}/ holds no <backbone>.parquet file: the run scored nothing")
    frames = []
    for rel in names:
        file_url = outputs.url(rel)
        frame = _read(outputs, rel, list(schema.SCORES.names))
        frame = pl.from_arrow(schema.conform(frame.to_arrow(), schema.SCORES, what=file_url))
        frames.append(_drop_null_keys(frame, ["item_id", "benchmark", "backbone", "metric"], file_url, problems))
    return pl.concat(frames)


def _read_optional(outputs: Outputs, rel: str, columns: dict, problems: list[str]) -> pl.DataFrame:
    """statistics / deltas: an empty table if absent or column-less (a run without benchmarks)."""
    url = outputs.url(rel)
    if not outputs.exists(rel):
        problems.append(f"{url} not found: tables that need it are left out")
        return pl.DataFrame(schema=columns)
    frame = _table(outputs, rel)
    if frame.width == 0:
        return pl.DataFrame(schema=columns)
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise ValueError(f"{url}: missing column(s) {missing}; have {frame.columns}")
    frame = frame.select([pl.col(c).cast(t) for c, t in columns.items()])
    keys = [c for c in ("benchmark", "backbone", "metric", "subset", "statistic") if c in columns]
    return _drop_null_keys(frame, keys, url, problems)
