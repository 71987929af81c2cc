"""Memory ceilings: a bounded object store and OOM retries for a local Ray, Ray Data
backpressure below the object store, and per-task memory reservations that can always be placed."""
import pytest

from pipeline.config import ComputeSpec, ConfigError, load_config
from pipeline.runtime import GiB, MemoryLimits, ensure_ray, local_memory_kwargs, task_options


def test_local_ray_gets_a_bounded_object_store_and_bounded_oom_retries():
    kwargs = local_memory_kwargs(MemoryLimits(object_store_memory_gb=1.5, oom_retries=2))
    assert kwargs == {"_system_config": {"task_oom_retries": 2}, "object_store_memory": int(1.5 * GiB)}
    assert "object_store_memory" not in local_memory_kwargs(MemoryLimits())  # Ray's own default


def test_limits_come_from_the_compute_config():
    limits = MemoryLimits.from_compute(ComputeSpec(task_memory_gb=0.5, oom_retries=1, data_object_store_fraction=0.25))
    assert (limits.task_memory_gb, limits.oom_retries, limits.data_object_store_fraction) == (0.5, 1, 0.25)
    assert MemoryLimits.from_compute(object()) == MemoryLimits()  # a config without the fields: defaults


@pytest.mark.parametrize("override", ["compute.data_object_store_fraction=0", "compute.task_memory_gb=0", "compute.oom_retries=-1"])
def test_bad_memory_settings_are_config_errors(tmp_path, override):
    with pytest.raises(ConfigError, match="compute"):
        load_config([f"root={tmp_path}", override])


def test_ray_data_waits_below_the_object_store_and_tasks_reserve_placeable_memory(ray_session):
    ensure_ray(progress_bars=False, memory=MemoryLimits(data_object_store_fraction=0.4, task_memory_gb=1000.0))
    store = ray_session.cluster_resources()["object_store_memory"]
    limit = ray_session.data.DataContext.get_current().execution_options.resource_limits.object_store_memory
    assert limit == pytest.approx(0.4 * store)
    resources = ray_session.cluster_resources()
    memory = task_options()["memory"]
    assert 0 < memory <= resources["memory"] / resources["CPU"]  # 1000 GiB asked: capped to a CPU's share
    assert ray_session.data.range(4).map_batches(lambda b: b, **task_options()).count() == 4  # placeable
    ensure_ray(progress_bars=False)  # back to the defaults for the rest of the session
