"""Meta-evaluation: how well each metric's scores agree with humans, per benchmark.

Entry points:
- `evaluate(scores, items, protocol, ...)` on in-memory tables;
- `evaluate_files(scores_path, human_path, kind, ...)` on Parquet / CSV files (local or s3://);
- `evaluate_released(source, scores_path, human_path, ...)` on a source's released per-item
  files (DSG answers, TIFA scores, GenAI-Bench scores; `pipeline.released`), with that
  source's own protocol.

Both return `MetaEvalResult(statistics, deltas, problems)` with the schemas of docs/DESIGN.md:
statistics `benchmark, backbone, metric, subset, statistic, value, ci_low, ci_high, n, note`
(n = items for correlations, groups for accuracies) and deltas `benchmark, backbone, subset,
statistic, metric, baseline, delta, ci_low, ci_high, significant, n_groups`.

What is computed (docs/method.md, "Meta-evaluation"):
- correlation: srcc, kendall (tau-b, as scipy.stats.kendalltau), pearson (plain), plcc (4PL;
  bounded starts, then an unbounded refit; a failed fit is NaN with the reason in `note`, a
  bound the kept fit ends on is noted, a fit below Pearson falls back to the line),
  pairwise_acc (acc23 with tie calibration; the chosen epsilon is in `note`);
- winoground: text_acc, image_acc, group_acc (strict: a tie fails);
- multiple_choice: accuracy with the protocol's tie policy.
Subsets: `all`, plus `tag=<t>`, `basic`, `advanced` (breakdown "tags"), `template=<t>`
(breakdown "template"). Intervals are group-bootstrap BCa 95% (seeded) for srcc, kendall,
pearson and the accuracies; plcc and pairwise_acc have none (a refit per resample is too
slow to be useful). Items whose metric had no questions follow `protocol.no_questions`
(exclude, or zero as DSG does); the statistics note records the policy and the count.
Deltas compare `target` with the strongest baseline (best primary statistic in that
backbone and subset) on the items both scored, with a paired group BCa interval.
Nothing bad is dropped silently: missing scores, unknown items, null human values and
excluded groups are counted in `problems` (and in `note`).
"""
from __future__ import annotations

import dataclasses
import math
import warnings
from dataclasses import dataclass
from pathlib import PurePosixPath

import fsspec
import numpy as np
import polars as pl
import pyarrow as pa

from pipeline.config import NO_QUESTION_POLICIES, ProtocolSpec
from pipeline.stats import bootstrap, choice, exact
from pipeline.stats.correlation import MIN_ITEMS, DegenerateInputWarning, kendall, pearson, plcc, srcc
from pipeline.stats.pairwise import pairwise_accuracy

STATISTICS = {
    "correlation": ("srcc", "kendall", "pearson", "plcc", "pairwise_acc"),
    "winoground": ("text_acc", "image_acc", "group_acc"),
    "multiple_choice": ("accuracy",),
}
DEFAULT_PRIMARY = {"correlation": "srcc", "winoground": "group_acc", "multiple_choice": "accuracy"}
WITH_INTERVALS = {"srcc", "kendall", "pearson", "text_acc", "image_acc", "group_acc", "accuracy"}
NO_QUESTIONS_NOTE = "no_questions"  # the scorers' note on an item whose metric had no questions
# correlation statistic -> (point estimate, group statistic with a fast jackknife)
_RANKED = {
    "srcc": (srcc, bootstrap.srcc_statistic),
    "kendall": (kendall, bootstrap.kendall_statistic),
    "pearson": (pearson, bootstrap.pearson_statistic),
}
DIAGNOSTIC_METRICS = {"mean_commitment"}  # per-item diagnostics in the scores table, not metrics

