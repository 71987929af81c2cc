"""How every job in jobs/ fails on bad input: one line on stderr and a known exit code.

A user who mistypes an override or points at a missing folder should read what to fix,
not a traceback. The exit codes are part of the contract (scripts and schedulers read
them):

    0  done
    2  bad input: a config value, the command line, a missing path, an unfinished run,
       a local path on a cluster of several nodes
    3  busy: another run holds the lease on the same output (retry later, or take it over)

Anything else (a bug, a crash of the cluster) still raises with its traceback.
"""
from __future__ import annotations

import sys
from collections.abc import Callable

EXIT_BAD_INPUT = 2
EXIT_BUSY = 3


class InputError(ValueError):
    """An input the user named is unusable (missing path, unfinished run); the message says which."""


def one_line(exc: BaseException) -> str:
    """The exception's message on a single line (YAML and OmegaConf messages span several)."""
    text = " ".join(str(exc).split())
    return text or type(exc).__name__


def guarded(main: Callable[[list[str]], int]) -> Callable[[list[str]], int]:
    """Wrap a job's `main(argv) -> int` so that input errors print one line and exit 2 (3: busy)."""
    from pipeline.config import ConfigError
    from pipeline.runtime import LocalPathOnCluster
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
        except (InputError, RunNotFinished, LocalPathOnCluster, FileNotFoundError, NotADirectoryError) as exc:
            print(f"error: {one_line(exc)}", file=sys.stderr)
            return EXIT_BAD_INPUT

    run.__doc__ = main.__doc__
    run.__wrapped__ = main  # type: ignore[attr-defined]
    return run
