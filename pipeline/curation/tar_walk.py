"""Plain tar files read from their 512-byte headers, without tarfile's per-member objects.

The standard library's tarfile builds a TarInfo and runs a dozen Python calls per member: a
WebDataset shard of 5,000 pairs (10,000 members) takes ~0.6 s of GIL-bound time to read. A
plain tar needs far less: each member is one header (name, size, type, checksum) followed by
its data padded to whole blocks, so the members can be located by stepping from header to
header and their bytes sliced out of one buffer.

This walker reads only what it can read exactly as tarfile does (`tarfile.open(mode="r|*")`
and iteration): USTAR/GNU/v7 headers of regular files, directories and links, uncompressed
or in one gzip stream. Anything else (pax or GNU long-name headers, sparse files, devices,
base-256 numbers, a bad or signed checksum, odd number fields, truncation, trailing
garbage after a gzip stream, bz2/xz/zstd) raises `Unsupported`, and the caller reads the file
with tarfile instead, so odd tars keep today's behaviour, errors included.
"""
from __future__ import annotations

import os
import re
import tarfile
import zlib
from typing import BinaryIO

BLOCK = 512
_ZERO_BLOCK = bytes(BLOCK)
# A number field tarfile's nti() reads as octal: digits between spaces, then optionally a NUL
# and anything. Stricter than nti (which also takes tabs, signs, "0o", underscores): those
# rarities are left to tarfile.
_OCTAL = re.compile(rb" *[0-7]* *(?:\x00.*)?", re.DOTALL)
# mode, uid, gid, size, mtime, chksum, devmajor, devminor: tarfile parses each, and a header
# with one it cannot parse ends the archive.
_NUMBER_FIELDS = ((100, 108), (108, 116), (116, 124), (124, 136), (136, 148), (148, 156), (329, 337), (337, 345))
# The shapes writers use for those fields (tarfile, GNU tar, bsdtar, Go): zero-padded digits
# ended by NUL or space, or all NUL. One match over the fields of every header (the bytes
# 100:156 and 329:345 of each, joined) checks an archive at once; other shapes are then
# checked field by field with _OCTAL.
_F8 = rb"(?:[0-7]{7}[\x00 ]|[0-7]{6} \x00|\x00{8})"
_F12 = rb"(?:[0-7]{11}[\x00 ]|[0-7]{10} \x00|\x00{12})"
_CHKSUM = rb"(?:[0-7]{6}\x00 |[0-7]{7}[\x00 ]|[0-7]{6} \x00)"
_USUAL_NUMBERS = re.compile(rb"(?:" + _F8 * 3 + _F12 * 2 + _CHKSUM + _F8 * 2 + rb")*")
_REGULAR = (ord("0"), 0)  # REGTYPE, AREGTYPE: the members tarfile's isfile() accepts here
_NO_DATA = (ord("1"), ord("2"), ord("5"))  # LNKTYPE, SYMTYPE, DIRTYPE: tarfile skips no data after them
# Compressed streams tarfile's "r|*" detects besides gzip (bz2, xz/lzma, zstd): left to it.
_OTHER_COMPRESSION = (b"BZh", b"\x5d\x00\x00\x80", b"\xfd7zXZ", b"\x28\xb5\x2f\xfd")


class Unsupported(Exception):
    """The file holds something this walker does not read exactly as tarfile does."""


def tar_bytes(raw: bytes) -> bytes:
    """The uncompressed tar in `raw`: a gzip stream is inflated (as tarfile's "r|*" mode
    does, from the magic bytes, whatever the file's name); a plain tar is returned as is."""
    if raw.startswith(b"\x1f\x8b\x08"):
        return _gunzip(raw)
    if raw.startswith(_OTHER_COMPRESSION):
        raise Unsupported("compressed with other than gzip")
    return raw