# GenAI-Bench skill groups, as in the benchmark's own evaluation code (t2v_metrics,
# genai_bench/evaluate.py `tag_groups`): basic = attribute, scene, spatial / action / part
# relation; advanced = counting, comparison, differentiation, negation, universal.
# A prompt is "advanced" if it has any advanced tag, "basic" if it has tags but none advanced.
ADVANCED_SKILLS = frozenset({"counting", "comparison", "differentiation", "negation", "universal"})
SKILL_GROUP_TAGS = frozenset({"basic", "advanced", "all"})  # pseudo-tags of genai_skills.json

STATISTICS_SCHEMA = {
    "benchmark": pl.String, "backbone": pl.String, "metric": pl.String, "subset": pl.String,
    "statistic": pl.String, "value": pl.Float64, "ci_low": pl.Float64, "ci_high": pl.Float64,
    "n": pl.Int64, "note": pl.String,
}  # fmt: skip
DELTAS_SCHEMA = {
    "benchmark": pl.String, "backbone": pl.String, "subset": pl.String, "statistic": pl.String,
    "metric": pl.String, "baseline": pl.String, "delta": pl.Float64, "ci_low": pl.Float64,
    "ci_high": pl.Float64, "significant": pl.Boolean, "n_groups": pl.Int64,
}  # fmt: skip
_NO_BACKBONE = "-"


@dataclass
class MetaEvalResult:
    statistics: pl.DataFrame
    deltas: pl.DataFrame
    problems: list[str]


def is_advanced(tag: str) -> bool:
    return tag.strip().lower().replace("_", " ") in ADVANCED_SKILLS | {"advanced"}


# ---------------------------------------------------------------------------------------------
# Input shaping


def _frame(table, what: str) -> pl.DataFrame:
    if isinstance(table, pl.DataFrame):
        return table
    if isinstance(table, pa.Table):
        return pl.from_arrow(table)
    raise TypeError(f"{what} must be a polars DataFrame or a pyarrow Table, got {type(table).__name__}")


def long_scores(scores) -> pl.DataFrame:
    """`item_id, backbone, metric, score` from long or wide scores (one column per metric)."""
    scores = _frame(scores, "scores")
    if "item_id" not in scores.columns:
        raise ValueError(f"scores: missing column 'item_id'; have {scores.columns}")
    if "backbone" not in scores.columns:
        scores = scores.with_columns(pl.lit(_NO_BACKBONE).alias("backbone"))
    if {"metric", "score"} <= set(scores.columns):
        long = scores
    else:
        metric_columns = [c for c in scores.columns if c not in {"item_id", "backbone", "benchmark", "note"}]
        scores = scores.drop("note", strict=False)  # a wide table's note is not per metric
        if not metric_columns:
            raise ValueError("scores: neither long (metric, score) nor wide (one column per metric) columns found")
        long = scores.unpivot(on=metric_columns, index=["item_id", "backbone"], variable_name="metric", value_name="score")
    note = pl.col("note").cast(pl.String) if "note" in long.columns else pl.lit(None, dtype=pl.String)
    return long.select(
        pl.col("item_id").cast(pl.String),
        pl.col("backbone").cast(pl.String).fill_null(_NO_BACKBONE),
        pl.col("metric").cast(pl.String),
        pl.col("score").cast(pl.Float64),
        note.alias("note"),
    )


def required_item_columns(protocol: ProtocolSpec) -> list[str]:
    needed = {
        "correlation": ["item_id", "group_id", "human"],
        "winoground": ["item_id", "group_id", "image_index", "caption_index"],
        "multiple_choice": ["item_id", "group_id", "caption_index", "correct"],
    }[protocol.kind]
    if "tags" in protocol.breakdowns:
        needed.append("tags")
    if "template" in protocol.breakdowns:
        needed.append("template")
    return needed


