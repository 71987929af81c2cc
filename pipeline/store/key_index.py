"""A compacted part's key index: its keys' 64-bit prefixes, sorted, in a sidecar file.

Why: a night's window of content keys is spread uniformly over the key space, so bucketing
parts by key prefix cannot keep the missing-key check from reading every stored key. The
index answers "which rows of this part may hold one of these keys" with a binary search
(`numpy.searchsorted`) over 8 bytes per stored key, and maps each candidate to its row, hence
to the fixed-size row group that holds it; only those row groups are read. A prefix match is
only a candidate: the reader confirms every hit against the full key in the row it read, so a
collision, or an index that is wrong, can never make a key look stored.

Prefix of a key: its first 16 characters read as a hex number when they are lowercase hex
(content keys are 32 hex characters; then prefix order is key order), else the first 8 bytes
of its blake2b digest. The rows of a part whose prefixes are not in key order (non-hex keys)
are stored explicitly (4 more bytes per key).

File (`<part name>.keyidx`, beside the part; written by `PartStore.compact` after its part):
MAGIC, a little-endian uint32 header length, a JSON header {part, rows, row_group_rows,
explicit_rows, crc32}, then the prefixes (uint64 LE) and, with explicit_rows, the rows
(uint32 LE). Anything that does not match raises `BadIndex`.
"""
from __future__ import annotations

import hashlib
import json
import struct
import zlib
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

MAGIC = b"DEPICT-KEYIDX-1\n"
SUFFIX = ".keyidx"
# Rows per row group of a compacted part: the unit a keyed read fetches. Small, so that a
# window whose few stored keys are spread over the store (a mostly new night) reads little
# beyond the index; 1,024 rows of answers are ~50 KB, and ~1,000 groups per 10^6-row part.
ROW_GROUP_ROWS = 1024
_HEX = np.full(256, 255, dtype=np.uint8)
_HEX[np.frombuffer(b"0123456789", np.uint8)] = np.arange(10, dtype=np.uint8)
_HEX[np.frombuffer(b"abcdef", np.uint8)] = np.arange(10, 16, dtype=np.uint8)


class BadIndex(Exception):
    """An index file that cannot be used: unreadable, truncated, or not its part's."""


def key_prefixes(keys) -> np.ndarray:
    """The 64-bit prefix of each key (uint64), vectorised for hex keys."""
    keys = keys.combine_chunks() if isinstance(keys, pa.ChunkedArray) else keys
    keys = keys if isinstance(keys, pa.Array) else pa.array(list(keys), pa.string())
    keys = keys.cast(pa.string())
    n = len(keys)
    out = np.zeros(n, dtype=np.uint64)
    if n == 0:
        return out
    if keys.null_count:
        raise ValueError("key_prefixes: null keys")
    offsets = np.frombuffer(keys.buffers()[1], np.int32, count=n + 1, offset=keys.offset * 4).astype(np.int64)
    data = np.frombuffer(keys.buffers()[2], np.uint8) if keys.buffers()[2] is not None else np.zeros(0, np.uint8)
    long_enough = (offsets[1:] - offsets[:-1]) >= 16
    lengths = offsets[1:] - offsets[:-1]
    if long_enough.all() and (lengths == lengths[0]).all():
        # all keys one length (content keys): the first 16 characters are a strided view,
        # decoded by bytes.fromhex once checked to be lowercase hex
        head = np.ascontiguousarray(data[offsets[0]:offsets[0] + n * int(lengths[0])].reshape(n, -1)[:, :16])
        valid = (_HEX[head] != 255).all(axis=1)
        if valid.all():
            return np.frombuffer(bytes.fromhex(head.tobytes().decode("ascii")), ">u8").astype(np.uint64)
    starts = offsets[:-1][long_enough]
    acc = np.zeros(len(starts), dtype=np.uint64)
    valid = np.ones(len(starts), dtype=bool)
    for j in range(16):  # one hex digit at a time: no (n, 16) temporaries
        nibble = _HEX[data[starts + j]] if starts.size else np.zeros(0, np.uint8)
        valid &= nibble != 255
        acc = (acc << np.uint64(4)) | nibble.astype(np.uint64)
    hexlike = np.zeros(n, dtype=bool)
    hexlike[long_enough] = valid
    out[long_enough] = acc
    other = np.flatnonzero(~hexlike)
    if other.size:
        texts = keys.take(pa.array(other)).to_pylist()
        out[other] = np.array([int.from_bytes(hashlib.blake2b(t.encode("utf-8"), digest_size=8).digest(), "big") for t in texts], dtype=np.uint64)
    return out


