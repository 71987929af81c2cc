"""How right a curation's keep decisions are, when the truth of its pairs is known (`truth=PATH`).

A truth file labels input rows: `shard` (the input file's name without its extension, e.g.
`pairs-0000` for pairs-0000.parquet or pairs-0000.tar), `row` (0-based row or sample in it) and
`label` (`match` for a pair whose caption describes its image, anything else names the kind of
mismatch). `jobs/demo_corpus.py` writes one beside its shards; any other labelled corpus can
have one.

Each computed metric is judged as the keep rule the run applies (its `min_score` and
`top_fraction`, per shard) with that metric's score: precision (kept pairs that match),
recall (matching pairs kept), mismatches dropped (overall and per kind), and ROC AUC (a match
scores above a mismatch; per kind: matches against that kind). A row without a score is never
kept, so it counts in precision and recall as dropped and is left out of AUC. Every value comes
with a BCa bootstrap interval over the labelled rows (`bootstrap` settings of the run).
"""
from __future__ import annotations

import io
import logging

import numpy as np
import polars as pl

from pipeline.config import BootstrapSpec
from pipeline.curation.rule import Rule, apply_rule
from pipeline.curation.shards import shard_stem
from pipeline.stats.bootstrap import Interval, group_interval, ratio_statistic
from pipeline.stats.classification import auc_statistic
from pipeline.store.folder import FileError
from pipeline.store.fs import read_bytes

log = logging.getLogger(__name__)

MATCH = "match"
TRUTH_COLUMNS = ("shard", "row", "label")


def read_truth(url: str) -> pl.DataFrame:
    """The truth file's (shard, row, label) rows, checked: a missing or unreadable file, a
    missing column, an empty value or a (shard, row) labelled twice is a FileError naming the
    file (and the row). Parquet, or CSV when the name ends in .csv."""
    try:
        data = read_bytes(url)
    except FileNotFoundError:
        raise FileError(f"{url}: truth file not found (truth=...)") from None
    try:
        frame = pl.read_csv(io.BytesIO(data)) if url.lower().endswith(".csv") else pl.read_parquet(io.BytesIO(data))
    except Exception as exc:  # noqa: BLE001 - polars raises several kinds for a file that is not what it says
        raise FileError(f"{url}: not a readable {'CSV' if url.lower().endswith('.csv') else 'Parquet'} file ({exc})") from exc
    missing = [c for c in TRUTH_COLUMNS if c not in frame.columns]
    if missing:
        raise FileError(f"{url}: lacks column(s) {missing}; a truth file has shard (file name without extension), row and label (match or a mismatch kind)")
    try:
        frame = frame.select(pl.col("shard").cast(pl.String), pl.col("row").cast(pl.Int64), pl.col("label").cast(pl.String))
    except pl.exceptions.PolarsError as exc:
        raise FileError(f"{url}: row must hold whole numbers, shard and label text ({exc})") from None
    for column in TRUTH_COLUMNS:
        empty = frame.with_row_index("_i").filter(pl.col(column).is_null() | (pl.col(column).cast(pl.String).str.strip_chars() == ""))
        if empty.height:
            raise FileError(f"{url}: row {empty['_i'][0]}: {column} is empty ({empty.height} such row(s))")
    repeated = frame.with_row_index("_i").filter(~pl.struct("shard", "row").is_first_distinct())
    if repeated.height:
        first = repeated.row(0, named=True)
        raise FileError(f"{url}: row {first['_i']}: shard {first['shard']!r} row {first['row']} is labelled more than once")
    return frame


def labelled_decisions(truth: pl.DataFrame, decisions: list[tuple[str, pl.DataFrame]]) -> tuple[pl.DataFrame, int]:
    """The decision rows (one frame per shard URI) that the truth labels, with `shard`, `label`
    and a `group` per row (the rule's shard), and how many decision rows have no label."""
    frames, unlabelled = [], 0
    for k, (uri, rows) in enumerate(decisions):
        joined = rows.with_columns(shard=pl.lit(shard_stem(uri)), group=pl.lit(k)).join(truth, on=["shard", "row"], how="left")
        unlabelled += joined.filter(pl.col("label").is_null()).height
        frames.append(joined.filter(pl.col("label").is_not_null()))
    return (pl.concat(frames, how="diagonal_relaxed") if frames else pl.DataFrame()), unlabelled


