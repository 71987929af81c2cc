"""The pipeline on S3, against a local moto server: the part store and run outputs on s3://,
benchmark images read from s3://, a sweep killed and resumed there, transient errors
survived with identical results, no partial object ever readable, and credentials that
never reach an output file or a log.

Sweeps run as subprocesses (`python jobs/sweep.py root=s3://...`), as users run them: the
endpoint and credentials reach the driver and its Ray workers through the environment only.
"""
from __future__ import annotations

import collections
import contextlib
import errno
import io
import json
import os
import secrets
import shutil
import string
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import polars as pl
import pyarrow as pa
import pytest
import s3fs
from botocore.exceptions import ClientError, EndpointConnectionError
from s3_server import Faults, S3Server, kill_session, running_s3_server
from s3fs.errors import translate_boto_error
from same_outputs import assert_same_table

from operators import retry, schema
from pipeline.config import load_config
from pipeline.store import settings
from pipeline.store.fs import exists, read_json, read_table, table_to_parquet_bytes, write_bytes_atomic, write_json, write_table
from pipeline.store.parts import Markers, PartStore
from pipeline.sweep import run_sweep

REPO = Path(__file__).resolve().parent.parent
BUCKET = "depict-test"
# The smoke sweep, cut down to what storage needs: the zero-cost engine (answers derived from
# a hash of the prompt, so no model to load) still makes the answer actors read every image
# from S3 and write a part per 4 requests (about 45 parts).
SWEEP = [
    "sweep=smoke",
    "backbones=[zero-cost]", "benchmarks=[demo]", "metrics=[depict,agree,vqascore,dsg]", "baselines=[vqascore,dsg]",
    "compute.rows_per_part=4", "compute.rows_per_batch=16", "compute.progress_bars=false", "bootstrap.n_resamples=20",
    # SRCC only: what is stored and read on S3 is the same, without PLCC's logistic fits in each run
    "benchmark_overrides.demo.protocol.statistics=[srcc]",
]  # Ray batches of 4 parts: a worker finishes the batch in its hands after a kill, so keep them small
BACKBONE = "zero-cost"
SWEEP_TIMEOUT_S = 300


def answers(keys, value=0.0):
    n = len(keys)
    return pa.table({"key": keys, "backbone": ["b"] * n, "kind": ["image"] * n, "logp_yes": [value] * n, "logp_no": [-1.0] * n})


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Server]:
    with running_s3_server() as server:
        server.create_bucket(BUCKET)
        yield server


@pytest.fixture
def s3_env(s3, monkeypatch) -> S3Server:
    """This process reaches the server through the environment only, as the pipeline does.

    AWS_MAX_ATTEMPTS=1 turns botocore's own retries off, so every injected fault reaches
    the store's retry layer (in production botocore absorbs the short ones first).
    """
    for name in list(os.environ):
        if name.startswith(("AWS_", "FSSPEC_S3")):
            monkeypatch.delenv(name)
    for name, value in s3.env(AWS_MAX_ATTEMPTS="1").items():
        monkeypatch.setenv(name, value)
    s3fs.S3FileSystem.clear_instance_cache()
    yield s3
    s3.faults = None
    s3fs.S3FileSystem.clear_instance_cache()


def s3_object(s3: S3Server, key: str) -> bytes:
    return s3.client().get_object(Bucket=BUCKET, Key=key)["Body"].read()


def s3_keys(s3: S3Server, prefix: str) -> list[str]:
    pages = s3.client().get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
    return [obj["Key"] for page in pages for obj in page.get("Contents", [])]


# -- classifying and retrying errors ------------------------------------------------------------


def s3_error(code: str, status: int) -> OSError:
    """The exception s3fs raises for an S3 error reply (after botocore and s3fs gave up)."""
    error = ClientError({"Error": {"Code": code, "Message": code}, "ResponseMetadata": {"HTTPStatusCode": status}}, "PutObject")
    return translate_boto_error(error)


@pytest.mark.parametrize(
    "exc, transient",
    [
        (s3_error("SlowDown", 503), True),
        (s3_error("ServiceUnavailable", 503), True),
        (s3_error("InternalError", 500), True),
        (s3_error("503", 503), True),  # a HEAD reply has no body, only the status
        (EndpointConnectionError(endpoint_url="http://127.0.0.1:1"), True),
        (ConnectionResetError(errno.ECONNRESET, "reset"), True),
        (TimeoutError(), True),
        (s3_error("NoSuchKey", 404), False),
        (s3_error("NoSuchBucket", 404), False),
        (s3_error("AccessDenied", 403), False),
        (FileNotFoundError("x"), False),
        (ValueError("bad parquet"), False),
    ],
)
def test_transient_errors_are_told_from_permanent_ones(exc, transient):
    assert retry.is_transient(exc) is transient


