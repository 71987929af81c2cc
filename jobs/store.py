"""Check or clean a store (the answer and generation cache of every run):

    python jobs/store.py verify store=<store dir or s3://...> [repair=true]
    python jobs/store.py gc store=<store dir or s3://...> [min_age_s=3600] [dry_run=true] [gone_shards=true]
    python jobs/store.py compact store=<store dir or s3://...> [target_rows=1048576] [small_rows=65536]

`verify` reads every part and marker, checks every part's bytes against the content checksum in
its name (parts written without one are counted as unchecked), checks each compacted part's key
index against the part, compares each finished marker's stored-key count with the keys the
readable parts hold (a deleted part shows there),
hashes every content-named file under images/ (image packs and single images, each named by the
hash of its bytes), and prints keys, parts, bytes and bad files per folder; exit code 1 when
something is bad (with repair=true bad parts are moved to `_quarantine/`, and the next run
computes their keys; missing or bad key indexes are written again; a bad image file is moved to
a `_quarantine/` beside it: the next curation of a pack's shard writes the pack again). `gc`
removes temporary files of killed writers older than min_age_s, quarantined parts and images
and unreadable markers; parts are never removed. With gone_shards=true it also removes the
pairs-cache entries of input shards that are gone or changed, and the image packs that no other
entry points into and that are older than min_age_s (pipeline/curation/prune.py; past runs' links
into a removed pack then show no image).
`compact` merges small parts into big ones sorted by key and bucketed by key prefix, each with
a key index (under each folder's lease; safe while runs write), so finding a night's keys
reads the indexes and only the row groups that hold hits (docs/storage.md).
See docs/troubleshooting.md.
"""
from __future__ import annotations

import math
import sys
from pathlib import Path

if not __package__:  # run as a file (python jobs/<job>.py): this checkout's code, from a fresh clone
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pipeline.cli import guarded  # noqa: E402
from pipeline.curation.prune import PruneError, prune_gone_shards  # noqa: E402
from pipeline.store.admin import GC_MIN_AGE_S, compact, gc, verify, verify_images  # noqa: E402
from pipeline.store.parts import COMPACT_SMALL_ROWS, COMPACT_TARGET_ROWS  # noqa: E402

USAGE = ("usage: python jobs/store.py verify|gc|compact store=<dir or s3://...> [repair=true] [min_age_s=N] [dry_run=true] "
         "[gone_shards=true] [target_rows=N] [small_rows=N]")
_BOOL = {"true": True, "false": False, "1": True, "0": False, "yes": True, "no": False}


def parse_args(argv: list[str]) -> dict:
    if not argv or argv[0] not in ("verify", "gc", "compact"):
        raise ValueError("the first argument must be verify, gc or compact")
    args: dict = {"command": argv[0], "repair": False, "dry_run": False, "gone_shards": False, "min_age_s": GC_MIN_AGE_S,
                  "target_rows": COMPACT_TARGET_ROWS, "small_rows": COMPACT_SMALL_ROWS}
    allowed = {"verify": ("store", "repair"), "gc": ("store", "min_age_s", "dry_run", "gone_shards"),
               "compact": ("store", "target_rows", "small_rows")}[argv[0]]
    for arg in argv[1:]:
        key, sep, value = arg.partition("=")
        if not sep or key not in allowed:
            raise ValueError(f"unexpected argument {arg!r} for {argv[0]}")
        if key in ("repair", "dry_run", "gone_shards"):
            if value.lower() not in _BOOL:
                raise ValueError(f"{key} must be true or false, got {value!r}")
            args[key] = _BOOL[value.lower()]
        elif key == "min_age_s":
            try:
                args[key] = float(value)
            except ValueError:
                raise ValueError(f"min_age_s must be a number of seconds, got {value!r}") from None
            if not math.isfinite(args[key]):  # nan compares false with every age: it would act as 0
                raise ValueError(f"min_age_s must be a finite number of seconds, got {value!r}")
            if args[key] < 0:
                raise ValueError(f"min_age_s must be >= 0, got {value!r}")
        elif key in ("target_rows", "small_rows"):
            try:
                args[key] = int(value)
            except ValueError:
                raise ValueError(f"{key} must be a whole number of rows, got {value!r}") from None
            if args[key] < (1 if key == "target_rows" else 0):
                raise ValueError(f"{key} must be >= {1 if key == 'target_rows' else 0}, got {value!r}")
        else:
            args[key] = value
    if not args.get("store"):
        raise ValueError("store=<store dir or s3://...> is required")
    return args


