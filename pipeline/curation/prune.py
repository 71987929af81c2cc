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
- A pack is removed when no live entry points into it, it is older than `min_age_s`, and no
  curation is running on the store. Each curation holds a reader's lease in
  `shard_pairs/_readers/` while it runs (`reading_packs`): a running one may be writing
  packs whose entries it records later (a pack whose bytes were stored before keeps its old
  mtime), or scoring rows that point into a pack whose shard was deleted meanwhile. A reader
  killed without releasing its lease stops counting when the lease expires (or at once, when
  its process is known dead); gc then removes the lease file. gc looks for readers again before
  every `REMOVE_CHUNK` packs it removes, and keeps a pack that an entry written since its listing
  points into (a curation that ran from start to end while gc checked the shards).
- Outputs of past runs that point into a removed pack (error rows) then show no image: the
  pack was the store's copy of a shard that is gone or has changed. A shard that comes back
  unchanged is read again and its pack written again, under the same name.

Everything is decided before anything is removed, so an error (a shard that cannot be checked,
a listing that fails) removes nothing.
"""
from __future__ import annotations

import os
import posixpath
import re
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field

from fsspec.core import url_to_fs

from operators.images import PACKS
from pipeline.curation.pairs_cache import FOLDER as PAIRS_FOLDER
from pipeline.curation.pairs_cache import recorded
from pipeline.curation.shards import Shard, _version
from pipeline.store.admin import _NAMED, GC_MIN_AGE_S, IMAGES, _age_s, _files, _url, remove_file
from pipeline.store.fs import is_local, join_url, protocols
from pipeline.store.lease import LEASE_FILE, Lease
from pipeline.store.settings import retrying

READERS = "_readers"  # under PAIRS_FOLDER: one lease folder per running curation
REMOVE_CHUNK = 32  # packs removed between two checks that no curation has started
_ENTRY = re.compile(rf"^{PAIRS_FOLDER}/[0-9a-f]{{2}}/[0-9a-f]{{32}}\.parquet$")


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
    readers: list[str] = field(default_factory=list)  # running curations: while any runs, no pack is removed
    stale_readers: list[str] = field(default_factory=list)  # lease files of curations that ended without releasing them
    curated: bool = True  # whether the store holds a pairs cache or packs at all (a wrong store= holds neither)

    @property
    def freed_bytes(self) -> int:
        return sum(o["bytes"] for o in self.orphans)

    def line(self) -> str:
        if not self.curated:
            return (f"{self.url}: no pairs cache ({PAIRS_FOLDER}/) and no image packs: nothing was curated into this store "
                    "(is store= the store folder, e.g. <root>/store?)")
        verb = "to remove" if self.dry_run else "removed"
        kept = f", {self.unrecorded} written before entries recorded their shard (kept)" if self.unrecorded else ""
        young = f", {self.young} newer than min_age_s (kept)" if self.young else ""
        line = (f"{self.url}: {self.entries} pairs-cache entries, {len(self.dead)} dead (shard gone or changed, or unreadable) {verb}{kept}; "
                f"{self.packs} image packs, {len(self.orphans)} that no live entry points into {verb} ({self.freed_bytes} bytes){young}")
        if self.readers:
            line += (f"; {'pack removal stopped' if self.orphans else 'packs kept'}: {len(self.readers)} curation(s) running on this store ("
                     + "; ".join(self.readers) + "), run gc again when they end")
        if self.stale_readers:
            line += f"; {len(self.stale_readers)} reader lease(s) of curations that ended without releasing them {verb}"
        return line


def shard_state(shard: Shard) -> str | None:
    """Why an entry of `shard` can never be used again, or None. Only "not found" means gone:
    any other error checking it is raised (and stops gc with nothing removed)."""
    fs, path = url_to_fs(shard.uri)
    fs.invalidate_cache(path)
    try:
        info = retrying(f"check {shard.uri}", lambda: fs.info(path))
    except FileNotFoundError as exc:
        if not _means_gone(fs, exc):
            raise OSError(f"{shard.uri}: cannot be reached ({exc.__cause__!r})") from exc
        return f"its shard {shard.uri} is gone"
    size = int(info["size"])
    if size != shard.size:
        return f"its shard {shard.uri} changed ({size} bytes, read at {shard.size})"
    if shard.version.startswith("blake2b:"):  # detect_changes=content: not read again here
        return None
    version = _version(fs, path, info, "stat")
    if version != shard.version:
        return f"its shard {shard.uri} changed ({version}, read at {shard.version})"
    return None


def _means_gone(fs, exc: FileNotFoundError) -> bool:
    """Whether "not found" means the file is gone. fsspec's HTTP file system raises it for any
    failure, a server down included, so there only a 404 or 410 answer counts."""
    if not {"http", "https"} & set(protocols(fs)):
        return True
    return getattr(exc.__cause__, "status", None) in (404, 410)


@contextmanager
def reading_packs(store: str, what: str, ttl_s: float = 600.0) -> Iterator[Lease]:
    """`with reading_packs(store, "curation nightly"):` a reader's lease, held while a curation
    runs, so that gc removes no pack under it (its own folder: readers never contend)."""
    lease = Lease(join_url(store, PAIRS_FOLDER, READERS, uuid.uuid4().hex), what=what, ttl_s=ttl_s)
    try:
        with lease:
            yield lease
    finally:
        if lease.local:  # the lease file is gone; its folder too
            with suppress(OSError):
                os.rmdir(posixpath.dirname(lease.path))


class PruneError(RuntimeError):
    """A shard could not be checked: nothing was removed."""


def readers(root: str) -> tuple[list[str], list[str]]:
    """(the running curations' reader leases, described; the lease files of readers that ended
    without releasing them: expired, or their process is known to be gone)."""
    fs, path = url_to_fs(join_url(root, PAIRS_FOLDER, READERS))
    fs.invalidate_cache(path)
    found = retrying(f"list {root} readers", lambda: fs.glob(posixpath.join(path, "*", LEASE_FILE)))
    now, live, stale = time.time(), [], []
    for lease_path in sorted(found):
        folder = posixpath.dirname(lease_path)
        current = Lease(fs.unstrip_protocol(folder) if not is_local(fs) else folder, what="gc").read()
        if current is None:
            continue
        info, _ = current
        if info.expires_at > now and not info.holder_is_gone():
            live.append(info.describe(now))
        else:
            stale.append(fs.unstrip_protocol(lease_path) if not is_local(fs) else lease_path)
    return live, stale


def _remove_stale_readers(stale: list[str]) -> None:
    """Remove the lease files of readers that ended without releasing them (and, locally,
    their folders)."""
    for lease_url in stale:
        fs, path = url_to_fs(lease_url)
        remove_file(fs, path)
        if is_local(fs):
            with suppress(OSError):
                os.rmdir(posixpath.dirname(path))


def prune_gone_shards(root: str, *, min_age_s: float = GC_MIN_AGE_S, dry_run: bool = False, threads: int = 16) -> PruneReport:
    """Remove the pairs-cache entries of shards that are gone or changed, then the image packs
    that no remaining entry points into (see the module docstring for what is kept)."""
    fs, root_path, found = _files(root)
    prefix = root_path.rstrip("/") + "/"
    relative = {p[len(prefix):]: (p, info) for p, info in found.items() if p.startswith(prefix)}
    entries = sorted(path for rel, (path, _) in relative.items() if _ENTRY.match(rel))
    packs = sorted((path, info) for rel, (path, info) in relative.items() if (m := _NAMED.match(rel)) and m["pack"] and m["ext"] == "tar")
    report = PruneReport(url=root.rstrip("/"), dry_run=dry_run, entries=len(entries), packs=len(packs))
    report.curated = any(rel.startswith((f"{PAIRS_FOLDER}/", f"{IMAGES}/{PACKS}/")) for rel in relative)
    report.readers, report.stale_readers = readers(root)

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
        try:
            judged = list(pool.map(judge, entries))
        except Exception as exc:
            raise PruneError(f"{root}: a shard could not be checked ({type(exc).__name__}: {exc}); nothing was removed") from exc
    kept_packs: set[str] = set()
    for path, (reason, names, unrecorded) in zip(entries, judged, strict=True):
        report.unrecorded += unrecorded
        if reason:
            report.dead.append({"path": _url(root, root_path, path), "reason": reason, "_path": path})
        else:
            kept_packs |= names
    now = time.time()
    for path, info in packs if not report.readers else ():
        if posixpath.basename(path) in kept_packs:
            continue
        age = _age_s(info, now)
        if age is None or age < min_age_s:
            report.young += 1
            continue
        report.orphans.append({"path": _url(root, root_path, path), "bytes": int(info.get("size") or 0), "_path": path})
    if not dry_run:
        _remove_stale_readers(report.stale_readers)
        for doomed in report.dead:
            _remove(fs, doomed)
        if report.orphans:  # (none when a curation was running at the start)
            report.orphans, report.readers = _remove_orphans(root, fs, prefix, set(entries), report.orphans)
    for doomed in report.dead + report.orphans:
        del doomed["_path"]
    return report


def _remove(fs, doomed: dict) -> None:
    remove_file(fs, doomed["_path"])


def _remove_orphans(root: str, fs, prefix: str, listed_entries: set[str], orphans: list[dict]) -> tuple[list[dict], list[str]]:
    """Remove orphaned packs, `REMOVE_CHUNK` at a time, unless a curation is found running
    before a chunk; a pack that an entry written since the listing points into is kept (a
    curation that ran from start to end while the shards were being checked).
    Returns (the packs removed, the running curations that stopped it)."""
    fs.invalidate_cache(prefix + PAIRS_FOLDER)
    fresh = retrying(f"list {root}/{PAIRS_FOLDER}", lambda: fs.find(prefix + PAIRS_FOLDER))
    new_refs: set[str] = set()
    for path in fresh:
        if path not in listed_entries and _ENTRY.match(path[len(prefix):]):
            with suppress(Exception):  # an entry that does not read is never used
                new_refs |= {posixpath.basename(u) for u in recorded(fs, path)[1]}
    removed: list[dict] = []
    candidates = [o for o in orphans if posixpath.basename(o["_path"]) not in new_refs]
    for start in range(0, len(candidates), REMOVE_CHUNK):
        live, _ = readers(root)
        if live:
            return removed, live
        for doomed in candidates[start:start + REMOVE_CHUNK]:
            _remove(fs, doomed)
            removed.append(doomed)
    return removed, []

