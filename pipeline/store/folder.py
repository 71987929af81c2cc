"""Files in a folder that may be local or on an object store, read and written safely.

- `Folder`: a local directory or `s3://` (any fsspec) prefix. Paths written *in the data*
  (image names, CSV columns, shard members) are joined with `Folder.join`, which refuses anything
  that would leave the folder ("../", absolute paths, URLs, and locally a symbolic link that
  resolves outside it), so bad data cannot point a job at arbitrary files. Paths written *in the
  config* are trusted (`Folder.sub`).
- Existence checks list each directory once instead of one request per image: 9,600
  HEAD requests against S3 would take minutes, one listing takes a second.
- Writes are atomic (readers see the old file or all of the new one), and content-named files
  (`content_address`: images, image packs) are written again when the copy on disk is damaged.
- `BadRecord` is what a path or value found in the data raises (its caller reports the record and
  skips it); `FileError` is a whole file missing or unreadable. Both are raised here, so they
  live here: the benchmark loaders, the store and curation all import them from this module.
"""

from __future__ import annotations

import json
import logging
import os
import posixpath
from typing import Any, BinaryIO

from fsspec.core import url_to_fs

from operators.hashing import image_hash
from pipeline.store.fs import is_local, write_local_atomically
from pipeline.store.settings import retrying

log = logging.getLogger(__name__)


class FileError(RuntimeError):
    """A whole file is missing or unreadable; the message names it."""


class BadRecord(ValueError):
    """One record is unusable: which field, and why. The loader reports it and moves on."""

    def __init__(self, field: str | None, message: str):
        super().__init__(message)
        self.field = field
        self.message = message


class Folder:
    """A dataset folder: a local directory or an fsspec URL prefix such as `s3://bucket/x`."""

    def __init__(self, uri: str):
        self.fs, path = url_to_fs(uri)
        self.path = path.rstrip("/") or "/"
        self._listings: dict[str, frozenset[str]] = {}

    @property
    def is_local(self) -> bool:
        return is_local(self.fs)

    def uri(self, path: str | None = None) -> str:
        """What `items.image_uri` holds: an absolute local path, or a URL with its scheme."""
        path = self.path if path is None else path
        return path if self.is_local else self.fs.unstrip_protocol(path)

    def sub(self, path: str) -> Folder:
        """A folder named in the config (trusted): a URL or absolute path, else relative to this one."""
        if "://" in path or path.startswith("/"):
            return Folder(path)
        return Folder(self.uri(posixpath.normpath(posixpath.join(self.path, path))))

    def locate(self, path: str) -> tuple[Folder, str]:
        """A file named in the config: the folder that holds it, and its path there."""
        parent, name = posixpath.split(path)
        folder = self.sub(parent or ".")
        return folder, posixpath.join(folder.path, name)

    def glob(self, pattern: str) -> tuple[Folder, list[str]]:
        """Files matching a pattern named in the config; none matching raises."""
        folder, path = self.locate(pattern)
        paths = sorted(p for p in folder.fs.glob(path) if folder.fs.isfile(p))
        if not paths:
            raise FileError(f"{folder.uri(path)}: no file matches")
        return folder, paths

    def join(self, relative: str) -> str:
        """The fs path of a path found in the data, refusing any that would leave the folder."""
        if not isinstance(relative, str) or not relative.strip():
            raise BadRecord(None, f"empty path {relative!r}")
        if "://" in relative or relative.startswith(("/", "\\")) or "\\" in relative or "\x00" in relative:
            raise BadRecord(None, f"path {relative!r} must be relative to {self.uri()}")
        normal = posixpath.normpath(relative)
        if normal == ".." or normal.startswith("../"):
            raise BadRecord(None, f"path {relative!r} escapes the dataset folder {self.uri()}")
        joined = posixpath.join(self.path, normal)
        if self.is_local:  # the text stays inside; a symbolic link on the way may not
            real = os.path.realpath(joined)
            if real != self._real_root and not real.startswith(self._real_root.rstrip("/") + "/"):
                raise BadRecord(None, f"path {relative!r} escapes the dataset folder {self.uri()} through a symbolic link (it resolves to {real})")
        return joined

    @property
    def _real_root(self) -> str:
        """The folder with its own symbolic links resolved (a dataset root may itself be a link)."""
        if not hasattr(self, "_real_root_cache"):
            self._real_root_cache = os.path.realpath(self.path)
        return self._real_root_cache

    def exists(self, path: str) -> bool:
        """Whether the file exists, from one cached listing of its directory."""
        parent = posixpath.dirname(path)
        if parent not in self._listings:
            try:
                names = self.fs.ls(parent, detail=False)
            except (FileNotFoundError, NotADirectoryError):
                names = []
            self._listings[parent] = frozenset(name.rstrip("/") for name in names)
        return path in self._listings[parent]

    def exists_now(self, path: str) -> bool:
        """Whether the file exists, asked now (no cached listing; os.stat for a local folder)."""
        return os.path.exists(path) if self.is_local else self.fs.exists(path)

    def open(self, path: str, mode: str = "rb") -> BinaryIO:
        """Open a whole file of the release; a missing one raises an error naming it."""
        if not self.fs.isfile(path):
            raise FileError(f"{self.uri(path)}: file not found")
        return self.fs.open(path, mode)

    def read_text(self, path: str) -> str:
        with self.open(path) as f:
            data = f.read()
        try:
            return data.decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            raise FileError(f"{self.uri(path)}: not UTF-8 text ({exc})") from exc

    def read_json(self, path: str) -> Any:
        """Parse a JSON file; objects come back as `JsonObject`, which remembers duplicate keys."""
        try:
            return json.loads(self.read_text(path), object_pairs_hook=JsonObject.from_pairs)
        except json.JSONDecodeError as exc:
            raise FileError(f"{self.uri(path)}: not valid JSON ({exc})") from exc

    def write_once(self, path: str, data: bytes) -> None:
        """Write `data` unless the file exists; readers never see a partial file."""
        if not self.exists_now(path):
            self.write(path, data)

    def write_content(self, path: str, data: bytes) -> None:
        """Write content-named `data` (an image, an image pack) unless the file already holds
        exactly these bytes. A copy damaged on disk (the name, other bytes: truncated or altered)
        is written again: a name whose bytes changed would be hashed anew downstream and scored
        as other pixels, or point readers at the wrong offsets."""
        try:
            found = retrying(f"read {self.uri(path)}", lambda: self.fs.cat_file(path))
        except FileNotFoundError:
            found = None
        if found == data:
            return
        if found is not None:
            log.warning("%s is damaged (%d bytes that are not the content it is named after); writing it again", self.uri(path), len(found))
        self.write(path, data)

    def write(self, path: str, data: bytes) -> None:
        """Write `data` (replacing the file if there is one); readers never see a partial file."""
        if not self.is_local:
            self.fs.pipe_file(path, data)  # one PUT on object stores: atomic
            return
        write_local_atomically(path, data)


