"""The sweep as users run it on a cluster: `ray job submit` to a live Ray head.

A real head (`ray start --head`) is started for this module with its own temp dir and
ports, token authentication and a 2-CPU budget; it shares nothing with the test session's
local Ray. The smoke sweep is submitted twice, once with the CLI (outputs on the local
filesystem) and once with the Python JobSubmissionClient (outputs on a local S3 server, the
endpoint passed in the job's runtime_env, the credentials in the node's environment as on
a real cluster). Both must match a plain local run, and the uploaded working directory must
leave out .venv/, .git/ and other heavy folders (the repository's .rayignore).

Ray 2.60 cannot do without the dashboard here: the Jobs API is served by it. Ray replaces
127.0.0.1 with the machine's own address for the GCS and raylet, which listen on every
interface; the dashboard, the only HTTP endpoint the tests talk to, is bound to 127.0.0.1.
Nothing is sent off this machine.
"""
from __future__ import annotations

import contextlib
import json
import shlex
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import polars as pl
import pytest
from ray_nodes import RayHead, ray_head
from s3_server import S3Server, running_s3_server
from same_outputs import assert_same_table

from pipeline.config import load_config
from pipeline.sweep import run_sweep

REPO = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent
BUCKET = "depict-jobs"
# The smoke sweep (tiny random-weight VLM), on the demo's correlation part only.
SMOKE = [
    "sweep=smoke",
    "benchmarks=[demo]", "metrics=[depict,agree,vqascore,dsg]", "baselines=[vqascore,dsg]",
    "compute.rows_per_part=16", "compute.progress_bars=false", "bootstrap.n_resamples=20",
    "benchmark_overrides.demo.protocol.statistics=[srcc]",  # what travels is the same, without PLCC's fits in each run
]
JOB_TIMEOUT_S = 400
# Folders that must never be uploaded with the working directory. (__pycache__ is left out
# of the upload too, but the job itself writes new ones into its unpacked copy.)
NEVER_UPLOADED = (".venv", ".git", "outputs", "runs", ".pytest_cache", ".hypothesis", ".ruff_cache")

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Server]:
    with running_s3_server() as server:
        server.create_bucket(BUCKET)
        yield server


@pytest.fixture(scope="module")
def head(s3, tmp_path_factory) -> Iterator[RayHead]:
    # As on a cluster node: credentials in the environment (an instance role or a Kubernetes
    # Secret in real life), the endpoint left to each job's runtime_env.
    node_env = {k: v for k, v in s3.env().items() if k != "AWS_ENDPOINT_URL"}
    with ray_head(node_env, tmp_path_factory.mktemp("ray_head")) as started:
        yield started


# Submits one job with the Python API and waits for it; prints the outcome as JSON.
SUBMIT_WITH_PYTHON = """
import json, sys, time
from ray.job_submission import JobSubmissionClient

address, entrypoint, runtime_env, timeout = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), float(sys.argv[4])
client = JobSubmissionClient(address)
job = client.submit_job(entrypoint=entrypoint, runtime_env=runtime_env)
deadline = time.time() + timeout
while not client.get_job_status(job).is_terminal() and time.time() < deadline:
    time.sleep(1)
info = client.get_job_info(job)
print(json.dumps({"status": str(info.status), "working_dir": info.runtime_env.get("working_dir"), "logs": client.get_job_logs(job)}))
"""


@dataclass
class Submitted:
    cli_root: Path
    cli_exit: int | None  # None: it did not finish in time
    cli_output: str
    python_exit: int | None
    python_output: str
    local_run: Path  # the same sweep run directly in this process


