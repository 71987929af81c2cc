"""BCa on discrete statistics is exact: an accuracy and an accuracy difference, their resamples
and their jackknife are computed so that equal rational values are equal floats, and every
interval equals scipy.stats.bootstrap's on a reference statistic computed exactly (fractions,
one rounding at the end), on the same resamples.

Covered paths: `bootstrap.ratio_statistic` (single), `bootstrap.difference` and
`paired_group_interval` of two ratios, `mean_difference_statistic`, metaeval's statistics and
deltas tables (Winoground 0/1 credit, multiple choice with 1/k tie credit) and the reports'
commitment-gain intervals (`tables.weighting_gains`).
"""
from __future__ import annotations

from fractions import Fraction

import numpy as np
import polars as pl
import pytest
from scipy import stats

from pipeline.config import ProtocolSpec
from pipeline.metaeval import evaluate
from pipeline.reports import tables
from pipeline.reports.finished_run import BackboneInfo, BenchmarkInfo, Run
from pipeline.stats import bootstrap, choice
from pipeline.stats.diagnostics import least_committed

TIE_CREDITS = [0.0, 1 / 4, 1 / 3, 1 / 2, 1.0]  # the `expected` policy's credit with 1-4 tied options


def exact_reference(a, b=None, *, n_resamples: int, seed: int):
    """scipy's BCa interval of mean(a) (or of mean(a) - mean(b), paired=True), with the statistic
    computed in fractions and rounded once: equal means are equal floats by construction."""
    values = {float(v): Fraction(float(v)).limit_denominator(1000) for v in np.concatenate([a, a if b is None else b])}

    def mean(x):
        return sum((values[v] for v in x), Fraction(0)) / len(x)

    if b is None:
        data, statistic = (np.asarray(a, float),), lambda x: float(mean(x))
    else:
        data, statistic = (np.asarray(a, float), np.asarray(b, float)), lambda x, y: float(mean(x) - mean(y))
    result = stats.bootstrap(
        data, statistic, n_resamples=n_resamples, batch=bootstrap._BATCH, vectorized=False, paired=b is not None,
        method="BCa", rng=np.random.default_rng(seed),
    )  # fmt: skip
    return result.confidence_interval


def _fraction_mean(values) -> Fraction:
    return sum((Fraction(float(v)).limit_denominator(1000) for v in values), Fraction(0)) / len(values)


def exact_mean(values) -> float:
    return float(_fraction_mean(values))


def exact_difference(a, b) -> float:
    return float(_fraction_mean(a) - _fraction_mean(b))


def assert_same_interval(interval, reference):
    assert (interval.low, interval.high) == pytest.approx((reference.low, reference.high), abs=1e-12, rel=0)


def _paired_accuracies(seed: int, n: int = 400):
    """Two Winoground-like group accuracies (0/1, ~0.27 and ~0.29) whose counts differ by 10:
    mean(a) - mean(b) is -0.024999999999999967 in floating point, not -0.025."""
    for attempt in range(10_000):
        r = np.random.default_rng([seed, attempt])
        a = (r.random(n) < 0.27).astype(float)
        b = np.where(r.random(n) < 0.8, a, (r.random(n) < 0.3).astype(float))  # mostly agreeing: many ties
        if b.sum() - a.sum() == 10 and a.mean() - b.mean() != -0.025:
            return a, b
    raise AssertionError("no such data")


def _tie_credits(seed: int, n: int = 120):
    r = np.random.default_rng(seed)
    a = r.choice(TIE_CREDITS, n, p=[0.3, 0.05, 0.15, 0.1, 0.4])
    b = np.where(r.random(n) < 0.6, a, r.choice(TIE_CREDITS, n, p=[0.35, 0.05, 0.15, 0.1, 0.35]))
    return a, b


# ---------------------------------------------------------------------------------------------
# The arithmetic


