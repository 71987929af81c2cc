"""jobs/preflight.py on CPU (tiny built-in model, hf engine) and its checks."""
from __future__ import annotations

import dataclasses
import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

from operators.engine_probe import agreement, p_yes
from operators.engines.spec import BackboneSpec
from pipeline.config import load_config
from pipeline.preflight_checks import PreflightOptions, check_backbone, preflight_prompts

ROOT = Path(__file__).parents[1]
FAKE_VLLM = ROOT / "tests" / "fake_vllm" / "vllm" / "__init__.py"


def _job():
    spec = importlib.util.spec_from_file_location("preflight_job", ROOT / "jobs" / "preflight.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_cpu_preflight_prints_the_report_and_fails_on_random_weights(tmp_path, capsys):
    job = _job()
    prefixes = "backbone_overrides.smoke.assistant_prefix_candidates=['','<think>\\n\\n</think>\\n\\n']"
    assert job.main([f"root={tmp_path}", prefixes]) == 1
    report = capsys.readouterr().out
    for needle in ("preflight: smoke", "prompts            15 (image 6, caption 6, holistic 3)", "answer mass        image",
                   "requests/s", "prompt tokens/s", "prefix cache hits  n/a", "GPU memory in use", "assistant prefix   '<think>"):
        assert needle in report, needle
    # random weights spread their mass over the whole vocabulary: the check must catch it
    assert "FAIL: low answer mass for image, caption, holistic" in report and "BOS" in report
    assert report.rstrip().endswith("preflight FAILED for smoke: do not start the sweep before fixing these")


def test_cpu_preflight_passes_with_thresholds_at_zero_and_rejects_bad_options(tmp_path, capsys):
    job = _job()
    assert job.main([f"root={tmp_path}", "min_mass=0", "min_p5=0", "images=1"]) == 0
    report = capsys.readouterr().out
    assert "prompts            5 (image 2, caption 2, holistic 1)" in report and report.rstrip().endswith("preflight passed")
    assert job.main([f"root={tmp_path}", "min_mass=high"]) == 2
    assert job.main([f"root={tmp_path}", "backbones=[no-such-backbone]"]) == 2


def test_agreement_measures_p_yes_and_raw_logprob_gaps():
    a = np.log([[0.6, 0.3], [0.1, 0.8]])
    b = np.log([[0.3, 0.6], [0.1, 0.8]])
    assert p_yes(a) == pytest.approx([2 / 3, 1 / 9])
    gap = agreement(a, b)
    assert gap["max_abs_p_yes"] == pytest.approx(1 / 3) and gap["max_abs_logprob"] == pytest.approx(np.log(2))
    assert agreement(a, a) == {"max_abs_p_yes": 0.0, "max_abs_logprob": 0.0}


@pytest.fixture
def fake_vllm(monkeypatch):
    spec = importlib.util.spec_from_file_location("vllm", FAKE_VLLM)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "vllm", module)
    spec.loader.exec_module(module)
    return module


def test_vllm_backbones_are_compared_with_hf_and_disagreement_fails(tmp_path, tiny_vlm_dir, fake_vllm):
    cfg = load_config([f"root={tmp_path}", "benchmarks=[demo]"])
    options = PreflightOptions(min_median_mass=0, min_p5_mass=0, images=1)
    prompts, kinds = preflight_prompts(cfg, options, None)
    spec = BackboneSpec(name="v", model_id=tiny_vlm_dir, engine="vllm", dtype="float32")
    result = check_backbone(spec, prompts, kinds, options)
    llm, without_cache = fake_vllm.LLM_INSTANCES
    assert llm.kwargs["disable_log_stats"] is False  # prefix-cache stats on for the preflight
    assert without_cache.kwargs["enable_prefix_caching"] is False  # the invariance record's second load
    assert result.invariance["prefix_cache_on_vs_off"]["option"] == {"enable_prefix_caching": False}
    assert any(line.startswith("  hf vs vllm         max |dP(yes)|") for line in result.lines)
    # the fake's answers are not the model's: the engines must be reported as disagreeing
    assert not result.ok and "hf and vLLM disagree" in result.failures[0]
    skipped = check_backbone(spec, prompts, kinds, PreflightOptions(min_median_mass=0, min_p5_mass=0, compare_hf=False))
    assert skipped.ok and "  hf vs vllm         not compared (compare_hf=false)" in skipped.lines