def _check_protocol(protocol: ProtocolSpec) -> tuple[list[str], str]:
    """The statistics to compute and the primary one, or ValueError."""
    if protocol.kind not in STATISTICS:
        raise ValueError(f"protocol kind must be one of {sorted(STATISTICS)}, got {protocol.kind!r}")
    valid = STATISTICS[protocol.kind]
    requested = list(protocol.statistics)
    if protocol.kind != "correlation" and requested == ProtocolSpec().statistics:
        requested = list(valid)  # the dataclass default is the correlation list
    unknown = [s for s in requested if s not in valid]
    if unknown:
        raise ValueError(f"statistic(s) {unknown} do not apply to kind {protocol.kind!r}; choose from {valid}")
    unknown = [b for b in protocol.breakdowns if b not in ("tags", "template")]
    if unknown:
        raise ValueError(f"unknown breakdown(s) {unknown}; choose from ['tags', 'template']")
    primary = protocol.primary_statistic if protocol.primary_statistic in valid else DEFAULT_PRIMARY[protocol.kind]
    if protocol.kind == "multiple_choice" and protocol.tie_policy not in choice.TIE_POLICIES:
        raise ValueError(f"tie_policy must be one of {choice.TIE_POLICIES}, got {protocol.tie_policy!r}")
    if getattr(protocol, "no_questions", "exclude") not in NO_QUESTION_POLICIES:
        raise ValueError(f"no_questions must be one of {NO_QUESTION_POLICIES}, got {protocol.no_questions!r}")
    return requested, primary


def apply_no_question_policy(scores: pl.DataFrame, policy: str) -> tuple[pl.DataFrame, dict[tuple[str, str], str]]:
    """Scores with the policy applied, and per (backbone, metric) the note that records it.

    An item whose metric had no questions has a null score and the note "no_questions".
    `exclude` leaves it null (dropped and counted like any missing score); `zero` scores it
    0, which is what DSG's released scorer does.
    """
    no_questions = pl.col("score").is_null() & (pl.col("note") == NO_QUESTIONS_NOTE).fill_null(False)
    counts = scores.filter(no_questions).group_by("backbone", "metric").agg(pl.len())
    notes = {}
    for backbone, metric, count in counts.iter_rows():
        action = "scored 0" if policy == "zero" else "excluded"
        notes[(backbone, metric)] = f"{count} item(s) without questions {action} (no_questions={policy})"
    if policy == "zero":
        scores = scores.with_columns(score=pl.when(no_questions).then(0.0).otherwise(pl.col("score")))
    return scores, notes


def _subsets(items: pl.DataFrame, protocol: ProtocolSpec) -> list[tuple[str, set[str] | None]]:
    """(subset name, item ids or None for all items)."""
    subsets: list[tuple[str, set[str] | None]] = [("all", None)]
    if "tags" in protocol.breakdowns:
        tagged = items.select("item_id", "tags").explode("tags").drop_nulls("tags")
        tagged = tagged.with_columns(tag=pl.col("tags").str.strip_chars().str.to_lowercase())
        advanced = set(tagged.filter(pl.col("tag").map_elements(is_advanced, return_dtype=pl.Boolean))["item_id"])
        subsets.append(("basic", set(tagged["item_id"]) - advanced))
        subsets.append(("advanced", advanced))
        for tag in sorted(set(tagged["tag"]) - SKILL_GROUP_TAGS):
            subsets.append((f"tag={tag}", set(tagged.filter(pl.col("tag") == tag)["item_id"])))
    if "template" in protocol.breakdowns:
        for template in sorted(items["template"].drop_nulls().unique()):
            subsets.append((f"template={template}", set(items.filter(pl.col("template") == template)["item_id"])))
    return subsets


# ---------------------------------------------------------------------------------------------
# Per-kind measurement: one metric on one subset


@dataclass(frozen=True)
class _Value:
    value: float
    n: int
    note: str | None = None
    interval: bootstrap.Interval | None = None


