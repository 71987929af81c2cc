"""Retrying storage operations: which errors are worth another attempt, and how often.

s3fs and botocore already retry some failures (botocore: throttling and 5xx, a few
attempts; s3fs: "SlowDown" and dropped connections). What escapes them (a longer outage, an
InternalError after botocore gave up) arrives as an OSError, and one blip must not fail a
sweep that has run for hours, so every store read and write, and every image read, goes
through `retrying`. Pure Python: operators (image reads) and pipeline (the store) share it.
"""
from __future__ import annotations

import errno
import logging
import random
import time
from collections.abc import Callable
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
