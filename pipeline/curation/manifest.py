"""The output folder's record of processed shards (manifest.json), and where each shard's
tables live in it (filtered/, decisions/, evidence/, errors/)."""
from __future__ import annotations

from pipeline.curation.shards import Shard
from pipeline.store.fs import exists, join_url, read_json, write_json

MANIFEST_VERSION = 1



class Manifest:
    """Processed shards by URI. Written once at the end of a run, atomically: a run killed
    before that leaves the previous manifest, and the next run redoes the shards (from cache)."""

    def __init__(self, url: str, shards: dict[str, dict] | None = None):
        self.url = url
        self.shards = shards or {}

    @classmethod
    def load(cls, output: str) -> Manifest:
        url = f"{output}/manifest.json"
        if not exists(url):
            return cls(url)
        data = read_json(url)
        if data.get("version") != MANIFEST_VERSION:
            raise ValueError(f"{url}: manifest version {data.get('version')!r}, expected {MANIFEST_VERSION}")
        return cls(url, data["shards"])

    def is_current(self, shard: Shard, fingerprint: str) -> bool:
        entry = self.shards.get(shard.uri)
        return bool(entry) and (entry["size"], entry["version"], entry["fingerprint"]) == (shard.size, shard.version, fingerprint)

    def failed_rows(self, shard: Shard) -> int:
        """Rows of `shard` that failed when it was last processed (0 if never processed)."""
        return int(self.shards.get(shard.uri, {}).get("failed") or 0)

    def shard(self, uri: str) -> Shard:
        e = self.shards[uri]
        return Shard(uri=uri, size=e["size"], version=e["version"], format=e["format"])

    def record(self, shard: Shard, **info) -> None:
        self.shards[shard.uri] = {"shard_id": shard.shard_id, "size": shard.size, "version": shard.version, "format": shard.format, **info}

    def save(self) -> None:
        write_json(self.url, {"version": MANIFEST_VERSION, "shards": self.shards})



def shard_url(output: str, kind: str, shard_id: str) -> str:
    return join_url(output, kind, f"{shard_id}.parquet")

