"""Ingest refuses a loader's items that lack a column every later stage needs, naming the
benchmark, the column and an item, before any model work (metaeval resamples by group_id and
cannot sort a null one)."""
from __future__ import annotations

import pytest

from pipeline.benchmarks.common import LoadResult
from pipeline.benchmarks.io import items_table
from pipeline.config import BenchmarkSpec
from pipeline.stages import ingest


def _loader_giving(rows):
    def load(root, **options):
        return LoadResult(items_table(rows, "pairs"))
    return lambda name: load


def _row(k, **extra):
    return {"item_id": f"p{k}", "image_uri": f"/data/{k}.png", "caption": "a red circle", "human": 3.0, **extra}


def test_items_without_a_group_id_are_refused_naming_the_benchmark_and_an_item(monkeypatch):
    monkeypatch.setattr(ingest, "loader", _loader_giving([_row(0, group_id="g0"), _row(1), _row(2)]))
    with pytest.raises(ValueError, match=r"^benchmark pairs \(loader pairs_csv\): 2 of 3 items have no group_id \(first: 'p1'\)"):
        ingest.load_items({"pairs": BenchmarkSpec(name="pairs", loader="pairs_csv", root="/data")})


def test_items_with_every_required_column_load(monkeypatch):
    monkeypatch.setattr(ingest, "loader", _loader_giving([_row(0, group_id="g0"), _row(1, group_id="g1")]))
    items, _, problems = ingest.load_items({"pairs": BenchmarkSpec(name="pairs", loader="pairs_csv", root="/data")})
    assert items["group_id"].to_list() == ["g0", "g1"] and problems.num_rows == 0
