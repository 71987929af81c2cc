"""Reaching object storage reliably: which errors are worth retrying, how to retry them, and
which storage settings Ray workers need to see the same storage as the driver.

s3fs and botocore already retry some failures (botocore: throttling and 5xx, a few
attempts; s3fs: "SlowDown" and dropped connections). What escapes them (a longer outage, an
InternalError after botocore gave up) arrives as an OSError, and one blip must not fail a
sweep that has run for hours, so every store read and write goes through `retrying`.

Endpoint and credentials never travel in code or config: botocore reads them from the
environment (AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, ...), a profile or an instance role, on
every node. Only the non-secret settings are forwarded to workers (`worker_env`), because
whatever is put in a Ray runtime_env is stored by the cluster and shown in its dashboard.
"""
from __future__ import annotations

import errno
import json
import logging
import os
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar

log = logging.getLogger(__name__)
T = TypeVar("T")

# errno values of failures that a later attempt may not see. s3fs turns S3 error codes into
# these: SlowDown/ServiceUnavailable -> EBUSY, InternalError -> EREMOTEIO, unknown -> EIO.
TRANSIENT_ERRNOS = frozenset(
    {
        errno.EAGAIN, errno.EBUSY, errno.EIO, errno.EREMOTEIO, errno.ETIMEDOUT,
        errno.ECONNRESET, errno.ECONNABORTED, errno.ECONNREFUSED, errno.EPIPE,
    }
)
# Never retried: the answer will not change (missing object, no permission, ...).
PERMANENT_ERRORS = (FileNotFoundError, PermissionError, FileExistsError, IsADirectoryError, NotADirectoryError)


def _library_transient_errors() -> tuple[type[BaseException], ...]:
    """The error types s3fs itself treats as transient, plus botocore's connection errors."""
    types: list[type[BaseException]] = [ConnectionError, TimeoutError]
    try:
        from s3fs.core import S3_RETRYABLE_ERRORS

        types += list(S3_RETRYABLE_ERRORS)
    except ImportError:  # pragma: no cover - s3fs is a core dependency
        pass
    try:
        from botocore.exceptions import ConnectionError as BotoConnectionError
        from botocore.exceptions import ResponseStreamingError

        types += [BotoConnectionError, ResponseStreamingError]
    except ImportError:  # pragma: no cover
        pass
    return tuple(types)


_TRANSIENT_TYPES = _library_transient_errors()


def is_transient(exc: BaseException) -> bool:
    """Whether trying the same storage operation again may succeed."""
    if isinstance(exc, PERMANENT_ERRORS):
        return False
    if isinstance(exc, _TRANSIENT_TYPES):
        return True
    return isinstance(exc, OSError) and exc.errno in TRANSIENT_ERRNOS


@dataclass(frozen=True)
class RetryPolicy:
    """Bounded exponential backoff: attempt k waits about first_delay_s * 2**(k-1), capped."""

    attempts: int = 8  # 7 waits of up to 0.2, 0.4, ..., 6.4, 10 s: rides out a brownout of 10-20 s
    first_delay_s: float = 0.2
    max_delay_s: float = 10.0

    def delay(self, failures: int) -> float:
        # Jitter keeps many actors that failed together from retrying in lockstep.
        return min(self.max_delay_s, self.first_delay_s * 2 ** (failures - 1)) * random.uniform(0.5, 1.0)


DEFAULT_RETRY = RetryPolicy()


def retrying(what: str, operation: Callable[[], T], policy: RetryPolicy | None = None) -> T:
    """Run `operation`, retrying transient storage errors; `what` names it in logs and errors.

    `operation` must be safe to repeat: every store write is (a part's bytes never change).
    """
    policy = policy or DEFAULT_RETRY
    for attempt in range(1, policy.attempts + 1):
        try:
            return operation()
        except Exception as exc:
            if not is_transient(exc) or attempt == policy.attempts:
                exc.add_note(f"{what}: gave up after {attempt} attempts" if attempt > 1 else f"while trying to {what}")
                raise
            wait = policy.delay(attempt)
            log.warning("%s failed (%s: %s); attempt %d of %d in %.2fs", what, type(exc).__name__, exc, attempt + 1, policy.attempts, wait)
            time.sleep(wait)
    raise AssertionError("unreachable")  # pragma: no cover


# -- settings that workers need --------------------------------------------------------------

# Non-secret settings botocore reads from the environment.
FORWARDED_ENV = (
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_RETRY_MODE",
    "AWS_MAX_ATTEMPTS",
    "AWS_REQUEST_CHECKSUM_CALCULATION",  # S3-compatible stores that reject botocore's default checksums
    "AWS_RESPONSE_CHECKSUM_VALIDATION",
)
# fsspec reads FSSPEC_<PROTOCOL>_<ARG> into filesystem arguments; those naming secrets stay put.
_SECRET_WORDS = ("KEY", "SECRET", "TOKEN", "PASSWORD", "CREDENTIAL")


def _is_forwarded(name: str) -> bool:
    if name in FORWARDED_ENV:
        return True
    if name.startswith("FSSPEC_S3_"):
        return not any(word in name.removeprefix("FSSPEC_S3_") for word in _SECRET_WORDS)
    return False


def worker_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The driver's non-secret storage settings (endpoint, region, retries), for workers."""
    environ = os.environ if environ is None else environ
    return {name: value for name, value in sorted(environ.items()) if _is_forwarded(name)}


def submitted_job_env_vars(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """env_vars of the runtime_env a submitted job was started with ({} outside a job).

    Ray refuses a ray.init(runtime_env=...) inside a job that sets one of these again.
    """
    environ = os.environ if environ is None else environ
    raw = environ.get("RAY_JOB_CONFIG_JSON_ENV_VAR")
    if not raw:
        return {}
    runtime_env = json.loads(raw).get("runtime_env") or {}
    return dict(runtime_env.get("env_vars") or {})
