"""A real two-node Ray cluster on this machine: a head (`ray start --head`) and a worker node
(`ray start --address=...`) that offers the custom resource `engine_node` and runs in its own
mount namespace where the test's temp folders and Ray's default temp dir are empty (its own model
cache lives there too), so that, as on a second machine, nothing the test or the head writes
locally is visible to it. Engine actors ask for
`engine_node` (`compute.engine_resources`), so they can only run on the worker; reading,
hashing and the driver run on the head. Outputs live on the local S3 server (moto), which both
nodes reach over 127.0.0.1.

- a local `root` is refused before any work (one line, exit 2, nothing written);
- a sweep loses its worker node mid-answers (every process of the node SIGKILLed) together with
  its driver; a new worker node joins; the rerun sends only the rows the lost node had not
  stored, every key is stored once, and the answers and scores equal an uninterrupted run's
  (to fp32 rounding: the resume batches other rows together);
- a nightly curation runs across both nodes.
Drivers are subprocesses that join the cluster with `compute.address`, as users run them.
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import polars as pl
import pytest
from killing import settled
from polars.testing import assert_frame_equal
from ray_nodes import RayHead, can_hide_folders, ray_head, ray_worker
from s3_server import S3Server, running_s3_server
from test_quiet_output import NOISE

from pipeline.config import load_config
from pipeline.sweep import run_sweep

REPO = Path(__file__).resolve().parent.parent
BUCKET = "depict-two-nodes"
ENGINE_NODE = {"engine_node": 1}
# The demo's correlation part, SRCC only; parts of 8 rows in batches of 16, so that the answers
# stage writes 22 parts one after another and a kill lands between them.
SWEEP = [
    "sweep=smoke",
    "benchmarks=[demo]", "metrics=[depict,agree,vqascore,dsg]", "baselines=[vqascore,dsg]",
    "compute.rows_per_part=8", "compute.rows_per_batch=16", "compute.progress_bars=false", "bootstrap.n_resamples=20",
    "benchmark_overrides.demo.protocol.statistics=[srcc]",
]
ON_THE_CLUSTER = ["compute.engine_resources={engine_node: 1}"]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not can_hide_folders(), reason="needs root and unshare to give the worker node its own view of the temp folders"),
]


@dataclass
class Cluster:
    head: RayHead
    s3: S3Server
    node_env: dict[str, str]  # the S3 endpoint and credentials every node and driver gets
    logs: Path
    private: Path  # the test session's temp folder: empty on the worker nodes

    @contextlib.contextmanager
    def worker(self, name: str) -> Iterator:
        """A worker node offering `engine_node`, with its own /tmp and model cache."""
        env = self.node_env | {"DEPICT_CACHE": str(self.private / "worker-model-cache")}  # on the node's private view
        # Ray's default temp dir too: the test session's own Ray keeps its session there
        with ray_worker(self.head, env, self.logs / f"{name}.log", resources=ENGINE_NODE, hide=[self.private, Path("/tmp/ray")]) as node:
            yield node

    def driver(self, job: str, args: list[str], log: Path) -> subprocess.Popen:
        """`python jobs/<job>.py ... compute.address=<head>`, in its own session."""
        command = [sys.executable, f"jobs/{job}.py", *args, f"compute.address={self.head.gcs_address}"]
        with open(log, "w") as out:
            return subprocess.Popen(command, cwd=REPO, env=self.head.client_env | self.node_env, stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)

    def keys(self, prefix: str) -> list[str]:
        listing = self.s3.client().list_objects_v2(Bucket=BUCKET, Prefix=prefix)
        return [o["Key"] for o in listing.get("Contents", [])]

    def read(self, key: str) -> pl.DataFrame:
        return pl.read_parquet(self.s3.client().get_object(Bucket=BUCKET, Key=key)["Body"].read())

    def json(self, key: str) -> dict:
        return json.loads(self.s3.client().get_object(Bucket=BUCKET, Key=key)["Body"].read())


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[Cluster]:
    logs = tmp_path_factory.mktemp("two_nodes")
    with running_s3_server() as s3:
        s3.create_bucket(BUCKET)
        env = s3.env()
        with ray_head(env, logs, auth=False) as head:
            yield Cluster(head, s3, env, logs, tmp_path_factory.getbasetemp())


def finished(proc: subprocess.Popen, log: Path, timeout: float = 300) -> None:
    try:
        code = proc.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        pytest.fail(f"the driver did not finish in {timeout:.0f} s:\n{log.read_text()[-4000:]}")
    assert code == 0, f"the driver exited {code}:\n{log.read_text()[-4000:]}"


def answers_report(manifest: dict) -> dict:
    (report,) = [r for r in manifest["stages"] if r["stage"] == "answers"]
    return report


def test_a_local_root_is_refused_before_any_work(cluster, tmp_path):
    with cluster.worker("worker-refusal"):
        root = tmp_path / "outputs"
        result = subprocess.run(
            [sys.executable, "jobs/sweep.py", f"root={root}", *SWEEP, f"compute.address={cluster.head.gcs_address}"],
            cwd=REPO, env=cluster.head.client_env | cluster.node_env, capture_output=True, text=True, timeout=120,
        )
    assert result.returncode == 2, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert errors == [
        f"error: root={root} is a local path, but this Ray cluster has 2 nodes and each would write to its own disk (answers "
        f"computed on another node would vanish from this run); use root=s3://<bucket>/<prefix>, or, if every node mounts "
        f"{root} at the same path (NFS, Lustre), declare it: compute.shared_paths=[{root}]"
    ]
    assert "Traceback" not in result.stderr
    assert not root.exists()  # refused before the lease, the run folder or the demo's files


def test_a_sweep_that_loses_its_engine_node_resumes_on_a_new_one(cluster, ray_session, tmp_path):
    parts_prefix = "sweep/store/answers/smoke/"
    log = tmp_path / "killed.log"
    with cluster.worker("worker-1") as lost:
        driver = cluster.driver("sweep", [f"root=s3://{BUCKET}/sweep", *SWEEP, *ON_THE_CLUSTER], log)
        deadline = time.time() + 240
        while sum("/part-" in k for k in cluster.keys(parts_prefix)) < 3:
            if driver.poll() is not None or time.time() > deadline:
                pytest.fail(f"the sweep never reached its answers (exit {driver.poll()}):\n{log.read_text()[-4000:]}")
            time.sleep(0.05)
        lost.kill()  # the node and everything on it: raylet, object store, the engine actor
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait()
    written = settled(lambda: sum("/part-" in k for k in cluster.keys(parts_prefix)), quiet_s=2)
    stored = pl.concat([cluster.read(k) for k in cluster.keys(parts_prefix) if "/part-" in k])["key"]

    reference = run_sweep(load_config([f"root={tmp_path / 'reference'}", *SWEEP]))  # one node, uninterrupted
    needed = next(r for r in reference.reports if r.stage == "answers").needed
    assert 0 < stored.n_unique() < needed, f"the kill must land in the middle of the answers stage ({written} parts)"

    with cluster.worker("worker-2"):
        resume_log = tmp_path / "resumed.log"
        finished(cluster.driver("sweep", [f"root=s3://{BUCKET}/sweep", *SWEEP, *ON_THE_CLUSTER], resume_log), resume_log)
        # both runs', dead actors included; an actor the pool killed before Ray placed it has no node
        engine_nodes = {a.node_id for a in engine_actors(cluster.head)}
        alive = cluster.head.alive_nodes()
    head_id = next(n.node_id for n in alive if n.is_head_node)
    new_id = next(n.node_id for n in alive if not n.is_head_node)
    # the engines ran on the worker nodes only: the lost one, then its replacement; never on the head
    assert len(engine_nodes) == 2 and new_id in engine_nodes and head_id not in engine_nodes

    # The whole output of a job whose engine ran on another node: our lines, none of Ray's or
    # transformers' internal chatter (the quieting travels to workers in the job's runtime_env).
    output = resume_log.read_text()
    assert [marker for marker in NOISE if marker in output] == [], output[-4000:]
    assert "answers/smoke:" in output and "WARNING: smoke: low answer mass" in output and "run: smoke" in output

    run = "sweep/runs/smoke"
    report = answers_report(cluster.json(f"{run}/manifest.json"))
    assert report["needed"] == needed
    assert report["cached"] == stored.n_unique()  # what the lost node had stored is kept...
    assert report["sent"] == needed - stored.n_unique()  # ...and only the rest is asked again
    print(f"two nodes: the lost node had stored {stored.n_unique()} of {needed} answers ({written} parts); the resume sent {report['sent']}")
    answers_now = pl.concat([cluster.read(k) for k in cluster.keys(parts_prefix) if "/part-" in k])
    assert answers_now["key"].len() == answers_now["key"].n_unique() == needed  # every key stored exactly once
    # Answers computed again agree with the uninterrupted run's to fp32 rounding, not to the bit:
    # the resume batches other rows together, and an fp32 forward rounds by its batch's shape and
    # by which questions of an image share its prefix (operators/engines/hf_prefix.py). Measured
    # in a full-suite run: 2 of 176 answers differed, logp by <= 2.8e-7, 4 scores by <= 1.5e-10.
    # Scores follow the answers within that, notes exactly.
    reference_answers = pl.concat([pl.read_parquet(p) for p in (tmp_path / "reference").rglob("part-*.parquet") if "answers" in p.parts])
    both = answers_now.join(reference_answers, on="key", suffix="_ref")
    assert both.height == needed
    drift = both.select((pl.col(c) - pl.col(f"{c}_ref")).abs().max() for c in ("logp_yes", "logp_no")).row(0)
    assert max(drift) <= 1e-5, drift
    order = ["item_id", "metric"]
    resumed = cluster.read(f"{run}/scores/smoke.parquet").sort(order)
    uninterrupted = pl.read_parquet(Path(reference.run_dir) / "scores" / "smoke.parquet").sort(order)
    assert_frame_equal(resumed, uninterrupted, check_exact=False, rtol=0, atol=1e-6)


def engine_actors(head: RayHead) -> list:
    """The engine actors Ray placed on a node, dead or alive (their class names are the answer
    writers'). One the pool killed while it still waited for a node has no node id: it ran nothing."""
    actors = head.state("actors", detail=True)
    return [a for a in actors if ("PartWriter" in a.class_name or a.class_name == "_Host") and a.node_id]


def test_a_nightly_curation_runs_across_both_nodes(cluster, tmp_path):
    from curation_shards import pair_rows, write_parquet

    local = tmp_path / "in"
    shards = [write_parquet(local / "day1-a.parquet", pair_rows(range(6))), write_parquet(local / "day1-b.parquet", pair_rows(range(6, 12)))]
    client = cluster.s3.client()
    for shard in shards:
        client.upload_file(str(shard), BUCKET, f"curation/in/{shard.name}")
    args = ["curation=smoke", f"root=s3://{BUCKET}/curation", f"inputs=[s3://{BUCKET}/curation/in/]", *ON_THE_CLUSTER]
    log = tmp_path / "curation.log"
    before = {a.actor_id for a in engine_actors(cluster.head)}
    with cluster.worker("worker-curation"):
        finished(cluster.driver("curate", args, log), log)
        alive = cluster.head.alive_nodes()
    worker_id = next(n.node_id for n in alive if not n.is_head_node)
    assert {a.node_id for a in engine_actors(cluster.head) if a.actor_id not in before} == {worker_id}
    decisions = [k for k in cluster.keys("curation/curation/smoke/decisions/") if k.endswith(".parquet")]
    assert len(decisions) == 2
    decided = pl.concat([cluster.read(k) for k in decisions])
    assert decided.height == 12 and decided["score_depict"].null_count() == 0
    assert decided["keep"].to_list() == (decided["score_depict"] >= 0.5).to_list()
    assert len([k for k in cluster.keys("curation/curation/smoke/filtered/") if k.endswith(".parquet")]) == 2
