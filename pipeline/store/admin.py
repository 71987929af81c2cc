"""Checking and cleaning a whole store: `verify` reads every part and marker, `gc` removes
what is safe to remove, `compact` merges small parts into big sorted ones.

A store root (`sweep.store`, `${root}/store` by default) holds one `PartStore` folder per
backbone or generator (`answers/<backbone>/`, `generations/<name>/`, `grounding/<detector>/`,
`views/`) next to rendered view images (`images/`). Besides its parts each folder may hold:

- `_markers/*.json`: notes that a unit of work finished; never trusted over the parts, so
  always safe to delete;
- `.tmp-*`: files of a writer that is still writing, or was killed while writing; never
  read; safe to delete once no run is writing (gc waits until they are old);
- `_quarantine/*`: parts a reader found unusable and moved aside; their keys were computed
  again, so they are kept only for inspection (and key indexes that disagreed with their part);
- `part-k...parquet.keyidx`: the key index of a compacted part (`pipeline.store.key_index`), written
  by `compact` after its part; derived data, so a bad one is rewritten, an orphan removed.

The stages check the parts they need on every run (`PartStore.missing`); this module checks
all of them, e.g. after a disk or bucket incident, and says what it found.
"""
from __future__ import annotations

import json
import logging
import posixpath
import re
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc

from operators import schema
from operators.hashing import digest_chunks
from operators.images import PACKS
from pipeline.store.fs import TMP_PREFIX, filesystem, is_local, is_local_path
from pipeline.store.key_index import SUFFIX
from pipeline.store.parts import COMPACT_SMALL_ROWS, COMPACT_TARGET_ROWS, COMPACTED, MARKERS, QUARANTINE, BadPart, PartStore, is_checksummed
from pipeline.store.settings import retrying

log = logging.getLogger(__name__)

GC_MIN_AGE_S = 3600.0  # a temporary file younger than this may belong to a live writer


def _schemas() -> dict[str, pa.Schema]:
    """Part schema by the store's top-level folder (imported late: only verify needs them)."""
    from operators.grounding import DETECTIONS
    from operators.views import VIEW_IMAGES

    return {"answers": schema.ANSWERS, "generations": schema.GENERATIONS, "grounding": DETECTIONS, "views": VIEW_IMAGES}


@dataclass
class FolderReport:
    """What one PartStore folder holds."""

    url: str
    parts: int = 0
    rows: int = 0
    keys: int = 0  # distinct keys over all good parts
    bytes: int = 0
    bad_parts: list[dict] = field(default_factory=list)  # {path, reason[, moved_to]}
    markers: int = 0
    bad_markers: list[dict] = field(default_factory=list)
    temp_files: list[str] = field(default_factory=list)
    quarantined: list[str] = field(default_factory=list)
    unchecked: int = 0  # good parts named without a content digest (written before parts carried one)
    indexes: int = 0  # compacted parts whose key index agrees with them
    unindexed: int = 0  # compacted parts without an index (read whole until `compact` indexes them)
    bad_indexes: list[dict] = field(default_factory=list)  # {path, reason[, rewritten]}
    # Finished markers whose stage stored more keys than the folder's readable parts hold
    # (a part deleted or lost): {marker, needed, found}. The next run computes the missing keys.
    lost_keys: list[dict] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.bad_parts and not self.bad_markers and not self.bad_indexes and not self.lost_keys

    def line(self) -> str:
        state = "ok" if self.ok else f"{len(self.bad_parts)} BAD parts, {len(self.bad_markers)} bad markers, {len(self.bad_indexes)} bad key indexes"
        if self.lost_keys:
            state += f", {len(self.lost_keys)} finished markers promise keys no part holds"
        extra = f", unchecked: {self.unchecked} parts written without a checksum" if self.unchecked else ""
        extra += f", {self.indexes} key indexes" if self.indexes else ""
        extra += f", {self.unindexed} compacted parts without a key index" if self.unindexed else ""
        extra += f", {len(self.temp_files)} temp files" if self.temp_files else ""
        extra += f", {len(self.quarantined)} quarantined" if self.quarantined else ""
        return f"{self.url}: {self.keys} keys, {self.parts} parts, {self.bytes} bytes, {self.markers} markers{extra}: {state}"


