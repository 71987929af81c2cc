"""Content addressing: every stored row is keyed by a hash of what determines it.

blake2b-128 from the standard library: fast, stable across Python and library versions
(unlike polars' or pandas' hash functions), and long enough that collisions are not a
practical concern at corpus scale.
"""
from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence

_SEP = b"\x1f"
_NONE = b"\x00"


def digest(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def image_hash(data: bytes) -> str:
    """Hash of an image file's bytes (what `items.image_hash` holds)."""
    return digest(data)


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


def content_keys(columns: Sequence[Iterable[str | None]], prefix: Sequence[str] = ()) -> list[str]:
    """Vectorised `content_key`: one key per row of parallel columns, after fixed prefix parts."""
    return [content_key(*prefix, *row) for row in zip(*columns, strict=True)]


def keys_digest(keys: Iterable[str]) -> str:
    """Name of a part holding `keys`: the same set of keys always gives the same name."""
    h = hashlib.blake2b(digest_size=12)
    for key in sorted(keys):
        h.update(key.encode("ascii"))
    return h.hexdigest()
