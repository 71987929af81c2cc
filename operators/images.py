"""Reading, decoding and sizing images, with errors that say which image and why.

A bad image must become an error row naming its URI, never a crash of the whole batch
and never a silent blank image, so every failure here raises `ImageError`.
"""
from __future__ import annotations

import io
import math
import os
import re
import socket
from collections.abc import Iterator
from urllib.parse import urlsplit

import fsspec
from fsspec.core import url_to_fs
from PIL import Image, ImageOps

from operators.hashing import image_hash, is_own_image_hash
from operators.retry import retrying


class ImageError(Exception):
    """An image could not be read or decoded; the message names the URI and the cause."""

    def __init__(self, uri: str, cause: str):
        super().__init__(f"{uri}: {cause}")
        self.uri = uri
        self.cause = cause


# An image inside a pack (pipeline.store.image_packs): `<...>/packs/<hh>/<32 hex>.tar#bytes=<first>-<last>`.
# Only that exact shape is a range, so a user's own file whose name merely ends in "#bytes=1-2"
# is still read whole, as the file it names.
PACKS = "packs"  # the folder of packs under the store's images folder
_PACK_RANGE = re.compile(rf"(?P<url>.*/{PACKS}/[0-9a-f]{{2}}/[0-9a-f]{{32}}\.tar)#bytes=(?P<first>[0-9]{{1,15}})-(?P<last>[0-9]{{1,15}})")
MAX_RANGE_BYTES = 1 << 31  # no image is this large; a bigger range is a damaged URI, not a read


def pack_path(images: str, name: str) -> str:
    """Where the pack named `name` (32 hex digits, the hash of its bytes) lives under `images`."""
    return f"{images.rstrip('/')}/{PACKS}/{name[:2]}/{name}.tar"


def byte_range_uri(url: str, offset: int, length: int) -> str:
    """The URI of `length` bytes of the pack `url` from `offset`."""
    return f"{url}#bytes={offset}-{offset + length - 1}"


def split_byte_range(uri: str) -> tuple[str, int | None, int | None]:
    """(pack URL, offset, length) of an image in a pack; (uri, None, None) for a whole file."""
    found = _PACK_RANGE.fullmatch(uri) if "#bytes=" in uri else None
    if found is None or int(found["last"]) < int(found["first"]):
        return uri, None, None
    first = int(found["first"])
    return found["url"], first, int(found["last"]) - first + 1


def _read(uri: str) -> bytes:
    url, offset, length = split_byte_range(uri)
    path = _local_path(url)
    if offset is None:
        with open(path, "rb") if path is not None else fsspec.open(url, "rb") as f:
            return f.read()
    if length > MAX_RANGE_BYTES:
        raise ValueError(f"a range of {length} bytes is larger than any image")
    if path is not None:
        with open(path, "rb") as f:
            data = os.pread(f.fileno(), length, offset)
    else:
        fs, remote = url_to_fs(url)
        data = fs.cat_file(remote, start=offset, end=offset + length)
    if len(data) != length:
        raise ValueError(f"the file holds {len(data)} of the range's {length} bytes (truncated)")
    return data


def _local_path(uri: str) -> str | None:
    """The path of a plain local path (read with `open`: fsspec's URL parsing costs ~30 us per
    image, three times the read itself); None for a URL, which fsspec opens."""
    if "://" in uri or "::" in uri:
        return None
    return os.path.expanduser(uri) if uri.startswith("~") else uri


def read_image_bytes(uri: str) -> bytes:
    """The file's bytes, from a local path or any fsspec URL (s3://, gs://, file://, ...);
    an image in a pack (`.../packs/<hh>/<hash>.tar#bytes=<first>-<last>`) is that range of the pack.

    Transient storage errors (throttling, 5xx, dropped connections) are retried with backoff;
    a missing or unreadable file is not.
    """
    try:
        return retrying(f"read image {uri}", lambda: _read(uri))
    except Exception as e:
        why = unreachable(split_byte_range(uri)[0], e)
        if why is not None:
            raise ImageError(uri, why) from e
        if isinstance(e, FileNotFoundError):
            raise ImageError(uri, "file not found") from e
        if isinstance(e, (OSError, ValueError)):
            raise ImageError(uri, f"cannot read: {e}") from e
        raise


