"""Score your own (image, caption) pairs from Python, in three lines:

    from pipeline import Scorer
    scorer = Scorer("qwen3_5-4b", metrics=["depict", "vqascore"])
    scores = scorer(images=["bus.jpg", "cats.png"], texts=["a red bus", "two cats on a sofa"])

This is the sweep's scoring half (`pipeline.scoring.score_items_all_backbones`), not a
second scoring path: the same stages, prompts, formulas and content-addressed answer
store, so a pair scored here is never asked again by a sweep or curation run with the
same store, and vice versa. Small inputs run in this process (`pipeline.stages.executor`, no
Ray, the model loaded once and kept by the scorer); large ones go through Ray Data.

Images decode exactly as files do, whatever form they come in: a PIL image goes through
the file path's own decoding (`operators.images.upright_rgb`: EXIF orientation, every pixel
mode a file may have) before it is stored, so a phone photo is the same upright picture as
a path, bytes or PIL image.

Bad input never raises by default: a missing file, a corrupt image or an empty caption
becomes a row with `error` and `error_detail` and null scores. `strict=True` raises
`PairErrors` instead.

A scorer may be called from several threads (a notebook, a web service): calls take turns
on its model, each returning its own result.
"""
from __future__ import annotations

import io
import logging
import math
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import polars as pl
import pyarrow as pa

from operators import schema
from operators.metrics.decomposed import question_table
from pipeline.config import ConfigError, ResolvedConfig, load_config, refuse_non_writers
from pipeline.scoring import Timings, score_items_all_backbones
from pipeline.stages import ingest
from pipeline.stages.engine_stage import StageReport
from pipeline.stages.executor import LocalExecutor, running_locally
from pipeline.store.fs import absolute_path, exists, join_url, read_table, write_table

log = logging.getLogger(__name__)

EXECUTORS = ("auto", "local", "ray")
BENCHMARK = "pairs"  # the items table's benchmark name for user pairs


class PairErrors(ValueError):
    """Strict mode: some pairs could not be scored; `errors` lists them (row, field, reason)."""

    def __init__(self, errors: pl.DataFrame):
        self.errors = errors
        first = errors.head(5).iter_rows(named=True)
        lines = [f"row {r['row']}: {r['reason']} ({r['detail']})" for r in first]
        more = f"; and {errors.height - 5} more" if errors.height > 5 else ""
        super().__init__(f"{errors.height} pair(s) could not be scored: " + "; ".join(lines) + more)


@dataclass
class LastRun:
    """What the latest call did: stage counts (needed/cached/sent), errors and timings."""

    executor: str
    reports: list[StageReport] = field(default_factory=list)
    errors: pl.DataFrame = field(default_factory=lambda: pl.from_arrow(schema.ERRORS.empty_table()))
    timings: Timings = field(default_factory=Timings)

    @property
    def sent(self) -> int:
        """Requests handed to a model by this call (0: everything came from the cache)."""
        return sum(r.sent for r in self.reports if r.stage != "ingest")

    def report_table(self) -> pl.DataFrame:
        return pl.DataFrame([r.as_row() for r in self.reports]) if self.reports else pl.DataFrame()


@dataclass
class Pairs:
    """User input normalised: one row per pair (row, image_uri, caption) plus the error
    rows of pairs that never reached ingest, and the input's own extra columns."""

    frame: pl.DataFrame  # row, image (as given, printable), image_uri, caption
    extra: pl.DataFrame | None  # the input frame's other columns, by row
    errors: list[dict]


