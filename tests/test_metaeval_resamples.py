"""jobs/metaeval.py: n_resamples=0 means point estimates without intervals.

docs/reproducing.md's commands pass n_resamples=0, which `evaluate` reads as "skip the
intervals": the job accepts it and the interval columns are empty (never a made-up interval);
1 to 9 are refused ("must be a whole number >= 10").
"""
from __future__ import annotations

import polars as pl

from jobs.metaeval import main as metaeval_main
from tests.test_released import _tifa_file


def test_zero_resamples_gives_the_same_estimates_and_no_intervals(tmp_path, capsys):
    path, _ = _tifa_file(tmp_path)
    for n in (0, 20):
        assert metaeval_main(["released=tifa", f"scores={path}", f"n_resamples={n}", f"out={tmp_path / str(n)}"]) == 0
    capsys.readouterr()
    none, some = (pl.read_parquet(tmp_path / n / "statistics.parquet") for n in ("0", "20"))
    assert none.height == some.height > 0
    assert none["ci_low"].null_count() == none["ci_high"].null_count() == none.height
    assert some["ci_low"].null_count() < some.height  # the bootstrap ran where intervals exist
    keys = ["metric", "subset", "statistic"]
    assert none.sort(keys)["value"].equals(some.sort(keys)["value"])  # point estimates do not depend on it
    deltas = pl.read_parquet(tmp_path / "0" / "deltas.parquet")
    assert deltas.height and deltas["ci_low"].null_count() == deltas["significant"].null_count() == deltas.height


def test_fewer_than_ten_resamples_are_still_refused(capsys):
    for bad in ("5", "-1", "1.5", "true"):
        assert metaeval_main(["scores=s.parquet", "human=h.csv", f"n_resamples={bad}"]) == 2
        err = capsys.readouterr().err.strip()
        assert "config error at 'n_resamples': must be 0 (no intervals) or a whole number >= 10" in err and len(err.splitlines()) == 1
