"""How every job in jobs/ fails: one line on stderr and a known exit code, never a traceback
for what a user can fix.

A user who mistypes an override, points at a missing folder, fills the disk or presses Ctrl-C
should read what happened and what to do, not a traceback. The exit codes are part of the
contract (scripts and schedulers read them):

    0    done
    2    bad input: a config value, the command line, a missing path, an unfinished run,
         a local path on a cluster of several nodes, engines asking for what no node offers
    3    busy: another run holds the lease on the same output (retry later, or take it over)
    4    storage: a file or folder cannot be written or read: no space left on device, a
         read-only file system, permission denied, a disk quota exceeded, or on S3 access
         denied or refused credentials. The line names the path and the cause; what was
         already written is kept, and the same command run again resumes.
    130  interrupted (Ctrl-C): "interrupted; rerun to resume"

A storage error arrives however deep it was raised: inside a Ray task or actor (a
`RayTaskError` whose `cause` is the OSError), or chained under another exception
(`__cause__`, `__context__`); the chain is walked to find it. Anything else (a bug, a crash of
the cluster) still raises with its traceback.
"""
from __future__ import annotations

import errno
import re
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

EXIT_BAD_INPUT = 2
EXIT_BUSY = 3
EXIT_STORAGE = 4
EXIT_INTERRUPTED = 130  # 128 + SIGINT, what a shell reports for a command stopped by Ctrl-C

INTERRUPTED = "interrupted; rerun to resume"

# errno -> how the line names it. Each means the storage refused the job, not a bug.
_STORAGE_NAMES = {
    "ENOSPC": "no space left on device",
    "EROFS": "read-only file system",
    "EACCES": "permission denied",
    "EPERM": "operation not permitted",
    "EDQUOT": "disk quota exceeded",
    "EFBIG": "file too large",
}
STORAGE_ERRNOS = {getattr(errno, name): text for name, text in _STORAGE_NAMES.items() if hasattr(errno, name)}  # no EDQUOT on Windows
_WRITING = {getattr(errno, name) for name in ("ENOSPC", "EROFS", "EDQUOT", "EFBIG") if hasattr(errno, name)}  # only a write meets these
# S3 error codes (botocore's ClientError; s3fs raises most as PermissionError) that say the
# bucket refuses this job, not that something is missing or busy.
S3_REFUSALS = {
    "AccessDenied": "access denied",
    "AllAccessDisabled": "access denied (all access to this object has been disabled)",
    "AccountProblem": "access denied (a problem with the AWS account)",
    "InvalidAccessKeyId": "credentials refused (the access key id does not exist)",
    "SignatureDoesNotMatch": "credentials refused (the secret key does not match)",
    "ExpiredToken": "credentials refused (the token has expired)",
    "InvalidToken": "credentials refused (the token is malformed or invalid)",
    "QuotaExceeded": "quota exceeded",
    "403": "access denied",  # a HEAD request's refusal has no body, so no code: only its status
}
_NOTE = re.compile(r"(?:while trying to )?(?P<what>.+?)(?:: gave up after \d+ attempts)?")  # operators.retry's notes
_PATH = re.compile(r"(?:[a-z][a-z0-9+.-]*://|/)[^\s'\"]+")


class InputError(ValueError):
    """An input the user named is unusable (missing path, unfinished run); the message says which."""


