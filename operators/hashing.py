"""Content addressing: every stored row is keyed by a hash of what determines it.

blake2b-128 from the standard library: fast, stable across Python and library versions
(unlike polars' or pandas' hash functions), and long enough that collisions are not a
practical concern at corpus scale.
"""
from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Sequence

_SEP = b"\x1f"
_OWN_IMAGE_HASH = re.compile("[0-9a-f]{32}")
_NONE = b"\x00"


def digest(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def digest_chunks(chunks: Iterable[bytes]) -> str:
    """`digest` of the chunks' concatenation, never holding it whole (a pack can be gigabytes)."""
    h = hashlib.blake2b(digest_size=16)
    for chunk in chunks:
        h.update(chunk)
    return h.hexdigest()


def image_hash(data: bytes) -> str:
    """Hash of an image file's bytes (what `items.image_hash` holds)."""
    return digest(data)


def is_own_image_hash(value: str | None) -> bool:
    """Whether `value` is an `image_hash` this project computed (32 lowercase hex digits), so
    bytes can be checked against it; a hash taken from a shard's own column
    (`<column>:<value>`, any algorithm) cannot be."""
    return value is not None and _OWN_IMAGE_HASH.fullmatch(value) is not None


def content_key(*parts: str | int | float | None) -> str:
    """Key of one unit of work from everything that determines its result.

    `None` and `""` hash differently, and the separator cannot be confused with text,
    so ("ab", "c") and ("a", "bc") never collide.
    """
    h = hashlib.blake2b(digest_size=16)
    for part in parts:
        h.update(_NONE if part is None else str(part).encode("utf-8"))
        h.update(_SEP)
    return h.hexdigest()


def content_keys(columns: Sequence, prefix: Sequence[str | int | float | None] = ()) -> list[str]:
    """`content_key(*prefix, *row)` for every row of parallel text columns, byte for byte.

    Columns are polars Series, Arrow arrays or sequences of `str | None`. The fixed prefix is
    hashed once and each row's bytes are joined by Arrow (a null becomes the NONE byte, as
    in `content_key`), so the only per-row Python is the blake2b call itself: ~8x faster than
    calling `content_key` per row on a night's 10^5-10^6 requests.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    base = hashlib.blake2b(digest_size=16)
    for part in prefix:
        base.update(_NONE if part is None else str(part).encode("utf-8"))
        base.update(_SEP)
    arrays = [_as_text_array(c) for c in columns]
    n = len(arrays[0]) if arrays else 0
    if any(len(a) != n for a in arrays):
        raise ValueError(f"content_keys: columns of different lengths {[len(a) for a in arrays]}")
    if not arrays:
        return []
    none, sep = _NONE.decode(), _SEP.decode()
    pieces = []
    for array in arrays:
        pieces += [pc.fill_null(array, none), pa.scalar(sep, pa.large_string())]
    joined = pc.binary_join_element_wise(*pieces, pa.scalar("", pa.large_string())).cast(pa.large_binary())
    copy = base.copy
    out = []
    for data in joined.to_pylist():
        h = copy()
        h.update(data)
        out.append(h.hexdigest())
    return out


def _as_text_array(column):
    """A column of `str | None` as one large_string Arrow array (other types raise: their
    `str()` form is not what Arrow would write, so keys could drift from `content_key`)."""
    import pyarrow as pa

    if hasattr(column, "to_arrow") and not isinstance(column, (pa.Array, pa.ChunkedArray)):  # polars
        column = column.to_arrow()
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if not isinstance(column, pa.Array):
        column = pa.array(list(column), type=pa.large_string())
    if pa.types.is_null(column.type):
        return pa.nulls(len(column), pa.large_string())
    if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type) or pa.types.is_string_view(column.type)):
        raise TypeError(f"content_keys: expected text columns, got {column.type}")
    return column.cast(pa.large_string())


def keys_digest(keys) -> str:
    """Name of a part holding `keys`: the same set of keys always gives the same name.

    `keys` is any iterable of str, or an Arrow string array: keys of one length (hex
    digests, the common case) are then sorted by numpy as fixed-width bytes, not as a
    stage's 700k Python strings. They are ASCII, so byte order is Python's code-point
    order and both paths give the same name.
    """
    joined = _sorted_fixed_width(keys)
    if joined is not None:
        return hashlib.blake2b(joined, digest_size=12).hexdigest()
    if not isinstance(keys, (list, tuple)) and hasattr(keys, "to_pylist"):
        keys = keys.to_pylist()
    # one update of the joined keys: the same digest as one update per key (the hash streams)
    return hashlib.blake2b("".join(sorted(keys)).encode("ascii"), digest_size=12).hexdigest()


def _sorted_fixed_width(keys) -> bytes | None:
    """An Arrow array of ASCII keys of one length, sorted and concatenated; None for anything
    else. (numpy compares bytes strings without their trailing NULs; NUL being the smallest
    byte, that is still byte order between strings of one width.)"""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    if not isinstance(keys, (pa.Array, pa.ChunkedArray)) or len(keys) == 0 or keys.null_count:
        return None
    if isinstance(keys, pa.ChunkedArray):
        keys = keys.combine_chunks()
    if not (pa.types.is_string(keys.type) or pa.types.is_large_string(keys.type)):
        return None
    keys = keys.cast(pa.large_string())
    _, offsets, data = keys.buffers()
    bounds = np.frombuffer(offsets, dtype=np.int64)[keys.offset : keys.offset + len(keys) + 1]
    width = int(bounds[1] - bounds[0])
    if width == 0 or np.any(np.diff(bounds) != width):
        return None
    if not pc.all(pc.string_is_ascii(keys)).as_py():
        return None
    fixed = np.frombuffer(data, dtype=f"S{width}", count=len(keys), offset=int(bounds[0]))
    return np.sort(fixed).tobytes()
