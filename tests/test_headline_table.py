"""The end-of-run table: each benchmark's primary statistic per backbone and metric, with its
bootstrap interval, and neither a made-up interval nor a number where the run has none."""
from __future__ import annotations

import math

import polars as pl

from pipeline.config import load_config
from pipeline.sweep import headline_table


def row(benchmark, metric, value, low=None, high=None, statistic=None, subset="all"):
    primary = {"demo": "srcc", "demo_winoground": "group_acc", "demo_mcq": "accuracy"}[benchmark]
    return {"benchmark": benchmark, "backbone": "micro", "metric": metric, "subset": subset,
            "statistic": statistic or primary, "value": value, "ci_low": low, "ci_high": high}


def test_values_carry_their_intervals_and_missing_ones_stay_missing(tmp_path):
    cfg = load_config([f"root={tmp_path}", "sweep=smoke", "backbones=[micro]"])
    stats = pl.DataFrame([
        row("demo", "depict", 0.4563, 0.1801, 0.6372),
        row("demo", "dsg", 0.5349, -0.0914, 0.7301),
        row("demo", "depict", 0.99, 0.0, 1.0, statistic="plcc"),  # not the primary statistic
        row("demo", "depict", 0.11, 0.0, 1.0, subset="basic"),  # not the whole benchmark
        row("demo_winoground", "depict", 0.1667),  # no interval computed (n_resamples=0)
        row("demo_mcq", "depict", math.nan, math.nan, math.nan),  # undefined
    ], schema_overrides={"ci_low": pl.Float64, "ci_high": pl.Float64})
    lines = headline_table(stats, cfg).splitlines()
    assert [c.strip() for c in lines[0].split("|")[1:-1]] == ["backbone", "metric", "demo:srcc", "demo_winoground:group_acc", "demo_mcq:accuracy"]
    cells = {line.split("|")[2].strip(): [c.strip() for c in line.split("|")[3:-1]] for line in lines[2:]}
    assert cells == {"depict": ["0.456 [0.180, 0.637]", "0.167", "-"], "dsg": ["0.535 [-0.091, 0.730]", "", ""]}
    assert [line.split("|")[2].strip() for line in lines[2:]] == ["depict", "dsg"]  # the sweep's metric order
    assert len({len(line) for line in lines}) == 1  # aligned


def test_no_statistics_no_table(tmp_path):
    cfg = load_config([f"root={tmp_path}"])
    empty = pl.DataFrame([row("demo", "depict", 0.5, 0.1, 0.9)]).clear()
    assert headline_table(empty, cfg) == ""
