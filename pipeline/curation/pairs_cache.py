"""The pairs of every shard read before, kept in the store, so that a shard is read once.

Reading a shard (parsing it, decoding and hashing its embedded images, writing its image pack)
is most of the ingest cost, and its result, the shard's PAIRS rows, depends only on the file
and on how it is read. A second night over the same files (another output name, another rule)
takes them from here. The key is the shard as discovery saw it, (uri, size, version), the
version being the same ETag, mtime or content hash that tells the manifest a shard changed,
plus every reading option. An entry is used only if the packs its rows point into still exist
and hold every range they name; anything unreadable is a miss, never an error: the shard is read
again (and a damaged pack written again, see pipeline.store.image_packs).

Each entry records, in its Parquet footer, the shard it was read from and the packs its rows
point into, so `pipeline.curation.prune` can tell entries of shards that are gone or changed (never
used again) and packs that only they pointed into, without reading their rows.
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.parquet as pq

from operators.hashing import digest
from operators.images import split_byte_range
from pipeline.curation.shards import PAIRS, Shard
from pipeline.store.fs import filesystem, join_url, read_table, write_table
from pipeline.store.settings import retrying

log = logging.getLogger(__name__)

FOLDER = "shard_pairs"  # the pairs cache's folder under the store
FORMAT = 1  # bump when PAIRS rows of the same shard would come out differently
SHARD_META = b"depict.shard"  # footer key: the shard an entry was read from (uri, size, version, format)
PACKS_META = b"depict.packs"  # footer key: the packs its rows point into


@dataclass(frozen=True)
class PairsCache:
    url: str  # <store>/shard_pairs
    options: dict  # the read_pairs_task keyword arguments: columns, images folder, reserved names

    def key(self, shard: Shard) -> str:
        what = {"format": FORMAT, "uri": shard.uri, "size": shard.size, "version": shard.version, "shard_format": shard.format, **self.options}
        return digest(json.dumps(what, sort_keys=True, default=list).encode())

    def _url(self, shard: Shard) -> str:
        key = self.key(shard)
        return join_url(self.url, key[:2], f"{key}.parquet")

    def get(self, shard: Shard) -> pa.Table | None:
        """The shard's PAIRS rows as first read, or None (never read, or not usable now)."""
        url = self._url(shard)
        try:
            table = read_table(url)
        except FileNotFoundError:
            return None
        except Exception as exc:  # noqa: BLE001 - a damaged entry is a miss: the shard is read again
            log.warning("pairs cache: %s unreadable (%s: %s); reading %s again", url, type(exc).__name__, exc, shard.uri)
            return None
        if not table.schema.equals(PAIRS):
            log.warning("pairs cache: %s has columns %s, not PAIRS; reading %s again", url, table.schema.names, shard.uri)
            return None
        for pack, end in sorted(pack_ends(table.column("image_uri")).items()):
            size = _size(pack)
            if size is None or size < end:
                what = "is gone" if size is None else f"holds {size} bytes, its images reach byte {end}"
                log.warning("pairs cache: image pack %s %s; reading %s again", pack, what, shard.uri)
                return None
        if SHARD_META not in (table.schema.metadata or {}):  # written before entries recorded their shard
            try:
                self.put(shard, table)  # recorded now, so `store gc gone_shards=true` can judge it
            except Exception as exc:  # noqa: BLE001 - only gc needs the record: the rows are good
                log.warning("pairs cache: could not record %s's shard in %s (%s: %s)", shard.uri, url, type(exc).__name__, exc)
        return table

    def put(self, shard: Shard, table: pa.Table) -> None:
        """Keep a shard's rows, unless the shard could not be read at all (retried next run)."""
        if "unreadable_shard" in table.column("reason").to_pylist():
            return
        table = table.cast(PAIRS)
        recorded = {
            SHARD_META: json.dumps({"uri": shard.uri, "size": shard.size, "version": shard.version, "format": shard.format}),
            PACKS_META: json.dumps(sorted(packs_of(table.column("image_uri")))),
        }
        write_table(self._url(shard), table.replace_schema_metadata(recorded))

    def row_count(self, shard: Shard) -> int | None:
        """The shard's input rows, from the entry's footer (window planning), or None."""
        fs, path = filesystem(self._url(shard))
        try:
            with fs.open(path, "rb") as f:
                return pq.ParquetFile(f).metadata.num_rows
        except Exception:  # noqa: BLE001 - no usable entry: the caller counts the shard itself
            return None


def pack_ends(image_uris) -> dict[str, int]:
    """For each pack that image URIs (an Arrow column) point into, the end of the furthest
    range they read."""
    ends: dict[str, int] = {}
    for uri in image_uris.drop_null().unique().to_pylist():
        pack, offset, length = split_byte_range(uri)
        if offset is not None:
            ends[pack] = max(ends.get(pack, 0), offset + length)
    return ends


def packs_of(image_uris) -> set[str]:
    """The pack URLs that image URIs (an Arrow column) point into."""
    return set(pack_ends(image_uris))


def recorded(fs, path: str) -> tuple[Shard | None, set[str]]:
    """(the shard an entry was read from, the pack URLs its rows point into). The shard is None
    for an entry written before entries recorded it; its packs are then read from its rows.
    Raises what reading the file raises (a damaged entry)."""
    with fs.open(path, "rb") as f:
        entry = pq.ParquetFile(f)
        meta = entry.schema_arrow.metadata or {}
        if SHARD_META in meta and PACKS_META in meta:
            return Shard(**json.loads(meta[SHARD_META])), set(json.loads(meta[PACKS_META]))
        return None, packs_of(entry.read(columns=["image_uri"]).column("image_uri"))


def _size(url: str) -> int | None:
    """The file's size now, or None if there is none."""
    fs, path = filesystem(url)
    fs.invalidate_cache(path)
    try:
        return int(retrying(f"check {url}", lambda: fs.size(path)))
    except FileNotFoundError:
        return None
