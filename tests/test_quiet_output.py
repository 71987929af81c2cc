"""A run prints what a user needs: our stage lines, our warnings and the summary. Ray's and
transformers' internal chatter is silenced unless `--verbose` (pipeline/console.py). A real
job's whole output is checked in tests/test_two_nodes.py, where the engine runs on another node."""
from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from pipeline import console

REPO = Path(__file__).resolve().parent.parent
# Lines a first run must not print: none says anything a user can act on.
NOISE = ("Token authentication is enabled", "logging_progress", "Running Dataset", "is falling back to its reference",
         "Loading weights", "Progress will be logged")


@pytest.fixture
def clean(monkeypatch):
    for name in [*console.QUIET_ENV, "DEPICT_VERBOSE"]:
        # set first, so that monkeypatch records it and removes what console.configure writes
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    levels = {name: logging.getLogger(name).level for name in console.QUIET_LOGGERS}
    yield monkeypatch
    for name, level in levels.items():
        logging.getLogger(name).setLevel(level)


def test_verbose_flags_are_taken_out_of_the_overrides_and_keep_the_libraries_loud(clean):
    assert console.configure(["--verbose", "root=/x", "-v"]) == ["root=/x"]
    assert console.verbose() and console.worker_env() == {} and console.library_log_level() == logging.WARNING
    assert "TRANSFORMERS_VERBOSITY" not in os.environ


def test_a_quiet_run_silences_the_libraries_here_and_on_ray_workers(clean):
    assert console.configure(["root=/x"]) == ["root=/x"]
    assert not console.verbose() and console.library_log_level() == logging.ERROR
    assert os.environ["TRANSFORMERS_VERBOSITY"] == "error" and os.environ["RAY_DATA_LOG_LEVEL"] == "WARNING"
    assert logging.getLogger("transformers").getEffectiveLevel() >= logging.ERROR
    assert console.worker_env() == console.QUIET_ENV  # what a cluster's workers are handed

    clean.setenv("TRANSFORMERS_VERBOSITY", "info")  # a user's own choice is kept
    assert console.worker_env()["TRANSFORMERS_VERBOSITY"] == "info"


def test_a_long_stage_logs_its_progress_with_rate_and_time_left(caplog, monkeypatch):
    from pipeline.stages import engine_stage

    clock = iter([0.0, 12.0, 15.0, 30.0])
    monkeypatch.setattr(engine_stage.time, "perf_counter", lambda: next(clock))
    progress = engine_stage.Progress("answers/smoke", total=400, every_s=10)
    with caplog.at_level(logging.INFO, logger="pipeline.stages.engine_stage"):
        progress.add(100)  # t=12: 100 done at 8.3/s, 300 left
        progress.add(100)  # t=15: under 10 s since the last line
        progress.add(200)  # t=30: done, the stage's own summary follows
    assert caplog.messages == ["answers/smoke: 100/400 requests (25%), 8.3/s, about 36 s left"]


# A job's logging set up as jobs/sweep.py does, then matplotlib imported on a fresh machine (an
# empty config dir: it builds its font cache and logs so at INFO), then a line of our own.
FRESH_MATPLOTLIB = """
import logging, sys
from pipeline import console
console.configure(sys.argv[1:])
import matplotlib.font_manager
logging.getLogger("pipeline.sweep").info("our stage line")
"""


@pytest.mark.parametrize("flags", [[], ["--verbose"]])
def test_a_quiet_run_prints_no_library_info_line_and_ours_still(tmp_path, flags):
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("DEPICT_VERBOSE", "MPLCONFIGDIR")}
    env |= {"MPLCONFIGDIR": str(tmp_path / "mpl"), "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", FRESH_MATPLOTLIB, *flags], env=env, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "our stage line" in done.stderr
    assert ("generated new fontManager" in done.stderr) == bool(flags)  # --verbose brings the libraries back
    assert (tmp_path / "mpl").is_dir()  # the cache really was built here