class PrefixSensitiveEngine:
    """Puts most mass on yes/no only when the thought block is closed (as a Gemma-4 may)."""

    def __init__(self, spec):
        self.spec = spec

    def score_yes_no(self, prompts):
        mass = 0.98 if self.spec.assistant_prefix == "<|channel>thought\n<channel|>" else 0.02
        return np.tile(np.log([mass * 0.7, mass * 0.3]), (len(prompts), 1))


def test_the_prefix_with_the_most_answer_mass_is_recommended():
    from operators.engines.base import Prompt
    from pipeline.preflight_checks import _prefix_candidates

    spec = BackboneSpec(name="gemma4-12b", model_id="m", engine="vllm", assistant_prefix_candidates=["", "<|channel>thought\n<channel|>"])
    engine = PrefixSensitiveEngine(spec)
    lines = _prefix_candidates(engine, spec, [Prompt(user="Is there a cat?")] * 3, ["caption"] * 3)
    assert engine.spec.assistant_prefix == ""  # the configured prefix is restored
    assert "lowest median mass 0.020" in lines[0] and "lowest median mass 0.980" in lines[1]
    assert lines[-1] == ("  -> recommended: backbone_overrides.gemma4-12b.assistant_prefix='<|channel>thought\\n<channel|>' "
                         "(mass 0.020 -> 0.980)")


def test_preflight_measures_batch_invariance_and_every_later_manifest_carries_it(tmp_path, capsys):
    """On the micro model (hf, CPU): each prompt alone answers as all prompts in one call, bit for
    bit; prefix reuse off moves answers in their last digits only. The record lands in the store,
    where a run's manifest finds it for the backbone as configured (not for another configuration)."""
    from pipeline.preflight_checks import invariance_for_manifest

    job = _job()
    assert job.main([f"root={tmp_path}", "backbones=[micro]", "images=2", "invariance=maybe"]) == 2
    assert job.main([f"root={tmp_path}", "backbones=[micro]", "images=2"]) == 0
    report = capsys.readouterr().out
    assert "  invariance         batch 1 vs 10: bit-identical; prefix cache on vs off: " in report, report
    cfg = load_config([f"root={tmp_path}", "backbones=[micro]"])
    spec = cfg.backbones["micro"]
    record = invariance_for_manifest(cfg.sweep.store, [spec])["micro"]
    assert record["fingerprint"] == spec.fingerprint() and record["engine"] == "hf" and record["hardware"].startswith("CPU ")
    assert record["batch_1_vs_n"] == {"max_abs_logprob": 0.0, "bit_identical": True}
    assert 0.0 <= record["prefix_cache_on_vs_off"]["max_abs_logprob"] < 1e-4
    assert record["prefix_cache_on_vs_off"]["option"] == {"prefix_reuse": False}
    other = dataclasses.replace(spec, max_image_pixels=4096)  # another configuration: another fingerprint
    assert "measured for another configuration" in invariance_for_manifest(cfg.sweep.store, [other])["micro"]["not_measured"]


def test_an_answer_that_moves_with_its_batch_is_reported_with_its_size():
    """The record's numbers come from the answers compared, -inf on both sides counting as equal."""
    from pipeline.preflight_checks import invariance_line, invariance_record

    together = np.array([[np.log(0.6), np.log(0.3)], [np.log(0.1), np.log(0.8)], [-np.inf, 0.0]])
    alone = together.copy()
    alone[1, 0] += 2.5e-6  # one answer moved when asked alone
    spec = BackboneSpec(name="s", model_id="m", engine="scripted")
    record = invariance_record(spec, [None] * 3, together, alone, "CPU x86_64, 1 threads")
    assert record["batch_1_vs_n"] == {"max_abs_logprob": pytest.approx(2.5e-6), "bit_identical": False}
    assert record["prefix_cache_on_vs_off"] == {"not_measured": "engine scripted has no prefix cache to turn off"}
    assert invariance_line(record) == ("batch 1 vs 3: max |dlogprob| 2.5e-06; prefix cache on vs off: not measured "
                                       "(engine scripted has no prefix cache to turn off)")
    assert invariance_record(spec, [None] * 3, together, together.copy(), "cpu")["batch_1_vs_n"]["bit_identical"]
