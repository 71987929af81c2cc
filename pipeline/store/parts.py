"""Content-addressed Parquet storage on any fsspec path (local folder or s3:// prefix).

A `PartStore` is one folder of Parquet parts that all have a `key` column (answers of one
backbone, generations of one generator, ...). Parts are immutable and named by a digest of
the keys they hold and of their bytes, so the same work always lands under the same name. A part becomes
visible only when complete: locally it is written under a temporary name and renamed; on
object stores a single PUT (or a completed multipart upload) is atomic. A run that is
killed therefore leaves only whole parts, and the next run computes just the keys that are
missing (anti-join).

Files are read and written through `pipeline.store.fs`. Every read and write is retried on
transient errors (`pipeline.store.settings.retrying`): writes
can be repeated safely because a file's bytes are fixed by its name. Listings and existence
checks drop fsspec's cached directory listings first, since other processes (answer
actors, a concurrent run) add parts behind this process's back.

Finding keys reads no more than it must. `compact` (under the store folder's lease) merges
the small parts the workers write into big ones, sorted by key, bucketed by the key's first
characters (`part-k<bucket>-n<rows>-<digest>.parquet`), in row groups of `ROW_GROUP_ROWS`, each
followed by its key index (`<part>.keyidx`, `pipeline.store.key_index`: sorted 64-bit key prefixes).
A check of which keys are stored (`missing`) or a read of given keys (`read(keys=...)`) takes
the compacted parts whose bucket can hold one of the keys, searches their indexes, and reads
only the row groups holding a candidate (ranged reads on object stores), confirming each by
its full key; parts not compacted yet, or without an index, are read whole and filtered. The
driver never holds a whole store. Compaction writes the merged part and its index before it
removes the small ones, so every key stays readable throughout (readers drop a key seen twice,
`_first_per_key`), and after it each key is stored once.

The store checks itself: a part that cannot be parsed (truncated, overwritten by hand, wrong
columns) or whose bytes differ from its content checksum is logged with its path and moved
aside to `<store>/_quarantine/` (never deleted), so its keys count as missing and are computed
again; writing a part whose name exists but whose file is bad replaces it.
`pipeline.store.admin` verifies and cleans whole stores.

Content checksums: a part's name ends in the blake2b digest of its whole file
(`part-<keys digest>-h<content digest>.parquet`), so a flipped byte anywhere (a value column,
a page header, the footer) is caught by every whole-part read, and the name and its checksum
appear together (one rename, one PUT): no side file can go missing or disagree. Ranged reads
of compacted parts fetch only some row groups, so they check the Parquet page checksums
(CRC-32 of every data and dictionary page, written into every part) of what they read; a flip
those cannot see (a few footer bytes) is found by the next whole read or `verify`. Parts
written without a content digest in their name stay readable, unchecked (`verify` counts them);
`compact` rewrites small ones into checksummed parts.
"""
from __future__ import annotations

import fnmatch
import hashlib
import logging
import posixpath
import re
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from operators.hashing import keys_digest
from operators.schema import added_later
from pipeline.store.fs import (
    exists,
    filesystem,
    is_local,
    read_json,
    table_to_parquet_bytes,
    write_bytes_atomic,
    write_json,
)
from pipeline.store.key_index import ROW_GROUP_ROWS, SUFFIX, BadIndex, KeyIndex, Window, key_prefixes
from pipeline.store.settings import retrying

log = logging.getLogger(__name__)

PART_GLOB = "part-*.parquet"
QUARANTINE = "_quarantine"  # bad parts moved aside: <store>/_quarantine/<part name>.<stamp>
MARKERS = "_markers"
READ_THREADS = 16
GROUPS_PER_READ = 128  # row groups of one part decoded together by a keyed read (~128k rows)
# Compacted parts: part-k<bucket>-n<rows>-<digest>[-h<content digest>].parquet ('k' is not a hex
# digit, so no worker-written part-<digest> name can look like one). Bucket: the key's first 0, 1 or 2
# characters (more as the store grows) when they are lowercase hex (content keys are), else "x"s.
COMPACTED = re.compile(r"^part-k(?P<bucket>[0-9a-fx]{0,2})-n(?P<rows>\d+)-[0-9a-f]+(?:-h[0-9a-f]{32})?\.parquet$")
# The content digest a part's name ends with: blake2b (16 bytes) of the whole file. 'h' is not
# a hex digit, so no keys digest of a name written without one can look like it.
CONTENT_DIGEST = re.compile(r"-h(?P<digest>[0-9a-f]{32})\.parquet$")
COMPACT_TARGET_ROWS = 1_048_576  # rows per compacted part at most
COMPACT_SMALL_ROWS = 65_536  # compacted parts below this are merged again
INDEX_CACHE_BYTES = 256 << 20  # parsed key indexes a process keeps (8 bytes a stored key: 32M keys)