def key_values(argv: Sequence[str], defaults: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A job's `key=value` arguments as plain Python values over `defaults`, in OmegaConf's
    dot-list syntax (`[a,b]` a list, `2000` a number, `null` None; `a.b=1` nests).

    Jobs parse their command line here so that they import only `pipeline`; a bare word or a
    malformed value raises `ConfigError` naming its key (one line, exit 2 under `guarded`).
    """
    from omegaconf import OmegaConf

    from pipeline.config import parse_overrides

    _, given = parse_overrides(list(argv), preset_key="-")  # "-": no preset key, every argument is a value
    return OmegaConf.to_container(OmegaConf.merge(OmegaConf.create(dict(defaults or {})), given))


def one_line(exc: BaseException) -> str:
    """The exception's message on a single line (YAML and OmegaConf messages span several)."""
    text = " ".join(str(exc).split())
    return text or type(exc).__name__


def chain(exc: BaseException) -> Iterator[BaseException]:
    """`exc` and every exception behind it: a Ray task's or actor's `cause`, `__cause__`,
    `__context__` (unless suppressed by `raise ... from None`)."""
    todo, seen = [exc], set()
    while todo:
        link = todo.pop(0)
        if link is None or id(link) in seen:
            continue
        seen.add(id(link))
        yield link
        cause = getattr(link, "cause", None)  # ray.exceptions.RayTaskError
        todo += [cause if isinstance(cause, BaseException) else None, link.__cause__,
                 None if link.__suppress_context__ else link.__context__]


def interrupted(exc: BaseException) -> bool:
    """Whether `exc` is, or was raised while handling, a Ctrl-C (KeyboardInterrupt)."""
    return any(isinstance(link, KeyboardInterrupt) for link in chain(exc))


def _s3_code(exc: BaseException) -> str | None:
    response = getattr(exc, "response", None)  # botocore.exceptions.ClientError
    error = response.get("Error") if isinstance(response, dict) else None
    return error.get("Code") if isinstance(error, dict) else None


def storage_error(exc: BaseException) -> str | None:
    """The one line for a storage failure somewhere in `exc`'s chain (no space, read-only,
    permission, quota; S3 access denied), naming the path and the cause; None for anything else."""
    links = list(chain(exc))
    for link in links:
        if _is_ray_error(link):  # a RayTaskError(OSError) is an OSError without errno: its `cause` is the real one
            continue
        code = _s3_code(link)
        if code in S3_REFUSALS:
            return _storage_line(link, _s3_cause(code), writing=False, links=links)
        if not isinstance(link, OSError):
            continue
        if link.errno in STORAGE_ERRNOS:
            cause = f"{STORAGE_ERRNOS[link.errno]} ({errno.errorcode[link.errno]})"
            return _storage_line(link, cause, writing=link.errno in _WRITING, links=links)
        if isinstance(link, PermissionError):  # s3fs: PermissionError("Access Denied"), no errno; the ClientError behind it says which
            code = next((c for c in map(_s3_code, links) if c in S3_REFUSALS), None)
            cause = _s3_cause(code) if code else f"permission denied ({one_line(link)})"
            return _storage_line(link, cause, writing=False, links=links)
    return None


def _s3_cause(code: str) -> str:
    return f"{S3_REFUSALS[code]} ({'HTTP 403 Forbidden' if code == '403' else code})"


def _is_ray_error(exc: BaseException) -> bool:
    return any(c.__module__.startswith("ray.") and c.__name__ == "RayError" for c in type(exc).__mro__)


def _storage_line(link: BaseException, cause: str, *, writing: bool, links: list[BaseException]) -> str:
    what = _what(link) or next(filter(None, map(_what, links)), None)  # "write <url>", from operators.retry's note
    if what is None:
        path = getattr(link, "filename", None) or next(iter(_PATH.findall(str(link))), None)
        what = f"{'write' if writing else 'access'} {path}" if path else None
    head = f"storage: cannot {what}: {cause}" if what else f"storage: {cause}: {one_line(link)}"
    return f"{head}; fix it and run the same command again (finished work is kept)"


def _what(exc: BaseException) -> str | None:
    """What was being done, with its path, when the failure came: the note `operators.retry`
    adds ("while trying to write <url>"), else the OSError's own file name."""
    for note in getattr(exc, "__notes__", ()):
        found = _NOTE.fullmatch(note.strip())
        if found and _PATH.search(found["what"]):
            return found["what"]
    filename = getattr(exc, "filename", None)
    if filename is not None and isinstance(exc, OSError) and exc.errno is not None:
        return f"{'write' if exc.errno in _WRITING else 'access'} {filename}"
    return None


def guarded(main: Callable[[list[str]], int]) -> Callable[[list[str]], int]:
    """Wrap a job's `main(argv) -> int` so that input errors print one line and exit 2 (3: busy,
    4: storage, 130: interrupted)."""
    from pipeline.config import ConfigError
    from pipeline.runtime import LocalPathOnCluster, Unplaceable
    from pipeline.store.folder import FileError
    from pipeline.store.lease import LeaseHeld
    from pipeline.store.run_folder import RunNotFinished

    def run(argv: list[str]) -> int:
        try:
            return main(argv)
        except LeaseHeld as exc:
            print(f"busy: {one_line(exc)}", file=sys.stderr)
            return EXIT_BUSY
        except ConfigError as exc:
            print(one_line(exc), file=sys.stderr)
            return EXIT_BAD_INPUT
        except (InputError, FileError, RunNotFinished, LocalPathOnCluster, Unplaceable, FileNotFoundError, NotADirectoryError) as exc:
            print(f"error: {one_line(exc)}", file=sys.stderr)
            return EXIT_BAD_INPUT
        except KeyboardInterrupt:
            print(INTERRUPTED, file=sys.stderr)
            return EXIT_INTERRUPTED
        except Exception as exc:
            if interrupted(exc):  # Ctrl-C during a Ray wait, or a cleanup that failed after it
                print(INTERRUPTED, file=sys.stderr)
                return EXIT_INTERRUPTED
            line = storage_error(exc)
            if line is None:
                raise
            print(line, file=sys.stderr)
            return EXIT_STORAGE

    run.__doc__ = main.__doc__
    run.__wrapped__ = main  # type: ignore[attr-defined]
    return run