class JsonObject(dict):
    """A JSON object that keeps the first value of a repeated key and lists the repeats.

    `json.load` silently keeps the last copy of a duplicated key; real releases have
    duplicated ids, and a loader must report them rather than lose one without a word.
    """

    duplicate_keys: list[str]

    @classmethod
    def from_pairs(cls, pairs: list[tuple[str, Any]]) -> JsonObject:
        obj = cls()
        obj.duplicate_keys = []
        for key, value in pairs:
            if key in obj:
                obj.duplicate_keys.append(key)
            else:
                obj[key] = value
        return obj


def extract_image(folder: Folder, data: bytes | None, name_hint: str | None = None) -> str:
    """Store embedded image bytes under `folder` by content hash and return the file's URI.

    Content addressing makes extraction idempotent and shared: the same image (across
    reruns, or repeated in a release) is stored once, at `<hh>/<hash>.<ext>`; a stored copy
    damaged since is written again.
    """
    path, _ = content_address(folder, data, name_hint)
    folder.write_content(path, data)
    return folder.uri(path)


def content_address(folder: Folder, data: bytes | None, name_hint: str | None = None) -> tuple[str, str]:
    """(path under `folder`, image hash) where `extract_image` stores these bytes."""
    if not data:
        raise BadRecord(None, "embedded image has no bytes")
    digest = image_hash(data)
    return posixpath.join(folder.path, digest[:2], f"{digest}.{image_extension(data, name_hint)}"), digest


_SIGNATURES = ((b"\x89PNG\r\n\x1a\n", "png"), (b"\xff\xd8\xff", "jpg"), (b"GIF8", "gif"), (b"BM", "bmp"))


def image_extension(data: bytes, name_hint: str | None = None) -> str:
    """The file extension of image bytes, from their signature (else the name's, else `img`)."""
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "webp"
    for signature, ext in _SIGNATURES:
        if data.startswith(signature):
            return ext
    hinted = posixpath.splitext(name_hint or "")[1].lstrip(".").lower()
    return hinted if hinted.isalnum() else "img"
