"""Write the report tables and figures of a finished run:
`python jobs/tables.py run=<run dir or s3://...> [out=<dir>] [formats=[md,tex,csv]] [n_resamples=N]`.

`out` defaults to <run>/tables/. `n_resamples` overrides the run's bootstrap size for the
intervals computed here (commitment gain, answer distributions). Prints the index.
A run that is not marked finished, or whose files differ from those its manifest lists, is
refused: one line, exit code 2 (docs/troubleshooting.md).
"""
from __future__ import annotations

import sys
from pathlib import Path

if not __package__:  # run as a file (python jobs/<job>.py): this checkout's code, from a fresh clone
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pipeline.cli import InputError, guarded  # noqa: E402
from pipeline.config import MIN_RESAMPLES  # noqa: E402
from pipeline.reports.write import FORMATS, index_markdown, write_reports  # noqa: E402

USAGE = "usage: python jobs/tables.py run=<run dir or s3://...> [out=<dir>] [formats=[md,tex,csv]] [n_resamples=N]"


def parse_args(argv: list[str]) -> dict:
    """key=value arguments; `formats` is a list written [md,tex] or md,tex."""
    args: dict = {"out": None, "formats": list(FORMATS), "n_resamples": None}
    for arg in argv:
        key, sep, value = arg.partition("=")
        if not sep or key not in ("run", "out", "formats", "n_resamples"):
            raise ValueError(f"unexpected argument {arg!r}")
        if key == "formats":
            args[key] = [f.strip() for f in value.strip("[]").split(",") if f.strip()]
        elif key == "n_resamples":
            try:
                args[key] = int(value)
            except ValueError:
                raise ValueError(f"n_resamples must be a whole number, got {value!r}") from None
            if args[key] < MIN_RESAMPLES:
                raise ValueError(f"n_resamples must be at least {MIN_RESAMPLES}, got {args[key]}")
        else:
            args[key] = value
    if "run" not in args or not args["run"]:
        raise ValueError("run=<run dir or s3://...> is required")
    unknown = [f for f in args["formats"] if f not in FORMATS]
    if unknown or not args["formats"]:
        raise ValueError(f"formats must be some of {list(FORMATS)}, got {args['formats']}")
    return args


@guarded  # a missing, unfinished or mixed run: one line, exit 2
def main(argv: list[str]) -> int:
    if {"-h", "--help"} & set(argv):
        print(__doc__)
        return 0
    try:
        args = parse_args(argv)
    except ValueError as exc:
        print(f"{exc}\n{USAGE}", file=sys.stderr)
        return 2
    try:
        index = write_reports(args["run"], args["out"], args["formats"], n_resamples=args["n_resamples"])
    except ValueError as exc:  # a malformed file of the run: named in the message
        raise InputError(str(exc)) from exc
    print(index_markdown(index))
    print(f"written to {index['out']}/")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
