"""Failures a user can fix are one line with a documented exit code, never a traceback
(pipeline/cli.py, docs/troubleshooting.md):

- storage: no space left, a read-only file system, permission denied, over quota, an S3
  bucket that refuses: exit 4, one line naming the path and the cause, also when the error
  was raised inside a Ray actor (RayTaskError) or chained under another exception;
- Ctrl-C: exit 130, "interrupted; rerun to resume";
- an image URL that cannot be read says why (host not resolved, connection refused, timeout,
  HTTP status) instead of "file not found", in the error row's detail too.

Tests run as root, where chmod does not stop a write: a read-only or full file system is
either real (a read-only bind mount or a tiny tmpfs in a private mount namespace, skipped
where `unshare -m` is not allowed) or the store's own write function raising the OSError the
kernel raises there (same errno, no file name, as a failed write() or close() gives).
"""
from __future__ import annotations

import errno
import http.server
import importlib.util
import os
import shutil
import socket
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pyarrow as pa
import pytest

from operators import schema
from operators.hashing import content_key
from operators.image_ingest import hash_images
from operators.images import ImageError, read_image_bytes, unreachable
from pipeline.cli import EXIT_INTERRUPTED, EXIT_STORAGE, guarded
from pipeline.store import fs
from pipeline.store.folder import Folder  # here: its first import binds fs.write_local_atomically, patched by some tests
from pipeline.store.parts import PartStore

REPO = Path(__file__).resolve().parent.parent


def _job(name: str):
    spec = importlib.util.spec_from_file_location(f"{name}_job_failures", REPO / "jobs" / f"{name}.py")
    job = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(job)
    return job


def _store_with_parts(root: Path) -> str:
    """A store with one folder of two parts (what `store compact` merges)."""
    store = PartStore(str(root / "answers" / "b"), schema.ANSWERS)
    for i in range(2):
        keys = [content_key("k", i)]
        store.write(pa.table({"key": keys, "backbone": ["b"], "kind": ["image"], "logp_yes": [0.0], "logp_no": [-1.0]}))
    return str(root)


def _one_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


# -- storage: the store's own write function fails as the kernel makes it fail ----------------


@pytest.mark.parametrize(("code", "cause"), [(errno.ENOSPC, "no space left on device (ENOSPC)"),
                                             (errno.EROFS, "read-only file system (EROFS)"),
                                             (errno.EDQUOT, "disk quota exceeded (EDQUOT)"),
                                             (errno.EACCES, "permission denied (EACCES)")])
def test_a_store_write_that_fails_is_one_line_naming_the_part_and_the_cause(code, cause, tmp_path, monkeypatch, capsys):
    root = _store_with_parts(tmp_path / "store")
    before = sorted(p.name for p in (tmp_path / "store" / "answers" / "b").iterdir())

    def refused(path, data):  # what a write() or close() on a full disk raises: errno, no file name
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(fs, "write_local_atomically", refused)
    assert _job("store").main(["compact", f"store={root}"]) == EXIT_STORAGE
    line = _one_line(capsys)
    folder = tmp_path / "store" / "answers" / "b"
    assert line.startswith(f"storage: cannot write {folder}/part-") and ".parquet: " + cause in line, line
    assert "run the same command again" in line
    assert sorted(p.name for p in folder.iterdir()) == before  # nothing lost (the lease is released)


def test_a_failed_write_of_a_local_file_names_the_file_not_its_temporary(tmp_path, monkeypatch, capsys):
    """Folder.write (extracted images, the demo's files): os.replace on a read-only file system
    names the temporary file; the line names the file being written."""

    def read_only(src, dst):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), src, None, dst)

    monkeypatch.setattr(os, "replace", read_only)
    folder = Folder(str(tmp_path))
    target = folder.join("images/ab/abc.png")
    assert guarded(lambda argv: folder.write(target, b"png"))([]) == EXIT_STORAGE
    assert _one_line(capsys).startswith(f"storage: cannot write {target}: read-only file system (EROFS)")
    assert not list((tmp_path / "images" / "ab").iterdir())  # no temporary file left behind


def test_a_full_disk_while_taking_the_lease_names_the_lease_and_leaves_no_empty_lease(tmp_path, monkeypatch, capsys):
    root = _store_with_parts(tmp_path / "store")  # written before the disk fills up
    real_fdopen = os.fdopen

    class Full:  # the file object of a full disk: the write (or its flush) fails
        def __init__(self, fd, *args, **kwargs):
            self.f = real_fdopen(fd, *args, **kwargs)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def write(self, data):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr("pipeline.store.lease.os.fdopen", Full)
    assert _job("store").main(["compact", f"store={root}"]) == EXIT_STORAGE
    lease = tmp_path / "store" / "answers" / "b" / "_lease.json"
    assert _one_line(capsys).startswith(f"storage: cannot write {lease}: no space left on device (ENOSPC)")
    assert not lease.exists()  # an empty lease would block the rerun until it expired


# -- storage: wrapped in a Ray actor's failure, or chained -----------------------------------