def test_retry_backs_off_exponentially_and_gives_up_saying_so(monkeypatch):
    waits: list[float] = []
    monkeypatch.setattr(retry.time, "sleep", waits.append)
    calls = []

    def flaky():
        calls.append(1)
        raise OSError(errno.EBUSY, "SlowDown")

    policy = retry.RetryPolicy(attempts=6, first_delay_s=0.1, max_delay_s=0.5)
    with pytest.raises(OSError) as info:
        retry.retrying("write s3://b/x", flaky, policy)
    assert len(calls) == 6 and len(waits) == 5
    assert "write s3://b/x: gave up after 6 attempts" in info.value.__notes__
    # 0.1, 0.2, 0.4, then capped at 0.5; each scaled by a jitter in [0.5, 1]
    for wait, bound in zip(waits, [0.1, 0.2, 0.4, 0.5, 0.5], strict=True):
        assert 0.5 * bound <= wait <= bound


def test_a_permanent_error_is_raised_at_once():
    calls = []

    def missing():
        calls.append(1)
        raise FileNotFoundError("s3://b/nothing")

    with pytest.raises(FileNotFoundError):
        retry.retrying("read s3://b/nothing", missing, retry.RetryPolicy(attempts=5, first_delay_s=0.01))
    assert calls == [1]


def test_workers_get_storage_settings_but_never_secrets():
    environ = {
        "AWS_ENDPOINT_URL": "http://minio:9000",
        "AWS_REGION": "eu-west-1",
        "AWS_ACCESS_KEY_ID": "AKIAEXAMPLE",
        "AWS_SECRET_ACCESS_KEY": "secret",
        "AWS_SESSION_TOKEN": "token",
        "FSSPEC_S3_ENDPOINT_URL": "http://minio:9000",
        "FSSPEC_S3_KEY": "AKIAEXAMPLE",
        "FSSPEC_S3_SECRET": "secret",
        "HOME": "/root",
    }
    assert settings.worker_env(environ) == {
        "AWS_ENDPOINT_URL": "http://minio:9000",
        "AWS_REGION": "eu-west-1",
        "FSSPEC_S3_ENDPOINT_URL": "http://minio:9000",
    }
    job = {"RAY_JOB_CONFIG_JSON_ENV_VAR": json.dumps({"runtime_env": {"working_dir": "gcs://x.zip", "env_vars": {"AWS_REGION": "eu-west-1"}}})}
    assert settings.submitted_job_env_vars(job) == {"AWS_REGION": "eu-west-1"}
    assert settings.submitted_job_env_vars({}) == {}


