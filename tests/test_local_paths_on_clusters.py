"""A local folder on a Ray cluster of several nodes is refused before any work: each node would
write answers to its own disk and the driver would never see those computed elsewhere
(tests/test_two_nodes.py runs the real thing; here the cluster's node list is stubbed)."""
from __future__ import annotations

import pytest

from pipeline.runtime import LocalPathOnCluster, refuse_unshared_paths


@pytest.fixture
def nodes(monkeypatch):
    import ray

    def alive(n: int, dead: int = 0):
        monkeypatch.setattr(ray, "nodes", lambda: [{"Alive": True}] * n + [{"Alive": False}] * dead)

    return alive


def test_one_node_accepts_local_folders(nodes):
    nodes(1, dead=3)  # dead nodes do not count
    refuse_unshared_paths({"root": "/data/outputs", "store": "outputs/store"})


def test_several_nodes_refuse_a_local_folder_in_one_line_naming_the_setting_and_both_fixes(nodes):
    nodes(2)
    with pytest.raises(LocalPathOnCluster) as info:
        refuse_unshared_paths({"root": "s3://bucket/runs", "data_root": "file:///data/sets"})
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("data_root=/data/sets is a local path, but this Ray cluster has 2 nodes")
    assert "use data_root=s3://<bucket>/<prefix>" in message and "compute.shared_paths=[/data/sets]" in message


def test_folders_under_a_declared_shared_mount_and_remote_urls_pass(nodes):
    nodes(3)
    refuse_unshared_paths({"root": "/mnt/lustre/runs", "store": "/mnt/lustre", "data_root": "s3://b/d", "unset": None},
                          ["/mnt/lustre/"])
    with pytest.raises(LocalPathOnCluster, match="root=/mnt/lustre-other"):  # a sibling with the same prefix is not under it
        refuse_unshared_paths({"root": "/mnt/lustre-other"}, ["/mnt/lustre"])


def test_the_sweep_checks_every_folder_its_workers_touch(tmp_path):
    from pipeline.config import load_config
    from pipeline.sweep import sweep_paths

    cfg = load_config([f"root={tmp_path}", f"benchmark_overrides.demo_large.root={tmp_path}/elsewhere"])
    paths = sweep_paths(cfg)
    assert paths["root"] == str(tmp_path) and paths["benchmark_overrides.demo_large.root"] == f"{tmp_path}/elsewhere"
    assert {"store", "data_root"} <= set(paths)


def test_the_api_refuses_a_local_root_on_a_cluster_before_scoring(ray_session, nodes, tmp_path):
    from PIL import Image

    from pipeline import Scorer

    scorer = Scorer("smoke", metrics=["vqascore"], root=tmp_path / "api", executor="ray")
    nodes(2)
    with pytest.raises(LocalPathOnCluster, match=rf"root={tmp_path / 'api'} is a local path, but this Ray cluster has 2 nodes"):
        scorer.score(images=[Image.new("RGB", (32, 32), "red")], captions=["a red square"], questions={"a red square": ["Is there a red square?"]})
    assert scorer.last.reports == []  # no stage ran


def test_ray_address_local_is_a_local_run_not_a_cluster(monkeypatch):
    """`RAY_ADDRESS=local` (exported to keep several Ray instances apart) starts a Ray here."""
    from pipeline.runtime import joins_cluster

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert not joins_cluster(None) and not joins_cluster("local") and joins_cluster("10.0.0.5:6379")
    monkeypatch.setenv("RAY_ADDRESS", "local")
    assert not joins_cluster(None) and joins_cluster("ray://head:10001")
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.5:6379")  # set by `ray job submit`
    assert joins_cluster(None) and not joins_cluster("local")