def unreachable(url: str, exc: BaseException) -> str | None:
    """Why a URL could not be read when the cause is the network or the server, not a missing
    file: "cannot resolve host <host>", "connection refused by <host>:<port>", "timed out
    reaching <host>:<port>", "HTTP <status> (<reason>)", "cannot connect to <host>:<port> (...)";
    None for anything else, and for every URL that is not http(s) (a local file, an S3 key:
    s3fs names its own errors).

    fsspec's HTTP file system raises FileNotFoundError for every failure of its first request
    (a host that does not resolve, a refused connection, a timeout, any HTTP status): the
    aiohttp error it chains says which one it was."""
    parts = urlsplit(url)
    if parts.scheme.lower() not in ("http", "https"):
        return None
    host = parts.hostname or url
    try:
        port = parts.port or {"http": 80, "https": 443}[parts.scheme.lower()]
    except ValueError:  # a port that is not a number
        port = None
    where = f"{host}:{port}" if port else host
    links = list(_chain(exc))
    for link in links:  # an HTTP answer: the server was reached, and said no
        status = getattr(link, "status", None)
        if isinstance(status, int) and 100 <= status <= 599:
            reason = getattr(link, "message", None)
            return f"HTTP {status}" + (f" ({reason})" if isinstance(reason, str) and reason.strip() else "")
    if any(isinstance(link, socket.gaierror) or type(link).__name__ == "ClientConnectorDNSError" for link in links):
        return f"cannot resolve host {host}"
    if any(isinstance(link, ConnectionRefusedError) for link in links):
        return f"connection refused by {where}"
    if any(isinstance(link, TimeoutError) for link in links):  # asyncio's and aiohttp's timeouts are TimeoutError
        return f"timed out reaching {where}"
    connection = next((link for link in links if isinstance(link, ConnectionError) or type(link).__name__.startswith("ClientConnector")), None)
    if connection is not None:
        return f"cannot connect to {where} ({' '.join(str(connection).split()) or type(connection).__name__})"
    return None


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """`exc` and the exceptions behind it (`__cause__`, `__context__`), outermost first."""
    seen: set[int] = set()
    link: BaseException | None = exc
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        yield link
        link = link.__cause__ if link.__cause__ is not None else link.__context__


_STORED_COPY = re.compile(r".*/images/(?P<hh>[0-9a-f]{2})/(?P=hh)[0-9a-f]{30}\.[a-z]{2,4}")  # the store's copy of an image
_RUN_AGAIN = "then run again (a curation: with retry_failed=true, which processes shards with failed rows again)"


def _changed_hint(uri: str) -> str:
    """How to cure an image that changed since it was hashed (docs/troubleshooting.md)."""
    if split_byte_range(uri)[1] is not None or _STORED_COPY.fullmatch(uri):
        return f"the store's copy was damaged on disk: `python jobs/store.py verify store=<store> repair=true` moves it aside; {_RUN_AGAIN}"
    return ("a file is hashed again when its size or modification time changes, and a copy that kept both (cp -p, "
            f"rsync -a) looks unchanged: touch the file, {_RUN_AGAIN}")


def load_image(uri: str, expected_hash: str | None = None) -> Image.Image:
    """The image at `uri`, decoded, after checking that its bytes still hash to `expected_hash`.

    Requests are keyed by the hash taken when the image was first read; the model later reads
    the image again by URI. If the file was replaced or damaged in between (an image rewritten
    in place, a pack corrupted on disk), an answer about other pixels would be stored for good
    under the old hash and served to every later run. So a mismatch raises, and the request
    becomes an error row. Hashes from a shard's own column (not ours) cannot be checked.
    """
    data = read_image_bytes(uri)
    if is_own_image_hash(expected_hash):
        found = image_hash(data)
        if found != expected_hash:
            raise ImageError(uri, f"changed since it was hashed: its bytes hash to {found}, not to {expected_hash}, the hash its requests are keyed by; {_changed_hint(uri)}")
    return decode_image(data, uri)


def decode_image(data: bytes, uri: str) -> Image.Image:
    """Decode to RGB, applying the EXIF orientation (phones store rotated pixels plus a tag)."""
    try:
        # No `with`: closing an in-memory image would void its pixels and force a copy; the
        # buffer is released with the image.
        img = Image.open(io.BytesIO(data))
    except Image.UnidentifiedImageError as e:
        raise ImageError(uri, "not a decodable image") from e
    except Exception as e:
        raise _decode_error(uri, e) from e
    return upright_rgb(img, uri)


def upright_rgb(img: Image.Image, uri: str) -> Image.Image:
    """An opened image -> the pixels a model sees: decoded, EXIF orientation applied, 8-bit RGB.

    Files go through here after `Image.open`, and so do PIL images passed to the API
    (pipeline.api), so a photo given as a path, as bytes or as a PIL image is one picture.
    `img` itself is left as it is (a transposed or converted copy is returned).
    """
    try:
        img.load()  # decode now, so truncation is caught here and not in the model
        source_format = img.format
        if img.getexif().get(_ORIENTATION, 1) != 1:  # exif_transpose copies even an upright image
            img = ImageOps.exif_transpose(img)
        return to_rgb(img, uri, source_format)
    except ImageError:
        raise
    except Exception as e:
        raise _decode_error(uri, e) from e


def _decode_error(uri: str, e: Exception) -> ImageError:
    """PIL's decoders raise OSError, SyntaxError, ValueError, EOFError...: one ImageError."""
    return ImageError(uri, "truncated file" if "truncated" in str(e) else f"cannot decode: {e}")


_ORIENTATION = 0x0112  # the EXIF tag of how the stored pixels are rotated or mirrored

