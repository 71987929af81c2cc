"""The smoke sweep on fixture copies of all five benchmarks, in their official formats.

Files are written by tests/benchmark_files.py exactly as the releases ship them; the sweep
reads them through the real loaders, generates questions with a scripted generator (a
random-weight model cannot write parseable ones), answers with the tiny VLM, and must produce
statistics of each benchmark's own protocol.
"""
from __future__ import annotations

import polars as pl
import pytest

from operators.metrics import catalog
from pipeline.config import load_config
from pipeline.sweep import run_sweep
from tests.benchmark_files import write_genai_bench, write_negbench, write_richhf, write_tifa160, write_winoground

pytestmark = pytest.mark.slow

# First match wins: the DSG prompt also mentions yes/no questions.
GENERATIONS = [
    {"contains": "dependency graph", "text": '[["1", "Is there an object?", []], ["2", "Is the object in the picture?", ["1"]]]'},
    {"contains": "yes/no questions", "text": '["Is there an object?", "Is the object in the picture?"]'},
]
EXPECTED = {
    "genai_bench": {"srcc", "kendall", "pearson", "plcc", "pairwise_acc"},
    "tifa160": {"srcc", "kendall", "pearson", "plcc", "pairwise_acc"},
    "richhf": {"srcc", "kendall", "pearson", "plcc"},  # SPEC: no pairwise accuracy for RichHF
    "winoground": {"text_acc", "image_acc", "group_acc"},
    "negbench": {"accuracy"},
}


def test_smoke_sweep_on_all_five_official_formats(ray_session, tmp_path, tiny_vlm_dir):
    data = tmp_path / "datasets"  # the folder names conf/benchmarks/*.yaml expect under data_root
    written = {
        "genai_bench": write_genai_bench(data / "GenAI-Image-1600", n_prompts=4),
        "tifa160": write_tifa160(data / "tifa160", n_prompts=3),
        "richhf": write_richhf(data / "richhf_18k", n_images=6),
        "winoground": write_winoground(data / "winoground", n_examples=3),
        "negbench": write_negbench(data / "negbench", n_rows=6),
    }
    cfg = load_config(
        [f"root={tmp_path}", f"data_root={data}", "compute.progress_bars=false", "bootstrap.n_resamples=50"],
        overrides={
            "name": "five",
            "backbones": ["micro"],  # the default's oracle answers only the demo world
            "benchmarks": list(EXPECTED),
            "questions": {"source": "model", "generator": "zero-cost", "sets": ["depict", "dsg"]},
            # the question-based metrics: the default's judge (the micro model writing verdicts on
            # these non-demo images) would refuse them, as error rows this test is not about
            "metrics": list(catalog.DEFAULT_METRICS),
            "backbone_overrides": {"zero-cost": {"engine_options": {"generations": GENERATIONS}}},
            "benchmark_overrides": {name: {"options": w.options} for name, w in written.items() if w.options},
        },
    )
    result = run_sweep(cfg)

    items = pl.read_parquet(f"{result.run_dir}/items.parquet")
    counts = dict(items.group_by("benchmark").len().iter_rows())
    assert counts == {name: w.items for name, w in written.items()}
    assert result.errors.height == 0, result.errors
    scores = result.scores
    assert scores.height == items.height * len(cfg.sweep.metrics)
    assert scores["score"].null_count() == 0
    stats = result.statistics.filter(pl.col("subset") == "all")
    for name, statistics in EXPECTED.items():
        got = stats.filter((pl.col("benchmark") == name) & (pl.col("metric") == "depict"))
        assert set(got["statistic"]) == statistics, name
        assert got["value"].is_finite().all(), got
    # NegBench is also broken down by template, and every benchmark gets a delta row
    assert result.statistics.filter((pl.col("benchmark") == "negbench") & pl.col("subset").str.starts_with("template="))["subset"].n_unique() == 3
    assert set(result.deltas["benchmark"]) == set(EXPECTED)
