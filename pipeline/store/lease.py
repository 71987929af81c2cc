"""A lease on an output folder: one writer at a time, and a killed writer never blocks forever.

Two runs writing the same output (two curations of one corpus, two sweeps with one run
name) would each rewrite the shared manifest from what they read at the start, and the
later write drops the other's rows. A lease makes the second run stop at once with a clear
message instead (`LeaseHeld`, exit code 3 in jobs/).

The lease is one small JSON file, `<output>/_lease.json`: owner token, host, pid, what
holds it, and when it expires. It is created only if absent, atomically: locally with
O_CREAT|O_EXCL, on S3 with a conditional PUT (`If-None-Match: *`). While the run lives, a
heartbeat thread pushes the expiry forward (every ttl/3). A run killed with SIGKILL leaves
its lease behind; it expires after at most `ttl_s`, and `force=True` takes it over at once
(for an operator who knows the holder is dead). A holder on the same machine (same host name
and PID namespace) whose process is gone is known dead: its lease is taken over at once, so
rerunning a job killed on a laptop or a single node does not wait for the expiry. Taking over a stale lease is itself a
conditional write (S3 `If-Match` on the stale ETag; locally a rename that is checked), so
two runs racing for the same stale lease cannot both win. Before committing its results, a
holder calls `check()`: if its lease was taken over meanwhile, it stops (`LeaseLost`)
instead of overwriting the new holder's work.
"""
from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from dataclasses import asdict, dataclass

import fsspec

from pipeline.store.fs import is_local, protocols
from pipeline.store.settings import retrying

log = logging.getLogger(__name__)

LEASE_FILE = "_lease.json"


class LeaseHeld(RuntimeError):
    """Another live run holds the lease on this output."""


class LeaseLost(RuntimeError):
    """This run's lease expired and another run took it over: its results must not be committed."""


@dataclass(frozen=True)
class LeaseInfo:
    token: str
    owner: str  # user@host pid
    what: str  # e.g. "curation nightly"
    acquired_at: float
    expires_at: float
    host: str = ""
    pid: int = 0
    pidns: int = 0  # the holder's PID namespace (same host name does not mean same PIDs in containers)

    def holder_is_gone(self) -> bool:
        """True only when the holder provably died: same host and PID namespace, and its PID is gone."""
        if not self.pid or self.host != socket.gethostname() or self.pidns != _pid_namespace() or not self.pidns:
            return False
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:  # alive, someone else's
            return False
        return False

    def describe(self, now: float) -> str:
        left = self.expires_at - now
        return (
            f"held by {self.owner} ({self.what}) since {_utc(self.acquired_at)}, "
            + (f"expires in {left:.0f} s" if left > 0 else f"expired {-left:.0f} s ago")
        )