def _sweep_failing_with(monkeypatch, tmp_path, exc: BaseException) -> int:
    sweep = _job("sweep")

    def run_sweep(cfg):
        raise exc

    monkeypatch.setattr(sweep, "run_sweep", run_sweep)
    return sweep.main([f"root={tmp_path}", "sweep=smoke"])


def test_a_full_disk_inside_a_ray_actor_is_one_line(tmp_path, monkeypatch, capsys):
    """What the engine stage's actor raised on a full disk (seen with the store on a 48 KiB
    tmpfs): ray.get raises RayTaskError(OSError), whose `cause` carries the note naming the part."""
    from ray.exceptions import RayTaskError

    part = f"{tmp_path}/store/answers/smoke/part-dd30d57a122ff3edd2c8816f.parquet"
    cause = OSError(errno.ENOSPC, "No space left on device")
    cause.add_note(f"while trying to write {part}")
    wrapped = RayTaskError("_Host.run", "Traceback (most recent call last):\n  ...\nOSError: [Errno 28]", cause).as_instanceof_cause()
    assert _sweep_failing_with(monkeypatch, tmp_path, wrapped) == EXIT_STORAGE
    assert _one_line(capsys).startswith(f"storage: cannot write {part}: no space left on device (ENOSPC); ")


def test_a_read_only_store_under_another_exception_is_one_line(tmp_path, monkeypatch, capsys):
    marker = f"{tmp_path}/store/answers/smoke/_markers"
    try:
        try:
            raise OSError(errno.EROFS, "Read-only file system", marker)
        except OSError as inner:
            raise RuntimeError("stage answers failed") from inner
    except RuntimeError as outer:
        chained = outer
    assert _sweep_failing_with(monkeypatch, tmp_path, chained) == EXIT_STORAGE
    assert _one_line(capsys).startswith(f"storage: cannot write {marker}: read-only file system (EROFS); ")


def test_other_errors_still_raise_with_their_traceback(tmp_path, monkeypatch):
    with pytest.raises(OSError, match="Connection reset"):  # not a storage refusal: a bug or an outage
        _sweep_failing_with(monkeypatch, tmp_path, OSError(errno.ECONNRESET, "Connection reset by peer"))
    with pytest.raises(ZeroDivisionError):
        _sweep_failing_with(monkeypatch, tmp_path, ZeroDivisionError("bug"))


# -- storage: a real read-only or full file system (a private mount namespace) ------------------


def _unshare_mounts() -> bool:
    if shutil.which("unshare") is None or shutil.which("mount") is None:
        return False
    probe = subprocess.run(["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt"], capture_output=True)
    return probe.returncode == 0


@pytest.mark.skipif(not sys.platform.startswith("linux") or not _unshare_mounts(), reason="needs `unshare -m` (root on Linux)")
@pytest.mark.parametrize("kind", ["read-only", "full"])
def test_a_real_read_only_or_full_store_is_one_line_exit_4(kind, tmp_path):
    store = tmp_path / "store"
    store.mkdir()
    if kind == "read-only":
        _store_with_parts(store)
        mount = f"mount --bind {store} {store} && mount -o remount,bind,ro {store}"
    else:
        mount = f"mount -t tmpfs -o size=256k tmpfs {store}"
    script = textwrap.dedent(f"""
        import errno, sys
        sys.path.insert(0, {str(REPO)!r}); sys.path.insert(0, {str(REPO / 'tests')!r})
        from test_failures_one_line import _job, _store_with_parts
        from pathlib import Path
        if {kind == "full"}:
            _store_with_parts(Path({str(store)!r}))
            with open({str(store / 'filler')!r}, "wb", buffering=0) as f:  # take every free block
                try:
                    while True:
                        f.write(b"x" * 4096)
                except OSError as exc:
                    assert exc.errno == errno.ENOSPC, exc
        sys.exit(_job("store").main(["compact", "store={store}"]))
    """)
    done = subprocess.run(["unshare", "-m", "sh", "-c", f'{mount} && exec "$0" -c "$1"', sys.executable, script],
                          capture_output=True, text=True, timeout=120, cwd=REPO)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == EXIT_STORAGE and len(lines) == 1, done.stderr
    cause = "read-only file system (EROFS)" if kind == "read-only" else "no space left on device (ENOSPC)"
    assert lines[0].startswith(f"storage: cannot write {store}/answers/b/_lease.json: {cause}; "), lines[0]


# -- storage: an S3 bucket that refuses ------------------------------------------------------


class _Refusing(http.server.BaseHTTPRequestHandler):
    """An S3 endpoint that refuses every request, as a bucket policy or a read-only key does."""

    def _refuse(self):
        length = int(self.headers.get("Content-Length") or 0)
        if length and not self.headers.get("Expect"):  # botocore waits for "100 Continue" before a PUT's body
            self.rfile.read(length)
        self.close_connection = True
        body = b"" if self.command == "HEAD" else (
            b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>AccessDenied</Code><Message>Access Denied</Message>'
            b"<RequestId>test</RequestId></Error>")
        self.send_response(403)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _refuse

    def log_message(self, *args):
        pass


