"""Write the report tables and figures of a finished run:
`python jobs/tables.py run=<run dir or s3://...> [out=<dir>] [formats=[md,tex,csv]] [n_resamples=N]`,
or the figure of several runs that differ only in questions.open_share:
`python jobs/tables.py runs=[<run>,<run>,...] figure=open_share out=<dir> [formats=[md,tex,csv]] [metrics=[depict,dsg,...]]`.

`out` defaults to <run>/tables/ (one run; several runs need it). `n_resamples` overrides the
run's bootstrap size for the intervals computed here (commitment gain, answer distributions).
`metrics` picks the figure's lines (default: the target, the baselines and hard_fixed_yes).
Prints the index. A run that is not marked finished, or whose files differ from those its
manifest lists, or runs that differ in more than questions.open_share, are refused: one line,
exit code 2 (docs/troubleshooting.md).
"""
from __future__ import annotations

import sys
from pathlib import Path

if not __package__:  # run as a file (python jobs/<job>.py): this checkout's code, from a fresh clone
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pipeline.cli import InputError, guarded  # noqa: E402
from pipeline.config import MIN_RESAMPLES  # noqa: E402
from pipeline.reports.write import FORMATS, index_markdown, open_share_markdown, write_open_share, write_reports  # noqa: E402

USAGE = (
    "usage: python jobs/tables.py run=<run dir or s3://...> [out=<dir>] [formats=[md,tex,csv]] [n_resamples=N]\n"
    "   or: python jobs/tables.py runs=[<run>,<run>,...] figure=open_share out=<dir> [formats=[md,tex,csv]] [metrics=[m,...]]"
)
FIGURES = ("open_share",)  # figures across runs
KEYS = ("run", "runs", "figure", "metrics", "out", "formats", "n_resamples")


def _items(value: str) -> list[str]:
    return [v.strip() for v in value.strip("[]").split(",") if v.strip()]


def parse_args(argv: list[str]) -> dict:
    """key=value arguments; `formats`, `runs` and `metrics` are lists written [a,b] or a,b."""
    args: dict = {"out": None, "formats": list(FORMATS), "n_resamples": None}
    for arg in argv:
        key, sep, value = arg.partition("=")
        if not sep or key not in KEYS:
            raise ValueError(f"unexpected argument {arg!r}")
        if key in ("formats", "runs", "metrics"):
            args[key] = _items(value)
        elif key == "n_resamples":
            try:
                args[key] = int(value)
            except ValueError:
                raise ValueError(f"n_resamples must be a whole number, got {value!r}") from None
            if args[key] < MIN_RESAMPLES:
                raise ValueError(f"n_resamples must be at least {MIN_RESAMPLES}, got {args[key]}")
        else:
            args[key] = value
    if "runs" in args:
        if "run" in args:
            raise ValueError("give run= (one run) or runs= (a figure across runs), not both")
        if len(args["runs"]) < 2:
            raise ValueError(f"runs= needs at least two runs, got {args['runs']}")
        if args.get("figure") not in FIGURES:
            raise ValueError(f"runs= needs figure= one of {list(FIGURES)}, got {args.get('figure')!r}")
        if not args["out"]:
            raise ValueError("runs= needs out=<dir>: the figure belongs to no single run")
        if args["n_resamples"] is not None:
            raise ValueError("n_resamples= applies to one run's tables; a figure across runs shows the runs' own intervals")
    else:
        if "run" not in args or not args["run"]:
            raise ValueError("run=<run dir or s3://...> is required")
        extra = [k for k in ("figure", "metrics") if k in args]
        if extra:
            raise ValueError(f"{', '.join(extra)}= go with runs=[...] (a figure across runs), not run=")
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
        if "runs" in args:
            index = write_open_share(args["runs"], args["out"], args["formats"], metrics=args.get("metrics"))
        else:
            index = write_reports(args["run"], args["out"], args["formats"], n_resamples=args["n_resamples"])
    except ValueError as exc:  # a malformed file of a run, or runs that differ: named in the message
        raise InputError(str(exc)) from exc
    print(open_share_markdown(index) if "runs" in args else index_markdown(index))
    print(f"written to {index['out']}/")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
