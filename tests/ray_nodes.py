"""Real Ray nodes for tests: a head started with `ray start --head` and worker nodes joined
with `ray start --address`, each in its own process session on this machine, every port chosen
here so that they collide with nothing (tests/test_job_submit.py, tests/test_two_nodes.py).

Ray replaces 127.0.0.1 with the machine's own address for the GCS and raylets, which listen on
every interface; the dashboard is bound to 127.0.0.1. Nothing is sent off this machine.
"""
from __future__ import annotations

import contextlib
import json
import os
import random
import secrets
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
from s3_server import kill_session

VENV_BIN = Path(sys.executable).parent


def free_ports(n: int) -> list[int]:
    """n distinct ports that are free now, below the kernel's ephemeral range (32768 and up)
    so that no process asking the OS for any free port is handed one before Ray binds it."""
    rng = random.Random()
    ports: list[int] = []
    while len(ports) < n:
        port = rng.randrange(20000, 32000)
        with socket.socket() as s:
            try:
                s.bind(("", port))
            except OSError:
                continue
        if port not in ports:
            ports.append(port)
    return ports


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without anything that would point Ray or boto elsewhere."""
    dropped = ("RAY_", "AWS_", "FSSPEC_S3")
    env = {k: v for k, v in os.environ.items() if not k.startswith(dropped)}
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"  # `python` in a job is the venv's
    return env | {"RAY_USAGE_STATS_ENABLED": "0", "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0", "PYTHONUNBUFFERED": "1"} | extra


@dataclass
class RayHead:
    address: str  # the Jobs API and state API: http://127.0.0.1:<dashboard port>
    gcs_address: str  # what drivers and worker nodes join: <machine address>:<GCS port>
    temp_dir: Path
    client_env: dict[str, str]  # what `ray job submit`, JobSubmissionClient, drivers and worker nodes need (the token)
    log: Path
    token: str | None = None  # the head's auth token, if token authentication is on

    def package_dir(self, uri: str) -> Path:
        """Where the head unpacked a working_dir package (gcs://_ray_pkg_<hash>.zip)."""
        import re

        name = re.search(r"(_ray_pkg_[0-9a-f]+)\.zip", uri).group(1)
        return self.temp_dir / "session_latest" / "runtime_resources" / "working_dir_files" / name

    def state(self, resource: str, detail: bool = False) -> list:
        """Ray's state API on this head (`nodes`, `actors`, ...), dead entries included: no driver needed."""
        from ray.util.state import StateApiClient
        from ray.util.state.common import ListApiOptions, StateResource

        headers = {"Authorization": f"Bearer {self.token}"} if self.token else None
        with without_ray_address():  # Ray lets $RAY_ADDRESS override the address given here
            client = StateApiClient(address=self.address, headers=headers)
        return client.list(StateResource(resource), ListApiOptions(limit=10_000, detail=detail), raise_on_missing_output=False)

    def alive_nodes(self) -> list:
        """The cluster's alive nodes (ray.util.state NodeState)."""
        return [node for node in self.state("nodes") if node.state == "ALIVE"]


@contextlib.contextmanager
def without_ray_address() -> Iterator[None]:
    """This process's environment without the variables by which Ray's clients replace an
    address they are given (RAY_ADDRESS, RAY_API_SERVER_ADDRESS), restored on exit."""
    names = ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS")
    saved = {name: os.environ.pop(name) for name in names if name in os.environ}
    try:
        yield
    finally:
        os.environ.update(saved)


@contextlib.contextmanager
def ray_head(node_env: dict[str, str], logs: Path, *, num_cpus: int = 2, auth: bool = True, attempts: int = 3) -> Iterator[RayHead]:
    """`ray start --head --block` in its own session; every process of it is killed on exit.

    A port chosen free may be taken before Ray binds it; the head is then started again
    with other ports.
    """
    for attempt in range(1, attempts + 1):
        # Ray's socket paths must stay under 107 bytes, so the temp dir lives directly in /tmp.
        temp_dir = Path(tempfile.mkdtemp(prefix="rayhead-", dir="/tmp"))
        token = temp_dir / "auth_token"
        token.write_text(secrets.token_hex(32))
        auth_env = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token)} if auth else {"RAY_AUTH_MODE": "disabled"}
        log = logs / f"ray-head-{attempt}.log"
        dashboard, gcs, *others = free_ports(9)
        with open(log, "w") as out:
            proc = subprocess.Popen(head_command(temp_dir, num_cpus, dashboard, gcs, *others), env=clean_env(**node_env, **auth_env),
                                    cwd=temp_dir, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        head = RayHead(f"http://127.0.0.1:{dashboard}", f"{node_address()}:{gcs}", temp_dir, clean_env(**auth_env), log,
                       token.read_text() if auth else None)
        try:
            if wait_for_jobs_api(head, proc) and wait_for_nodes(head, proc, 1):
                yield head
                return
            if attempt == attempts:
                pytest.fail(f"the Ray head did not start ({attempts} tries); last log:\n{log.read_text()[-3000:]}")
        finally:
            kill_session(proc.pid)  # the head's GCS, raylet, dashboard and workers share its session
            proc.wait()
            shutil.rmtree(temp_dir, ignore_errors=True)


def node_address() -> str:
    """The address Ray gives a node on this machine (it replaces 127.0.0.1 with it)."""
    from ray.util import get_node_ip_address

    return get_node_ip_address()


def head_command(temp_dir: Path, num_cpus: int, dashboard: int, gcs: int, node_manager: int, object_manager: int, client: int,
                 agent_http: int, agent_grpc: int, runtime_env_agent: int, metrics: int) -> list[str]:
    """Every port Ray would otherwise take at a fixed default (6379, 8265, 10001, 52365, ...)
    is chosen here, so this head cannot collide with another Ray on the machine."""
    return [
        str(VENV_BIN / "ray"), "start", "--head", "--block", "--disable-usage-stats",
        "--num-cpus", str(num_cpus), "--num-gpus", "0", "--temp-dir", str(temp_dir),
        "--port", str(gcs), "--include-dashboard", "true", "--dashboard-host", "127.0.0.1", "--dashboard-port", str(dashboard),
        "--ray-client-server-port", str(client), *node_ports(node_manager, object_manager, agent_http, agent_grpc, runtime_env_agent, metrics),
    ]


def node_ports(node_manager: int, object_manager: int, agent_http: int, agent_grpc: int, runtime_env_agent: int, metrics: int) -> list[str]:
    """The per-node ports (a second node on the same machine must not take the first one's)."""
    return [
        "--node-manager-port", str(node_manager), "--object-manager-port", str(object_manager),
        "--dashboard-agent-listen-port", str(agent_http), "--dashboard-agent-grpc-port", str(agent_grpc),
        "--runtime-env-agent-port", str(runtime_env_agent), "--metrics-export-port", str(metrics),
        "--min-worker-port", "0", "--max-worker-port", "0",
    ]


def wait_for_jobs_api(head: RayHead, proc: subprocess.Popen, timeout: float = 120) -> bool:
    """True once the Jobs API answers a request (authenticated, with a token); False if the head died."""
    headers = {"Authorization": f"Bearer {head.token}"} if head.token else {}
    request = urllib.request.Request(f"{head.address}/api/jobs/", headers=headers)
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            return False
        with contextlib.suppress(urllib.error.URLError, ConnectionError, TimeoutError), urllib.request.urlopen(request, timeout=5) as reply:
            if reply.status == 200:
                return True
        time.sleep(0.5)
    pytest.fail(f"the Jobs API did not come up in {timeout}s:\n{head.log.read_text()[-3000:]}")


def wait_for_nodes(head: RayHead, proc: subprocess.Popen, n: int, timeout: float = 60) -> bool:
    """True once the state API lists `n` alive nodes (the head's own node shows up a moment
    after its Jobs API does); False if the head died."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            return False
        if len(head.alive_nodes()) >= n:
            return True
        time.sleep(0.25)
    pytest.fail(f"the head's node did not register in {timeout}s:\n{head.log.read_text()[-3000:]}")


@dataclass
class RayWorker:
    """A worker node: `ray start --address=<head> --block` in its own session."""

    proc: subprocess.Popen
    log: Path

    def kill(self) -> None:
        """SIGKILL the node's every process (raylet, object store, its workers and actors), as a lost machine."""
        kill_session(self.proc.pid)
        self.proc.wait()


@contextlib.contextmanager
def ray_worker(head: RayHead, node_env: dict[str, str], log: Path, *, num_cpus: int = 1, resources: dict[str, float] | None = None,
               hide: Sequence[Path] = (), timeout: float = 90) -> Iterator[RayWorker]:
    """A worker node joined to `head`, killed on exit. `hide`: folders the node sees empty (an
    empty tmpfs over each, in a mount namespace of its own; needs root and `unshare`), so that it
    shares them with neither the head nor the test, as a second machine would not. Only those
    folders: a checkout or virtual environment under /tmp stays visible to it."""
    before = {node.node_id for node in head.alive_nodes()}
    command = [
        str(VENV_BIN / "ray"), "start", "--address", head.gcs_address, "--block", "--disable-usage-stats",
        "--num-cpus", str(num_cpus), "--num-gpus", "0", "--resources", json.dumps(resources or {}),
        "--object-store-memory", str(300 << 20), *node_ports(*free_ports(6)),
    ]
    if hide:
        mounts = " && ".join(f"mkdir -p {shlex.quote(str(d))} && mount -t tmpfs tmpfs {shlex.quote(str(d))}" for d in hide)
        command = ["unshare", "--mount", "--propagation", "private", "sh", "-c", f'{mounts} && exec "$@"', "sh", *command]
    with open(log, "w") as out:
        proc = subprocess.Popen(command, env=head.client_env | node_env, cwd="/", stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    worker = RayWorker(proc, log)
    try:
        deadline = time.time() + timeout
        while not {node.node_id for node in head.alive_nodes()} - before:
            if proc.poll() is not None or time.time() > deadline:
                pytest.fail(f"the worker node did not join (exit {proc.poll()}):\n{log.read_text()[-3000:]}")
            time.sleep(0.5)
        yield worker
    finally:
        if proc.poll() is None:
            worker.kill()


def can_hide_folders() -> bool:
    """Whether this machine lets a test give a process its own view of a folder (root and util-linux's unshare)."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    with tempfile.TemporaryDirectory() as folder:
        probe = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", f"mount -t tmpfs tmpfs {shlex.quote(folder)}"],
                               capture_output=True)
    return probe.returncode == 0