def _files(root: str) -> tuple[object, str, dict[str, dict]]:
    fs, path = filesystem(root)
    fs.invalidate_cache(path)
    if not retrying(f"check {root}", lambda: fs.exists(path)):
        # A mistyped store path must not read as a healthy empty store ("0 bad").
        raise FileNotFoundError(f"no store at {root}")
    found = retrying(f"list {root}", lambda: fs.find(path, detail=True))
    return fs, path, found


def _folder_of(path: str) -> tuple[str, str] | None:
    """(PartStore folder, role) of a file, or None for files no store owns (view PNGs)."""
    parent, name = posixpath.split(path)
    special = posixpath.basename(parent) in (MARKERS, QUARANTINE)
    folder = posixpath.dirname(parent) if special else parent
    if name.startswith(TMP_PREFIX):
        return folder, "tmp"
    if special:
        return folder, posixpath.basename(parent)
    if name.startswith("part-") and name.endswith(".parquet"):
        return folder, "part"
    if name.startswith("part-") and name.endswith(SUFFIX):
        return folder, "index"
    return None


def _url(root: str, root_path: str, path: str) -> str:
    return root.rstrip("/") + path[len(root_path.rstrip("/")):]


def survey(root: str) -> dict[str, dict[str, list[tuple[str, dict]]]]:
    """Every store folder under `root` -> role -> [(path, file info)]."""
    _, root_path, found = _files(root)
    folders: dict[str, dict[str, list]] = {}
    for path, info in sorted(found.items()):
        owner = _folder_of(path)
        if owner:
            folder, role = owner
            folders.setdefault(folder, {}).setdefault(role, []).append((path, info))
    return {_url(root, root_path, folder): roles for folder, roles in folders.items()}


def verify(root: str, *, repair: bool = False) -> list[FolderReport]:
    """Read every part (all columns, checked against its schema and against the content digest
    in its name: any flipped byte makes it bad) and every marker.

    Each compacted part's key index is rebuilt from the part and compared with the stored
    one (an index that lies would make keys it omits read as missing).

    With `repair`, bad parts are quarantined as a stage's reader would (their keys are then
    computed by the next run), unreadable markers removed, and missing or bad key indexes
    written again from their part.
    """
    schemas = _schemas()
    reports = []
    _, root_path, _ = _files(root)
    for url, roles in survey(root).items():
        top = url[len(root.rstrip("/")) + 1:].split("/", 1)[0]
        if top == IMAGES:  # content-named images, not parts: verify_images checks them
            continue
        store = PartStore(url, schemas.get(top, pa.schema([("key", pa.string())])))
        report = FolderReport(url=url)
        keys = []
        for path, info in roles.get("part", []):
            report.parts += 1
            report.bytes += int(info.get("size") or 0)
            try:
                table = store.read_part(path)
            except FileNotFoundError:
                continue
            except BadPart as bad:
                entry = {"path": _url(root, root_path, path), "reason": bad.reason}
                if repair:
                    entry["moved_to"] = store.quarantine(path, bad.reason)
                report.bad_parts.append(entry)
                continue
            report.rows += table.num_rows
            report.unchecked += not is_checksummed(path)
            keys.append(table.column("key"))
            if COMPACTED.match(posixpath.basename(path)):
                _check_index(store, report, path, repair, _url(root, root_path, path + SUFFIX))
        if keys:
            report.keys = len(pc.unique(pa.chunked_array([c for k in keys for c in k.chunks], pa.string())))
        for path, _info in roles.get(MARKERS, []):
            report.markers += 1
            try:
                marker = json.loads(store.fs.cat_file(path))
            except (ValueError, UnicodeDecodeError) as exc:
                report.bad_markers.append({"path": _url(root, root_path, path), "reason": f"{type(exc).__name__}: {exc}"[:300]})
                if repair:
                    store.fs.rm(path)
                continue
            stored = _promised_keys(marker)
            if stored is not None and stored > report.keys:
                report.lost_keys.append({"marker": _url(root, root_path, path), "needed": stored, "found": report.keys, "removed": repair})
                if repair:  # the stage's next run would remove it too, before computing the missing keys
                    store.fs.rm(path)
        report.temp_files = [_url(root, root_path, p) for p, _ in roles.get("tmp", [])]
        report.quarantined = [_url(root, root_path, p) for p, _ in roles.get(QUARANTINE, [])]
        reports.append(report)
    return reports


