"""What a run prints: our progress lines, our warnings, errors and the summary.

Ray's and transformers' internal messages (the token-authentication notice, Ray Data's
progress log, weight-loading bars, missing-kernel fallbacks) say nothing a user can act on, so
a job silences them unless started with `--verbose` (or DEPICT_VERBOSE=1), which brings them
all back. Nothing that matters goes: errors, low answer mass, failed rows and every warning of
this project's own loggers still print.
"""
from __future__ import annotations

import logging
import os

VERBOSE_FLAGS = ("--verbose", "-v")
# Environment that quiets the libraries in this process and in every Ray worker it starts
# (local workers inherit it; a cluster's get it through the job's runtime_env, pipeline/runtime.py).
QUIET_ENV = {
    "TRANSFORMERS_VERBOSITY": "error",  # missing-kernel fallbacks, generation-config notes
    "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",  # "Loading weights" and "Writing model shards" bars
    "RAY_DATA_LOG_LEVEL": "WARNING",  # Ray Data's progress log (it resets its loggers on every dataset)
}
# This project's loggers: the only ones a quiet run shows below WARNING.
OWN_LOGGERS = ("pipeline", "operators", "jobs", "__main__")
# Library loggers and the level below which their records are dropped in a quiet run.
QUIET_LOGGERS = {"ray": logging.ERROR, "transformers": logging.ERROR, "filelock": logging.WARNING}


def verbose() -> bool:
    return os.environ.get("DEPICT_VERBOSE", "") not in ("", "0", "false")


def configure(argv: list[str], level: int = logging.INFO) -> list[str]:
    """Set up a job's logging; returns `argv` without the verbosity flags.

    Our loggers (OWN_LOGGERS) print at `level` (INFO: one line per stage and its progress);
    every other logger, through the root, only at WARNING and above unless `--verbose`, so that
    a library's INFO line (matplotlib's "generated new fontManager" on a fresh machine) never
    reaches a quiet run; the libraries in QUIET_LOGGERS only at their floor.
    """
    if set(VERBOSE_FLAGS) & set(argv):
        os.environ["DEPICT_VERBOSE"] = "1"
    logging.basicConfig(level=level if verbose() else max(level, logging.WARNING), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for name in OWN_LOGGERS:
        logging.getLogger(name).setLevel(level)
    if not verbose():
        quiet_libraries()
    return [arg for arg in argv if arg not in VERBOSE_FLAGS]


def quiet_libraries() -> None:
    for name, value in QUIET_ENV.items():
        os.environ.setdefault(name, value)
    for name, floor in QUIET_LOGGERS.items():
        logger = logging.getLogger(name)
        logger.setLevel(max(logger.getEffectiveLevel(), floor))


def library_log_level() -> int:
    """The level `ray.init` gives Ray's own loggers: WARNING with --verbose, else ERROR."""
    return logging.WARNING if verbose() else logging.ERROR


def worker_env() -> dict[str, str]:
    """The quieting variables Ray workers on other nodes need (empty with --verbose)."""
    return {} if verbose() else {name: os.environ.get(name, value) for name, value in QUIET_ENV.items()}
