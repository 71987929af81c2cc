"""Which storage settings Ray workers need to see the same storage as the driver.

Endpoint and credentials never travel in code or config: botocore reads them from the
environment (AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, ...), a profile or an instance role, on
every node. Only the non-secret settings are forwarded to workers (`worker_env`), because
whatever is put in a Ray runtime_env is stored by the cluster and shown in its dashboard.
Retrying transient storage errors lives in operators/retry.py (re-exported here).
"""
from __future__ import annotations

import json
import os
from collections.abc import Mapping

from operators.retry import DEFAULT_RETRY, RetryPolicy, is_transient, retrying  # noqa: F401

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