def _promised_keys(marker: object) -> int | None:
    """How many keys a finished marker's stage stored (a stage marks itself finished only
    when it failed on none), or None for a marker that does not say."""
    if not isinstance(marker, dict):
        return None
    needed, failed = marker.get("needed"), marker.get("failed", 0)
    if not isinstance(needed, int) or not isinstance(failed, int):
        return None
    return needed - failed


@dataclass
class ImagesReport:
    """What the store's images folder holds: image packs (`images/packs/<hh>/<hash>.tar`, a
    curated shard's embedded images) and single images (`images/<hh>/<hash>.<ext>`, rendered
    views and images handed to the API as bytes). Each is named by the hash of its bytes."""

    url: str
    packs: int = 0
    images: int = 0
    bytes: int = 0
    bad: list[dict] = field(default_factory=list)  # {path, reason[, moved_to]}
    temp_files: int = 0  # of writers still writing or killed (gc removes old ones)
    quarantined: int = 0  # bad files moved aside by an earlier repair (gc removes them)

    def line(self) -> str:
        state = "ok" if not self.bad else f"{len(self.bad)} BAD files"
        extra = f", {self.temp_files} temp files" if self.temp_files else ""
        extra += f", {self.quarantined} quarantined" if self.quarantined else ""
        return f"{self.url}: {self.packs} image packs, {self.images} single images, {self.bytes} bytes{extra}: {state}"


IMAGES = "images"  # the store's folder of content-named images (views, API bytes, packs)
# root-relative paths of content-named files: images/packs/<hh>/<hash>.tar and images/<hh>/<hash>.<ext>
_NAMED = re.compile(rf"^{IMAGES}/(?:(?P<pack>{PACKS})/)?(?P<hh>[0-9a-f]{{2}})/(?P<name>(?P=hh)[0-9a-f]{{30}})\.(?P<ext>[a-z]{{2,4}})$")
_HASH_CHUNK = 8 << 20  # bytes hashed at a time: packs can be gigabytes


def verify_images(root: str, *, repair: bool = False, threads: int = 8) -> ImagesReport:
    """Hash every content-named file under `<root>/images/`: one whose bytes no longer hash to
    its name was altered or truncated after it was written. The workers already refuse its
    images ("changed since it was hashed"), so no wrong answer is stored, but a damaged pack
    keeps failing its shard's rows night after night (the pairs cache checks sizes, not bytes).
    With `repair` a bad file is moved to `_quarantine/` beside it (gc removes it): the next
    curation of a pack's shard reads the shard again and writes the pack anew, and the next
    run that extracts a single image writes it again."""
    fs, root_path, found = _files(root)
    prefix = root_path.rstrip("/") + "/"
    named = sorted((p, info, m) for p, info in found.items() if p.startswith(prefix) and (m := _NAMED.match(p[len(prefix):])))
    report = ImagesReport(url=f"{root.rstrip('/')}/{IMAGES}")
    for path in found:
        if path.startswith(prefix + IMAGES + "/"):
            report.temp_files += posixpath.basename(path).startswith(TMP_PREFIX)
            report.quarantined += posixpath.basename(posixpath.dirname(path)) == QUARANTINE

    def check(path: str, name: str) -> str | None:
        try:
            with fs.open(path, "rb") as f:
                found_hash = digest_chunks(iter(lambda: f.read(_HASH_CHUNK), b""))
                size = f.tell()
        except FileNotFoundError:
            return "removed while it was being checked"
        return None if found_hash == name else f"{size} bytes that hash to {found_hash}, not to its name"

    with ThreadPoolExecutor(max(1, threads)) as pool:  # hashing large buffers frees the GIL; object stores answer slowly
        reasons = list(pool.map(lambda entry: check(entry[0], entry[2]["name"]), named))
    for (path, info, m), reason in zip(named, reasons, strict=True):
        if reason == "removed while it was being checked":
            continue
        report.packs += bool(m["pack"])
        report.images += not m["pack"]
        report.bytes += int(info.get("size") or 0)
        if reason is None:
            continue
        entry = {"path": _url(root, root_path, path), "reason": reason}
        if repair:
            moved = posixpath.join(posixpath.dirname(path), QUARANTINE, f"{posixpath.basename(path)}.{time.strftime('%Y%m%dT%H%M%S')}")
            if is_local(fs):
                fs.makedirs(posixpath.dirname(moved), exist_ok=True)
            try:
                retrying(f"quarantine {path}", lambda p=path, m=moved: fs.mv(p, m))
                entry["moved_to"] = _url(root, root_path, moved)
            except FileNotFoundError:  # removed meanwhile
                pass
        report.bad.append(entry)
    return report