class Scorer:
    """One backbone, any metric ids, the shared answer cache.

    backbone: a name in conf/backbones/ (e.g. "qwen3_5-4b"; "smoke" is a tiny random-weight
    model for trying things out). metrics: any metric ids the sweep accepts. generator:
    the backbone that writes questions (default: `backbone`); or pass `questions=` to
    `score`. root: where the answer store lives (`<root>/store`, shared with `jobs/sweep.py
    root=...`). executor: "local" (this process), "ray", or "auto" (local up to
    `local_max_pairs` pairs and without evidence checks). overrides: any other config
    keys, as the command line writes them (["lam=0.3", "backbone_overrides.x.batch_size=8"]).

    Thread-safe: calls from several threads run one at a time (the in-process workers and
    engine, and `last`, are this scorer's single copies); inputs are read and stored first,
    outside the turn.
    """

    def __init__(
        self,
        backbone: str = "smoke",
        metrics: Sequence[str] = ("depict", "vqascore"),
        *,
        generator: str | None = None,
        root: str | os.PathLike | None = None,
        executor: str = "auto",
        local_max_pairs: int = 256,
        strict: bool = False,
        overrides: Sequence[str] = (),
    ):
        if executor not in EXECUTORS:
            raise ValueError(f"executor must be one of {EXECUTORS}, got {executor!r}")
        args = [f"backbones=[{backbone}]", f"questions.generator={generator or backbone}", *overrides]
        if root is not None:
            args.append(f"root={os.fspath(root)}")
        metric_list = list(metrics)
        if not metric_list:
            raise ConfigError("metrics", "no metric requested")
        self.cfg: ResolvedConfig = load_config(
            args, preset_key="api", overrides={"metrics": metric_list, "target": metric_list[0]}
        )
        self.backbone = backbone
        self.metrics = metric_list
        self.executor = executor
        self.local_max_pairs = local_max_pairs
        self.strict = strict
        self.last: LastRun | None = None
        self._local = LocalExecutor()
        self._lock = threading.RLock()  # one call at a time uses the engine, workers and `last`

    @property
    def store(self) -> str:
        return self.cfg.sweep.store

    def __repr__(self) -> str:
        b = self.cfg.backbones[self.backbone]
        return f"Scorer({self.backbone!r}: {b.model_id} on {b.engine}, metrics={self.metrics}, store={self.store!r}, executor={self.executor!r})"

    def __call__(self, images: Any = None, texts: Any = None, **kwargs) -> pl.DataFrame | tuple[pl.DataFrame, pl.DataFrame]:
        """`scorer(images=..., texts=...)`: the same as `score`."""
        return self.score(images, texts, **kwargs)

    def score(
        self,
        images: Any = None,
        captions: Any = None,
        *,
        questions: Any = None,
        records: bool = False,
        cross: bool = False,
        image_column: str = "image",
        caption_column: str = "caption",
        strict: bool | None = None,
        out_dir: str | None = None,
    ) -> pl.DataFrame | tuple[pl.DataFrame, pl.DataFrame]:
        """Scores of (image, caption) pairs: one row per pair, in input order.

        images: a path, URI, bytes or PIL image, a list of them, or a polars/pandas frame
        with `image_column` and `caption_column` (its other columns are kept).
        captions: a string or a list; with equal lengths pairs are zipped, a single image or
        caption is paired with every caption or image, `cross=True` scores every image with
        every caption. questions: {caption: [question, ...]}, or a frame with caption,
        question (and optionally question_set, question_id, parents), used instead of the
        generator. records=True also returns the per-question table (p_v, p_t, commitment,
        agreement). out_dir: keep the run's tables there (a run folder the explorer reads).
        """
        strict = self.strict if strict is None else strict
        pairs = to_pairs(images, captions, cross=cross, image_column=image_column, caption_column=caption_column, images_url=join_url(self.store, "images"))
        keep = out_dir is not None
        run_dir = out_dir or tempfile.mkdtemp(prefix="depict-api-")
        try:
            with self._lock:
                scores, recs = self._run(pairs, questions, run_dir)
        finally:
            if not keep:
                shutil.rmtree(run_dir, ignore_errors=True)
        if strict:
            bad = scores.filter(pl.col("error").is_not_null()).select("row", pl.col("error").alias("reason"), pl.col("error_detail").alias("detail"))
            if bad.height:
                raise PairErrors(bad)
        return (scores, recs) if records else scores

    def close(self) -> None:
        """Release the in-process model (it is loaded again on the next local call); waits
        for a call in progress in another thread."""
        with self._lock:
            self._local.close()

    # -- internals ---------------------------------------------------------------------------

    def _config_for(self, shipped: pl.DataFrame | None) -> ResolvedConfig:
        if shipped is None:
            return self.cfg
        questions = replace(self.cfg.sweep.questions, source="benchmark")
        return replace(self.cfg, sweep=replace(self.cfg.sweep, questions=questions))

    def _choose_executor(self, n_pairs: int, cfg: ResolvedConfig) -> str:
        evidence = cfg.sweep.needs_grounding()
        if self.executor == "local" and evidence:
            raise ValueError("evidence checks (grounding, views) run on Ray: use executor='ray' or 'auto'")
        if self.executor != "auto":
            return self.executor
        return "ray" if evidence or n_pairs > self.local_max_pairs else "local"

    def _run(self, pairs: Pairs, questions: Any, run_dir: str) -> tuple[pl.DataFrame, pl.DataFrame]:
        shipped = user_questions(questions) if questions is not None else None
        cfg = self._config_for(shipped)
        if shipped is None:
            refuse_non_writers(cfg)
        items = pairs_items(pairs.frame)
        chosen = self._choose_executor(items.height, cfg)
        last = LastRun(executor=chosen)
        self.last = last
        error_tables = [_errors(pairs.errors)]
        t_start = time.perf_counter()
        if chosen == "ray":
            from pipeline.runtime import ensure_ray, refuse_unshared_paths

            c = cfg.sweep.compute
            ensure_ray(c.address, c.num_cpus, c.progress_bars)
            refuse_unshared_paths({"root": cfg.sweep.root, "store": self.store}, c.shared_paths)
            scored = self._score(items, shipped, cfg, run_dir, last, error_tables)
        else:
            with running_locally(self._local):
                scored = self._score(items, shipped, cfg, run_dir, last, error_tables)
        errors = pl.from_arrow(schema.concat_errors(error_tables))
        last.errors = errors
        last.timings["total"] = time.perf_counter() - t_start
        write_table(f"{run_dir}/errors.parquet", errors.to_arrow())
        records = self._records(run_dir, pairs.frame, cfg)
        return wide_scores(pairs, scored, errors, self.metrics), records

    def _score(self, items: pl.DataFrame, shipped, cfg: ResolvedConfig, run_dir: str, last: LastRun, error_tables: list) -> pl.DataFrame:
        with last.timings("ingest"):
            items, report, errors = ingest.prepare_items(items)
            last.reports.append(report)
            error_tables += errors
            write_table(f"{run_dir}/items.parquet", schema.conform(items.to_arrow(), schema.ITEMS))
        if items.height == 0:
            return pl.from_arrow(schema.SCORES.empty_table())
        scored = score_items_all_backbones(items, shipped, cfg, run_dir, last.timings)
        last.reports += scored.reports
        error_tables += scored.errors
        return scored.scores

    def _records(self, run_dir: str, pairs: pl.DataFrame, cfg: ResolvedConfig) -> pl.DataFrame:
        url = f"{run_dir}/records/{self.backbone}.parquet"
        if not exists(url):
            return pl.DataFrame(schema={"row": pl.Int64, "question_set": pl.String, "question": pl.String})
        recs = question_table(pl.from_arrow(read_table(url)), cfg.sweep.probability)
        recs = recs.with_columns(row=pl.col("item_id").cast(pl.Int64)).drop("item_id")
        return recs.select("row", *[c for c in recs.columns if c != "row"]).sort("row", "question_set", "question_id")


