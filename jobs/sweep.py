"""Run (or resume) a sweep: `python jobs/sweep.py [sweep=demo] [key=value ...]`.

With no sweep= it runs the built-in default (conf/sweep/demo.yaml: the large demo benchmark scored
by builtin:micro-vlm, a small model trained on the demo world and shipped in the package, beside
the world-truth oracle); sweep=smoke runs the demo's fixed items on a random-weight model (a
plumbing check).

Locally this starts Ray on this machine; on a cluster submit it with
`ray job submit --working-dir . -- python jobs/sweep.py sweep=paper root=s3://bucket/depict`.
Overrides use OmegaConf dot-list syntax: backbones=[qwen3_5-4b] compute.engines_per_backbone=4.
Exit codes: 0 done, 2 bad input (one line naming the key or path), 3 another sweep is writing
the same run folder, 4 the store or run folder cannot be written (no space, read-only, permission
denied: one line naming the path), 130 interrupted: rerun to resume (docs/troubleshooting.md).
"""
from __future__ import annotations

import sys
from pathlib import Path

if not __package__:  # run as a file (python jobs/<job>.py): this checkout's code, from a fresh clone
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pipeline import console  # noqa: E402
from pipeline.cli import guarded  # noqa: E402
from pipeline.config import load_config  # noqa: E402
from pipeline.sweep import run_sweep, summary_text  # noqa: E402


@guarded  # a bad value, a malformed override or a missing folder: one line, exit 2
def main(argv: list[str]) -> int:
    if {"-h", "--help"} & set(argv):
        print(__doc__)
        return 0
    argv = console.configure(argv)  # --verbose: Ray's and transformers' own messages too
    cfg = load_config(argv)
    result = run_sweep(cfg)
    print(summary_text(cfg, result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