class _Correlation:
    """SRCC / PLCC / pairwise accuracy of one metric's scores against `human`."""

    def __init__(self, frame: pl.DataFrame, protocol: ProtocolSpec):
        usable = frame.filter(pl.col("score").is_not_null() & pl.col("score").is_not_nan())
        usable = usable.filter(pl.col("human").is_not_null() & pl.col("human").is_not_nan())
        self.dropped = frame.height - usable.height
        self.frame = usable.sort("item_id")
        self.group_statistics: dict[str, bootstrap.Statistic] = {}  # reused by `paired` (same resamples)

    def measure(self, statistic: str, n_resamples: int, seed: int) -> _Value:
        metric, human = self.frame["score"].to_numpy(), self.frame["human"].to_numpy()
        n = metric.size
        if n < MIN_ITEMS:
            return _Value(float("nan"), n, f"only {n} item(s) with scores and human values")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DegenerateInputWarning)  # the note carries it
            if statistic in _RANKED:
                point, group_statistic = _RANKED[statistic]
                result = point(metric, human)
                interval = None
                if n_resamples and math.isfinite(result.value):
                    groups, n_groups = bootstrap.group_codes(self.frame["group_id"].to_numpy())
                    if n_groups >= 2:
                        stat = group_statistic(metric, human, groups)
                        self.group_statistics[statistic] = stat
                        interval = bootstrap.group_interval(stat, n_groups, n_resamples=n_resamples, seed=seed)
                return _Value(result.value, n, result.note, interval)
            if statistic == "plcc":
                result = plcc(metric, human)
                return _Value(result.value, n, result.note)
        result = pairwise_accuracy(metric, human)
        return _Value(result.value, n, f"epsilon={result.epsilon:.6g}")

    def paired(self, other: _Correlation, statistic: str, n_resamples: int, seed: int):
        """(delta, interval or None, n_groups) of self - other on the items both have."""
        both = self.frame.join(other.frame.select("item_id", pl.col("score").alias("other")), on="item_id")
        if both.height < MIN_ITEMS:
            return float("nan"), None, 0
        a, b, human = both["score"].to_numpy(), both["other"].to_numpy(), both["human"].to_numpy()
        groups, n_groups = bootstrap.group_codes(both["group_id"].to_numpy())
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DegenerateInputWarning)
            if statistic in _RANKED:
                same_items = all(
                    m.frame.height == both.height and m.frame["item_id"].equals(both["item_id"]) and statistic in m.group_statistics
                    for m in (self, other)
                )
                if same_items:  # the single intervals' statistics: their resamples are reused
                    stat_a, stat_b = self.group_statistics[statistic], other.group_statistics[statistic]
                else:
                    stat_a, stat_b = (_RANKED[statistic][1](x, human, groups) for x in (a, b))
            elif statistic == "plcc":
                stat_a, stat_b = (bootstrap.item_statistic(lambda m, h: plcc(m, h).value, x, human, groups) for x in (a, b))
            else:  # pairwise accuracy: exact but ~1 s per resample at 9,600 items; no interval
                return pairwise_accuracy(a, human).value - pairwise_accuracy(b, human).value, None, n_groups
            delta = float(stat_a(np.ones((1, n_groups)))[0] - stat_b(np.ones((1, n_groups)))[0])
            if not n_resamples or n_groups < 2 or not math.isfinite(delta):
                return delta, None, n_groups
            interval = bootstrap.paired_group_interval(stat_a, stat_b, n_groups, n_resamples=n_resamples, seed=seed)
        return delta, interval, n_groups