# -- input normalisation ------------------------------------------------------------------------


def to_pairs(images: Any, captions: Any, *, cross: bool, image_column: str, caption_column: str, images_url: str) -> Pairs:
    """Any supported input -> one row per pair; images given as bytes or PIL are written
    content-addressed under `images_url` (as curation does with embedded images)."""
    extra = None
    if _is_frame(images):
        if captions is not None:
            raise ValueError("pass either a frame (with image and caption columns) or images and captions, not both")
        frame = images if isinstance(images, pl.DataFrame) else _from_pandas(images, image_column)
        for column in (image_column, caption_column):
            if column not in frame.columns:
                raise ValueError(f"the frame has no column {column!r} (columns: {frame.columns}); set image_column= / caption_column=")
        image_list, caption_list = frame[image_column].to_list(), frame[caption_column].to_list()
        rest = [c for c in frame.columns if c not in (image_column, caption_column)]
        extra = frame.select(rest).with_row_index("row").with_columns(pl.col("row").cast(pl.Int64)) if rest else None
    else:
        image_list, caption_list = _as_list(images, "images"), _as_list(captions, "captions")
        if cross:
            image_list, caption_list = [i for i in image_list for _ in caption_list], [c for _ in image_list for c in caption_list]
        elif len(image_list) == 1 and len(caption_list) > 1:
            image_list = image_list * len(caption_list)
        elif len(caption_list) == 1 and len(image_list) > 1:
            caption_list = caption_list * len(image_list)
        elif len(image_list) != len(caption_list):
            raise ValueError(f"{len(image_list)} images and {len(caption_list)} captions: give equal numbers, one of either, or cross=True")
    folder = None
    rows, errors = [], []
    for i, (image, caption) in enumerate(zip(image_list, caption_list, strict=True)):
        shown = _describe(image)
        uri, problem = None, None
        try:
            if isinstance(image, (bytes, bytearray)) or _is_pil(image):
                from pipeline.store.folder import Folder, extract_image

                folder = folder or Folder(images_url)
                uri = extract_image(folder, bytes(image) if isinstance(image, (bytes, bytearray)) else _pil_png(image, shown))
            elif isinstance(image, (str, os.PathLike)) and os.fspath(image).strip():
                uri = absolute_path(os.fspath(image))
            elif image is None or (isinstance(image, float) and math.isnan(image)) or (isinstance(image, str) and not image.strip()):
                problem = ("image", "missing_image", "no image given")
            else:
                problem = ("image", "bad_image_type", f"expected a path, URI, bytes or PIL image, got {type(image).__name__}")
        except Exception as exc:  # a PIL image a file could not hold either, a store error: this pair only
            problem = ("image", "unreadable_image", f"{type(exc).__name__}: {exc}")
        text, caption_problem = _caption(caption)
        problem = problem or caption_problem
        if problem is not None:
            field_, reason, detail = problem
            errors.append({"stage": "input", "benchmark": BENCHMARK, "item_id": str(i), "source": shown, "field": field_, "reason": reason, "detail": f"row {i}: {detail}"})
            uri = None
        rows.append({"row": i, "image": shown, "image_uri": uri, "caption": text})
    frame = pl.DataFrame(rows, schema={"row": pl.Int64, "image": pl.String, "image_uri": pl.String, "caption": pl.String})
    return Pairs(frame=frame, extra=extra, errors=errors)