@pytest.fixture
def refusing_s3(monkeypatch):
    s3fs = pytest.importorskip("s3fs")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Refusing)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    for key, value in {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{server.server_port}", "AWS_ACCESS_KEY_ID": "testing",
                       "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"}.items():
        monkeypatch.setenv(key, value)
    s3fs.S3FileSystem.clear_instance_cache()
    yield
    s3fs.S3FileSystem.clear_instance_cache()
    server.shutdown()
    server.server_close()


def test_an_s3_bucket_that_refuses_is_one_line_exit_4(refusing_s3, capsys):
    url = "s3://bucket/store/answers/b/part-1.parquet"
    assert guarded(lambda argv: fs.write_bytes_atomic(url, b"x"))([]) == EXIT_STORAGE
    assert _one_line(capsys).startswith(f"storage: cannot write {url}: access denied (AccessDenied); ")
    assert _job("store").main(["verify", "store=s3://bucket/store"]) == EXIT_STORAGE  # a listing: HEAD's 403 has no code
    assert _one_line(capsys).startswith("storage: cannot check s3://bucket/store: access denied (HTTP 403 Forbidden); ")


# -- Ctrl-C ------------------------------------------------------------------------------------


def test_ctrl_c_inside_the_job_is_one_line_exit_130(tmp_path, monkeypatch, capsys):
    assert _sweep_failing_with(monkeypatch, tmp_path, KeyboardInterrupt()) == EXIT_INTERRUPTED
    assert _one_line(capsys) == "interrupted; rerun to resume"


def test_ctrl_c_in_a_ray_wait_whose_cleanup_fails_is_still_an_interruption(tmp_path, monkeypatch, capsys):
    try:
        try:
            raise KeyboardInterrupt  # in ray.wait
        except KeyboardInterrupt:
            raise RuntimeError("could not kill the engine actors")  # noqa: B904 - a cleanup failing during the interrupt
    except RuntimeError as exc:
        failed_cleanup = exc
    assert _sweep_failing_with(monkeypatch, tmp_path, failed_cleanup) == EXIT_INTERRUPTED
    assert _one_line(capsys) == "interrupted; rerun to resume"


# -- image URLs: why they cannot be read ---------------------------------------------------------


class _NotFound(http.server.SimpleHTTPRequestHandler):
    def do_GET(self):
        self.send_error(404, "Not Found")

    do_HEAD = do_GET

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def urls():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _NotFound)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    with socket.socket() as s:  # a port nothing listens on: bound, then closed
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    yield {
        "dns": ("http://no-such-host.invalid/x.png", "cannot resolve host no-such-host.invalid"),
        "refused": (f"http://127.0.0.1:{free}/x.png", f"connection refused by 127.0.0.1:{free}"),
        "404": (f"http://127.0.0.1:{server.server_port}/gone.png", "HTTP 404 (Not Found)"),
    }
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("case", ["dns", "refused", "404"])
def test_an_unreadable_url_says_why(case, urls):
    url, why = urls[case]
    with pytest.raises(ImageError) as info:
        read_image_bytes(url)
    assert info.value.cause == why and "not found" not in why.lower().replace("http 404 (not found)", "")


def test_error_rows_of_unreadable_urls_say_why_and_a_missing_file_is_still_not_found(urls, tmp_path):
    cases = [*urls.values(), (str(tmp_path / "gone.png"), "file not found")]
    rows = hash_images(pa.table({"image_uri": [url for url, _ in cases]})).to_pylist()
    assert [r["error"] for r in rows] == [f"ImageError: {url}: {why}" for url, why in cases]


def test_a_timeout_is_named():
    try:
        try:
            raise TimeoutError  # asyncio's and aiohttp's timeouts are TimeoutError
        except TimeoutError as exc:
            raise FileNotFoundError("http://slow.example/x.png") from exc  # what fsspec's HTTP file system raises
    except FileNotFoundError as exc:
        assert unreachable("http://slow.example/x.png", exc) == "timed out reaching slow.example:80"
    assert unreachable("s3://bucket/x.png", FileNotFoundError("s3://bucket/x.png")) is None


def test_a_curation_shard_url_says_why(urls):
    from pipeline.curation.shards import ShardError, read_shard

    url, why = urls["dns"]
    with pytest.raises(ShardError) as info:
        read_shard(url.replace(".png", ".parquet"), "parquet")
    assert str(info.value) == f"{url.replace('.png', '.parquet')}: {why}"
    url, why = urls["404"]
    with pytest.raises(ShardError) as info:
        read_shard(url.replace(".png", ".parquet"), "parquet")
    assert str(info.value) == f"{url.replace('.png', '.parquet')}: input shard not found (HTTP 404)"


def test_a_benchmark_release_file_that_is_missing_is_one_line_exit_2(tmp_path, capsys):
    """A benchmark folder without its annotation file: the loader's FileError names the file;
    the job prints that one line and exits 2 instead of a traceback."""
    from pipeline.cli import EXIT_BAD_INPUT

    folder = Folder(str(tmp_path))
    assert guarded(lambda argv: folder.read_text(folder.join("human_annotations.json")))([]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err.strip()
    assert err == f"error: {tmp_path / 'human_annotations.json'}: file not found"