class _Choice:
    """Winoground or multiple-choice credit per group for one metric."""

    def __init__(self, frame: pl.DataFrame, protocol: ProtocolSpec):
        self.kind = protocol.kind
        if self.kind == "winoground":
            result = choice.winoground(frame)
            self.credit = {"text_acc": result.text, "image_acc": result.image, "group_acc": result.group}
            self.tied_note = None
        else:
            result = choice.multiple_choice(frame, protocol.tie_policy)
            self.credit = {"accuracy": result.credit}
            self.tied_note = f"{result.n_tied} tied group(s), policy {protocol.tie_policy}" if result.n_tied else None
        self.group_ids = result.group_ids
        self.excluded = result.excluded
        self.dropped = len(result.excluded)

    def measure(self, statistic: str, n_resamples: int, seed: int) -> _Value:
        credit = self.credit[statistic]
        notes = [f"{len(self.excluded)} group(s) excluded"] if self.excluded else []
        if self.tied_note:
            notes.append(self.tied_note)
        note = "; ".join(notes) or None
        if credit.size == 0:
            return _Value(float("nan"), 0, note or "no scored groups")
        interval = None
        if n_resamples and credit.size >= 2:
            stat = bootstrap.ratio_statistic(credit, np.ones(credit.size))
            interval = bootstrap.group_interval(stat, credit.size, n_resamples=n_resamples, seed=seed)
        return _Value(exact.mean(credit), credit.size, note, interval)  # the interval's estimate, bit for bit

    def paired(self, other: _Choice, statistic: str, n_resamples: int, seed: int):
        common = sorted(set(self.group_ids) & set(other.group_ids))
        if not common:
            return float("nan"), None, 0
        position_a = {g: i for i, g in enumerate(self.group_ids)}
        position_b = {g: i for i, g in enumerate(other.group_ids)}
        a = self.credit[statistic][[position_a[g] for g in common]]
        b = other.credit[statistic][[position_b[g] for g in common]]
        difference = bootstrap.mean_difference_statistic(a, b)  # exact for discrete credit
        delta = float(difference(np.ones((1, len(common))))[0])
        if not n_resamples or len(common) < 2:
            return delta, None, len(common)
        interval = bootstrap.group_interval(difference, len(common), n_resamples=n_resamples, seed=seed)
        return delta, interval, len(common)


# ---------------------------------------------------------------------------------------------
# Entry points


