"""sweep=laptop: a real model small enough for a laptop CPU. It cannot run here (no model
hub), so this checks what can be checked offline: the preset validates, and it runs the
hf engine (the code path the tiny random-weight Qwen3.5 model tests end to end) on the
smallest backbone of the paper's main family."""
from __future__ import annotations

import re

from pipeline.config import CONF_DIR, load_config


def _billions(size: str) -> float:
    return float(re.sub(r"[^0-9.]", "", size))


def test_laptop_preset_validates_and_uses_the_smallest_real_qwen3_5_on_the_hf_engine(tmp_path):
    cfg = load_config(["sweep=laptop", f"root={tmp_path}"])
    (name,) = cfg.sweep.backbones
    backbone = cfg.backbones[name]
    assert backbone.engine == "hf" and not backbone.model_id.startswith("builtin:")
    assert backbone.family == "qwen3_5" and not backbone.note  # real weights: no "scores mean nothing" note
    assert set(cfg.benchmarks) == {"demo", "demo_winoground", "demo_mcq"}
    assert cfg.sweep.questions.source == "benchmark"  # the demo ships questions: no generation on CPU
    assert cfg.sweep.compute.threads_per_engine == 0  # every core: Ray alone would give the engine one
    paper = load_config(["sweep=paper", f"root={tmp_path}"])
    family = [b for b in paper.backbones.values() if b.family == backbone.family]
    assert family and all(_billions(backbone.size) < _billions(b.size) for b in family)


def test_laptop_backbone_file_names_itself():
    text = (CONF_DIR / "backbones" / "qwen3_5-0_8b.yaml").read_text()
    assert "name: qwen3_5-0_8b" in text and "Qwen/Qwen3.5-0.8B" in text
