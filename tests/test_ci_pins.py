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


def test_ci_installs_the_vllm_the_cluster_image_builds():
    dockerfile = (ROOT / "infra" / "Dockerfile").read_text()
    (image_vllm,) = re.findall(r"^ARG VLLM_VERSION=(\S+)", dockerfile, flags=re.M)
    assert _pins(ROOT / ".ci" / "vllm-cpu.txt")["vllm"] == image_vllm


def test_the_cluster_pin_pass_finds_every_library_it_overrides():
    run = (ROOT / ".ci" / "run").read_text()
    (pattern,) = re.findall(r"grep -E '\^\(([^)]*)\)==' infra/requirements-cluster.txt", run)
    cluster = _pins(ROOT / "infra" / "requirements-cluster.txt")
    for name in pattern.split("|"):
        assert name in cluster, f".ci/run overrides {name}, which infra/requirements-cluster.txt does not pin"
    assert "-m templates" in run