def _gunzip(raw: bytes) -> bytes:
    """One whole gzip member, its header skipped the way tarfile's stream reader skips it."""
    if len(raw) < 10:
        raise Unsupported("truncated gzip header")
    flags, pos = raw[3], 10
    if flags & 4:  # FEXTRA: tarfile skips it oddly (through the inflater); leave it to tarfile
        raise Unsupported("gzip extra field")
    for flag in (8, 16):  # FNAME, FCOMMENT: NUL-terminated
        if flags & flag:
            end = raw.find(b"\x00", pos)
            if end < 0:
                raise Unsupported("truncated gzip header")
            pos = end + 1
    if flags & 2:  # FHCRC
        pos += 2
    inflater = zlib.decompressobj(-zlib.MAX_WBITS)
    try:
        data = inflater.decompress(memoryview(raw)[pos:])
    except zlib.error as exc:
        raise Unsupported(f"invalid compressed data ({exc})") from None
    if not inflater.eof or len(inflater.unused_data) != 8:  # cut short, or more than the CRC32 + size trailer
        raise Unsupported("truncated gzip stream or data after it")
    return data


def regular_members(buf) -> list[tuple[str, int, int]]:
    """(name, data offset, size) of every regular-file member of the plain tar in `buf`, in
    archive order, names as tarfile gives them. `buf` is bytes-like, or a `FileBlocks` (then
    only headers are read). Raises Unsupported, having checked the whole archive, if any
    part of it is outside what this walker reads exactly."""
    members = []
    headers = []
    numbers = []
    end = len(buf)
    pos = 0
    encoding = tarfile.ENCODING
    try:
        while pos < end:
            header = buf[pos : pos + BLOCK]
            if len(header) != BLOCK:
                raise Unsupported(f"truncated header at byte {pos}")
            if header[0] == 0 and header == _ZERO_BLOCK:
                break  # end of archive; tarfile reads nothing after it
            # tarfile's unsigned checksum: the header's bytes summed, the checksum field as
            # spaces. Summed as two 256-byte halves by adler32 (each half's sum < its modulus).
            total = (zlib.adler32(header[:256]) & 0xFFFF) + (zlib.adler32(header[256:]) & 0xFFFF) - 2
            if _number(header, 148, 156) != 256 + total - sum(header[148:156]):
                raise Unsupported(f"checksum of the header at byte {pos}")  # bad, or tarfile's signed variant
            headers.append(header)
            numbers += (header[100:156], header[329:345])
            kind = header[156]
            name = header[:100].partition(b"\x00")[0]
            pos += BLOCK
            if kind in _NO_DATA or (kind == 0 and name.endswith(b"/")):  # a v7 directory
                continue
            if kind not in _REGULAR:
                raise Unsupported(f"member type {bytes([kind])!r} at byte {pos - BLOCK}")
            size = _number(header, 124, 136)
            data = pos
            pos += -(-size // BLOCK) * BLOCK
            if pos > end or size < 0:
                raise Unsupported(f"data cut short at byte {end}")
            text = name.decode(encoding, "surrogateescape")
            if header[345]:  # a USTAR name split in two
                text = header[345:500].partition(b"\x00")[0].decode(encoding, "surrogateescape") + "/" + text
            members.append((text, data, size))
    except ValueError as exc:  # a number int() refuses (nti may not, or may): tarfile's to read
        raise Unsupported(f"number field at byte {pos} ({exc})") from None
    if end == 0:
        raise Unsupported("empty file")
    if _USUAL_NUMBERS.fullmatch(b"".join(numbers)) is None:
        for header in headers:
            for start, stop in _NUMBER_FIELDS:
                if _OCTAL.fullmatch(header, start, stop) is None:
                    raise Unsupported(f"number field {start}:{stop} of a header")
    return members


def _number(header: bytes, start: int, stop: int) -> int:
    """A number field read as nti() reads it, for the shapes _OCTAL accepts (the others are
    refused once the walk is done)."""
    return int(header[start:stop].partition(b"\x00")[0].strip() or b"0", 8)


class FileBlocks:
    """An open file sliced like bytes (`blocks[a:b]` seeks and reads), so the walker reads
    member headers and seeks over their data."""

    def __init__(self, file: BinaryIO):
        self._file = file
        self._size = os.fstat(file.fileno()).st_size

    def __len__(self) -> int:
        return self._size

    def __getitem__(self, span: slice) -> bytes:
        self._file.seek(span.start)
        return self._file.read(span.stop - span.start)