class BadPart(Exception):
    """A stored part that cannot be used: truncated, not Parquet, or with the wrong columns."""

    def __init__(self, path: str, reason: str):
        super().__init__(f"{path}: {reason}")
        self.path, self.reason = path, reason


def content_digest(data: bytes) -> str:
    """The checksum a part's name carries: blake2b of the whole file (any flipped byte changes it)."""
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def check_content(path: str, data: bytes) -> bool:
    """Raise BadPart when `data` differs from the content digest in part `path`'s name; False
    for a part named without one (nothing to check it against), True when it matched."""
    named = CONTENT_DIGEST.search(posixpath.basename(path))
    if named is None:
        return False
    found = content_digest(data)
    if found != named["digest"]:
        raise BadPart(path, f"content checksum mismatch: the name says {named['digest']}, the {len(data)} bytes hash to {found} (corrupted on disk or in transit)")
    return True


def is_checksummed(path: str) -> bool:
    """Whether part `path` was named with a content digest (parts written without one are read unchecked)."""
    return CONTENT_DIGEST.search(posixpath.basename(path)) is not None


class PartStore:
    """Immutable, key-addressed Parquet parts under one folder."""

    def __init__(self, url: str, schema: pa.Schema):
        if "key" not in schema.names:
            raise ValueError("a PartStore schema needs a 'key' column")
        self.url = url.rstrip("/")
        self.schema = schema
        self.fs, self.path = filesystem(self.url)
        self.quarantined: list[dict] = []  # bad parts this object moved aside
        self.quarantined_indexes: list[dict] = []  # key indexes that disagreed with their part

    def __repr__(self) -> str:
        return f"PartStore({self.url!r})"

    # -- reading ---------------------------------------------------------------------------
    def part_paths(self) -> list[str]:
        """The complete parts stored now (temporary files of local writers never match)."""
        return self._listing()[0]

    def _listing(self) -> tuple[list[str], dict[str, tuple]]:
        """(the parts stored now, {part with a key index: that index file's version}), one listing."""
        self.fs.invalidate_cache(self.path)
        pattern = posixpath.join(self.path, "part-*")
        found = retrying(f"list {self.url}", lambda: self.fs.glob(pattern, detail=True))
        parts = sorted(p for p in found if fnmatch.fnmatchcase(posixpath.basename(p), PART_GLOB))
        listed = set(parts)
        indexes = {p[: -len(SUFFIX)]: _version(info) for p, info in found.items() if p.endswith(SUFFIX)}
        return parts, {p: v for p, v in indexes.items() if p in listed}

    def read(self, columns: list[str] | None = None, *, keys: pa.Array | Iterable[str] | None = None) -> pa.Table:
        """Stored rows (one per key: a key written twice by racing runs is kept once); with
        `keys`, only the rows of those keys, reading only what can hold them: the key index
        and the row groups with hits of an indexed compacted part, whole parts otherwise.

        Bad parts are quarantined and skipped (`self.quarantined` lists them), so their keys
        read as missing and the next anti-join computes them again.
        """
        wanted = list(columns) if columns else self.schema.names
        if "key" not in wanted:
            wanted = ["key", *wanted]
        if keys is None:
            with ThreadPoolExecutor(READ_THREADS) as pool:  # object stores: many GETs in flight
                tables = [t for t in pool.map(lambda path: self._read_or_quarantine(path, wanted), self.part_paths()) if t is not None]
        else:
            window = pc.unique(_as_array(keys).cast(pa.string()))
            parts, indexed = self._listing()
            tables = self._lookup(window, wanted, self._parts_for(window, parts), indexed)
        tables = [t for t in tables if t.num_rows]
        if not tables:
            return self.schema.empty_table().select(wanted)
        return _first_per_key(pa.concat_tables(tables))

    def _lookup(self, window: pa.Array, wanted: list[str], paths: list[str], indexed: dict[str, tuple]) -> list[pa.Table]:
        """The rows of `paths` whose key is in `window` (unique keys)."""
        searched = Window(window) if indexed else None
        done: list[pa.Table] = []

        def one(path):
            if path in indexed:
                found = self._read_indexed(path, indexed[path], searched, wanted)
                if found is not _UNINDEXED:
                    return found, True
            return self._read_or_quarantine(path, wanted), False

        with ThreadPoolExecutor(READ_THREADS) as pool:  # object stores: many GETs in flight
            def whole_parts():  # filtered below a group at a time; indexed reads are filtered already
                for table, filtered in pool.map(one, paths):
                    if table is not None:
                        if filtered:
                            done.append(table)
                        else:
                            yield table

            return _matching(whole_parts(), window) + done

    def _parts_for(self, keys: pa.Array, parts: list[str]) -> list[str]:
        """The parts that can hold any of `keys`: compacted parts of their buckets, and every
        part not compacted yet."""
        buckets = {width: set(pc.unique(key_buckets(keys, width)).to_pylist()) for width in (0, 1, 2)}
        chosen = []
        for path in parts:
            found = COMPACTED.match(posixpath.basename(path))
            if found is None or found["bucket"] in buckets[len(found["bucket"])]:
                chosen.append(path)
        return chosen

    def read_part(self, path: str, columns: list[str] | None = None) -> pa.Table:
        """One part, checked: raises BadPart (naming the file) if it cannot be used or its bytes
        differ from the content digest in its name.

        Transient storage errors are retried and then raised as they are: a part that could
        not be fetched is not a bad part. A part that vanished (quarantined or collected by
        another process) raises FileNotFoundError.
        """
        columns = list(columns or self.schema.names)
        data = retrying(f"read {path}", lambda: self.fs.cat_file(path))
        check_content(path, data)
        try:
            # ParquetFile, not read_table: one footer parse and no dataset machinery (a third of
            # the cost of a small part, and an all-cached night reads thousands of them)
            part = pq.ParquetFile(pa.BufferReader(data))
            present = set(part.schema_arrow.names)
            table = part.read(columns=[c for c in columns if c in present])
        except (pa.ArrowException, OSError, ValueError, KeyError, TypeError) as exc:
            raise BadPart(path, f"{type(exc).__name__}: {exc}"[:500]) from exc
        return self._conform(path, table, columns)

    def _conform(self, path: str, table: pa.Table, columns: list[str]) -> pa.Table:
        """`table` (a part's `columns` that it has) with the store's types; raises BadPart."""
        try:
            # A part written before a column was added to the schema (operators.schema.ADDED_LATER)
            # reads with that column null; any other missing column makes it a bad part.
            for name in (c for c in columns if c not in table.column_names):
                if not added_later(self.schema.field(name)):
                    raise BadPart(path, f"no {name!r} column")
                table = table.append_column(name, pa.nulls(table.num_rows, self.schema.field(name).type))
            table = table.select(columns).cast(pa.schema([self.schema.field(c) for c in columns]))
        except (pa.ArrowException, ValueError, KeyError, TypeError) as exc:
            raise BadPart(path, f"{type(exc).__name__}: {exc}"[:500]) from exc
        if table.column("key").null_count:
            raise BadPart(path, "null keys")
        return table

    # -- the key index of compacted parts (pipeline.store.key_index) -----------------------------
    def _index(self, path: str, version: tuple | None = None) -> KeyIndex:
        """The key index of a compacted part; raises BadIndex, FileNotFoundError. With the
        index file's `version` (size, mtime or ETag) from a listing, a copy this process
        parsed before is used (`_INDEXES`): a driver reading window after window against one
        store fetches each index once."""
        cached = _INDEXES.get(self._cache_key(path, version)) if version is not None else None
        if cached is not None:
            return cached
        name = posixpath.basename(path)
        data = retrying(f"read {path}{SUFFIX}", lambda: self.fs.cat_file(path + SUFFIX))
        index = KeyIndex.from_bytes(data, name)
        found = COMPACTED.match(name)
        if found is not None and int(found["rows"]) != index.num_rows:
            raise BadIndex(f"{index.num_rows} keys for a part of {found['rows']} rows")
        if version is not None:
            _INDEXES.put(self._cache_key(path, version), index)
        return index

    def _cache_key(self, path: str, version: tuple | None) -> tuple:
        return (self._full(path), version)

    def _read_indexed(self, path: str, version: tuple, window: Window, wanted: list[str]):
        """The rows of an indexed part whose key is in `window`, reading the index and only the
        row groups with candidates; None when there are none or the part is gone (its keys are
        missing); `_UNINDEXED` when the index cannot be used or the ranged read failed: the
        caller then reads the part whole, which retries storage errors and quarantines a bad part."""
        try:
            index = self._index(path, version)
        except FileNotFoundError:  # removed since the listing (compaction, quarantine)
            return _UNINDEXED
        except BadIndex as bad:
            self.quarantine_index(path, str(bad))
            return _UNINDEXED
        rows, candidates = index.candidates(window.prefixes)
        if not rows.size:
            return None
        try:
            table = self._read_rows(path, index, rows, candidates, wanted)
        except BadIndex as bad:
            _INDEXES.drop(self._cache_key(path, version))
            self.quarantine_index(path, str(bad))
            return _UNINDEXED
        except FileNotFoundError:
            log.warning("%s: part %s vanished while reading; its keys count as missing", self.url, path)
            return None
        except BadPart:  # or a storage error inside pyarrow: the whole-part read retries, and judges
            return _UNINDEXED
        return table.filter(pc.is_in(table.column("key"), value_set=window.keys_with(candidates)))  # full keys decide

    def _read_rows(self, path: str, index: KeyIndex, rows: np.ndarray, candidates: np.ndarray, wanted: list[str]) -> pa.Table:
        """Rows `rows` of a part, fetching only their row groups (ranged reads on object
        stores), `GROUPS_PER_READ` at a time so a part with hits everywhere is never decoded
        whole at once; raises BadIndex when the part's layout or keys disagree with its index."""
        size = index.row_group_rows
        groups = np.unique(rows // size)

        def fetch():
            with self._open(path) as f:
                try:
                    part = pq.ParquetFile(f, pre_buffer=True, page_checksum_verification=True)
                    meta = part.metadata
                    if not _layout_agrees(meta, index.num_rows, size):
                        raise BadIndex(f"index of {index.num_rows} rows in groups of {size}, part of {meta.num_rows} rows in {meta.num_row_groups} groups")
                    present = [c for c in wanted if c in set(part.schema_arrow.names)]
                    taken = []
                    for start in range(0, len(groups), GROUPS_PER_READ):
                        batch = groups[start:start + GROUPS_PER_READ]
                        mine = rows[(rows // size >= batch[0]) & (rows // size <= batch[-1])]
                        # no threads of its own: parts are read in parallel already (READ_THREADS)
                        table = part.read_row_groups(batch.tolist(), columns=present, use_threads=False)
                        positions = np.searchsorted(batch, mine // size) * size + mine % size
                        if positions.size and int(positions[-1]) >= table.num_rows:
                            raise BadIndex(f"row {int(mine[-1])} is past the part's end")
                        taken.append(table.take(pa.array(positions)))
                    return pa.concat_tables(taken)
                except (BadIndex, FileNotFoundError):
                    raise
                except (pa.ArrowException, OSError, ValueError, KeyError, TypeError) as exc:
                    raise BadPart(path, f"{type(exc).__name__}: {exc}"[:500]) from exc

        table = self._conform(path, retrying(f"read {path}", fetch), wanted)
        if not np.array_equal(key_prefixes(table.column("key")), candidates):
            raise BadIndex("the part's keys at the index's rows have other prefixes")
        return table

    def _open(self, path: str):
        """A seekable file for ranged reads: pyarrow's own for local files, else fsspec's
        without read-ahead, so each row group is one ranged GET, not a whole-file one."""
        if is_local(self.fs):
            return pa.OSFile(path, "rb")
        return self.fs.open(path, "rb", cache_type="none")

    def write_index(self, path: str, keys: pa.Array | None = None) -> KeyIndex | None:
        """Write the key index of a compacted part (from its key column when `keys` is not
        given); None, with nothing written, when its row groups are not of one size."""
        data = retrying(f"read {path}", lambda: self.fs.cat_file(path))
        check_content(path, data)
        try:
            meta = pq.read_metadata(pa.BufferReader(data))
            if keys is None:
                keys = pq.read_table(pa.BufferReader(data), columns=["key"]).column("key")
        except (pa.ArrowException, OSError, ValueError, KeyError, TypeError) as exc:
            raise BadPart(path, f"{type(exc).__name__}: {exc}"[:500]) from exc
        size = _row_group_rows(meta)
        if size is None or meta.num_rows != len(keys):
            log.warning("%s: part %s has row groups of several sizes; left without a key index", self.url, path)
            return None
        index = KeyIndex.build(posixpath.basename(path), keys, size)
        write_bytes_atomic(self._full(path + SUFFIX), index.to_bytes())
        return index

    def check_index(self, path: str) -> str | None:
        """Why the key index of part `path` disagrees with the part (None: it agrees).
        Raises FileNotFoundError when there is no index, BadPart when the part is bad."""
        try:
            stored = self._index(path)
        except BadIndex as bad:
            return str(bad)
        data = retrying(f"read {path}", lambda: self.fs.cat_file(path))
        check_content(path, data)
        try:
            meta = pq.read_metadata(pa.BufferReader(data))
            keys = pq.read_table(pa.BufferReader(data), columns=["key"]).column("key")
        except (pa.ArrowException, OSError, ValueError, KeyError, TypeError) as exc:
            raise BadPart(path, f"{type(exc).__name__}: {exc}"[:500]) from exc
        size = _row_group_rows(meta)
        if size != stored.row_group_rows:
            return f"index says row groups of {stored.row_group_rows} rows, the part has {size or 'mixed sizes'}"
        if not stored.same_as(KeyIndex.build(stored.part, keys, stored.row_group_rows)):
            return "index lists other keys or rows than the part holds"
        return None

    def quarantine_index(self, path: str, reason: str) -> None:
        """Move aside the key index of part `path` that cannot be used; the part is then read
        whole until the next compaction writes its index again."""
        name = posixpath.basename(path) + SUFFIX
        target = posixpath.join(self.path, QUARANTINE, f"{name}.{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:6]}")
        try:
            if is_local(self.fs):
                self.fs.makedirs(posixpath.dirname(target), exist_ok=True)
            retrying(f"quarantine {path}{SUFFIX}", lambda: self.fs.mv(path + SUFFIX, target))
        except FileNotFoundError:  # no index, or another reader moved it first
            return
        log.warning("%s: key index of %s unusable (%s); moved to %s, the part is read whole", self.url, self._full(path), reason, self._full(target))
        self.quarantined_indexes.append({"path": self._full(path + SUFFIX), "moved_to": self._full(target), "reason": reason})

    def _read_or_quarantine(self, path: str, columns: list[str]) -> pa.Table | None:
        try:
            return self.read_part(path, columns)
        except FileNotFoundError:
            log.warning("%s: part %s vanished while reading; its keys count as missing", self.url, path)
            return None
        except BadPart as bad:
            self.quarantine(path, bad.reason)
            return None

    def quarantine(self, path: str, reason: str) -> str | None:
        """Move a bad part aside (never delete it) so it is no longer read; returns where it went."""
        name = posixpath.basename(path)
        target = posixpath.join(self.path, QUARANTINE, f"{name}.{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:6]}")
        log.warning("%s: unreadable part %s (%s); moved to %s, its keys will be computed again", self.url, self._full(path), reason, self._full(target))
        try:
            if is_local(self.fs):
                self.fs.makedirs(posixpath.dirname(target), exist_ok=True)
            retrying(f"quarantine {path}", lambda: self.fs.mv(path, target))
        except FileNotFoundError:  # another reader moved it first
            return None
        self.quarantined.append({"path": self._full(path), "moved_to": self._full(target), "reason": reason})
        if COMPACTED.match(name):  # its index would only point into a part that is gone
            self.quarantine_index(path, "its part was quarantined")
        return self._full(target)

    def _full(self, path: str) -> str:
        """A filesystem path of this store as a URL the user can paste (s3://... on S3)."""
        return self.url + path[len(self.path):] if path.startswith(self.path) else path

    def keys(self) -> pa.Array:
        return self.read(["key"]).column("key").combine_chunks()

    def missing(self, keys: pa.Array | Iterable[str]) -> pa.Array:
        """Boolean mask: True where a key is not stored (the anti-join).

        The one place that decides what must be computed: success markers never replace it.
        Only the key columns of parts that can hold `keys` are read (`read(keys=...)`).
        Parts that cannot be read are quarantined on the way, so their keys are missing.
        """
        keys = _as_array(keys)
        stored = self.read(["key"], keys=keys).column("key").combine_chunks()
        return pc.invert(pc.is_in(keys, value_set=stored))

    # -- compaction ------------------------------------------------------------------------
    def compact(self, *, target_rows: int = COMPACT_TARGET_ROWS, small_rows: int = COMPACT_SMALL_ROWS) -> dict:
        """Merge small parts into compacted parts (sorted by key, one key bucket each, row
        groups of `ROW_GROUP_ROWS`), each followed by its key index.

        Call under the store folder's lease (`pipeline.store.admin.compact` takes it), so two
        compactions never race; workers may keep writing new parts meanwhile. Order of work:
        the merged parts (then their indexes) are written completely first, the small parts
        removed after, so a reader always finds every key, and a compaction killed midway
        leaves at worst keys stored twice (read once) or a part without its index (read whole),
        which the next compaction folds back to once and indexes: a key already in a kept
        compacted part is dropped from the merge (found through that part's index).
        """
        if target_rows < 1 or small_rows < 0:
            raise ValueError(f"compact: target_rows must be >= 1 and small_rows >= 0, got {target_rows}, {small_rows}")
        parts, indexed = self._listing()
        inputs, kept = [], {}
        for path in parts:
            found = COMPACTED.match(posixpath.basename(path))
            if found is not None and int(found["rows"]) >= small_rows:
                kept.setdefault(found["bucket"], []).append(path)
            else:
                inputs.append(path)
        summary = {"store": self.url, "parts_in": 0, "parts_out": 0, "rows": 0, "dropped_duplicates": 0,
                   "indexes_written": self._index_kept([p for paths in kept.values() for p in paths], indexed)}
        self._remove_orphan_indexes(set(parts))
        indexed = self._listing()[1]
        if len(inputs) < 2 and all(COMPACTED.match(posixpath.basename(p)) for p in inputs):
            return summary  # nothing to merge (a lone small part is still folded into the kept ones)
        with ThreadPoolExecutor(READ_THREADS) as pool:
            tables = [t for t in pool.map(lambda p: self._read_or_quarantine(p, self.schema.names), inputs)]
        read = [p for p, t in zip(inputs, tables) if t is not None]
        tables = [t for t in tables if t is not None]
        if not tables:
            return summary
        merged = pa.concat_tables(tables)
        rows_in = merged.num_rows
        merged = _first_per_key(merged)
        # bucket width: the widest that leaves each bucket's part at least `small_rows` rows on average
        width = max([w for w in (0, 1, 2) if merged.num_rows >= 2 * max(small_rows, 1) * 16**w] or [0])
        buckets = key_buckets(merged.column("key"), width)
        written = set()
        for bucket in sorted(pc.unique(buckets).to_pylist()):
            rows = merged.filter(pc.equal(buckets, bucket))
            overlapping = [p for b, paths in kept.items() if b.startswith(bucket) or bucket.startswith(b) for p in paths]
            if overlapping:  # keys a kept compacted part already holds stay only there
                window = pc.unique(rows.column("key"))
                held = [t.column("key") for t in self._lookup(window, ["key"], overlapping, {p: indexed[p] for p in overlapping if p in indexed})]
                if held:
                    held = pa.chunked_array([c for k in held for c in k.chunks], pa.string()).combine_chunks()
                    rows = rows.filter(pc.invert(pc.is_in(rows.column("key"), value_set=held)))
            rows = rows.sort_by("key")
            for start in range(0, rows.num_rows, target_rows):
                chunk = rows.slice(start, target_rows).combine_chunks()
                group = min(ROW_GROUP_ROWS, chunk.num_rows)
                data = table_to_parquet_bytes(chunk, row_group_rows=group)
                name = f"part-k{bucket}-n{chunk.num_rows}-{keys_digest(chunk.column('key'))}-h{content_digest(data)}.parquet"
                url = f"{self.url}/{name}"
                if not exists(url) or not self._readable(url):
                    write_bytes_atomic(url, data)
                    write_bytes_atomic(url + SUFFIX, KeyIndex.build(name, chunk.column("key"), group).to_bytes())
                elif posixpath.join(self.path, name) not in indexed:
                    self.write_index(posixpath.join(self.path, name))
                written.add(posixpath.join(self.path, name))
                summary["parts_out"] += 1
                summary["rows"] += chunk.num_rows
        for path in read:  # only now: every key of these parts is in a written or kept part
            if path not in written:
                for doomed in (path, path + SUFFIX) if path in indexed else (path,):
                    try:
                        retrying(f"remove {doomed}", lambda p=doomed: self.fs.rm(p))
                    except FileNotFoundError:
                        pass
        summary["parts_in"] = len(read)
        summary["dropped_duplicates"] = rows_in - summary["rows"]
        log.info("%s: compacted %d parts into %d (%d rows, %d duplicate rows dropped)", self.url, len(read), summary["parts_out"], summary["rows"], summary["dropped_duplicates"])
        return summary

    def _index_kept(self, kept: list[str], indexed: dict[str, tuple]) -> int:
        """Write the missing key indexes of kept compacted parts (older code, or a compaction
        killed between a part and its index); returns how many were written."""
        written = 0
        for path in kept:
            if path not in indexed:
                try:
                    written += self.write_index(path) is not None
                except FileNotFoundError:
                    pass
                except BadPart as bad:
                    self.quarantine(path, bad.reason)
        return written

    def _remove_orphan_indexes(self, parts: set[str]) -> None:
        """Indexes whose part is gone (a compaction killed between removing a part and its
        index): never read, removed here under the lease."""
        self.fs.invalidate_cache(self.path)
        for path in retrying(f"list {self.url}", lambda: self.fs.glob(posixpath.join(self.path, "part-*" + SUFFIX))):
            if path[: -len(SUFFIX)] not in parts:
                try:
                    retrying(f"remove {path}", lambda p=path: self.fs.rm(p))
                except FileNotFoundError:
                    pass

    # -- writing ---------------------------------------------------------------------------
    def part_url(self, keys, data: bytes | None = None) -> str:
        """The part's name: a digest of its keys (any iterable of str, or an Arrow array), then
        the content digest of its file bytes `data` (None: a name without one, read unchecked)."""
        checksum = f"-h{content_digest(data)}" if data is not None else ""
        return f"{self.url}/part-{keys_digest(keys)}{checksum}.parquet"

    def write(self, table: pa.Table) -> str | None:
        """Store `table` as one part; returns its URL (None for an empty table).

        The name is the digest of its keys and of its file's bytes, so writing the same rows
        again is a no-op when the stored part is good; a part under that name that cannot be
        read or fails its checksum is replaced. The same keys with other bytes (an engine
        whose numbers vary from run to run) land beside it, and readers keep one row per key.
        """
        if table.num_rows == 0:
            return None
        for field in self.schema:  # a column added to the schema later may be missing: stored null
            if field.name not in table.column_names and added_later(field):
                table = table.append_column(field.name, pa.nulls(table.num_rows, field.type))
        # sorted by key: the same rows in any order are the same bytes, hence the same name
        table = table.select(self.schema.names).cast(self.schema).sort_by("key")
        data = table_to_parquet_bytes(table)
        url = self.part_url(table.column("key"), data)
        if not exists(url) or not self._readable(url):
            write_bytes_atomic(url, data)
        return url

    def _readable(self, url: str) -> bool:
        _, path = filesystem(url)
        try:
            self.read_part(path, ["key"])
            return True
        except FileNotFoundError:
            return False
        except BadPart as bad:
            log.warning("%s: replacing unreadable part %s (%s)", self.url, url, bad.reason)
            return False


def _matching(tables: Iterable[pa.Table], window: pa.Array) -> list[pa.Table]:
    """The rows of `tables` whose key is in `window`, filtered a group of parts at a time:
    one hash set of the window per group (not per part), and at most a group in memory."""
    group_rows = max(len(window), 1 << 18)
    out, group, rows = [], [], 0

    def flush():
        if group:
            table = pa.concat_tables(group)
            out.append(table.filter(pc.is_in(table.column("key"), value_set=window)))
            group.clear()

    for table in tables:
        group.append(table)
        rows += table.num_rows
        if rows >= group_rows:
            flush()
            rows = 0
    flush()
    return out


_UNINDEXED = object()  # _read_indexed: the index cannot be used, read the part whole


def _version(info: dict) -> tuple:
    """What tells one version of a file from another in a listing: size and mtime or ETag."""
    return (info.get("size"), info.get("mtime") or info.get("ETag") or info.get("LastModified") or info.get("created"))


class _IndexCache:
    """Parsed key indexes by (file, version), least recently used dropped beyond `max_bytes`."""

    def __init__(self, max_bytes: int):
        self.max_bytes, self.nbytes = max_bytes, 0
        self._items: OrderedDict[tuple, KeyIndex] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: tuple) -> KeyIndex | None:
        with self._lock:
            index = self._items.get(key)
            if index is not None:
                self._items.move_to_end(key)
            return index

    def put(self, key: tuple, index: KeyIndex) -> None:
        with self._lock:
            if key in self._items or index.nbytes > self.max_bytes:
                return
            self._items[key] = index
            self.nbytes += index.nbytes
            while self.nbytes > self.max_bytes:
                self.nbytes -= self._items.popitem(last=False)[1].nbytes

    def drop(self, key: tuple) -> None:
        with self._lock:
            index = self._items.pop(key, None)
            self.nbytes -= index.nbytes if index is not None else 0


_INDEXES = _IndexCache(INDEX_CACHE_BYTES)


def _row_group_rows(meta: pq.FileMetaData) -> int | None:
    """The row-group size of a part whose groups (but the last) are all one size, else None."""
    sizes = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
    if not sizes:
        return None
    if len(sizes) == 1 or (len(set(sizes[:-1])) == 1 and sizes[-1] <= sizes[0]):
        return max(sizes[0], 1)
    return None


def _layout_agrees(meta: pq.FileMetaData, rows: int, size: int) -> bool:
    """Whether a part has `rows` rows in groups of `size` (the last may be shorter), checked on
    the first and last group only: a shifted row anywhere else shows in the prefix check."""
    groups = meta.num_row_groups
    if meta.num_rows != rows or groups != -(-rows // size):
        return False
    return rows == 0 or (meta.row_group(0).num_rows == min(size, rows) and meta.row_group(groups - 1).num_rows == rows - (groups - 1) * size)


def _as_array(keys) -> pa.Array:
    if isinstance(keys, pa.ChunkedArray):
        return keys.combine_chunks()
    return keys if isinstance(keys, pa.Array) else pa.array(list(keys), type=pa.string())


def key_buckets(keys: pa.Array, width: int = 2) -> pa.Array:
    """Each key's bucket in compacted parts: its first `width` characters when lowercase hex,
    else `width` x's (a key shorter than that, too)."""
    keys = keys.cast(pa.string())
    if width == 0:
        return pa.repeat(pa.scalar(""), len(keys))
    prefix = pc.utf8_slice_codeunits(keys, 0, width)
    hexlike = pc.match_substring_regex(prefix, f"^[0-9a-f]{{{width}}}$")
    return pc.if_else(hexlike, prefix, pa.scalar("x" * width))


def _first_per_key(table: pa.Table) -> pa.Table:
    """Drop repeated keys, keeping each key's first row in read order."""
    if table.num_rows == 0:
        return table
    import polars as pl

    if pl.from_arrow(table.select(["key"]))["key"].n_unique() == table.num_rows:  # the usual case, ~5x quicker to rule out
        return table
    indices = pa.array(np.arange(table.num_rows, dtype=np.int64))
    firsts = pa.table({"key": table.column("key"), "i": indices}).group_by("key", use_threads=False).aggregate([("i", "min")])
    return table.take(np.sort(firsts.column("i_min").to_numpy())).combine_chunks()


class Markers:
    """Success markers: a unit of work (e.g. one backbone's answers for one request set) finished.

    A marker is a note, never the truth: the stages still check every needed key against the
    store (`PartStore.missing`), and a marker whose keys are not all there is removed.
    Deleting markers is always safe.
    """

    def __init__(self, url: str):
        self.url = url.rstrip("/")

    def _url(self, name: str) -> str:
        return f"{self.url}/{name}.json"

    def done(self, name: str) -> bool:
        return exists(self._url(name))

    def mark(self, name: str, info: dict) -> None:
        write_json(self._url(name), info)

    def clear(self, name: str) -> None:
        """Remove a marker that turned out to be wrong (a missing marker only costs a check)."""
        fs, path = filesystem(self._url(name))
        try:
            retrying(f"remove {self._url(name)}", lambda: fs.rm(path))
        except FileNotFoundError:
            pass

    def info(self, name: str) -> dict:
        return read_json(self._url(name))
