"""Per-item explorer: `python jobs/explore.py run=outputs/runs/demo [out=DIR]`.

Writes a static, offline site (default <run>/explorer/; open index.html in a browser, or
copy the folder to any static host such as an S3 bucket): per benchmark and backbone,
items sortable and filterable by any metric, human score, rank disagreement, tag or
template; each item with its image, questions (p_v, p_t, commitment, agreement), DSG
parents, evidence boxes and masked views, judge outputs and errors. See docs/explorer.md.
"""
from __future__ import annotations

import logging
import sys
from pathlib import Path

if not __package__:  # run as a file (python jobs/<job>.py): this checkout's code, from a fresh clone
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pipeline import console  # noqa: E402
from pipeline.cli import guarded, key_values  # noqa: E402
from pipeline.explore.site import write_site  # noqa: E402
from pipeline.store.fs import absolute_path  # noqa: E402


@guarded  # a missing run: one line, exit 2; storage failures exit 4; Ctrl-C exits 130
def main(argv: list[str]) -> int:
    if not argv or {"-h", "--help"} & set(argv):
        print(__doc__)
        return 0 if argv else 2
    argv = console.configure(argv, logging.WARNING)  # --verbose: Ray's and transformers' own messages too
    bad = [a for a in argv if "=" not in a or a.split("=", 1)[0] not in ("run", "out")]
    if bad:
        print(f"unknown argument(s) {bad}: write run=<run folder> [out=<site folder>]", file=sys.stderr)
        return 2
    args = key_values(argv)
    if "run" not in args:
        print("which run? run=<run folder>, e.g. run=outputs/runs/demo", file=sys.stderr)
        return 2
    run = absolute_path(str(args["run"]))
    out = args.get("out")
    if out is not None:
        out = absolute_path(str(out))
    try:
        result = write_site(run, out)
    except FileNotFoundError as exc:
        print(exc, file=sys.stderr)
        return 2
    print(f"explorer: {result.out}/index.html  ({result.views} view(s), {result.items} items, {result.images} images"
          f"{f', {result.image_errors} unreadable' if result.image_errors else ''}; {result.seconds:.1f}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
