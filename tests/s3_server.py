"""A local S3 for the tests: moto's server on 127.0.0.1 behind a small WSGI layer that
records every request, can fail chosen requests the way S3 does when it is overloaded
(503 SlowDown, 500 InternalError), and can stall a request until the test lets it through.

Clients find it only through environment variables (`S3Server.env()`), exactly as the
pipeline finds a real endpoint: nothing in the code under test knows it is talking to moto.
"""
from __future__ import annotations

import contextlib
import os
import random
import re
import signal
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from moto.moto_server.werkzeug_app import (
    DomainDispatcherApplication,
    MotoRequestHandler,
    create_backend_app,
)
from werkzeug.serving import make_server

REGION = "us-east-1"

_ERRORS = {
    503: ("SlowDown", "Please reduce your request rate."),
    500: ("InternalError", "We encountered an internal error. Please try again."),
}


@dataclass(frozen=True)
class Request:
    method: str
    key: str  # "<bucket>/<key>", or "<bucket>/<prefix>" for a listing
    query: str
    status: int
    injected: bool  # the fault layer answered (or overrode moto's answer)


@dataclass
class Faults:
    """Fail a share of the requests whose key starts with one of `prefixes`.

    `after` of the failures happen after moto has done the work (the write landed, the
    reply was lost), the rest before it (nothing happened).
    """

    rate: float
    prefixes: tuple[str, ...]
    seed: int = 0
    after: float = 0.3
    limit: int | None = None  # stop failing after this many failures
    statuses: tuple[int, ...] = (500, 503)

    def __post_init__(self):
        self._rng = random.Random(self.seed)
        self.injected = 0

    def decide(self, key: str) -> tuple[int, bool] | None:
        """(status, after) for a request to fail, None to let it through."""
        if not key.startswith(self.prefixes) or self._rng.random() >= self.rate:
            return None
        if self.limit is not None and self.injected >= self.limit:
            return None
        self.injected += 1
        return self._rng.choice(self.statuses), self._rng.random() < self.after


@dataclass
class _Hold:
    matches: Callable[[str, str, str], bool]
    forward: bool
    arrived: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)


class _QuietHandler(MotoRequestHandler):
    def log_request(self, *args, **kwargs):  # one line per request would drown the test output
        pass