def evaluate(
    scores,
    items,
    protocol: ProtocolSpec,
    *,
    baselines: list[str] | None = None,
    target: str = "depict",
    n_resamples: int = 2000,
    seed: int = 0,
    benchmark: str | None = None,
) -> MetaEvalResult:
    """Statistics of every (backbone, metric, subset) and target-vs-best-baseline deltas.

    `scores`: long (item_id, [backbone], metric, score) or wide (item_id, [backbone], one
    column per metric). `items`: the ITEMS columns the protocol needs (see
    `required_item_columns`). `baselines`: metrics to compare `target` with (default: every
    other metric). `n_resamples=0` skips all intervals. `benchmark` names the rows (default:
    the items' `benchmark` column, else "benchmark").
    """
    statistics_names, primary = _check_protocol(protocol)
    items = _frame(items, "items")
    missing = [c for c in required_item_columns(protocol) if c not in items.columns]
    if missing:
        raise ValueError(f"items: missing column(s) {missing} needed by a {protocol.kind} protocol")
    if benchmark is None:
        names = items["benchmark"].drop_nulls().unique().to_list() if "benchmark" in items.columns else []
        if len(names) > 1:
            raise ValueError(f"items hold several benchmarks {sorted(names)}; evaluate one benchmark at a time")
        benchmark = names[0] if names else "benchmark"
    items = items.with_columns(pl.col("item_id").cast(pl.String), pl.col("group_id").cast(pl.String))
    problems: list[str] = []
    repeated = items.filter(pl.col("item_id").is_duplicated())
    if repeated.height:
        problems.append(f"items: {repeated.height} rows share an item_id (e.g. {repeated['item_id'][0]!r}); kept the first")
        items = items.unique("item_id", keep="first", maintain_order=True)

    scores = long_scores(scores)
    scores = scores.filter(~pl.col("metric").is_in(list(DIAGNOSTIC_METRICS)))
    scores, policy_notes = apply_no_question_policy(scores, getattr(protocol, "no_questions", "exclude"))
    duplicates = scores.filter(pl.struct("item_id", "backbone", "metric").is_duplicated())
    if duplicates.height:
        problems.append(f"scores: {duplicates.height} rows repeat an (item_id, backbone, metric); kept the first")
        scores = scores.unique(["item_id", "backbone", "metric"], keep="first", maintain_order=True)
    unknown = scores.filter(~pl.col("item_id").is_in(items["item_id"].implode()))
    if unknown.height:
        ids = unknown["item_id"].unique().sort()
        problems.append(f"scores: {ids.len()} item_id(s) not in the items table, ignored (e.g. {ids[0]!r})")
    item_columns = [c for c in items.columns if c in {"item_id", "group_id", "human", "image_index", "caption_index", "correct", "template"}]
    joined = items.select(item_columns).join(scores, on="item_id", how="inner")

    subsets = _subsets(items, protocol)
    measure_class = _Correlation if protocol.kind == "correlation" else _Choice
    stat_rows, delta_rows = [], []
    for backbone in sorted(joined["backbone"].unique()):
        per_backbone = joined.filter(pl.col("backbone") == backbone)
        metrics = sorted(per_backbone["metric"].unique())
        for metric in metrics:
            scored = per_backbone.filter(pl.col("metric") == metric)
            unscored = items.height - scored.height
            if unscored:
                problems.append(f"{backbone}/{metric}: {unscored} item(s) have no score")
        for subset, ids in subsets:
            frame = per_backbone if ids is None else per_backbone.filter(pl.col("item_id").is_in(list(ids)))
            measured = {m: measure_class(frame.filter(pl.col("metric") == m), protocol) for m in metrics}
            primary_values = {}
            for metric, measure in measured.items():
                if measure.dropped and subset == "all":
                    problems.append(f"{backbone}/{metric}: {_dropped_message(measure)}")
                for statistic in statistics_names:
                    value = measure.measure(statistic, n_resamples if statistic in WITH_INTERVALS else 0, seed)
                    row = _statistics_row(benchmark, backbone, metric, subset, statistic, value)
                    if (backbone, metric) in policy_notes:
                        row["note"] = "; ".join(filter(None, [row["note"], policy_notes[(backbone, metric)]]))
                    stat_rows.append(row)
                    if statistic == primary:
                        primary_values[metric] = value.value
                if primary not in statistics_names:
                    primary_values[metric] = measure.measure(primary, 0, seed).value
            delta = _delta_row(measured, primary_values, primary, target, baselines, n_resamples, seed)
            if delta is not None:
                delta_rows.append(dict(benchmark=benchmark, backbone=backbone, subset=subset, **delta))
    if target not in set(joined["metric"].unique()) and joined.height:
        problems.append(f"target metric {target!r} has no scores: no deltas")
    statistics = pl.DataFrame(stat_rows, schema=STATISTICS_SCHEMA)
    deltas = pl.DataFrame(delta_rows, schema=DELTAS_SCHEMA)
    return MetaEvalResult(statistics, deltas, problems)


def _dropped_message(measure) -> str:
    if isinstance(measure, _Correlation):
        return f"{measure.dropped} item(s) without a score or human value left out"
    group_id, reason = next(iter(measure.excluded.items()))
    return f"{measure.dropped} group(s) excluded (e.g. {group_id}: {reason})"


def _statistics_row(benchmark, backbone, metric, subset, statistic, value: _Value) -> dict:
    interval = value.interval
    note = value.note
    if interval is not None and interval.note:
        note = "; ".join(filter(None, [note, interval.note]))
    return dict(
        benchmark=benchmark, backbone=backbone, metric=metric, subset=subset, statistic=statistic,
        value=value.value, ci_low=interval.low if interval else None,
        ci_high=interval.high if interval else None, n=value.n, note=note,
    )  # fmt: skip


