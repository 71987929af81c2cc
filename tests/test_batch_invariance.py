"""The hf engine gives a request the same log-probabilities, bit for bit, whatever else shares its
call: alone or among 3, 8 or 64, in the demo's order or shuffled, with the backbone's `batch_size`
at 64 or 3, with image-prefix reuse on or off. With batched rows (left padding to a neighbour's
length, image groups formed by what a call holds) the shipped micro model's answers move by up
to 1.6e-5 between calls of 1, 3 or 8 and one call of all; `engine_options.batch_invariant: false`
(batched rows, padded together) stays within the documented 1e-4."""
from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest

from operators.engines.hf import HFEngine
from pipeline.config import load_config
from pipeline.preflight_checks import PreflightOptions, preflight_prompts

CALL_SIZES = (1, 3, 8, 64)
BATCHED_BOUND = 1e-4  # docs/engines.md, "Batch composition": batch_invariant false


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """The demo's image, caption-only and holistic prompts about 6 images (61 requests), and the configs."""
    cfg = load_config([f"root={tmp_path_factory.mktemp('demo')}", "benchmarks=[demo]", "backbones=[micro,smoke]"])
    prompts, kinds = preflight_prompts(cfg, PreflightOptions(images=6, questions_per_image=5), None)
    assert {"image", "caption", "holistic"} == set(kinds)
    return cfg, prompts


def answers_in_calls(engine: HFEngine, prompts, call_size: int, order: list[int]) -> np.ndarray:
    """The prompts answered `call_size` at a time, in `order`, placed back in prompt order."""
    out = np.full((len(prompts), 2), np.nan)
    for start in range(0, len(order), call_size):
        part = order[start:start + call_size]
        out[part] = engine.score_yes_no([prompts[i] for i in part])
    return out


def engine(cfg, backbone: str, **options) -> HFEngine:
    spec = cfg.backbones[backbone]
    batch_size = options.pop("batch_size", spec.batch_size)
    return HFEngine(dataclasses.replace(spec, batch_size=batch_size, engine_options={**spec.engine_options, **options}), device="cpu")


@pytest.mark.parametrize("backbone, reuse", [("micro", True), ("micro", False), ("smoke", True)])
def test_a_request_gets_the_same_bits_whatever_shares_its_call(demo, backbone, reuse):
    cfg, prompts = demo
    wide = engine(cfg, backbone, prefix_reuse=reuse, batch_size=64)
    assert wide.prefix_reuse == reuse
    reference = wide.score_yes_no(prompts)
    shuffled = list(range(len(prompts)))
    random.Random(7).shuffle(shuffled)
    for call_size in CALL_SIZES:
        for order in (list(range(len(prompts))), shuffled):
            got = answers_in_calls(wide, prompts, call_size, order)
            assert np.array_equal(got, reference), (call_size, order[:3], np.abs(got - reference).max())
    narrow = engine(cfg, backbone, prefix_reuse=reuse, batch_size=3)
    assert np.array_equal(answers_in_calls(narrow, prompts, 8, shuffled), reference)


def test_batched_rows_stay_within_the_documented_bound(demo):
    """`batch_invariant: false`: rows padded together and prefix groups formed per call; faster on
    a CPU, and answers that move in their last digits with the batch."""
    cfg, prompts = demo
    batched = engine(cfg, "micro", batch_invariant=False, batch_size=64)
    reference = batched.score_yes_no(prompts)
    order = list(range(len(prompts)))
    random.Random(7).shuffle(order)
    for call_size in CALL_SIZES:
        got = answers_in_calls(batched, prompts, call_size, order)
        assert np.abs(got - reference).max() <= BATCHED_BOUND
    invariant = engine(cfg, "micro", batch_size=64).score_yes_no(prompts)
    assert np.abs(invariant - reference).max() <= BATCHED_BOUND  # the two modes answer alike


@pytest.mark.vllm_cpu
@pytest.mark.slow
def test_preflight_measures_vllms_invariance_on_this_cpu(demo):
    """The micro model through the real vLLM (CPU build, float32): preflight's record of each
    prompt alone vs all in one call and the prefix cache on vs off, within the documented noise."""
    from pipeline.preflight_checks import check_backbone
    from tests.vllm_cpu import require_vllm_cpu

    require_vllm_cpu()
    cfg, _ = demo
    spec = dataclasses.replace(cfg.backbones["micro"], engine="vllm")
    options = PreflightOptions(min_median_mass=0, min_p5_mass=0, images=2, compare_hf=False)
    prompts, kinds = preflight_prompts(cfg, options, None)
    result = check_backbone(spec, prompts, kinds, options)
    record = result.invariance
    # two images: each one's first questions (on the image and from the caption alone) and its holistic question
    assert kinds.count("holistic") == 2 and kinds.count("image") == kinds.count("caption") > 2
    assert record["engine"] == "vllm" and record["prompts"] == len(prompts)
    assert record["prefix_cache_on_vs_off"]["option"] == {"enable_prefix_caching": False}
    for measure in ("batch_1_vs_n", "prefix_cache_on_vs_off"):
        assert 0.0 <= record[measure]["max_abs_logprob"] <= BATCHED_BOUND, record
    assert any(line.startswith(f"  invariance         batch 1 vs {len(prompts)}: ") for line in result.lines), result.lines


def test_the_mode_is_not_part_of_the_answer_key():
    """Both modes compute the same quantity (within the bound above): stored answers stay valid."""
    from operators.engines.spec import BackboneSpec

    spec = BackboneSpec(name="m", model_id="org/model", engine="hf")
    assert dataclasses.replace(spec, engine_options={"batch_invariant": False}).fingerprint() == spec.fingerprint()
    assert dataclasses.replace(spec, engine_options={"cpu_dtype": "bfloat16"}).fingerprint() != spec.fingerprint()