def test_common_scale_finds_the_denominator_of_small_fractions_only():
    from pipeline.stats import exact

    assert exact.common_scale(np.array([0.0, 1.0, 1.0])) == 1
    assert exact.common_scale(np.array(TIE_CREDITS)) == 12
    assert exact.common_scale(np.array([2.0, 7.0]), np.array([0.5])) == 2
    assert exact.common_scale(np.array([0.1 + 0.2])) is None  # not the float nearest 3/10
    assert exact.common_scale(np.random.default_rng(0).random(50)) is None


def test_mean_of_tie_credits_is_the_exact_mean_rounded_once():
    from pipeline.stats import exact

    credits = np.array([1 / 3] * 7 + [0.5] * 3 + [1.0] * 5 + [0.0] * 4)
    assert exact.mean(credits) == exact_mean(credits) == float(Fraction(7, 3 * 19) + Fraction(3, 38) + Fraction(5, 19))
    for seed in range(20):
        a, _ = _tie_credits(seed)
        assert exact.mean(a) == exact_mean(a)


# ---------------------------------------------------------------------------------------------
# bootstrap: single and paired intervals


@pytest.mark.parametrize("seed", range(4))
def test_difference_of_two_accuracies_is_exact_and_equals_scipy(seed):
    # In floating point mean(a) - mean(b) = -0.024999999999999967 makes the resamples equal to
    # -0.025 count as below the estimate, and BCa moves an interval end by a whole step (1/400).
    a, b = _paired_accuracies(seed)
    n = a.size
    reference = stats.bootstrap((a - b,), np.mean, n_resamples=2000, batch=bootstrap._BATCH, method="BCa", rng=np.random.default_rng(0))
    ones = np.ones(n)
    for statistic in (
        bootstrap.difference(bootstrap.ratio_statistic(a, ones), bootstrap.ratio_statistic(b, ones)),
        bootstrap.mean_difference_statistic(a, b),
    ):
        interval = bootstrap.group_interval(statistic, n, n_resamples=2000, seed=0)
        assert interval.estimate == -0.025
        assert_same_interval(interval, reference.confidence_interval)
    paired = bootstrap.paired_group_interval(bootstrap.ratio_statistic(a, ones), bootstrap.ratio_statistic(b, ones), n, n_resamples=2000, seed=0)
    assert paired.estimate == -0.025
    assert_same_interval(paired, reference.confidence_interval)


@pytest.mark.parametrize("seed", range(6))
def test_accuracy_with_tie_credits_equals_exact_scipy(seed):
    a, _ = _tie_credits(seed)
    interval = bootstrap.group_interval(bootstrap.ratio_statistic(a, np.ones(a.size)), a.size, n_resamples=1000, seed=seed)
    assert interval.estimate == exact_mean(a)
    assert_same_interval(interval, exact_reference(a, n_resamples=1000, seed=seed))


@pytest.mark.parametrize("seed", range(6))
def test_paired_difference_with_tie_credits_equals_exact_scipy(seed):
    a, b = _tie_credits(seed)
    n = a.size
    reference = exact_reference(a, b, n_resamples=1000, seed=seed)
    ones = np.ones(n)
    for statistic in (
        bootstrap.difference(bootstrap.ratio_statistic(a, ones), bootstrap.ratio_statistic(b, ones)),
        bootstrap.mean_difference_statistic(a, b),
    ):
        interval = bootstrap.group_interval(statistic, n, n_resamples=1000, seed=seed)
        assert interval.estimate == exact_difference(a, b)
        assert_same_interval(interval, reference)


def test_difference_of_ratios_with_different_denominators_is_exact():
    # shares of questions per caption (numerator and denominator vary per group)
    r = np.random.default_rng(3)
    questions = r.integers(1, 6, 60).astype(float)
    no_a = np.minimum(questions, r.integers(0, 4, 60)).astype(float)
    no_b = np.minimum(questions, r.integers(0, 4, 60)).astype(float)
    both = bootstrap.difference(bootstrap.ratio_statistic(no_a, questions), bootstrap.ratio_statistic(no_b, questions))
    counts = r.multinomial(60, [1 / 60] * 60, size=200).astype(float)
    expected = [float(Fraction(int(c @ no_a) - int(c @ no_b), int(c @ questions))) for c in counts]
    assert both(counts).tolist() == expected
    jackknife = [float(Fraction(int(no_a.sum() - no_a[i]) - int(no_b.sum() - no_b[i]), int(questions.sum() - questions[i]))) for i in range(60)]
    assert both.jackknife(60).tolist() == jackknife