def _delta_row(measured, primary_values, primary, target, baselines, n_resamples, seed) -> dict | None:
    """target minus the baseline with the best primary statistic in this backbone/subset."""
    candidates = [m for m, v in primary_values.items() if m != target and (baselines is None or m in baselines)]
    ranked = [m for m in candidates if math.isfinite(primary_values[m])]
    if target not in measured or not ranked:
        return None
    strongest = max(ranked, key=lambda m: (primary_values[m], m))
    delta, interval, n_groups = measured[target].paired(measured[strongest], primary, n_resamples, seed)
    low = interval.low if interval else None
    high = interval.high if interval else None
    significant = bool(interval.excludes_zero) if interval and math.isfinite(interval.low) else None
    return dict(
        statistic=primary, metric=target, baseline=strongest, delta=delta,
        ci_low=low, ci_high=high, significant=significant, n_groups=n_groups,
    )  # fmt: skip


# ---------------------------------------------------------------------------------------------
# Files


def read_table(path: str, *, what: str) -> pl.DataFrame:
    """Read a Parquet or CSV file (local path or any fsspec URL such as s3://)."""
    suffix = PurePosixPath(path.split("?")[0]).suffix.lower()
    if suffix not in (".parquet", ".pq", ".csv"):
        raise ValueError(f"{what} file {path}: expected a .parquet or .csv file")
    try:
        with fsspec.open(path, "rb") as handle:
            return pl.read_parquet(handle) if suffix in (".parquet", ".pq") else pl.read_csv(handle)
    except FileNotFoundError as exc:
        raise FileNotFoundError(f"{what} file not found: {path}") from exc
    except (pl.exceptions.PolarsError, OSError) as exc:
        raise ValueError(f"{what} file {path} could not be read: {exc}") from exc


def protocol_for(kind: str, human: pl.DataFrame, *, tie_policy: str = "expected") -> ProtocolSpec:
    """The default protocol of `kind`, with the breakdowns the human table supports."""
    if kind not in STATISTICS:
        raise ValueError(f"kind must be one of {sorted(STATISTICS)}, got {kind!r}")
    breakdowns = []
    if "tags" in human.columns and human["tags"].list.len().sum() > 0:
        breakdowns.append("tags")
    if kind == "multiple_choice" and "template" in human.columns and human["template"].drop_nulls().len() > 0:
        breakdowns.append("template")
    return ProtocolSpec(
        kind=kind, statistics=list(STATISTICS[kind]), tie_policy=tie_policy,
        breakdowns=breakdowns, primary_statistic=DEFAULT_PRIMARY[kind],
    )  # fmt: skip


def evaluate_files(
    scores_path: str,
    human_path: str,
    kind: str,
    *,
    metrics: list[str] | None = None,
    protocol: ProtocolSpec | None = None,
    **options,
) -> MetaEvalResult:
    """`evaluate` on a scores file and a human-judgment (items) file keyed by item_id.

    The human file holds the ITEMS columns the protocol needs; in a CSV, `tags` may be one
    string with tags separated by "|". Missing columns raise ValueError naming the file and
    column; items found in only one of the files are reported in `problems`. `metrics`
    keeps only those metrics. `options` go to `evaluate` (target, baselines, n_resamples, seed);
    `tie_policy` and `no_questions` set the protocol's policies.
    """
    scores = read_table(scores_path, what="scores")
    human = read_table(human_path, what="human")
    if "tags" in human.columns and human["tags"].dtype == pl.String:
        human = human.with_columns(pl.col("tags").fill_null("").str.split("|").list.eval(pl.element().str.strip_chars()).list.filter(pl.element() != ""))
    tie_policy = options.pop("tie_policy", "expected")
    no_questions = options.pop("no_questions", None)
    protocol = protocol or protocol_for(kind, human, tie_policy=tie_policy)
    if no_questions is not None:
        protocol = dataclasses.replace(protocol, no_questions=no_questions)
    missing = [c for c in required_item_columns(protocol) if c not in human.columns]
    if missing:
        raise ValueError(f"human file {human_path}: missing column(s) {missing} needed by a {protocol.kind} protocol")
    if "item_id" not in scores.columns:
        raise ValueError(f"scores file {scores_path}: missing column 'item_id'")
    long = long_scores(scores)
    if metrics is not None:
        absent = sorted(set(metrics) - set(long["metric"].unique()))
        if absent:
            raise ValueError(f"scores file {scores_path}: no scores for metric(s) {absent}")
        long = long.filter(pl.col("metric").is_in(list(metrics)))
    human_ids = human["item_id"].cast(pl.String)
    unscored = human_ids.filter(~human_ids.is_in(long["item_id"].unique().implode()))
    score_ids = long["item_id"].unique().sort()
    unknown = score_ids.filter(~score_ids.is_in(human_ids.implode()))
    long = long.filter(pl.col("item_id").is_in(human_ids.implode()))
    result = evaluate(long, human, protocol, **options)
    if unknown.len():
        result.problems.insert(0, f"{unknown.len()} item_id(s) in {scores_path} are not in {human_path}, ignored (e.g. {unknown[0]!r})")
    if unscored.len():
        result.problems.insert(0, f"{unscored.len()} item(s) in {human_path} have no row in {scores_path} (e.g. {unscored[0]!r})")
    return result


