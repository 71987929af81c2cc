"""Comparing two runs' tables: exactly, except the one statistic a numerical fit computes.

PLCC comes from a nonlinear least-squares fit (pipeline/stats/correlation.py): LAPACK's work
arrays land wherever the allocator puts them, and in a long-lived process (the whole suite)
two fits of the same data once ended 1e-11 apart (-0.30947108485813 vs -0.30947108486872,
on one subset of 288 rows). Its value is compared to 1e-9 relative; every other column and
statistic bit for bit.
"""
from __future__ import annotations

import polars as pl
from polars.testing import assert_frame_equal

FITTED = pl.col("statistic") == "plcc"


def assert_same_table(name: str, got: pl.DataFrame, want: pl.DataFrame) -> None:
    if name != "statistics" or "statistic" not in got.columns:
        assert_frame_equal(got, want, check_exact=True)
        return
    assert_frame_equal(got.drop("value"), want.drop("value"), check_exact=True)
    assert_frame_equal(got.filter(~FITTED), want.filter(~FITTED), check_exact=True)
    assert_frame_equal(got.filter(FITTED), want.filter(FITTED), check_exact=False, rtol=1e-9, atol=0.0)