@guarded  # a missing store: one line, exit 2; a compaction already running on a folder: exit 3
def main(argv: list[str]) -> int:
    if {"-h", "--help"} & set(argv):
        print(__doc__)
        return 0
    try:
        args = parse_args(argv)
    except ValueError as exc:
        print(f"{exc}\n{USAGE}", file=sys.stderr)
        return 2
    if args["command"] == "compact":
        for s in compact(args["store"], target_rows=args["target_rows"], small_rows=args["small_rows"]):
            print(f"{s['store']}: {s['parts_in']} parts -> {s['parts_out']} compacted parts, {s['rows']} rows, "
                  f"{s['dropped_duplicates']} duplicate rows dropped, {s['indexes_written']} key indexes written for kept parts")
        return 0
    if args["command"] == "gc":
        verb = "would remove " if args["dry_run"] else "removed "
        if args["gone_shards"]:  # first: if a shard cannot be checked, nothing at all is removed
            try:
                pruned = prune_gone_shards(args["store"], min_age_s=args["min_age_s"], dry_run=args["dry_run"])
            except PruneError as exc:
                print(f"error: {exc}", file=sys.stderr)
                return 1
            for dead in pruned.dead:
                print(f"{verb}{dead['path']} (pairs-cache entry: {dead['reason']})")
            for orphan in pruned.orphans:
                print(f"{verb}{orphan['path']} (image pack no live entry points into, {orphan['bytes']} bytes)")
            print(pruned.line())
        removed = gc(args["store"], min_age_s=args["min_age_s"], dry_run=args["dry_run"])
        for path in removed:
            print(verb + path)
        print(f"{len(removed)} files {'to remove' if args['dry_run'] else 'removed'}")
        return 0
    reports = verify(args["store"], repair=args["repair"])
    images = verify_images(args["store"], repair=args["repair"])
    for report in reports:
        print(report.line())
        for bad in report.bad_parts:
            moved = f" -> moved to {bad['moved_to']}" if bad.get("moved_to") else ""
            print(f"  bad part {bad['path']}: {bad['reason']}{moved}")
        for bad in report.bad_markers:
            print(f"  bad marker {bad['path']}: {bad['reason']}")
        for bad in report.bad_indexes:
            fixed = " -> written again" if bad.get("rewritten") else ""
            print(f"  bad key index {bad['path']}: {bad['reason']}{fixed}")
        for lost in report.lost_keys:
            print(f"  marker {lost['marker']} says {lost['needed']} keys were stored, the readable parts hold {lost['found']}: "
                  "parts were deleted or lost; the next run computes the missing keys" + (" -> marker removed" if lost.get("removed") else ""))
    if images.packs or images.images or images.bad or images.quarantined or images.temp_files:
        print(images.line())
        for bad in images.bad:
            moved = f" -> moved to {bad['moved_to']}" if bad.get("moved_to") else ""
            print(f"  bad image file {bad['path']}: {bad['reason']}{moved}")
    total = {k: sum(getattr(r, k) for r in reports) for k in ("keys", "parts", "bytes")}
    n_bad = sum(len(r.bad_parts) + len(r.bad_markers) + len(r.bad_indexes) + len(r.lost_keys) for r in reports) + len(images.bad)
    print(f"total: {len(reports)} folders, {total['keys']} keys, {total['parts']} parts, {total['bytes']} bytes, {n_bad} bad")
    return 1 if n_bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