def test_continuous_values_keep_the_float_path():
    values = np.random.default_rng(5).exponential(size=80)
    statistic = bootstrap.ratio_statistic(values, np.ones(80))
    reference = stats.bootstrap((values,), np.mean, n_resamples=999, batch=bootstrap._BATCH, method="BCa", rng=np.random.default_rng(11))
    assert_same_interval(bootstrap.group_interval(statistic, 80, n_resamples=999, seed=11), reference.confidence_interval)


# ---------------------------------------------------------------------------------------------
# metaeval: statistics and deltas tables


def _winoground_frames(a, b):
    """Items and scores whose strict group credit is exactly `a` (depict) and `b` (vqascore)."""
    rows = []
    for g, (win_a, win_b) in enumerate(zip(a, b)):
        for image in (0, 1):
            for caption in (0, 1):
                match = image == caption
                rows.append(
                    dict(
                        item_id=f"w/{g:04d}_{image}{caption}", group_id=f"ex{g:04d}", image_index=image, caption_index=caption,
                        depict=float(match) if win_a else 0.5, vqascore=float(match) if win_b else 0.5,
                    )
                )  # fmt: skip
    frame = pl.DataFrame(rows)
    return frame.drop("depict", "vqascore"), frame.select("item_id", "depict", "vqascore")


def _row(table, **keys):
    row = table.filter(pl.all_horizontal(pl.col(k) == v for k, v in keys.items()))
    assert row.height == 1, row
    return row.row(0, named=True)


def test_metaeval_winoground_delta_and_accuracies_are_exact():
    a, b = _paired_accuracies(0)
    items, scores = _winoground_frames(a, b)
    result = evaluate(scores, items, ProtocolSpec(kind="winoground", statistics=["group_acc"]), n_resamples=2000, benchmark="winoground")
    delta = _row(result.deltas, subset="all")
    assert (delta["metric"], delta["baseline"]) == ("depict", "vqascore")
    assert delta["delta"] == -0.025
    reference = stats.bootstrap((a - b,), np.mean, n_resamples=2000, batch=bootstrap._BATCH, method="BCa", rng=np.random.default_rng(0))
    assert (delta["ci_low"], delta["ci_high"]) == pytest.approx(tuple(reference.confidence_interval), abs=1e-12, rel=0)
    for metric, credit in (("depict", a), ("vqascore", b)):
        row = _row(result.statistics, metric=metric, statistic="group_acc")
        single = stats.bootstrap((credit,), np.mean, n_resamples=2000, batch=bootstrap._BATCH, method="BCa", rng=np.random.default_rng(0))
        assert row["value"] == exact_mean(credit)
        assert (row["ci_low"], row["ci_high"]) == pytest.approx(tuple(single.confidence_interval), abs=1e-12, rel=0)


def _multiple_choice_frames(n: int = 150, seed: int = 0):
    """NegBench-like groups of 4 options: `hard` scores in {0, 1} tie often (credit 1/2, 1/3,
    1/4 under the expected policy); `depict` mostly agrees with it, breaking some ties."""
    r = np.random.default_rng(seed)
    rows = []
    for g in range(n):
        correct = int(r.integers(4))
        hard = (r.random(4) < 0.5).astype(float)
        hard[correct] = float(r.random() < 0.7)
        soft = np.where(r.random(4) < 0.7, hard, r.random(4) < 0.5).astype(float)
        for option in range(4):
            rows.append(dict(item_id=f"n/{g:04d}_{option}", group_id=f"img{g:04d}", caption_index=option, correct=option == correct,
                             hard=hard[option], depict=soft[option], agree_unweighted_vqascore=hard[option],
                             mean_commitment=float(r.random())))  # fmt: skip
    return pl.DataFrame(rows)


