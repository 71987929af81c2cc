"""Measurements a preflight takes on one loaded engine (pure: no Ray, no pipeline code).

`score_timed` scores a fixed list of prompts once and reports what a user about to spend
GPU-days needs to know first: answer mass per request kind, throughput, prefix-cache hit
rate and GPU memory. `agreement` compares two engines' answers on the same prompts.
"""
from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from operators.engines.base import Engine, Prompt
from operators.engines.yesno import answer_mass


@dataclass
class EngineRun:
    """One engine's answers to the preflight prompts, with the numbers around them."""

    logprobs: np.ndarray  # (n, 2) raw log-probabilities [yes, no]
    kinds: list[str]
    seconds: float
    prompt_tokens: int | None = None
    prefix_cache_hit_rate: float | None = None
    gpu_memory_gib: float | None = None
    mass_by_kind: dict[str, tuple[float, float]] = field(default_factory=dict)  # kind -> (median, p5)

    @property
    def requests_per_s(self) -> float:
        return len(self.kinds) / self.seconds if self.seconds > 0 else float("inf")

    @property
    def prompt_tokens_per_s(self) -> float | None:
        return self.prompt_tokens / self.seconds if self.prompt_tokens is not None and self.seconds > 0 else None


def score_timed(engine: Engine, prompts: Sequence[Prompt], kinds: Sequence[str]) -> EngineRun:
    """Score `prompts` in one engine call; mass per kind, throughput, cache and memory."""
    tokens_before = getattr(engine, "prompt_tokens", None)
    start = time.perf_counter()
    logprobs = np.asarray(engine.score_yes_no(list(prompts)), dtype=np.float64).reshape(len(prompts), 2)
    seconds = time.perf_counter() - start
    tokens_after = getattr(engine, "prompt_tokens", None)
    hit_rate = engine.prefix_cache_hit_rate() if hasattr(engine, "prefix_cache_hit_rate") else None
    run = EngineRun(
        logprobs=logprobs, kinds=list(kinds), seconds=seconds,
        prompt_tokens=None if tokens_before is None else tokens_after - tokens_before,
        prefix_cache_hit_rate=hit_rate, gpu_memory_gib=gpu_memory_in_use_gib(),
    )
    mass = answer_mass(logprobs[:, 0], logprobs[:, 1])
    for kind in dict.fromkeys(kinds):
        values = mass[[k == kind for k in kinds]]
        run.mass_by_kind[kind] = (float(np.median(values)), float(np.quantile(values, 0.05)))
    return run


def p_yes(logprobs: np.ndarray) -> np.ndarray:
    """Normalised P(yes) = sigmoid(logp_yes - logp_no), what the metrics read."""
    return 1.0 / (1.0 + np.exp(logprobs[:, 1] - logprobs[:, 0]))


def agreement(a: np.ndarray, b: np.ndarray) -> dict[str, float]:
    """How far two engines' answers to the same prompts are apart.

    max_abs_p_yes: largest |P(yes) difference| (the metrics' input); max_abs_logprob: largest
    raw log-probability difference over both answers.
    """
    return {
        "max_abs_p_yes": float(np.max(np.abs(p_yes(a) - p_yes(b)))),
        "max_abs_logprob": float(np.max(np.abs(a - b))),
    }


def gpu_memory_in_use_gib() -> float | None:
    """Memory in use on the current GPU, all processes (vLLM's engine runs in its own)."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    free, total = torch.cuda.mem_get_info()
    return (total - free) / 2**30


# How a backbone's engine turns its prefix cache off, to compare answers with it on.
PREFIX_CACHE_OFF = {"hf": {"prefix_reuse": False}, "vllm": {"enable_prefix_caching": False}}


def answers_one_at_a_time(engine: Engine, prompts: Sequence[Prompt]) -> np.ndarray:
    """Each prompt in a call of its own: what a request answered with no neighbours gets."""
    return np.concatenate([np.asarray(engine.score_yes_no([p]), dtype=np.float64).reshape(1, 2) for p in prompts])


def largest_difference(a: np.ndarray, b: np.ndarray) -> float:
    """Largest |log-probability difference| over both answers; 0.0 exactly when every bit agrees
    (an answer -inf on both sides counts as equal)."""
    same = (a == b) | (np.isnan(a) & np.isnan(b))
    return 0.0 if same.all() else float(np.max(np.abs(a[~same] - b[~same])))


def hardware(engine: object) -> str:
    """What the engine computed on: the GPU's name, or the CPU with its math threads (both change
    answers in their last digits, so an invariance record names them)."""
    import platform

    try:
        import torch
    except ImportError:
        return platform.machine()
    device = getattr(engine, "device", None)
    on_gpu = torch.cuda.is_available() if device is None else getattr(device, "type", str(device)) == "cuda"
    if on_gpu:
        return f"{torch.cuda.get_device_name()} (CUDA {torch.version.cuda}, torch {torch.__version__})"
    return f"CPU {platform.machine()} {platform.processor() or ''}".rstrip() + f", {torch.get_num_threads()} threads, torch {torch.__version__}"
