"""An engine stage never waits forever for GPUs the cluster does not have: on a cluster without
GPUs a vLLM engine runs on vLLM's CPU build when that is installed, anything else asking for more
GPUs than any node has fails at once, naming the backbone, the ask and what the nodes have."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from operators.engines import vllm
from operators.engines.spec import BackboneSpec
from pipeline.config import ComputeSpec
from pipeline.stages import engine_stage, placement
from pipeline.stages.placement import engine_pool, placeable


def _pool(engine: str, **compute):
    return engine_pool(BackboneSpec(name="big", model_id="some/model", engine=engine, tensor_parallel_size=2), ComputeSpec(**compute))


def _nodes(monkeypatch, *gpus: float, groups=None):
    """The cluster's alive nodes with these GPUs, and the node groups its autoscaler published."""
    import ray
    from ray._private.state import state

    monkeypatch.setattr(ray, "nodes", lambda: [{"Alive": True, "Resources": {"CPU": 2.0, **({"GPU": g} if g else {})}} for g in gpus])
    config = None if groups is None else SimpleNamespace(node_group_configs=[SimpleNamespace(max_count=n, resources={"GPU": g}) for n, g in groups])
    monkeypatch.setattr(state, "get_cluster_config", lambda: config)


def test_a_vllm_engine_on_a_cluster_without_gpus_runs_on_the_cpu_build(monkeypatch, caplog):
    _nodes(monkeypatch, 0, 0)
    monkeypatch.setattr(vllm, "cpu_build", lambda: "0.32.0")
    pool = placeable(_pool("vllm"), "answers")
    assert pool.num_gpus == 0
    assert "backbone big asks for 2 GPU(s) per engine and this cluster has none: its vLLM engines run on the CPU" in caplog.text


def test_without_the_cpu_build_a_gpu_ask_on_a_cpu_cluster_fails_at_once(monkeypatch):
    _nodes(monkeypatch, 0)
    monkeypatch.setattr(vllm, "cpu_build", lambda: None)
    with pytest.raises(RuntimeError, match=r"answers: backbone big asks for 2 GPU\(s\) per engine, but no node has a GPU.*install vLLM's CPU build"):
        placeable(_pool("vllm"), "answers")


def test_an_ask_larger_than_any_node_fails_at_once_even_with_the_cpu_build(monkeypatch):
    _nodes(monkeypatch, 1, 1)  # two GPUs in the cluster, but no node has both
    monkeypatch.setattr(vllm, "cpu_build", lambda: "0.32.0")
    with pytest.raises(RuntimeError, match=r"asks for 2 GPU\(s\) per engine, but no node has more than 1.*gpus_per_engine"):
        placeable(_pool("vllm"), "answers")
    with pytest.raises(RuntimeError, match=r"asks for 3 GPU\(s\)"):
        placeable(_pool("hf", gpus_per_engine=3), "judge")


def test_asks_that_fit_and_opted_in_waits_are_left_alone(monkeypatch):
    _nodes(monkeypatch, 0, 4)
    assert placeable(_pool("vllm"), "answers").num_gpus == 2
    assert placeable(_pool("hf"), "answers").num_gpus == 0  # hf/scripted engines ask for none
    _nodes(monkeypatch, 0)
    assert placeable(_pool("vllm", wait_for_gpus=True), "answers").num_gpus == 2  # an autoscaler adds GPU nodes


def test_gpu_nodes_an_autoscaler_may_add_count(monkeypatch):
    """A KubeRay cluster scaling its GPU groups from zero has no GPU node at the start."""
    monkeypatch.setattr(vllm, "cpu_build", lambda: None)
    _nodes(monkeypatch, 0, groups=[(0, 8), (4, 2)])  # a group that may not grow does not count
    assert placeable(_pool("vllm"), "answers").num_gpus == 2
    _nodes(monkeypatch, 0, groups=[(4, 1)])
    with pytest.raises(RuntimeError, match="no node has more than 1"):
        placeable(_pool("vllm"), "answers")


def test_the_local_test_cluster_has_no_gpu(ray_session):
    assert placement.largest_gpu_node() == 0


def test_the_ray_path_places_the_pool_before_asking_for_actors(monkeypatch):
    seen = []

    def refuse(pool, stage):
        seen.append((pool.num_gpus, stage))
        raise RuntimeError("refused")

    monkeypatch.setattr(engine_stage, "placeable", refuse)
    with pytest.raises(RuntimeError, match="refused"):
        engine_stage.compute_blocks([], object, {}, _pool("vllm"), stage="answers")
    assert seen == [(2, "answers")]


def test_engines_asking_for_a_resource_no_node_offers_fail_at_once(monkeypatch):
    import ray

    def nodes(*offers):
        monkeypatch.setattr(ray, "nodes", lambda: [{"Alive": True, "Resources": {"CPU": 2.0, **o}} for o in offers]
                            + [{"Alive": False, "Resources": {"vlm_node": 9.0}}])  # a dead node offers nothing

    pool = _pool("hf", engine_resources={"vlm_node": 2})
    nodes({}, {"vlm_node": 1.0})
    with pytest.raises(RuntimeError, match=r"answers: backbone big's engines ask for \{'vlm_node': 2\} \(compute.engine_resources\), which no alive node offers"):
        placeable(pool, "answers")
    assert placeable(_pool("hf", engine_resources={"vlm_node": 2}, wait_for_gpus=True), "answers")  # an autoscaler adds them
    nodes({}, {"vlm_node": 2.0})
    assert placeable(pool, "answers").resources == {"vlm_node": 2}
    assert engine_stage._actor_asks(pool) == {"resources": {"vlm_node": 2}}


def test_an_unplaceable_pool_ends_a_job_with_one_line_and_exit_2(monkeypatch, capsys):
    import ray

    from pipeline.cli import guarded

    monkeypatch.setattr(ray, "nodes", lambda: [{"Alive": True, "Resources": {"CPU": 2.0}}])

    @guarded
    def job(argv):
        placeable(_pool("hf", engine_resources={"vlm_node": 1}), "answers")
        return 0

    assert job([]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: answers: backbone big's engines ask for {'vlm_node': 1}") and "\n" not in err
