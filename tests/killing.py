"""Killing a job mid-stage in tests, the way an operator's SIGKILL or a lost node would."""
from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest


def kill_when(proc: subprocess.Popen, ready: Callable[[], bool], log_path: Path, timeout: float = 240) -> None:
    """SIGKILL `proc`'s whole process group as soon as `ready()`; fail if it ends first or never gets there."""
    deadline = time.time() + timeout
    try:
        while time.time() < deadline:
            if ready():
                return
            if proc.poll() is not None:
                pytest.fail(f"the job ended before it could be killed:\n{log_path.read_text()[-3000:]}")
            time.sleep(0.02)
        pytest.fail(f"the job never reached the point to kill it within {timeout:.0f} s")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def settled(count: Callable[[], int], quiet_s: float = 2.0) -> int:
    """`count()` once it has not changed for `quiet_s`: a Ray worker may finish the batch in its
    hands before it notices its driver is gone (that part is complete: parts are atomic)."""
    seen, since = -1, time.time()
    while time.time() - since < quiet_s:
        now = count()
        if now != seen:
            seen, since = now, time.time()
        time.sleep(0.1)
    return seen