def _check_index(store: PartStore, report: FolderReport, path: str, repair: bool, url: str) -> None:
    """Count a compacted part's key index as agreeing, missing or bad (rewritten with repair)."""
    try:
        reason = store.check_index(path)
    except FileNotFoundError:
        report.unindexed += 1
        if repair and store.write_index(path) is not None:
            report.unindexed -= 1
            report.indexes += 1
        return
    except BadPart:  # the part changed since it was read: the next verify sees it
        return
    if reason is None:
        report.indexes += 1
        return
    entry = {"path": url, "reason": reason}
    if repair:
        entry["rewritten"] = store.write_index(path) is not None
    report.bad_indexes.append(entry)


def compact(root: str, *, target_rows: int = COMPACT_TARGET_ROWS, small_rows: int = COMPACT_SMALL_ROWS, ttl_s: float = 600.0, force: bool = False) -> list[dict]:
    """Compact every PartStore folder under `root` (`PartStore.compact`), each under its own
    lease (`<folder>/_lease.json`), so two compactions of one folder never run at once.

    Runs may keep writing while this runs: compaction only merges the parts it listed, and
    writes the merged part before it removes them. Returns one summary per folder.
    """
    from pipeline.store.lease import Lease

    schemas = _schemas()
    summaries = []
    for url, roles in survey(root).items():
        if len(roles.get("part", [])) < 2:
            continue
        top = url[len(root.rstrip("/")) + 1:].split("/", 1)[0]
        store = PartStore(url, schemas.get(top, pa.schema([("key", pa.string())])))
        with Lease(url, what=f"compact {url}", ttl_s=ttl_s, force=force):
            summary = store.compact(target_rows=target_rows, small_rows=small_rows)
        summary["quarantined"] = [q["path"] for q in store.quarantined]
        summaries.append(summary)
    return summaries


def compact_between_windows(store: PartStore) -> None:
    """Fold the parts a night wrote so far into key-indexed parts, between its windows.

    A window's missing-key check reads every part without a key index in full, so without
    this window k would read the parts of all k-1 windows before it (quadratic in the night);
    with it, it searches one index per earlier window. Under the folder's lease (as
    `compact`); a folder leased elsewhere is left for later."""
    from pipeline.store.lease import Lease, LeaseHeld

    try:
        with Lease(store.url, what=f"compact {store.url}"):
            store.compact()
    except LeaseHeld as held:
        log.info("between windows: %s not compacted now (%s)", store.url, held)


def remove_file(fs, path: str) -> None:
    """Remove a file, retrying transient errors; one already gone (another gc) is fine."""
    try:
        retrying(f"remove {path}", lambda: fs.rm(path))
    except FileNotFoundError:
        pass


def _age_s(info: dict, now: float) -> float | None:
    """Seconds since a file was last written (None when the filesystem does not say)."""
    stamp = info.get("mtime", info.get("LastModified", info.get("last_modified")))
    if stamp is None:
        return None
    if hasattr(stamp, "timestamp"):
        stamp = stamp.timestamp()
    return now - float(stamp)


def gc(root: str, *, min_age_s: float = GC_MIN_AGE_S, dry_run: bool = False) -> list[str]:
    """Remove temporary files older than `min_age_s` (killed writers), every quarantined part,
    every marker that cannot be read and every key index whose part is gone; returns what was
    (or, dry run, would be) removed.

    Parts are never removed: a good part is the cache, a bad one is quarantined first
    (by a run or by `verify(repair=True)`).
    """
    fs, _root_path, _ = _files(root)
    now = time.time()
    doomed = []
    for roles in survey(root).values():
        for path, info in roles.get("tmp", []):
            age = _age_s(info, now)
            if age is not None and age >= min_age_s:
                doomed.append(path)
        doomed += [path for path, _ in roles.get(QUARANTINE, [])]
        parts = {path for path, _ in roles.get("part", [])}
        doomed += [path for path, _ in roles.get("index", []) if path[: -len(SUFFIX)] not in parts]
        for path, _ in roles.get(MARKERS, []):
            try:
                json.loads(fs.cat_file(path))
            except (ValueError, UnicodeDecodeError):
                doomed.append(path)
    if not dry_run:
        for path in doomed:
            remove_file(fs, path)
    return [fs.unstrip_protocol(p) if not is_local_path(root) else p for p in doomed]