def judge(labelled: pl.DataFrame, metrics: list[str], rule: Rule, bootstrap: BootstrapSpec) -> list[dict]:
    """Per metric: kept, unscored, precision, recall, mismatches dropped and ROC AUC, overall
    and per mismatch kind, each an interval dict (`interval_dict`). `labelled` holds the
    decision rows with `label` and `group` (the shard each rule decision was made in)."""
    match = (labelled["label"] == MATCH).to_numpy()
    kinds = sorted(set(labelled["label"].to_list()) - {MATCH})
    labels = labelled["label"].to_numpy()
    out = []
    for metric in metrics:
        column = f"score_{metric}"
        if column not in labelled.columns:
            continue
        keep = _kept(labelled, Rule(metric, rule.min_score, rule.top_fraction))
        score = labelled[column].cast(pl.Float64).fill_nan(None)
        scored = score.is_not_null().to_numpy()
        values = score.fill_null(0.0).to_numpy()
        dropped = ~keep & ~match
        row = {
            "metric": metric,
            "decides": metric == rule.metric,
            "kept": int(keep.sum()),
            "unscored": int((~scored).sum()),
            "precision": _interval(ratio_statistic(keep & match, keep), match.size, bootstrap),
            "recall": _interval(ratio_statistic(keep & match, match), match.size, bootstrap),
            "mismatch_dropped": _interval(ratio_statistic(dropped, ~match), match.size, bootstrap),
            "auc": _interval(auc_statistic(values, match & scored, ~match & scored), match.size, bootstrap),
            "kinds": {},
        }
        for kind in kinds:
            of_kind = labels == kind
            row["kinds"][kind] = {
                "pairs": int(of_kind.sum()),
                "dropped": _interval(ratio_statistic(~keep & of_kind, of_kind), match.size, bootstrap),
                "auc": _interval(auc_statistic(values, match & scored, of_kind & scored), match.size, bootstrap),
            }
        out.append(row)
    return out


def _kept(labelled: pl.DataFrame, rule: Rule) -> np.ndarray:
    """The rule's keep decision for every labelled row, made shard by shard (a top fraction is
    per shard), in the rows' order."""
    indexed = labelled.with_row_index("_i")
    decided = pl.concat([apply_rule(part, rule) for part in indexed.partition_by("group", maintain_order=True)])
    return decided.sort("_i")["keep"].to_numpy().astype(bool)


def _interval(statistic, n: int, bootstrap: BootstrapSpec) -> dict:
    if n < 2:
        value = float(statistic(np.ones((1, n)))[0]) if n else float("nan")
        return interval_dict(Interval(value, float("nan"), float("nan"), n, 0, "fewer than 2 labelled pairs"))
    return interval_dict(group_interval(statistic, n, n_resamples=bootstrap.n_resamples, seed=bootstrap.seed, confidence=bootstrap.confidence))


def interval_dict(interval: Interval) -> dict:
    """An interval as report.json holds it: NaN (undefined) as null."""
    def value(x: float) -> float | None:
        return None if not np.isfinite(x) else round(float(x), 6)

    return {"estimate": value(interval.estimate), "low": value(interval.low), "high": value(interval.high), "note": interval.note}


def truth_section(url: str, decisions: list[tuple[str, pl.DataFrame]], metrics: list[str], rule: Rule, bootstrap: BootstrapSpec) -> dict:
    """report.json's `truth`: the labelled rows' counts and `judge`'s rows."""
    labelled, unlabelled = labelled_decisions(read_truth(url), decisions)
    counts = dict(sorted(labelled.group_by("label").len().iter_rows())) if labelled.height else {}
    if not labelled.height:
        log.warning("truth %s labels none of this run's %d row(s); rows are matched by shard (the input file's name "
                    "without extension) and row", url, unlabelled)
    return {
        "file": url,
        "pairs": labelled.height,
        "match": counts.get(MATCH, 0),
        "mismatch": labelled.height - counts.get(MATCH, 0),
        "labels": counts,
        "unlabelled_rows": unlabelled,
        "interval": f"{bootstrap.confidence:.0%} BCa bootstrap over labelled pairs, {bootstrap.n_resamples} resamples",
        "metrics": judge(labelled, metrics, rule, bootstrap) if labelled.height else [],
    }
