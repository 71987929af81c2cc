"""The output lease (pipeline/store/lease.py): one writer per output folder, locally and on S3, and
a killed writer's lease is recovered by expiry or by force. What is lost in every case: nothing."""
from __future__ import annotations

import json
import time
import uuid

import pytest

from pipeline.store.lease import LEASE_FILE, Lease, LeaseHeld, LeaseLost


class Clock:
    def __init__(self):
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


@pytest.fixture(params=["local", "s3"])
def folder(request, tmp_path):
    if request.param == "local":
        return str(tmp_path / "out")
    fs = request.getfixturevalue("moto_s3")
    bucket = f"leases-{uuid.uuid4().hex[:8]}"  # moto's state outlives one server
    fs.mkdir(bucket)
    return f"s3://{bucket}/curation/nightly"


def test_a_second_writer_is_refused_while_the_first_holds_the_lease(folder):
    first = Lease(folder, what="curation nightly", ttl_s=60).acquire()
    with pytest.raises(LeaseHeld, match=r"curation nightly.*expires in \d+ s.*lease.force=true"):
        Lease(folder, what="curation nightly", ttl_s=60).acquire()
    first.check()  # the first still holds it
    first.release()
    Lease(folder, what="curation nightly", ttl_s=60).acquire().release()  # free again after release


def test_a_killed_writers_lease_expires_and_is_taken_over(folder):
    clock = Clock()
    killed = Lease(folder, what="curation nightly", ttl_s=60, clock=clock).acquire()  # never released: SIGKILL
    clock.now += 30
    with pytest.raises(LeaseHeld):  # not expired yet
        Lease(folder, what="curation nightly", ttl_s=60, clock=clock).acquire()
    clock.now += 31
    successor = Lease(folder, what="curation nightly", ttl_s=60, clock=clock).acquire()
    successor.check()
    # had the "killed" run been merely slow, it now finds out before committing anything
    with pytest.raises(LeaseLost, match="taken over"):
        killed.check()


def test_force_takes_over_a_live_lease_at_once(folder):
    old = Lease(folder, what="curation nightly", ttl_s=3600).acquire()
    forced = Lease(folder, what="curation nightly", ttl_s=3600, force=True).acquire()
    forced.check()
    with pytest.raises(LeaseLost):
        old.check()


def test_renewal_keeps_a_long_run_alive(folder):
    clock = Clock()
    lease = Lease(folder, what="sweep paper", ttl_s=60, clock=clock).acquire()
    for _ in range(5):  # 5 x 40 s of work, renewed in between: never expires
        clock.now += 40
        lease.renew()
        with pytest.raises(LeaseHeld):
            Lease(folder, what="sweep paper", ttl_s=60, clock=clock).acquire()
    lease.check()


def test_context_manager_releases_and_an_unreadable_lease_is_recoverable(tmp_path):
    with Lease(str(tmp_path), what="x", ttl_s=60):
        assert json.loads((tmp_path / LEASE_FILE).read_text())["what"] == "x"
    assert not (tmp_path / LEASE_FILE).exists()
    (tmp_path / LEASE_FILE).write_text("{truncated")  # e.g. a disk that filled up mid-write
    Lease(str(tmp_path), what="y", ttl_s=60).acquire().check()


def test_a_lease_left_by_a_killed_process_on_this_machine_is_taken_over_at_once(tmp_path):
    import signal
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parent.parent
    holder = subprocess.Popen(
        [sys.executable, "-c", f"from pipeline.store.lease import Lease; Lease({str(tmp_path)!r}, what='sweep smoke', ttl_s=3600).acquire(); print('held', flush=True); import time; time.sleep(600)"],
        cwd=repo, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(LeaseHeld):  # alive: held, an hour left
            Lease(str(tmp_path), what="sweep smoke", ttl_s=60).acquire()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    # killed: same host, same PID namespace, its PID gone -> no need to wait an hour or to force
    Lease(str(tmp_path), what="sweep smoke", ttl_s=60).acquire().check()


def test_a_holder_in_another_pid_namespace_is_never_presumed_dead(tmp_path):
    import socket

    lease_file = tmp_path / LEASE_FILE
    record = {"token": "t", "owner": "x", "what": "curation nightly", "acquired_at": time.time(), "expires_at": time.time() + 600,
              "host": socket.gethostname(), "pid": 2**22 + 17, "pidns": 1}  # fmt: skip
    lease_file.write_text(json.dumps(record))  # e.g. another container with --network host: same host name
    with pytest.raises(LeaseHeld):
        Lease(str(tmp_path), what="curation nightly", ttl_s=60).acquire()