def test_inside_a_job_the_driver_leaves_the_jobs_own_variables_alone(monkeypatch):
    from pipeline.runtime import worker_env_vars

    for name in list(os.environ):
        if name.startswith(("AWS_", "FSSPEC_S3", "RAY_JOB_CONFIG_JSON_ENV_VAR")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("DEPICT_VERBOSE", "1")  # the storage settings alone (a quiet run adds pipeline/console.py's)
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://minio:9000")
    monkeypatch.setenv("AWS_REGION", "eu-west-1")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    assert worker_env_vars() == {"AWS_ENDPOINT_URL": "http://minio:9000", "AWS_REGION": "eu-west-1"}
    job = {"runtime_env": {"working_dir": "gcs://x.zip", "env_vars": {"AWS_ENDPOINT_URL": "http://minio:9000"}}}
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", json.dumps(job))
    assert "AWS_ENDPOINT_URL" not in worker_env_vars()  # Ray refuses a driver that sets it again
    assert worker_env_vars()["AWS_REGION"] == "eu-west-1"


def test_a_quiet_run_hands_workers_the_quieting_variables_the_job_does_not_set_itself(monkeypatch):
    from pipeline import console
    from pipeline.runtime import worker_env_vars

    monkeypatch.delenv("DEPICT_VERBOSE", raising=False)
    job = {"runtime_env": {"env_vars": {"RAY_DATA_LOG_LEVEL": "INFO"}}}
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", json.dumps(job))
    handed = worker_env_vars()
    assert "RAY_DATA_LOG_LEVEL" not in handed
    assert {k: handed[k] for k in console.QUIET_ENV if k != "RAY_DATA_LOG_LEVEL"} == {
        k: os.environ.get(k, v) for k, v in console.QUIET_ENV.items() if k != "RAY_DATA_LOG_LEVEL"}


# -- the store on S3 --------------------------------------------------------------------------------


def test_part_store_on_s3_sees_parts_that_other_processes_wrote(s3_env):
    store = PartStore(f"s3://{BUCKET}/unit/answers/b", schema.ANSWERS)
    assert store.read().num_rows == 0
    store.write(answers(["a", "b"]))
    assert sorted(store.keys().to_pylist()) == ["a", "b"]
    # Another process adds a part; this process has the folder's listing cached by now.
    other = store.part_url(["c"])
    s3_env.client().put_object(Bucket=BUCKET, Key=other.removeprefix(f"s3://{BUCKET}/"), Body=table_to_parquet_bytes(answers(["c"])))
    assert exists(other)
    assert sorted(store.keys().to_pylist()) == ["a", "b", "c"]
    assert store.missing(["a", "c", "x"]).to_pylist() == [False, False, True]
    assert store.read().column("logp_no").to_pylist() == [-1.0] * 3


def test_run_outputs_and_markers_on_s3(s3_env):
    run = f"s3://{BUCKET}/unit/runs/r"
    write_table(f"{run}/items.parquet", pa.table({"x": [1, 2]}))
    write_json(f"{run}/manifest.json", {"n": 2})
    assert read_table(f"{run}/items.parquet").column("x").to_pylist() == [1, 2]
    assert read_json(f"{run}/manifest.json") == {"n": 2}
    markers = Markers(f"{run}/markers")
    assert not markers.done("u")
    markers.mark("u", {"k": 1})
    assert markers.done("u") and markers.info("u") == {"k": 1}
    with pytest.raises(FileNotFoundError):
        read_table(f"{run}/missing.parquet")


def test_errors_that_escape_botocore_and_s3fs_are_retried(s3_env, monkeypatch):
    monkeypatch.setattr(retry, "DEFAULT_RETRY", retry.RetryPolicy(first_delay_s=0.01))
    prefix = f"{BUCKET}/unit/flaky/"
    s3_env.faults = Faults(rate=1.0, prefixes=(prefix,), limit=5, seed=3)
    store = PartStore(f"s3://{prefix}answers", schema.ANSWERS)
    store.write(answers(["a", "b"]))
    assert sorted(store.keys().to_pylist()) == ["a", "b"]
    write_table(f"s3://{prefix}items.parquet", pa.table({"x": [7]}))
    assert read_table(f"s3://{prefix}items.parquet").column("x").to_pylist() == [7]
    assert s3_env.count(prefix=prefix, injected=True) == 5


def test_retries_are_bounded(s3_env, monkeypatch):
    monkeypatch.setattr(retry, "DEFAULT_RETRY", retry.RetryPolicy(attempts=3, first_delay_s=0.01))
    prefix = f"{BUCKET}/unit/down/"
    s3_env.faults = Faults(rate=1.0, prefixes=(prefix,), after=0.0, statuses=(500,))
    with pytest.raises(OSError) as info:
        write_bytes_atomic(f"s3://{prefix}x.json", b"{}")
    assert any("gave up after 3 attempts" in note for note in info.value.__notes__)
    assert s3_env.count("PUT", prefix=prefix) == 3
    assert s3_env.count("PUT", prefix=prefix, ok=True) == 0


def test_a_missing_bucket_is_an_error_naming_the_file_not_a_new_bucket(s3_env):
    url = "s3://no-such-bucket-here/run/items.parquet"
    with pytest.raises(FileNotFoundError) as info:
        write_table(url, pa.table({"x": [1]}))
    assert f"while trying to write {url}" in info.value.__notes__
    assert "no-such-bucket-here" not in {b["Name"] for b in s3_env.client().list_buckets()["Buckets"]}


def test_a_missing_object_is_not_retried(s3_env):
    key = f"{BUCKET}/unit/never-written.parquet"
    with pytest.raises(FileNotFoundError):
        read_table(f"s3://{key}")
    assert s3_env.count("GET", prefix=key) == 1


# -- nothing partial is ever readable ---------------------------------------------------------------


def start_python(code: str, *args: str, env: dict[str, str], log: Path) -> subprocess.Popen:
    with open(log, "w") as out:
        return subprocess.Popen([sys.executable, "-c", code, *args], cwd=REPO, env=env, start_new_session=True,
                                stdout=out, stderr=subprocess.STDOUT)


def subprocess_env(s3: S3Server, **extra: str) -> dict[str, str]:
    """This process's environment pointed at `s3` alone; a sweep started with it runs its own
    Ray (RAY_ADDRESS=local: not the caller's, nor one `ray start` left running here)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "FSSPEC_S3", "RAY_ADDRESS", "RAY_TMPDIR", "RAY_JOB"))}
    return env | s3.env() | {"PYTHONUNBUFFERED": "1", "RAY_ADDRESS": "local"} | extra


def test_a_writer_killed_mid_put_leaves_no_object(s3_env, tmp_path):
    """A part big enough that the client is still sending its body when it is killed."""
    key = f"unit/killed/answers/part-{'0' * 24}.parquet"
    code = "import sys; from pipeline.store.fs import write_bytes_atomic; write_bytes_atomic(sys.argv[1], b'x' * (64 << 20))"
    with s3_env.hold(lambda method, k, query: method == "PUT" and k == f"{BUCKET}/{key}") as arrived:
        writer = start_python(code, f"s3://{BUCKET}/{key}", env=subprocess_env(s3_env), log=tmp_path / "writer.log")
        try:
            assert arrived.wait(60), (tmp_path / "writer.log").read_text()[-2000:]
        finally:
            kill_session(writer.pid)
            writer.wait()
    # the held request now reaches moto with a truncated body
    s3_env.wait_idle()
    assert s3_keys(s3_env, "unit/killed/") == []
    assert PartStore(f"s3://{BUCKET}/unit/killed/answers", schema.ANSWERS).part_paths() == []
    assert not exists(f"s3://{BUCKET}/{key}")


def test_a_writer_killed_mid_multipart_upload_leaves_no_object(s3_env, tmp_path):
    """Large files go up in parts; the object exists only once the upload is completed."""
    key = "unit/killed-multipart/answers/part-big.parquet"
    code = (
        "import sys, fsspec\n"
        "fs = fsspec.filesystem('s3')\n"
        "with fs.open(sys.argv[1], 'wb', block_size=5 << 20) as f:\n"
        "    for _ in range(3):\n"
        "        f.write(b'y' * (5 << 20))  # each full block goes up as one part\n"
    )
    def completes(method, k, query):
        return method == "POST" and k == f"{BUCKET}/{key}" and "uploadId=" in query
    with s3_env.hold(completes, forward=False) as arrived:
        writer = start_python(code, f"s3://{BUCKET}/{key}", env=subprocess_env(s3_env), log=tmp_path / "writer.log")
        try:
            assert arrived.wait(60), (tmp_path / "writer.log").read_text()[-2000:]
            kill_session(writer.pid)
            writer.wait()
            uploads = s3_env.client().list_multipart_uploads(Bucket=BUCKET, Prefix=key).get("Uploads", [])
            assert len(uploads) == 1  # its parts are up; only the completion is missing
            assert s3_env.count("PUT", prefix=f"{BUCKET}/{key}", ok=True) >= 2
            assert s3_keys(s3_env, "unit/killed-multipart/") == []
            assert PartStore(f"s3://{BUCKET}/unit/killed-multipart/answers", schema.ANSWERS).part_paths() == []
        finally:
            kill_session(writer.pid)
    s3_env.wait_idle()
    assert not exists(f"s3://{BUCKET}/{key}")


# -- sweeps on S3 -------------------------------------------------------------------------------------


@contextlib.contextmanager
def short_tmp_dir() -> Iterator[Path]:
    """A folder directly under /tmp: Ray's socket paths must stay under 107 bytes."""
    path = Path(tempfile.mkdtemp(prefix="ray-s3-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def sweep_process(s3: S3Server, root: str, log_path: Path, ray_dir: Path, **env: str) -> Iterator[subprocess.Popen]:
    """`python jobs/sweep.py root=s3://<bucket>/<root>` with its own local Ray under ray_dir."""
    cmd = [sys.executable, "jobs/sweep.py", f"root=s3://{BUCKET}/{root}", *SWEEP, "compute.num_cpus=2"]
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, cwd=REPO, env=subprocess_env(s3, RAY_TMPDIR=str(ray_dir), **env),
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            yield proc
        finally:
            kill_session(proc.pid)  # the driver, and Ray's processes that outlive it
            proc.wait()


def run_sweep_process(s3: S3Server, root: str, log_path: Path, ray_dir: Path, **env: str) -> str:
    """Run a sweep to the end; returns its log (stdout and stderr)."""
    with sweep_process(s3, root, log_path, ray_dir, **env) as proc:
        try:
            code = proc.wait(SWEEP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            code = None
    log = log_path.read_text()
    assert code == 0, f"sweep on s3://{BUCKET}/{root} ended with {code}:\n{log[-4000:]}"
    return log


def s3_parquet(s3: S3Server, key: str) -> pl.DataFrame:
    return pl.read_parquet(io.BytesIO(s3_object(s3, key)))


def sorted_scores(frame: pl.DataFrame) -> pl.DataFrame:
    return frame.sort("item_id", "metric")


def answers_stage(manifest: dict) -> dict:
    (stage,) = [s for s in manifest["stages"] if s["stage"] == "answers"]
    return stage


SECRETS = {
    "AWS_ACCESS_KEY_ID": "AKIA" + "".join(secrets.choice(string.ascii_uppercase + string.digits) for _ in range(16)),
    "AWS_SECRET_ACCESS_KEY": secrets.token_urlsafe(30)[:40],
    "AWS_SESSION_TOKEN": "IQoJb3JpZ2luX2VjE" + secrets.token_urlsafe(48),
}
ROOT = "sweep"  # s3://<bucket>/sweep
RUN = f"{ROOT}/runs/smoke"
PARTS = f"{ROOT}/store/answers/{BACKBONE}/part-"


@dataclass
class Scenario:
    """A sweep on S3, SIGKILLed in the middle of its answers and run again to the end while
    10% of the requests to the store and the run outputs fail (500 InternalError or 503
    SlowDown, some after the write landed); both runs with secret-looking credentials."""

    written: set[str]  # answer keys in the store when the first run was killed
    logs: dict[str, str]  # stdout and stderr of both runs
    ray_dirs: list[Path]  # both runs' Ray session folders (all of Ray's logs)
    local_run: Path  # the same sweep run on the local filesystem, in this process


@pytest.fixture(scope="module")
def scenario(s3, ray_session, tmp_path_factory) -> Iterator[Scenario]:
    logs = tmp_path_factory.mktemp("s3_sweep")
    with short_tmp_dir() as killed_ray, short_tmp_dir() as resumed_ray:
        with sweep_process(s3, ROOT, logs / "killed.log", killed_ray, **SECRETS) as proc:
            deadline = time.time() + SWEEP_TIMEOUT_S
            while s3.count("PUT", prefix=f"{BUCKET}/{PARTS}", ok=True) < 3:
                if proc.poll() is not None or time.time() > deadline:
                    pytest.fail(f"the sweep was not killed mid-answers:\n{(logs / 'killed.log').read_text()[-3000:]}")
                time.sleep(0.02)
        s3.wait_idle()  # a PUT received just before the kill may still be landing
        written = {k for key in s3_keys(s3, PARTS) for k in s3_parquet(s3, key)["key"]}

        # botocore's own retries are off, so only the store's retries can save the run
        s3.faults = Faults(rate=0.1, prefixes=(f"{BUCKET}/{ROOT}/store/", f"{BUCKET}/{ROOT}/runs/"), seed=11)
        try:
            run_sweep_process(s3, ROOT, logs / "resumed.log", resumed_ray, AWS_MAX_ATTEMPTS="1", **SECRETS)
        finally:
            s3.faults = None
        local_run = Path(run_sweep(load_config([f"root={logs / 'local'}", *SWEEP])).run_dir)
        yield Scenario(written, {n: (logs / f"{n}.log").read_text() for n in ("killed", "resumed")}, [killed_ray, resumed_ray], local_run)


def test_sweep_on_s3_reads_benchmarks_and_writes_everything_there(s3, scenario):
    written = s3_keys(s3, f"{RUN}/")
    for name in ("manifest.json", "summary.txt", "items.parquet", "questions.parquet", "errors.parquet",
                 f"scores/{BACKBONE}.parquet", f"records/{BACKBONE}.parquet", "statistics.parquet", "statistics.csv", "deltas.parquet"):
        assert f"{RUN}/{name}" in written, name
    items = s3_parquet(s3, f"{RUN}/items.parquet")
    assert items["image_uri"].str.starts_with(f"s3://{BUCKET}/{ROOT}/datasets/demo/").all()  # demo written to and read from S3
    assert s3_parquet(s3, f"{RUN}/errors.parquet").height == 0
    local_scores = pl.read_parquet(scenario.local_run / "scores" / f"{BACKBONE}.parquet")
    assert sorted_scores(s3_parquet(s3, f"{RUN}/scores/{BACKBONE}.parquet")).equals(sorted_scores(local_scores))
    order = ["benchmark", "backbone", "metric", "subset", "statistic"]
    local_statistics = pl.read_parquet(scenario.local_run / "statistics.parquet")
    assert_same_table("statistics", s3_parquet(s3, f"{RUN}/statistics.parquet").sort(order), local_statistics.sort(order))


def test_killed_sweep_on_s3_resumes_without_resending_what_was_written(s3, scenario):
    stage = answers_stage(json.loads(s3_object(s3, f"{RUN}/manifest.json")))
    assert 0 < len(scenario.written) < stage["needed"], "the kill must land in the middle of the answers stage"
    assert stage["cached"] == len(scenario.written)
    assert stage["sent"] == stage["needed"] - len(scenario.written)  # nothing already written is asked again
    puts = collections.Counter(r.key for r in s3.matching("PUT", prefix=f"{BUCKET}/{PARTS}", ok=True))
    assert set(puts.values()) == {1}, "every part was uploaded once over both runs"
    keys = pl.concat([s3_parquet(s3, key).select("key") for key in s3_keys(s3, PARTS)])
    assert keys.height == keys["key"].n_unique() == stage["needed"]


def test_sweep_on_s3_survives_transient_errors(s3, scenario):
    assert s3.count(prefix=f"{BUCKET}/{ROOT}/", injected=True) >= 10
    assert "attempt 2 of" in scenario.logs["resumed"]  # the driver's retries, logged
    local_scores = pl.read_parquet(scenario.local_run / "scores" / f"{BACKBONE}.parquet")
    assert sorted_scores(s3_parquet(s3, f"{RUN}/scores/{BACKBONE}.parquet")).equals(sorted_scores(local_scores))


def test_credentials_never_reach_outputs_or_logs(s3, scenario):
    assert SECRETS["AWS_ACCESS_KEY_ID"] in s3.access_keys  # the sweeps did sign with them
    places: dict[str, bytes] = {f"{name} run stdout/stderr": log.encode() for name, log in scenario.logs.items()}
    for key in s3_keys(s3, f"{ROOT}/"):
        places[f"s3://{BUCKET}/{key}"] = s3_object(s3, key)
    for ray_dir in scenario.ray_dirs:
        for path in ray_dir.rglob("*"):
            if path.is_file() and not path.is_symlink():
                places[str(path)] = path.read_bytes()
    ray_logs = [p for p in places if "/logs/" in p]
    assert any("python-core-driver" in p for p in ray_logs) and any("worker" in p for p in ray_logs), sorted(places)[:20]
    assert f"s3://{BUCKET}/{RUN}/manifest.json" in places
    for name, value in SECRETS.items():
        leaks = [where for where, content in places.items() if value.encode() in content]
        assert not leaks, f"{name} found in {leaks}"


def test_compacted_parts_on_s3_are_read_by_index_and_ranged_gets(s3_env, monkeypatch):
    """On S3 a keyed read fetches the key index and byte ranges of the row groups with hits,
    never a whole compacted part (pipeline.store.key_index)."""
    from operators.hashing import content_key
    from pipeline.store.key_index import SUFFIX

    store = PartStore(f"s3://{BUCKET}/unit/indexed/answers", schema.ANSWERS)
    keys = [content_key("s3-index", i) for i in range(3000)]
    for i in range(0, 3000, 500):
        store.write(answers(keys[i:i + 500], value=float(i)))
    store.compact(small_rows=64)
    assert all(exists(f"s3://{p}{SUFFIX}") for p in store.part_paths())
    whole = []
    cat = store.fs.cat_file
    monkeypatch.setattr(store.fs, "cat_file", lambda path, *a, **k: whole.append(path) or cat(path, *a, **k))
    probe = keys[::100] + [content_key("s3-new", i) for i in range(30)]
    assert store.missing(probe).to_pylist() == [False] * 30 + [True] * 30
    got = store.read(["key", "logp_yes"], keys=probe)
    assert sorted(got.column("key").to_pylist()) == sorted(keys[::100])
    assert whole and all(p.endswith(SUFFIX) for p in whole)  # indexes only; parts by ranged reads