class S3Server:
    """moto on 127.0.0.1:<free port>; use as a context manager (see `running_s3_server`)."""

    def __init__(self):
        self._moto = DomainDispatcherApplication(create_backend_app)
        self._lock = threading.Lock()
        self.requests: list[Request] = []
        self.faults: Faults | None = None
        self._holds: list[_Hold] = []
        self._in_flight = 0
        self.access_keys: set[str] = set()  # access key ids that signed requests
        self._server = make_server("127.0.0.1", 0, self._app, threaded=True, request_handler=_QuietHandler)
        self.endpoint = f"http://127.0.0.1:{self._server.server_port}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="moto-s3", daemon=True)

    # -- what clients need -----------------------------------------------------------------
    def env(self, **overrides: str) -> dict[str, str]:
        """Environment for a client of this server: endpoint, dummy credentials, region."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": REGION,
            "AWS_EC2_METADATA_DISABLED": "true",  # never look for an instance role off this machine
            **overrides,
        }

    def client(self):
        """A boto3 client that bypasses the fault layer's decisions only by not being faulted."""
        import boto3

        return boto3.client(
            "s3", endpoint_url=self.endpoint, region_name=REGION, aws_access_key_id="testing", aws_secret_access_key="testing"
        )

    def create_bucket(self, name: str) -> None:
        self.client().create_bucket(Bucket=name)

    # -- what the tests look at ------------------------------------------------------------
    def count(self, method: str | None = None, prefix: str = "", ok: bool | None = None, injected: bool | None = None) -> int:
        return len(self.matching(method, prefix, ok, injected))

    def matching(self, method: str | None = None, prefix: str = "", ok: bool | None = None, injected: bool | None = None) -> list[Request]:
        with self._lock:
            return [
                r for r in self.requests
                if (method is None or r.method == method)
                and r.key.startswith(prefix)
                and (ok is None or (r.status < 400) == ok)
                and (injected is None or r.injected == injected)
            ]

    def wait_idle(self, timeout: float = 30.0) -> None:
        """Until no request is being served (one received before its client died may still land)."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            with self._lock:
                if self._in_flight == 0:
                    return
            time.sleep(0.05)
        raise TimeoutError(f"S3 server still busy after {timeout}s")

    @contextlib.contextmanager
    def hold(self, matches: Callable[[str, str, str], bool], forward: bool = True) -> Iterator[threading.Event]:
        """Stall requests for which matches(method, key, query) holds until the block exits;
        then pass them on to moto (forward) or answer 500 without moto ever seeing them.

        Yields an event that is set once such a request has arrived (and is being held).
        """
        held = _Hold(matches, forward)
        with self._lock:
            self._holds.append(held)
        try:
            yield held.arrived
        finally:
            with self._lock:
                self._holds.remove(held)
            held.release.set()

    # -- the WSGI layer --------------------------------------------------------------------
    def _app(self, environ, start_response):
        with self._lock:
            self._in_flight += 1
        try:
            return self._handle(environ, start_response)
        finally:
            with self._lock:
                self._in_flight -= 1

    def _handle(self, environ, start_response):
        method = environ["REQUEST_METHOD"]
        query = environ.get("QUERY_STRING", "")
        key = _request_key(environ.get("PATH_INFO", ""), query)
        signed_with = re.search(r"Credential=([^/,\s]+)/", environ.get("HTTP_AUTHORIZATION", ""))
        with self._lock:
            if signed_with:
                self.access_keys.add(signed_with.group(1))
            holds = [h for h in self._holds if h.matches(method, key, query)]
            fault = self.faults.decide(key) if self.faults else None
        for held in holds:
            held.arrived.set()
            held.release.wait(60)
            if not held.forward:
                fault = (500, False)
        if fault and not fault[1]:
            _drain(environ)
            return self._error(fault[0], method, key, query, start_response)
        status_line, headers, body = _call(self._moto, environ)
        if fault:
            return self._error(fault[0], method, key, query, start_response)
        self._record(Request(method, key, query, int(status_line.split()[0]), False))
        start_response(status_line, headers)
        return [body]

    def _error(self, status: int, method: str, key: str, query: str, start_response):
        self._record(Request(method, key, query, status, True))
        code, message = _ERRORS[status]
        body = b"" if method == "HEAD" else (
            f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code><Message>{message}</Message>'
            f"<RequestId>injected</RequestId></Error>".encode()
        )
        start_response(f"{status} {code}", [("Content-Type", "application/xml"), ("Content-Length", str(len(body)))])
        return [body]

    def _record(self, request: Request) -> None:
        with self._lock:
            self.requests.append(request)

    def __enter__(self) -> S3Server:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        with self._lock:
            holds = list(self._holds)
        for held in holds:
            held.release.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(10)


def _request_key(path: str, query: str) -> str:
    """"bucket/key" of a path-style request; for a listing, "bucket/<prefix>"."""
    bucket_and_key = urllib.parse.unquote(path.lstrip("/"))
    params = urllib.parse.parse_qs(query)
    if "/" not in bucket_and_key.rstrip("/") and "prefix" in params:
        return f"{bucket_and_key.rstrip('/')}/{params['prefix'][0]}"
    return bucket_and_key


def _drain(environ) -> None:
    """Read the request body we refuse, so the connection stays in step for the next request."""
    length = int(environ.get("CONTENT_LENGTH") or 0)
    stream = environ["wsgi.input"]
    while length > 0:
        chunk = stream.read(min(length, 1 << 20))
        if not chunk:
            break
        length -= len(chunk)


def _call(app, environ) -> tuple[str, list, bytes]:
    captured = {}

    def start_response(status, headers, exc_info=None):
        captured["status"], captured["headers"] = status, headers

    chunks = app(environ, start_response)
    try:
        body = b"".join(chunks)
    finally:
        if hasattr(chunks, "close"):
            chunks.close()
    return captured["status"], captured["headers"], body


@contextlib.contextmanager
def running_s3_server() -> Iterator[S3Server]:
    """A fresh moto S3 for one test module; stopped, and its buckets dropped, on exit."""
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()  # cached clients may point at an earlier server
    with S3Server() as server:
        try:
            yield server
        finally:
            s3fs.S3FileSystem.clear_instance_cache()
            # moto keeps buckets in module globals of this process: forget them
            urllib.request.urlopen(urllib.request.Request(f"{server.endpoint}/moto-api/reset", method="POST"), timeout=10)


# -- subprocesses under test -------------------------------------------------------------------


def kill_session(session_id: int, timeout: float = 20.0) -> None:
    """SIGKILL every process of the session `session_id` (a subprocess started with
    start_new_session=True and everything it spawned that stayed in its session: Ray's GCS,
    raylet, workers), then wait until they are gone. Processes are named by id only."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        pids = _session_pids(session_id)
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.2)
    raise RuntimeError(f"processes of session {session_id} still alive: {_session_pids(session_id)}")


def _session_pids(session_id: int) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        # fields after the command name (which may hold spaces) start at ") "
        fields = stat[stat.rindex(")") + 2:].split()
        state, session = fields[0], int(fields[3])
        if session == session_id and state != "Z":
            pids.append(int(entry))
    return pids
