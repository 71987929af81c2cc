"""Image ingest: content hashes for items, and a clear error for every unreadable image."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import fsspec
import pyarrow as pa

from operators.hashing import content_keys, image_hash
from operators.images import decode_image, read_image_bytes

HASHED = pa.schema([("image_uri", pa.string()), ("image_hash", pa.string()), ("error", pa.string())])


def hash_images(batch: pa.Table) -> pa.Table:
    """For each distinct `image_uri` of the batch: its content hash, or why it cannot be read.

    The image is decoded as well as read, so a truncated or corrupt file is caught here,
    once, rather than in every request that would use it.
    """
    out = []
    for uri in dict.fromkeys(batch.column("image_uri").to_pylist()):
        try:
            data = read_image_bytes(uri)
            decode_image(data, uri)
            out.append({"image_uri": uri, "image_hash": image_hash(data), "error": None})
        except Exception as exc:
            out.append({"image_uri": uri, "image_hash": None, "error": f"{type(exc).__name__}: {exc}"})
    return pa.Table.from_pylist(out, schema=HASHED)


STAT_THREADS = 16  # object stores: many HEADs in flight
CACHE_KEY_VERSION = "image-hash-cache/v1"


def file_version(uri: str) -> str | None:
    """What tells two versions of a file apart without reading it: size plus the object
    store's ETag or the modification time; None when the file cannot be stat'ed (it is then
    read and hashed, and a missing file becomes its error there)."""
    try:
        fs, path = fsspec.core.url_to_fs(uri)
        info = fs.info(path)
    except Exception:  # noqa: BLE001 - unknown version: not cacheable, not an error here
        return None
    stamp = info.get("ETag") or info.get("etag")
    if not stamp:
        stamp = next((info[k] for k in ("mtime", "LastModified", "updated", "last_modified") if info.get(k) is not None), None)
    if stamp is None or info.get("size") is None:
        return None
    return f"{int(info['size'])}:{stamp.isoformat() if hasattr(stamp, 'isoformat') else stamp!r}"


def hash_cache_keys(uris: list[str]) -> list[str | None]:
    """Key of each uri's (uri, size, ETag or mtime) in the image-hash cache; None if unknown."""
    with ThreadPoolExecutor(STAT_THREADS) as pool:
        versions = list(pool.map(file_version, uris))
    keys = content_keys([uris, versions], prefix=(CACHE_KEY_VERSION,))
    return [k if v is not None else None for k, v in zip(keys, versions, strict=True)]