@dataclass(frozen=True)
class KeyIndex:
    """The sorted prefixes of one part's keys and where each key's row is."""

    part: str  # the part's file name
    prefixes: np.ndarray  # uint64, sorted
    rows: np.ndarray | None  # uint32 row of each prefix in the part; None: prefix i is row i
    row_group_rows: int

    @property
    def num_rows(self) -> int:
        return len(self.prefixes)

    @property
    def nbytes(self) -> int:
        return self.prefixes.nbytes + (self.rows.nbytes if self.rows is not None else 0)

    @classmethod
    def build(cls, part: str, keys, row_group_rows: int = ROW_GROUP_ROWS) -> KeyIndex:
        """The index of a part whose key column (in row order) is `keys`."""
        prefixes = key_prefixes(keys)
        if prefixes.size and bool(np.all(prefixes[1:] >= prefixes[:-1])):
            return cls(part, prefixes, None, row_group_rows)
        order = np.argsort(prefixes, kind="stable")
        return cls(part, prefixes[order], order.astype(np.uint32), row_group_rows)

    def candidates(self, window: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(rows, prefixes) of this part whose prefix is one of `window`'s (uint64, sorted and
        unique: `Window.prefixes`), rows ascending. Candidates only: the caller confirms keys."""
        positions = _runs(self.prefixes, window)
        if not positions.size:
            return np.zeros(0, np.int64), np.zeros(0, np.uint64)
        rows = positions if self.rows is None else self.rows[positions].astype(np.int64)
        prefixes = self.prefixes[positions]
        order = np.argsort(rows, kind="stable")
        return rows[order], prefixes[order]

    def to_bytes(self) -> bytes:
        payload = self.prefixes.astype("<u8").tobytes() + (self.rows.astype("<u4").tobytes() if self.rows is not None else b"")
        header = json.dumps({"part": self.part, "rows": self.num_rows, "row_group_rows": self.row_group_rows,
                             "explicit_rows": self.rows is not None, "crc32": zlib.crc32(payload)}, sort_keys=True).encode()
        return MAGIC + struct.pack("<I", len(header)) + header + payload

    @classmethod
    def from_bytes(cls, data: bytes, part: str) -> KeyIndex:
        """Parse an index file; raises BadIndex unless it is whole and belongs to `part`."""
        if not data.startswith(MAGIC) or len(data) < len(MAGIC) + 4:
            raise BadIndex("not a key index file")
        (size,) = struct.unpack_from("<I", data, len(MAGIC))
        start = len(MAGIC) + 4
        try:
            header = json.loads(data[start:start + size])
            rows, explicit, group = int(header["rows"]), bool(header["explicit_rows"]), int(header["row_group_rows"])
            crc, named = int(header["crc32"]), header["part"]
        except (ValueError, KeyError, TypeError) as exc:
            raise BadIndex(f"unreadable header ({type(exc).__name__}: {exc})") from None
        if named != part:
            raise BadIndex(f"index of {named!r}, not of {part!r}")
        payload = memoryview(data)[start + size:]
        if len(payload) != rows * (12 if explicit else 8) or rows < 0 or group < 1:
            raise BadIndex(f"{len(payload)} bytes of payload for {rows} rows (truncated or padded)")
        if zlib.crc32(payload) != crc:
            raise BadIndex("checksum mismatch")
        prefixes = np.frombuffer(payload, "<u8", count=rows).astype(np.uint64, copy=False)
        order = np.frombuffer(payload, "<u4", count=rows, offset=rows * 8).astype(np.uint32, copy=False) if explicit else None
        if rows > 1 and not bool(np.all(prefixes[1:] >= prefixes[:-1])):
            raise BadIndex("prefixes not sorted")
        return cls(part, prefixes, order, group)

    def same_as(self, other: KeyIndex) -> bool:
        """Whether two indexes list the same prefixes at the same rows."""
        def pairs(ix):
            rows = np.arange(ix.num_rows) if ix.rows is None else ix.rows.astype(np.int64)
            order = np.argsort(rows, kind="stable")
            return rows[order], ix.prefixes[order]

        if self.num_rows != other.num_rows or self.row_group_rows != other.row_group_rows:
            return False
        (ra, pa_), (rb, pb) = pairs(self), pairs(other)
        return bool(np.array_equal(ra, rb) and np.array_equal(pa_, pb))


def _runs(sorted_values: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """Positions in `sorted_values` of every element equal to one of `wanted` (sorted, unique)."""
    lo = np.searchsorted(sorted_values, wanted, side="left")
    hi = np.searchsorted(sorted_values, wanted, side="right")
    counts = hi - lo
    total = int(counts.sum())
    if not total:
        return np.zeros(0, np.int64)
    return np.repeat(lo - (np.cumsum(counts) - counts), counts) + np.arange(total)


class Window:
    """The keys looked up in one read, with their prefixes sorted for searching indexes."""

    def __init__(self, keys: pa.Array):
        self.keys = pc.unique(keys)
        prefixes = key_prefixes(self.keys)
        self._order = np.argsort(prefixes, kind="stable")
        self._sorted = prefixes[self._order]
        keep = np.concatenate(([True], self._sorted[1:] != self._sorted[:-1])) if prefixes.size else np.zeros(0, bool)
        self.prefixes = self._sorted[keep]  # sorted, unique: what `KeyIndex.candidates` takes

    def keys_with(self, prefixes: np.ndarray) -> pa.Array:
        """The window's keys whose prefix is one of `prefixes`: the few a part's candidates are
        checked against, rather than hashing the whole window once per part."""
        wanted = np.unique(prefixes)
        return self.keys.take(pa.array(self._order[_runs(self._sorted, wanted)]))
