"""Typed configuration: OmegaConf structured configs over the YAML files in conf/."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ProtocolSpec:
    """How a benchmark is evaluated against its human signal."""

    # correlation (SRCC/PLCC/pairwise accuracy) | winoground | multiple_choice
    kind: str = "correlation"
    # correlation: srcc, plcc, pairwise_acc; winoground: text_acc, image_acc, group_acc;
    # multiple_choice: accuracy
    statistics: list[str] = field(default_factory=lambda: ["srcc", "plcc", "pairwise_acc"])
    # multiple choice ties: expected (1/k), strict (a tie fails), first (official NegBench argmax)
    tie_policy: str = "expected"
    # extra per-subset breakdowns: tags (GenAI-Bench skills), template (NegBench)
    breakdowns: list[str] = field(default_factory=list)
    # the statistic the paired bootstrap compares metrics on
    primary_statistic: str = "srcc"


@dataclass
class BenchmarkSpec:
    name: str = "???"
    loader: str = "???"  # module in pipeline.benchmarks: genai_bench, tifa160, richhf, winoground, negbench, demo
    root: str = "???"  # local folder or s3:// prefix holding the official files
    options: dict = field(default_factory=dict)  # loader keyword arguments
    protocol: ProtocolSpec = field(default_factory=ProtocolSpec)
    limit_groups: int | None = None  # keep only the first N bootstrap groups (smoke runs)
