"""Nightly curation: `python jobs/curate.py [curation=default] [key=value ...]`.

Scores the input shards that are new or changed since the last run, keeps the pairs that
pass the rule and publishes filtered shards with their scores and per-question evidence.
Rerunning the same night does nothing. Change the rule without any model work:
`python jobs/curate.py curation=default decide_only=true min_score=0.7`.
On a cluster: `ray job submit --working-dir . -- python jobs/curate.py root=s3://bucket/depict inputs=[s3://bucket/incoming/]`.
Exit codes: 0 done, 2 bad input, 3 another curation holds the lease on this output
(it expires after lease.ttl_s; lease.force=true takes it over), 4 the output or store cannot be
written (no space, read-only, permission denied: one line naming the path), 130 interrupted:
rerun to resume. See docs/curation.md and docs/troubleshooting.md.
"""
from __future__ import annotations

import sys
from pathlib import Path

if not __package__:  # run as a file (python jobs/<job>.py): this checkout's code, from a fresh clone
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pipeline import console  # noqa: E402
from pipeline.cli import guarded, one_line  # noqa: E402
from pipeline.curation.curation_config import load_curation_config  # noqa: E402
from pipeline.curation.report import summary_text  # noqa: E402
from pipeline.curation.run import run_curation  # noqa: E402
from pipeline.curation.shards import ShardError  # noqa: E402


@guarded  # bad config or command line: one line, exit 2; another curation on this output: exit 3
def main(argv: list[str]) -> int:
    if {"-h", "--help"} & set(argv):
        print(__doc__)
        return 0
    argv = console.configure(argv)  # --verbose: Ray's and transformers' own messages too
    cfg = load_curation_config(argv)
    try:
        result = run_curation(cfg)
    except ShardError as exc:  # e.g. an input file named in the config does not exist
        print(f"error: {one_line(exc)}", file=sys.stderr)
        return 2
    print(summary_text(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