def _caption(value: Any) -> tuple[str | None, tuple[str, str, str] | None]:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None, None  # ingest reports it as empty_caption, like any benchmark's
    if not isinstance(value, str):
        return None, ("caption", "bad_caption_type", f"expected text, got {type(value).__name__}")
    return value, None


def pairs_items(frame: pl.DataFrame) -> pl.DataFrame:
    """The ITEMS table of the pairs that reached ingest (item_id = input row)."""
    usable = frame.filter(pl.col("image_uri").is_not_null())
    items = usable.select(
        pl.col("row").cast(pl.String).alias("item_id"), pl.lit(BENCHMARK).alias("benchmark"), "image_uri", "caption",
        pl.col("row").cast(pl.String).alias("group_id"),
    )
    return pl.from_arrow(schema.conform(items.to_arrow(), schema.ITEMS, what="pairs"))


def user_questions(questions: Any) -> pl.DataFrame:
    """Questions passed by the user -> the QUESTIONS table (question_set depict unless given)."""
    if isinstance(questions, dict):
        rows = []
        for caption, qs in questions.items():
            if isinstance(qs, str) or not isinstance(qs, Sequence):
                raise ValueError(f"questions[{caption!r}] must be a list of questions, got {type(qs).__name__}")
            rows += [{"caption": caption, "question_set": "depict", "question_id": str(k + 1), "question": q} for k, q in enumerate(qs)]
        frame = pl.DataFrame(rows, schema={"caption": pl.String, "question_set": pl.String, "question_id": pl.String, "question": pl.String})
    elif _is_frame(questions):
        frame = questions if isinstance(questions, pl.DataFrame) else pl.from_pandas(questions)
        missing = {"caption", "question"} - set(frame.columns)
        if missing:
            raise ValueError(f"the questions frame lacks column(s) {sorted(missing)} (has {frame.columns})")
        if "question_set" not in frame.columns:
            frame = frame.with_columns(question_set=pl.lit("depict"))
        if "question_id" not in frame.columns:
            frame = frame.with_columns(question_id=(pl.int_range(pl.len()).over("caption", "question_set") + 1).cast(pl.String))
    else:
        raise ValueError(f"questions must be a dict {{caption: [question, ...]}} or a frame, got {type(questions).__name__}")
    frame = frame.with_columns(source=pl.lit("user"))
    if frame.select("caption", "question_set", "question_id").is_duplicated().any():
        raise ValueError("questions: a (caption, question_set, question_id) appears twice")
    return pl.from_arrow(schema.conform(frame.to_arrow(), schema.QUESTIONS, what="questions"))