def _credit(frame: pl.DataFrame, metric: str) -> tuple[list[str], np.ndarray]:
    result = choice.multiple_choice(frame.with_columns(score=pl.col(metric)), "expected")
    return result.group_ids, result.credit


def test_metaeval_multiple_choice_with_tie_credits_equals_exact_scipy():
    frame = _multiple_choice_frames()
    items = frame.select("item_id", "group_id", "caption_index", "correct")
    scores = frame.select("item_id", "depict", "hard")
    result = evaluate(scores, items, ProtocolSpec(kind="multiple_choice", statistics=["accuracy"]), n_resamples=1000, benchmark="negbench")
    ids_a, a = _credit(frame, "depict")
    ids_b, b = _credit(frame, "hard")
    assert ids_a == ids_b and {1 / 3, 1 / 4, 1 / 2} <= set(b.tolist())
    for metric, credit in (("depict", a), ("hard", b)):
        row = _row(result.statistics, metric=metric, statistic="accuracy")
        assert row["value"] == exact_mean(credit)
        interval = exact_reference(credit, n_resamples=1000, seed=0)
        assert (row["ci_low"], row["ci_high"]) == pytest.approx((interval.low, interval.high), abs=1e-12, rel=0)
    delta = _row(result.deltas, subset="all")
    baseline = b if delta["baseline"] == "hard" else a
    target = a if delta["metric"] == "depict" else b
    reference = exact_reference(target, baseline, n_resamples=1000, seed=0)
    assert delta["delta"] == exact_difference(target, baseline)
    assert (delta["ci_low"], delta["ci_high"]) == pytest.approx((reference.low, reference.high), abs=1e-12, rel=0)


# ---------------------------------------------------------------------------------------------
# reports: the commitment-gain intervals (Table 12)


def _choice_run(frame: pl.DataFrame, n_resamples: int) -> Run:
    items = frame.select("item_id", "group_id", "caption_index", "correct").with_columns(benchmark=pl.lit("neg"))
    long = frame.select(
        "item_id", pl.col("depict"), pl.col("agree_unweighted_vqascore").alias(tables.UNWEIGHTED), pl.col("mean_commitment").alias(tables.COMMITMENT)
    ).unpivot(index="item_id", variable_name="metric", value_name="score")
    scores = long.with_columns(backbone=pl.lit("b"), benchmark=pl.lit("neg"))
    protocol = ProtocolSpec(kind="multiple_choice", statistics=["accuracy"], primary_statistic="accuracy", tie_policy="expected")
    empty = pl.DataFrame()
    return Run(
        url="memory://exact", name="exact", backbones={"b": BackboneInfo("b")}, benchmarks={"neg": BenchmarkInfo("neg", protocol)},
        metrics=["depict", tables.UNWEIGHTED], target="depict", baselines=[], lam=0.5, n_resamples=n_resamples, seed=0,
        items=items, scores=scores, statistics=empty, deltas=empty, errors=empty,
    )  # fmt: skip


def test_reports_commitment_gain_with_tie_credits_equals_exact_scipy():
    frame = _multiple_choice_frames(seed=1)
    gains, left_out = tables.weighting_gains(_choice_run(frame, 1000), "b", "neg")
    assert left_out is None
    _, weighted = _credit(frame, "depict")
    _, unweighted = _credit(frame, "agree_unweighted_vqascore")
    commitment = frame.group_by("group_id").agg(pl.col("mean_commitment").mean()).sort("group_id")["mean_commitment"].to_numpy()
    low, _ = least_committed(commitment)
    for gain in gains:
        mask = low if gain.subset == "least_committed" else np.ones(weighted.size, bool)
        a, b = weighted[mask], unweighted[mask]
        assert gain.weighted == exact_mean(a) and gain.unweighted == exact_mean(b)
        assert_same_interval(gain.gain, exact_reference(a, b, n_resamples=1000, seed=0))