@pytest.fixture(scope="module")
def submitted(head, s3, ray_session, tmp_path_factory) -> Submitted:
    """Both submissions at once, and meanwhile the reference run in this process.

    CLI: outputs on the local filesystem (head and test share the machine). Python client:
    outputs on S3, with the endpoint in the job's runtime_env and .gitignore handling off,
    so that .rayignore alone has to keep .venv/ out of the upload.
    """
    work = tmp_path_factory.mktemp("jobs")
    cli_root = work / "cli"
    cli = [str(VENV_BIN / "ray"), "job", "submit", "--address", head.address, "--working-dir", str(REPO),
           "--", "python", "jobs/sweep.py", f"root={cli_root}", *SMOKE]
    entrypoint = shlex.join(["python", "jobs/sweep.py", f"root=s3://{BUCKET}/py", *SMOKE])
    runtime_env = {"working_dir": str(REPO), "env_vars": {"AWS_ENDPOINT_URL": s3.endpoint}}
    python = [sys.executable, "-c", SUBMIT_WITH_PYTHON, head.address, entrypoint, json.dumps(runtime_env), str(JOB_TIMEOUT_S)]
    with contextlib.ExitStack() as stack:
        cli_log, python_log = (stack.enter_context(open(work / name, "w+")) for name in ("cli.log", "python.log"))
        procs = [
            subprocess.Popen(cli, cwd=REPO, env=head.client_env, stdout=cli_log, stderr=subprocess.STDOUT),
            subprocess.Popen(python, cwd=REPO, env=head.client_env | {"RAY_RUNTIME_ENV_IGNORE_GITIGNORE": "1"},
                             stdout=python_log, stderr=subprocess.STDOUT),
        ]
        try:
            local_run = Path(run_sweep(load_config([f"root={work / 'local'}", *SMOKE])).run_dir)
            exits = [wait_or_none(proc, JOB_TIMEOUT_S) for proc in procs]
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                proc.wait()
    return Submitted(cli_root, exits[0], (work / "cli.log").read_text(), exits[1], (work / "python.log").read_text(), local_run)


def wait_or_none(proc: subprocess.Popen, timeout: float) -> int | None:
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        return None


def assert_same_results(scores: pl.DataFrame, statistics: pl.DataFrame, reference: Path) -> None:
    assert scores.height > 0 and scores["score"].null_count() == 0
    assert scores.sort("item_id", "metric").equals(pl.read_parquet(reference / "scores" / "smoke.parquet").sort("item_id", "metric"))
    order = ["benchmark", "backbone", "metric", "subset", "statistic"]
    assert_same_table("statistics", statistics.sort(order), pl.read_parquet(reference / "statistics.parquet").sort(order))


def assert_nothing_heavy_uploaded(package: Path) -> None:
    files = [p.relative_to(package) for p in package.rglob("*")]
    assert (package / "jobs" / "sweep.py").is_file() and (package / "pipeline" / "store" / "parts.py").is_file()
    uploaded = [f for f in files if set(f.parts) & set(NEVER_UPLOADED) or f.parts[0].endswith(".egg-info")]
    assert not uploaded, f"uploaded with the working dir: {uploaded[:10]}"
    size = sum(p.stat().st_size for p in package.rglob("*") if p.is_file())
    assert size < 20 << 20, f"working dir package is {size / 2**20:.1f} MiB"


def test_submit_with_the_cli(head, submitted):
    output = submitted.cli_output
    assert submitted.cli_exit == 0, f"ray job submit ended with {submitted.cli_exit}; its output and the job's logs:\n{output[-6000:]}"
    assert "succeeded" in output
    run = submitted.cli_root / "runs" / "smoke"
    for name in ("manifest.json", "summary.txt", "items.parquet", "errors.parquet", "statistics.csv", "records/smoke.parquet"):
        assert (run / name).is_file(), name
    scores, statistics = pl.read_parquet(run / "scores" / "smoke.parquet"), pl.read_parquet(run / "statistics.parquet")
    assert_same_results(scores, statistics, submitted.local_run)
    assert_nothing_heavy_uploaded(head.package_dir(output))


def test_submit_with_the_python_client_to_s3(head, s3, submitted):
    assert submitted.python_exit == 0, f"the submitting script ended with {submitted.python_exit}:\n{submitted.python_output[-4000:]}"
    outcome = json.loads(submitted.python_output.strip().splitlines()[-1])
    assert outcome["status"] == "SUCCEEDED", f"job ended {outcome['status']}; its logs:\n{outcome['logs'][-6000:]}"
    run = "py/runs/smoke"
    objects = {o["Key"] for o in s3.client().list_objects_v2(Bucket=BUCKET, Prefix="py/").get("Contents", [])}
    for name in ("manifest.json", "summary.txt", "items.parquet", "errors.parquet", "statistics.csv", "records/smoke.parquet"):
        assert f"{run}/{name}" in objects, name
    assert any(key.startswith("py/store/answers/smoke/part-") for key in objects)

    def read(key: str) -> pl.DataFrame:
        return pl.read_parquet(s3.client().get_object(Bucket=BUCKET, Key=key)["Body"].read())

    assert read(f"{run}/items.parquet")["image_uri"].str.starts_with(f"s3://{BUCKET}/py/datasets/").all()
    assert_same_results(read(f"{run}/scores/smoke.parquet"), read(f"{run}/statistics.parquet"), submitted.local_run)
    assert_nothing_heavy_uploaded(head.package_dir(outcome["working_dir"]))
