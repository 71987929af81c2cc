"""Write synthetic input shards for curation tests, benchmarks and the demo.

Every pair index gets its own image (an 8x8 PNG whose colour encodes the index, so content
hashes differ up to 16.7M pairs) and its own caption. Shards are Parquet (image bytes, paths
or a Hugging Face {bytes, path} struct, plus extra columns that must survive filtering) or
WebDataset tars (<key>.png + <key>.txt or <key>.json).

    python tests/curation_shards.py /tmp/shards      # a small demo set: 2 Parquet + 1 tar
"""
from __future__ import annotations

import io
import json
import sys
import tarfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image

CORRUPT_PNG = b"\x89PNG\r\n\x1a\n but the rest is not an image"


def image_bytes(index: int) -> bytes:
    """An 8x8 PNG whose colour is the index's 24 bits: distinct bytes for every index."""
    color = (index & 0xFF, (index >> 8) & 0xFF, (index >> 16) & 0xFF)
    out = io.BytesIO()
    Image.new("RGB", (8, 8), color).save(out, format="PNG")
    return out.getvalue()


def caption(index: int) -> str:
    return f"a plain square of colour number {index} on a white background"


def pair_rows(indices, *, image: str = "bytes", folder: Path | None = None) -> list[dict]:
    """Rows {image, caption, url, license} for pair indices; `image` is bytes, path (images
    written under `folder/images/`, referenced relative to the shard) or struct."""
    rows = []
    for i in indices:
        data = image_bytes(i)
        if image == "bytes":
            value = data
        elif image == "path":
            (folder / "images").mkdir(parents=True, exist_ok=True)
            (folder / "images" / f"{i}.png").write_bytes(data)
            value = f"images/{i}.png"
        elif image == "struct":
            value = {"bytes": data, "path": f"{i}.png"}
        else:
            raise ValueError(f"unknown image mode {image!r}")
        rows.append({"image": value, "caption": caption(i), "url": f"https://example.org/{i}.png", "license": "cc-by"})
    return rows


def write_parquet(path: Path, rows: list[dict], image_type: pa.DataType | None = None) -> Path:
    """A Parquet shard from rows; the image column's type is inferred unless given."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if image_type is None:
        first = next((r["image"] for r in rows if r["image"] is not None), b"")
        image_type = (
            pa.binary() if isinstance(first, bytes)
            else pa.string() if isinstance(first, str)
            else pa.struct([("bytes", pa.binary()), ("path", pa.string())])
        )
    schema = pa.schema([("image", image_type), ("caption", pa.string()), ("url", pa.string()), ("license", pa.string())])
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)
    return path


def write_tar(path: Path, samples: list[dict]) -> Path:
    """A WebDataset tar. A sample is {key, png (bytes, optional), txt (str, optional),
    json (dict, optional)}; members are written in key order, as WebDataset expects."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w") as tar:
        for sample in samples:
            for ext in ("png", "txt", "json"):
                if sample.get(ext) is None:
                    continue
                value = sample[ext]
                data = value if isinstance(value, bytes) else (json.dumps(value) if ext == "json" else value).encode()
                info = tarfile.TarInfo(f"{sample['key']}.{ext}")
                info.size = len(data)
                info.mtime = 0
                tar.addfile(info, io.BytesIO(data))
    return path


def tar_samples(indices, *, caption_in: str = "txt") -> list[dict]:
    """Samples for pair indices, the caption in a .txt member or a .json {"caption": ...}."""
    samples = []
    for i in indices:
        sample = {"key": f"sample{i:06d}", "png": image_bytes(i)}
        if caption_in == "txt":
            sample["txt"] = caption(i) + "\n"
        else:
            sample["json"] = {"caption": caption(i), "source": "synthetic"}
        samples.append(sample)
    return samples


def demo_shards(folder: Path, per_shard: int = 8) -> list[Path]:
    """Two Parquet shards (bytes and paths) and a tar; the second Parquet repeats a pair of the first."""
    folder = Path(folder)
    first = write_parquet(folder / "day1-part-0.parquet", pair_rows(range(per_shard)))
    second = write_parquet(folder / "day1-part-1.parquet", pair_rows([0, *range(per_shard, 2 * per_shard - 1)], image="path", folder=folder))
    third = write_tar(folder / "day1-part-2.tar", tar_samples(range(2 * per_shard, 3 * per_shard)))
    return [first, second, third]


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python tests/curation_shards.py <folder>")
    for written in demo_shards(Path(sys.argv[1])):
        print(written)
