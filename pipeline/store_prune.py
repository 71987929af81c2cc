"""Reclaim what the store keeps of input shards that are gone or changed.

Curation reads a shard once: its rows go to the pairs cache (`<store>/shard_pairs/`) and its
embedded images to one pack (`<store>/images/packs/`). Both stand for the shard as it was
(uri, size, version). Once a night's inputs are deleted or rewritten, their entries are never
used again, and their packs hold copies of images that no new run will read: a store curating
new shards every night would otherwise grow by a copy of every night's images. A run cannot
know that a shard is not coming back, so nothing is removed during runs; this is done on
demand (`python jobs/store.py gc store=... gone_shards=true`).

- An entry is dead when its shard is not found, or has another size or version. A shard
  versioned by content hash (`detect_changes=content`) is not read again here: with the same
  size it counts as unchanged. An entry that cannot be read is dead too: a run treats it as
  a miss and never uses it. Entries written before entries recorded their shard are kept.
- A pack is removed when no live entry points into it and it is older than `min_age_s`: a
  running curation writes a window's packs before it records their entries.
- Outputs of past runs that point into a removed pack (error rows, the explorer) then show no
  image: the pack was the store's copy, and the shard it came from is gone. A shard that comes
  back is read again and its pack written again, under the same name.

Everything is decided before anything is removed, so an error (a shard that cannot be checked,
a listing that fails) removes nothing.
"""
from __future__ import annotations

import posixpath
import re
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from operators.images import PACKS
from pipeline.pairs_cache import recorded
from pipeline.shards import Shard, ShardError, current_version
from pipeline.storage import retrying
from pipeline.store_admin import GC_MIN_AGE_S, IMAGES, _age_s, _files, _url

PAIRS_FOLDER = "shard_pairs"
_ENTRY = re.compile(rf"^{PAIRS_FOLDER}/[0-9a-f]{{2}}/[0-9a-f]{{32}}\.parquet$")
_PACK = re.compile(rf"^{IMAGES}/{PACKS}/[0-9a-f]{{2}}/[0-9a-f]{{32}}\.tar$")


@dataclass
class PruneReport:
    """What `prune_gone_shards` found, and removed unless it was a dry run."""

    url: str
    dry_run: bool
    entries: int = 0  # pairs-cache entries looked at
    dead: list[dict] = field(default_factory=list)  # {path, reason}
    unrecorded: int = 0  # entries from before entries recorded their shard: kept
    packs: int = 0  # packs looked at
    orphans: list[dict] = field(default_factory=list)  # {path, bytes}: no live entry points into them
    young: int = 0  # orphaned packs newer than min_age_s: kept (a running curation may record them)

    @property
    def freed_bytes(self) -> int:
        return sum(o["bytes"] for o in self.orphans)

    def line(self) -> str:
        verb = "to remove" if self.dry_run else "removed"
        kept = f", {self.unrecorded} written before entries recorded their shard (kept)" if self.unrecorded else ""
        young = f", {self.young} newer than min_age_s (kept)" if self.young else ""
        return (f"{self.url}: {self.entries} pairs-cache entries, {len(self.dead)} of shards gone or changed {verb}{kept}; "
                f"{self.packs} image packs, {len(self.orphans)} that no live entry points into {verb} "
                f"({self.freed_bytes} bytes){young}")


def shard_state(shard: Shard) -> str | None:
    """Why an entry of `shard` can never be used again, or None."""
    try:
        size, version = current_version(shard, "stat")
    except ShardError:
        return f"its shard {shard.uri} is gone"
    if size != shard.size:
        return f"its shard {shard.uri} changed ({size} bytes, read at {shard.size})"
    if not shard.version.startswith("blake2b:") and version != shard.version:
        return f"its shard {shard.uri} changed ({version}, read at {shard.version})"
    return None


def prune_gone_shards(root: str, *, min_age_s: float = GC_MIN_AGE_S, dry_run: bool = False, threads: int = 16) -> PruneReport:
    """Remove the pairs-cache entries of shards that are gone or changed, then the image packs
    that no remaining entry points into (see the module docstring for what is kept)."""
    fs, root_path, found = _files(root)
    prefix = root_path.rstrip("/") + "/"
    relative = {p[len(prefix):]: (p, info) for p, info in found.items() if p.startswith(prefix)}
    entries = sorted(path for rel, (path, _) in relative.items() if _ENTRY.match(rel))
    packs = sorted((path, info) for rel, (path, info) in relative.items() if _PACK.match(rel))
    report = PruneReport(url=root.rstrip("/"), dry_run=dry_run, entries=len(entries), packs=len(packs))

    def judge(path: str) -> tuple[str | None, set[str], bool]:
        """(why the entry is dead or None, the names of the packs it keeps, whether it is
        from before entries recorded their shard)."""
        try:
            shard, pack_urls = recorded(fs, path)
        except FileNotFoundError:  # removed meanwhile (another gc): nothing to keep or remove
            return None, set(), False
        except Exception as exc:  # noqa: BLE001 - a run never uses an entry it cannot read
            return f"the entry is unreadable ({type(exc).__name__}: {exc})", set(), False
        state = shard_state(shard) if shard is not None else None
        return state, set() if state else {posixpath.basename(u) for u in pack_urls}, shard is None

    with ThreadPoolExecutor(max(1, threads)) as pool:  # a stat per shard: object stores answer slowly
        judged = list(pool.map(judge, entries))
    kept_packs: set[str] = set()
    for path, (reason, names, unrecorded) in zip(entries, judged, strict=True):
        report.unrecorded += unrecorded
        if reason:
            report.dead.append({"path": _url(root, root_path, path), "reason": reason, "_path": path})
        else:
            kept_packs |= names
    now = time.time()
    for path, info in packs:
        if posixpath.basename(path) in kept_packs:
            continue
        age = _age_s(info, now)
        if age is None or age < min_age_s:
            report.young += 1
            continue
        report.orphans.append({"path": _url(root, root_path, path), "bytes": int(info.get("size") or 0), "_path": path})
    if not dry_run:
        for doomed in report.dead + report.orphans:
            try:
                retrying(f"remove {doomed['path']}", lambda p=doomed["_path"]: fs.rm(p))
            except FileNotFoundError:
                pass
    for doomed in report.dead + report.orphans:
        del doomed["_path"]
    return report