# -- outputs --------------------------------------------------------------------------------------


def wide_scores(pairs: Pairs, scores: pl.DataFrame, errors: pl.DataFrame, metrics: list[str]) -> pl.DataFrame:
    """One row per input pair: row, image, caption, the input's other columns, one column per
    metric, `note_<metric>` where a metric has notes, and `error`/`error_detail` saying why
    a pair has no scores (its first error, or `no_score`)."""
    out = pairs.frame.select("row", "image", "caption", "image_uri")
    if pairs.extra is not None:
        out = out.join(pairs.extra, on="row", how="left", maintain_order="left")
    scores = scores.with_columns(row=pl.col("item_id").cast(pl.Int64))
    for metric in metrics:
        one = scores.filter(pl.col("metric") == metric)
        out = out.join(one.select("row", pl.col("score").alias(metric)), on="row", how="left", maintain_order="left")
        notes = one.select("row", pl.col("note").alias(f"note_{metric}"))
        if notes[f"note_{metric}"].drop_nulls().len():
            out = out.join(notes, on="row", how="left", maintain_order="left")
    first = (
        errors.filter(pl.col("item_id").is_not_null())
        .unique(subset="item_id", keep="first", maintain_order=True)
        .select(pl.col("item_id").cast(pl.Int64).alias("row"), pl.col("reason").alias("error"), pl.col("detail").alias("error_detail"))
    )
    out = out.join(first, on="row", how="left", maintain_order="left")
    if metrics:
        unscored = pl.all_horizontal([pl.col(m).is_null() | pl.col(m).is_nan() for m in metrics])
        out = out.with_columns(
            error=pl.when(pl.col("error").is_null() & unscored).then(pl.lit("no_score")).otherwise(pl.col("error")),
        )
    return out.sort("row")


def _errors(rows: list[dict]) -> pa.Table:
    return schema.error_table(rows)


# -- small helpers ---------------------------------------------------------------------------------


def _is_frame(value: Any) -> bool:
    if isinstance(value, pl.DataFrame):
        return True
    module = type(value).__module__
    return module.startswith("pandas") and type(value).__name__ == "DataFrame"


def _is_pil(value: Any) -> bool:
    return type(value).__module__.startswith("PIL.") and hasattr(value, "save") and hasattr(value, "size")


def _pil_png(image, shown: str) -> bytes:
    """The PNG of the pixels a file holding `image` decodes to (`upright_rgb`: EXIF
    orientation applied, any mode a file accepts as 8-bit RGB; ImageError, naming the cause,
    for the rest). Without metadata, so the same pixels are always the same bytes."""
    from operators.images import upright_rgb

    buffer = io.BytesIO()
    upright_rgb(image, shown).save(buffer, format="PNG", icc_profile=None)
    return buffer.getvalue()


def _from_pandas(frame, image_column: str) -> pl.DataFrame:
    """A pandas frame as polars; an image column of PIL images (Arrow cannot hold them)
    stays a column of Python objects, as in a polars frame."""
    if image_column in frame.columns and any(_is_pil(v) for v in frame[image_column]):
        rest = pl.from_pandas(frame.drop(columns=[image_column]))
        column = pl.Series(image_column, frame[image_column].tolist(), dtype=pl.Object)
        if not rest.width:
            return pl.DataFrame([column])
        return rest.insert_column(list(frame.columns).index(image_column), column)
    return pl.from_pandas(frame)


def _as_list(value: Any, what: str) -> list:
    if value is None:
        raise ValueError(f"no {what} given")
    if isinstance(value, (str, bytes, bytearray, os.PathLike)) or _is_pil(value):
        return [value]
    if isinstance(value, pl.Series):
        return value.to_list()
    try:
        return list(value)
    except TypeError:
        raise ValueError(f"{what}: expected one value or a list, got {type(value).__name__}") from None


def _describe(image: Any) -> str:
    if isinstance(image, (str, os.PathLike)):
        return os.fspath(image)
    if isinstance(image, (bytes, bytearray)):
        return f"<{len(image)} bytes>"
    if _is_pil(image):
        return f"<PIL image {image.size[0]}x{image.size[1]}, mode {image.mode}>"
    return f"<{type(image).__name__}>"
