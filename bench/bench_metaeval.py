"""Meta-evaluation wall time at 10k and 100k items (prints numbers; not a test).

    python bench/bench_metaeval.py [--sizes 10000 100000] [--metrics 3] [--resamples 2000] [--statistics srcc plcc]
    python bench/bench_metaeval.py --baseline /path/to/other/checkout   # that code first, then this one

Synthetic correlation benchmark shaped like GenAI-Bench (prompts of 6 images, human = mean
of three 1-5 ratings, many ties), `--metrics` metrics of varying noise (one rounded, so
the metric ties too), the default correlation protocol (srcc, kendall, pearson, plcc,
pairwise_acc; group BCa intervals for the first three) and a target-vs-best delta. Prints
the whole `evaluate` time per size, then at the largest size one metric's time per
statistic, and for the interval statistics where it goes: point estimate, the bootstrap
resamples, BCa's leave-one-group-out jackknife (a continuous metric: the first one).
For scale: with a quadratic jackknife and pairwise accuracy, 100k items took 1,509 s; with
the linear ones and the default statistics, 228 s (Kendall's resamples ~45 s per metric). The
machine is shared: compare runs back to back (`--baseline`), not absolute seconds.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

if not os.environ.get("PYTHONPATH"):  # this checkout's code, not an editable install of another
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import polars as pl

from pipeline.config import ProtocolSpec
from pipeline.metaeval import evaluate
from pipeline.stats import bootstrap


def synthetic(n_items: int, n_metrics: int, seed: int = 0) -> tuple[pl.DataFrame, pl.DataFrame]:
    rng = np.random.default_rng(seed)
    per_group = 6
    n_groups = -(-n_items // per_group)
    ids = [f"item{i:07d}" for i in range(n_items)]
    human = rng.integers(1, 6, size=(n_items, 3)).mean(axis=1)
    items = pl.DataFrame(dict(item_id=ids, group_id=[f"p{i // per_group:06d}" for i in range(n_items)], human=human))
    columns = {"item_id": ids}
    for k in range(n_metrics):
        noisy = human + rng.normal(0, 0.6 + 0.3 * k, n_items)
        columns["depict" if k == 0 else f"metric{k}"] = np.round(noisy, 1) if k == n_metrics - 1 else noisy
    assert n_groups >= 2
    return items, pl.DataFrame(columns)


def breakdown(size: int, n_resamples: int, names: list[str]) -> None:
    """Seconds per part of one interval statistic: point estimate, resamples, jackknife."""
    builders = {"srcc": bootstrap.srcc_statistic, "kendall": bootstrap.kendall_statistic, "pearson": bootstrap.pearson_statistic}
    items, scores = synthetic(size, 2)  # metric 0 is continuous (with 1 metric it is the rounded one)
    groups, n_groups = bootstrap.group_codes(items["group_id"].to_numpy())
    metric, human = scores["depict"].to_numpy(), items["human"].to_numpy()
    for name in [n for n in names if n in builders]:
        start = time.perf_counter()
        statistic = builders[name](metric, human, groups)
        statistic(np.ones((1, n_groups)))
        point = time.perf_counter()
        bootstrap.bootstrap_distribution(statistic, n_groups, n_resamples, 0)
        resamples = time.perf_counter()
        statistic.jackknife(n_groups)
        done = time.perf_counter()
        print(
            f"  {name:<8} at {size:,} items: point {point - start:6.2f} s, {n_resamples} resamples "
            f"{resamples - point:6.2f} s, jackknife {done - resamples:6.2f} s"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--metrics", type=int, default=3)
    parser.add_argument("--resamples", type=int, default=2000)
    parser.add_argument("--statistics", nargs="+", default=None, help="default: the protocol's correlation statistics")
    parser.add_argument("--baseline", default=None, help="another checkout: run the same benchmark on its code first")
    args = parser.parse_args()
    if args.baseline:
        here = [
            a for i, a in enumerate(sys.argv[1:])
            if a != "--baseline" and not a.startswith("--baseline=") and sys.argv[i] != "--baseline"
        ]  # fmt: skip
        for label, root in (("baseline " + args.baseline, args.baseline), ("this checkout", str(Path(__file__).resolve().parents[1]))):
            print(f"== {label}", flush=True)
            environment = dict(os.environ, PYTHONPATH=root)
            subprocess.run([sys.executable, str(Path(__file__).resolve()), *here], env=environment, check=True)
        return
    protocol = ProtocolSpec(kind="correlation")
    if args.statistics:
        protocol = ProtocolSpec(kind="correlation", statistics=args.statistics, primary_statistic=args.statistics[0])
    for size in args.sizes:
        items, scores = synthetic(size, args.metrics)
        start = time.perf_counter()
        result = evaluate(scores, items, protocol, n_resamples=args.resamples)
        elapsed = time.perf_counter() - start
        print(
            f"metaeval {size:>7,} items, {args.metrics} metrics, {len(protocol.statistics)} statistics, "
            f"{args.resamples} resamples: {elapsed:7.1f} s ({result.statistics.height} rows, {result.deltas.height} delta)",
            flush=True,
        )
    items, scores = synthetic(args.sizes[-1], 1)
    for statistic in protocol.statistics:
        start = time.perf_counter()
        evaluate(scores, items, ProtocolSpec(kind="correlation", statistics=[statistic], primary_statistic=statistic), n_resamples=args.resamples)
        print(f"  one metric at {args.sizes[-1]:,} items, {statistic:<12}: {time.perf_counter() - start:7.1f} s", flush=True)
    breakdown(args.sizes[-1], args.resamples, list(protocol.statistics))


if __name__ == "__main__":
    main()
