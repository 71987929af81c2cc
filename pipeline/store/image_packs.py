"""Image packs: a shard's embedded images stored as one file, each image addressed by a byte range.

A file per embedded image would cost, at 100k images a night, 100k inode creations, and on a
local disk the kernel's file creation (not the bytes) is then the largest cost of the first
run; the answer actors would open those 100k files again. A
pack holds all of one shard's images, so a shard costs one file write, and readers open one
file per shard.

A pack is a plain uncompressed tar (`tar -tf` lists it; members are `<image hash>.<ext>`),
named by the hash of its bytes, so the same images in the same order make the same pack, which
is written once. Each image's URI is the pack's URI plus its byte range,
`<pack>#bytes=<first>-<last>` (inclusive, as in an HTTP Range header), which
`operators.images.read_image_bytes` reads like any other image URI.
"""
from __future__ import annotations

import io
import tarfile

from operators.hashing import digest, image_hash
from operators.images import byte_range_uri, pack_path
from pipeline.store.folder import BadRecord, Folder, image_extension


class ImagePack:
    """The embedded images of one shard, added one by one, written as one tar."""

    def __init__(self) -> None:
        self._buffer = io.BytesIO()
        self._ranges: dict[str, tuple[int, int]] = {}  # image hash -> (offset, length) in the tar

    def add(self, data: bytes | None) -> str:
        """Add an image's bytes (once per distinct image); returns its hash."""
        if not data:
            raise BadRecord(None, "embedded image has no bytes")
        h = image_hash(data)
        if h not in self._ranges:
            self._buffer.write(ustar_header(f"{h}.{image_extension(data)}", len(data)))
            self._ranges[h] = (self._buffer.tell(), len(data))
            self._buffer.write(data)
            self._buffer.write(bytes(-len(data) % tarfile.BLOCKSIZE))
        return h

    def __len__(self) -> int:
        return len(self._ranges)

    def write(self, images: Folder) -> str:
        """Write the pack under `<images>/packs/` unless it is there already, intact (its bytes
        hash to its name: a truncated or altered one is written again); returns its URI."""
        self._buffer.write(bytes(2 * tarfile.BLOCKSIZE))  # the end-of-archive marker
        data = self._buffer.getvalue()
        path = pack_path(images.path, digest(data))  # named by its bytes: a pack found under this name holds these offsets
        images.write_content(path, data)  # a copy truncated or altered since is written again: the shard is here
        return images.uri(path)

    def image_uri(self, pack_uri: str, h: str) -> str:
        offset, length = self._ranges[h]
        return byte_range_uri(pack_uri, offset, length)


def ustar_header(name: str, size: int) -> bytes:
    """The 512-byte USTAR header of a regular file (mode 644, owner 0, mtime 0).

    The same bytes as `tarfile.TarInfo.tobuf(USTAR_FORMAT)` (the tests compare them), built
    here because tarfile takes ~25 us per member, a second per 40k images."""
    encoded = name.encode("ascii")
    if len(encoded) > 100:
        raise ValueError(f"member name over 100 bytes: {name!r}")
    header = bytearray(tarfile.BLOCKSIZE)
    header[0 : len(encoded)] = encoded
    header[100:124] = b"0000644\x000000000\x000000000\x00"  # mode, uid, gid
    header[124:136] = b"%011o\x00" % size
    header[136:148] = b"00000000000\x00"  # mtime
    header[148:156] = b" " * 8  # the checksum counts its own field as spaces
    header[156:157] = tarfile.REGTYPE
    header[257:265] = tarfile.POSIX_MAGIC  # b"ustar\x0000"
    header[148:156] = b"%06o\x00 " % sum(header)
    return bytes(header)
