"""Benchmark of the two expensive statistics, at GenAI-Bench size (prints numbers; not a test).

    python bench/bench_stats.py

1. Exact tie-calibrated pairwise accuracy on 9,600 items (46,075,200 pairs).
2. One paired group-BCa interval of an SRCC difference: 2,000 resamples, 1,600 groups of 6.
3. Group-BCa intervals of Kendall tau-b and plain Pearson (same resamples).
Targets: under 5 s each on a 2-core machine. Whole-metaeval scaling: bench/bench_metaeval.py.
"""
from __future__ import annotations

import importlib.util
import sys
import time
from pathlib import Path

if importlib.util.find_spec("pipeline") is None:  # a fresh clone without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

from pipeline.stats import bootstrap
from pipeline.stats.pairwise import pairwise_accuracy


def synthetic(n_groups: int = 1600, per_group: int = 6, seed: int = 0):
    """Human = mean of 3 ratings 1-5 (many ties, as in GenAI-Bench); two noisy metrics."""
    rng = np.random.default_rng(seed)
    n = n_groups * per_group
    human = rng.integers(1, 6, size=(n, 3)).mean(axis=1)
    better = human + rng.normal(0, 0.8, n)
    worse = np.round(human + rng.normal(0, 1.2, n), 1)  # coarse scores: ties in the metric too
    groups = np.repeat(np.arange(n_groups), per_group)
    return human, better, worse, groups


def main() -> None:
    human, better, worse, groups = synthetic()
    print(f"items: {human.size}, pairs: {human.size * (human.size - 1) // 2:,}, groups: {groups.max() + 1}")
    for name, metric in (("continuous metric", better), ("rounded metric (ties)", worse)):
        start = time.perf_counter()
        result = pairwise_accuracy(metric, human)
        elapsed = time.perf_counter() - start
        print(f"pairwise accuracy, {name}: acc={result.value:.6f} eps={result.epsilon:.6g} in {elapsed:.2f} s")

    codes, n_groups = bootstrap.group_codes(groups)
    start = time.perf_counter()
    interval = bootstrap.paired_group_interval(
        bootstrap.srcc_statistic(better, human, codes),
        bootstrap.srcc_statistic(worse, human, codes),
        n_groups,
        n_resamples=2000,
        seed=0,
    )
    elapsed = time.perf_counter() - start
    print(
        f"paired group BCa, SRCC difference: {interval.estimate:.4f} "
        f"[{interval.low:.4f}, {interval.high:.4f}] (2,000 resamples, {n_groups} groups) in {elapsed:.2f} s"
    )
    for name, build in (("Kendall tau-b", bootstrap.kendall_statistic), ("Pearson", bootstrap.pearson_statistic)):
        start = time.perf_counter()
        interval = bootstrap.group_interval(build(better, human, codes), n_groups, n_resamples=2000, seed=0)
        print(f"group BCa, {name}: {interval.estimate:.4f} [{interval.low:.4f}, {interval.high:.4f}] in {time.perf_counter() - start:.2f} s")


if __name__ == "__main__":
    main()
