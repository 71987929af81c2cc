"""Image ingest: content hashes for items, and a clear error for every unreadable image."""
from __future__ import annotations

import pyarrow as pa

from operators.hashing import image_hash
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