# Pillow's own convert("RGB") clips 16- and 32-bit pixels to 0..255, so a 16-bit grayscale
# PNG (values up to 65535) came out solid white. These modes are rescaled here instead.
_HIGH_DEPTH = ("I;16", "I;16L", "I;16B", "I;16N", "I", "F")
# Transparent pixels are shown on white (what a viewer shows), not on whatever colour the
# file happens to store under alpha 0.
BACKGROUND = (255, 255, 255)


def to_rgb(img: Image.Image, uri: str, source_format: str | None = None) -> Image.Image:
    """8-bit RGB for any mode, or ImageError naming the mode when it has no defined colours."""
    if img.mode == "RGB" and "transparency" not in img.info:
        return img
    if img.mode in _HIGH_DEPTH:
        # A PNG decodes to mode I only from 16-bit samples: always on the 16-bit scale.
        return _high_depth_to_rgb(img, uri, sixteen_bit=img.mode.startswith("I;16") or (img.mode == "I" and source_format == "PNG"))
    if img.mode in ("RGBA", "LA", "PA", "La", "RGBa") or (img.mode in ("P", "L", "RGB") and "transparency" in img.info):
        rgba = img.convert("RGBA")
        canvas = Image.new("RGBA", rgba.size, (*BACKGROUND, 255))
        return Image.alpha_composite(canvas, rgba).convert("RGB")
    try:
        return img.convert("RGB")
    except ValueError as e:  # e.g. LAB, HSV and multi-band modes Pillow cannot map to RGB
        raise ImageError(uri, f"unsupported pixel mode {img.mode!r}: {e}") from e


def _high_depth_to_rgb(img: Image.Image, uri: str, sixteen_bit: bool) -> Image.Image:
    """16-bit / 32-bit integer and float grayscale -> 8-bit, on the format's full scale.

    The scale is the format's, not the image's own min..max, so a dark 16-bit image stays
    dark: 16-bit and 32-bit integers holding 0..65535 are divided by 257; integers in 0..255
    are already 8-bit; floats in 0..1 are multiplied by 255. Anything else (negative or
    larger integers, floats outside 0..1 or 0..255, NaN) has no agreed display range and is
    rejected with the reason rather than guessed.
    """
    import numpy as np

    values = np.asarray(img)
    if values.dtype.byteorder not in ("=", "|"):
        values = values.astype(values.dtype.newbyteorder("="))
    values = values.astype(np.float64)
    if values.size == 0:
        raise ImageError(uri, f"empty image (mode {img.mode!r})")
    if not np.isfinite(values).all():
        raise ImageError(uri, f"mode {img.mode!r} image holds NaN or infinite pixels")
    low, high = float(values.min()), float(values.max())
    if img.mode == "F":
        if low >= 0 and high <= 1:
            scaled = values * 255.0
        elif low >= 0 and high <= 255:
            scaled = values
        else:
            raise ImageError(uri, f"float pixels span {low:g}..{high:g}: neither 0..1 nor 0..255, no defined brightness")
    elif sixteen_bit or (low >= 0 and high <= 65535 and high > 255):
        if low < 0:
            raise ImageError(uri, f"16-bit pixels below 0 ({low:g})")
        scaled = values / 257.0
    elif low >= 0 and high <= 255:
        scaled = values
    else:
        raise ImageError(uri, f"32-bit integer pixels span {low:g}..{high:g}, outside 0..65535: no defined brightness")
    gray = Image.fromarray(np.clip(np.rint(scaled), 0, 255).astype(np.uint8), "L")
    return gray.convert("RGB")


def fit_pixels(img: Image.Image, max_pixels: int, min_pixels: int) -> Image.Image:
    """Rescale, keeping the aspect ratio, so that min_pixels <= width*height <= max_pixels.

    Done before the processor so that every engine (HF, vLLM) sees the same pixels for
    the same backbone. An image already within bounds is returned unchanged.
    """
    if not 0 < min_pixels <= max_pixels:
        raise ValueError(f"need 0 < min_pixels <= max_pixels, got {min_pixels}, {max_pixels}")
    width, height = img.size
    area = width * height
    if area > max_pixels:
        scale = math.sqrt(max_pixels / area)
        new_w, new_h = max(1, math.floor(width * scale)), max(1, math.floor(height * scale))
        # A sliver (e.g. 10000 x 1) cannot keep its aspect: shorten the long side instead.
        if new_w * new_h > max_pixels:
            new_w, new_h = (max_pixels // new_h, new_h) if new_w > new_h else (new_w, max_pixels // new_w)
        size = (new_w, new_h)
    elif area < min_pixels:
        scale = math.sqrt(min_pixels / area)
        # Rounding both sides up reaches min_pixels but may pass max_pixels when the bounds
        # are close: take the largest rounding that stays within max_pixels (rounding both
        # down never passes it, so there always is one).
        candidates = [(round_w(width * scale), round_h(height * scale))
                      for round_w in (math.ceil, math.floor) for round_h in (math.ceil, math.floor)]
        size = max((c for c in candidates if c[0] * c[1] <= max_pixels), key=lambda c: c[0] * c[1])
    else:
        return img
    return img.resize(size, Image.Resampling.BICUBIC)