def _utc(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


class Lease:
    """`with Lease(url, what=..., ttl_s=600):` holds the lease for the block (see module doc)."""

    def __init__(self, folder: str, *, what: str, ttl_s: float = 600.0, force: bool = False, clock=time.time):
        if ttl_s <= 0:
            raise ValueError(f"lease ttl must be positive, got {ttl_s}")
        self.url = f"{folder.rstrip('/')}/{LEASE_FILE}"
        self.what = what
        self.ttl_s = float(ttl_s)
        self.force = force
        self.clock = clock
        self.token = uuid.uuid4().hex
        self.fs, self.path = fsspec.core.url_to_fs(self.url)
        self.local = is_local(self.fs)
        self.s3 = bool({"s3", "s3a"} & set(protocols(self.fs)))
        self._lost = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- the lease record ------------------------------------------------------------------
    def _record(self, acquired_at: float | None = None) -> LeaseInfo:
        now = self.clock()
        host = socket.gethostname()
        owner = f"{os.environ.get('USER', 'user')}@{host} pid {os.getpid()}"
        return LeaseInfo(self.token, owner, self.what, acquired_at or now, now + self.ttl_s, host, os.getpid(), _pid_namespace())

    def read(self) -> tuple[LeaseInfo, str | None] | None:
        """The current lease and its version (S3 ETag), or None if nobody holds one."""
        try:
            if self.local:
                with open(self.path, "rb") as f:
                    data, etag = f.read(), None
            elif self.s3:  # body and ETag from one GET, so they belong together
                bucket, key, _ = self.fs.split_path(self.path)

                def get():
                    out = self.fs.call_s3("get_object", Bucket=bucket, Key=key)
                    return _read_body(self.fs, out), out.get("ETag")

                data, etag = retrying(f"read {self.url}", get)
            else:
                self.fs.invalidate_cache(self.path)
                data, etag = retrying(f"read {self.url}", lambda: self.fs.cat_file(self.path)), None
        except FileNotFoundError:
            return None
        try:
            return LeaseInfo(**json.loads(data)), etag
        except (ValueError, TypeError):  # unreadable: treat as expired so it can be recovered
            return LeaseInfo("?", "unknown (unreadable lease file)", "?", 0.0, 0.0), etag

    # -- acquiring -------------------------------------------------------------------------
    def acquire(self) -> Lease:
        mine = self._record()
        if self._create(mine):
            log.debug("lease %s taken (%s, ttl %.0f s)", self.url, self.what, self.ttl_s)
            return self
        current = self.read()
        if current is None:  # released between our attempt and the read: try once more
            if self._create(mine):
                return self
            current = self.read()
        info, etag = current if current else (None, None)
        now = self.clock()
        dead = info is not None and info.holder_is_gone()
        if info is not None and info.expires_at > now and not self.force and not dead:
            raise LeaseHeld(
                f"{self.url} is {info.describe(now)}; another {self.what} is writing this output. "
                f"Wait for it, or if it was killed, rerun after the lease expires or with lease.force=true"
            )
        reason = "dead holder's" if dead else "forced" if self.force and info and info.expires_at > now else "stale"
        if not self._replace(info, etag, mine):
            raise LeaseHeld(f"{self.url}: another run took over the {reason} lease first")
        log.warning("lease %s: took over the %s lease (%s)", self.url, reason, info.describe(now) if info else "")
        return self

    def _create(self, info: LeaseInfo) -> bool:
        data = json.dumps(asdict(info)).encode()
        if self.local:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                return False
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
            except OSError as exc:  # no space left, over quota: the file is ours (O_EXCL), and empty or cut
                try:
                    os.unlink(self.path)
                except OSError:
                    pass
                if exc.errno is not None and exc.filename is None:
                    exc.filename = self.path  # a failed write names no file; the job's one line names this one
                raise
            return True
        if self.s3:
            try:
                retrying(f"create {self.url}", lambda: self.fs.pipe_file(self.path, data, mode="create"))
            except Exception as exc:  # botocore's PreconditionFailed arrives in several wrappers
                if _precondition_failed(exc):
                    return self._is_mine()  # a retried PUT whose first try landed is ours
                raise
            return True
        # Other object stores: no conditional write available here; best effort.
        self.fs.invalidate_cache(self.path)
        if self.fs.exists(self.path):
            return False
        self.fs.pipe_file(self.path, data)
        return True

    def _replace(self, stale: LeaseInfo | None, etag: str | None, mine: LeaseInfo) -> bool:
        """Swap the stale lease for ours, failing if someone else swapped it first."""
        data = json.dumps(asdict(mine)).encode()
        if self.local:
            aside = f"{self.path}.stale-{self.token}"
            try:
                os.rename(self.path, aside)
            except FileNotFoundError:
                return self._create(mine)
            with open(aside, "rb") as f:
                moved = f.read()
            if stale is not None and stale.token != "?" and json.loads(moved).get("token") != stale.token:
                try:  # we moved a fresh lease someone else just took: put it back
                    os.link(aside, self.path)
                finally:
                    os.remove(aside)
                return False
            os.remove(aside)
            return self._create(mine)
        if self.s3 and etag:
            bucket, key, _ = self.fs.split_path(self.path)
            try:
                retrying(f"replace {self.url}", lambda: self.fs.call_s3("put_object", Bucket=bucket, Key=key, Body=data, IfMatch=etag))
            except Exception as exc:
                if _precondition_failed(exc):
                    return self._is_mine()
                raise
            self.fs.invalidate_cache(self.path)
            return True
        self.fs.pipe_file(self.path, data)
        return True

    def _is_mine(self) -> bool:
        current = self.read()
        return current is not None and current[0].token == self.token

    # -- holding ---------------------------------------------------------------------------
    def renew(self) -> None:
        """Push the expiry forward; notices (and remembers) a takeover."""
        current = self.read()
        if current is None or current[0].token != self.token:
            self._lost = True
            return
        info, etag = current
        fresh = self._record(acquired_at=info.acquired_at)
        if self.local:
            tmp = f"{self.path}.renew-{self.token}"
            with open(tmp, "wb") as f:
                f.write(json.dumps(asdict(fresh)).encode())
            os.replace(tmp, self.path)
        elif not self._replace(info, etag, fresh):
            self._lost = True

    def check(self) -> None:
        """Raise LeaseLost unless this run still holds the lease (call before committing)."""
        current = self.read()
        if self._lost or current is None or current[0].token != self.token:
            self._lost = True
            holder = current[0].describe(self.clock()) if current else "released"
            raise LeaseLost(f"{self.url}: this run's lease was taken over ({holder}); its results were not committed")

    def release(self) -> None:
        current = self.read()
        if current is not None and current[0].token == self.token:
            if self.local:
                os.remove(self.path)
            else:
                retrying(f"remove {self.url}", lambda: self.fs.rm(self.path))

    def _heartbeat(self) -> None:
        while not self._stop.wait(self.ttl_s / 3):
            try:
                self.renew()
            except Exception as exc:  # a storage hiccup: try again next beat, well before expiry
                log.warning("lease %s: renewal failed (%s)", self.url, exc)

    def __enter__(self) -> Lease:
        self.acquire()
        self._thread = threading.Thread(target=self._heartbeat, name="lease-heartbeat", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.release()


def _pid_namespace() -> int:
    """Identity of this process's PID namespace (Linux); 0 where unknown, which disables the check."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


def _precondition_failed(exc: BaseException) -> bool:
    """S3 answered 412 (or 409, a concurrent conditional write): s3fs turns it into FileExistsError."""
    if isinstance(exc, FileExistsError):
        return True
    text = f"{type(exc).__name__} {exc}"
    return "PreconditionFailed" in text or "pre-conditions" in text or "ConditionalRequestConflict" in text


def _read_body(fs, response) -> bytes:
    """The bytes of an aiobotocore get_object response (its body is an async stream)."""
    from fsspec.asyn import sync

    async def read():
        async with response["Body"] as body:
            return await body.read()

    return sync(fs.loop, read)