def evaluate_released(
    source: str,
    scores_path: str,
    human_path: str | None = None,
    *,
    reader_options: dict | None = None,
    no_questions: str | None = None,
    target: str | None = None,
    **options,
) -> MetaEvalResult:
    """`evaluate` on released files of `source` (see `pipeline.released`) with its protocol.

    `reader_options` go to the reader (e.g. answer_rule, split for DSG; skills for
    GenAI-Bench); `no_questions` overrides the source protocol's policy; `target` defaults to
    the source's headline metric. The reader's problems come first in `problems`.
    """
    from pipeline.released import load

    released = load(source, scores_path, human_path, **(reader_options or {}))
    protocol = released.protocol
    if no_questions is not None:
        protocol = dataclasses.replace(protocol, no_questions=no_questions)
    chosen = target or released.target or "depict"
    result = evaluate(released.scores, released.items, protocol, target=chosen, benchmark=released.benchmark, **options)
    result.problems[:0] = released.problems
    return result


def write_result(result: MetaEvalResult, out: str) -> list[str]:
    """Write statistics and deltas as Parquet and CSV under `out` (local dir or URL); return paths."""
    fs, root = fsspec.core.url_to_fs(out)
    fs.makedirs(root, exist_ok=True)
    written = []
    for name, frame in (("statistics", result.statistics), ("deltas", result.deltas)):
        for suffix in ("parquet", "csv"):
            path = f"{out.rstrip('/')}/{name}.{suffix}"
            with fsspec.open(path, "wb") as handle:
                frame.write_parquet(handle) if suffix == "parquet" else frame.write_csv(handle)
            written.append(path)
    return written


def format_table(result: MetaEvalResult, *, max_rows: int = 200) -> str:
    """A readable text table: one line per (backbone, metric, subset), one column per statistic."""
    if result.statistics.is_empty():
        return "(no statistics)"
    cells = result.statistics.with_columns(
        cell=pl.when(pl.col("ci_low").is_not_null() & pl.col("ci_low").is_not_nan())
        .then(pl.format("{} [{}, {}]", *(pl.col(c).round(3) for c in ("value", "ci_low", "ci_high"))))
        .otherwise(pl.col("value").round(3).cast(pl.String))
    )
    wide = cells.pivot(on="statistic", index=["backbone", "subset", "metric"], values="cell")
    lines = []
    with pl.Config(tbl_rows=max_rows, tbl_cols=-1, tbl_width_chars=200, fmt_str_lengths=40, tbl_hide_dataframe_shape=True):
        lines.append(str(wide))
        if not result.deltas.is_empty():
            lines.append(str(result.deltas.drop("benchmark")))
    if result.problems:
        lines.append("problems:\n" + "\n".join(f"  - {p}" for p in result.problems))
    return "\n".join(lines)
