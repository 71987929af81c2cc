"""The output lease (pipeline/lease.py): one writer per output folder, locally and on S3, and
a killed writer's lease is recovered by expiry or by force. What is lost in every case: nothing."""
from __future__ import annotations

import json
import time
import uuid

import pytest

from pipeline.lease import LEASE_FILE, Lease, LeaseHeld, LeaseLost


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
