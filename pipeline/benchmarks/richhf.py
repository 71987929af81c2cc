"""RichHF-18K (Liang et al. 2024) test split: 955 Pick-a-Pic images with a misalignment score.

RichHF ships labels only (google-research-datasets/richhf-18k, `test.tfrecord` of
`tf.train.Example`s): `filename` (bytes, `<folder>/<uid>.<ext>`), the float scores
`misalignment_score`, `aesthetics_score`, `artifact_score`, `overall_score`, two PNG
heatmaps and `prompt_misalignment_label`. Captions and images come from Pick-a-Pic v1
(`yuvalkirstain/pickapic_v1`), joined on the image uid (the filename's stem), which the
user supplies as:
- a captions table (Parquet or CSV) with columns (`uid` or `filename`, `caption`), or
  Pick-a-Pic's own columns (`caption`, `image_0_uid`, `image_1_uid`);
- an image folder holding `<uid><image_ext>` (default `images/<uid>.jpg`).

Sign: the release states that every score is "the higher the better", so despite its
name a high `misalignment_score` means the image matches its prompt well; it is used
as `human` unchanged. One item per image; group = caption (prompts repeat across images).
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterator
from typing import Any, BinaryIO

import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from pipeline.benchmarks.common import LoadResult, Problem
from pipeline.benchmarks.io import ProblemLog, items_table, number_value, require_image, text_value
from pipeline.benchmarks.tfrecord import ExampleError, TFRecordError, parse_example, read_records
from pipeline.store.folder import BadRecord, FileError, Folder

LOADER = "richhf"  # the name benchmark configs give as `loader:`

SCORE_FEATURE = "misalignment_score"


def load(
    root: str,
    *,
    benchmark: str = "richhf",
    tfrecord: str = "test.tfrecord",
    captions: str = "pickapic_captions.parquet",
    images: str = "images",
    image_ext: str = ".jpg",
) -> LoadResult:
    """Load the RichHF split in `tfrecord`, joined to Pick-a-Pic captions and images."""
    folder = Folder(root)
    problems: list[Problem] = []
    caption_of = _read_captions(*folder.locate(captions), problems)
    image_folder = folder.sub(images)
    tf_folder, tf_path = folder.locate(tfrecord)
    log = ProblemLog(tf_folder.uri(tf_path), problems)

    rows = []
    seen: set[str] = set()
    with tf_folder.open(tf_path) as stream:
        for index, data in _intact_records(stream, log):
            record = f"record {index}"
            try:
                features = _features(data)
                uid = _uid(features)
                record = f"{record} ({uid})"
                human = number_value(_single(features, SCORE_FEATURE, float), SCORE_FEATURE)
                if uid in seen:
                    raise BadRecord("filename", f"duplicate image uid {uid!r}: only its first record is used")
                seen.add(uid)
                if uid not in caption_of:
                    raise BadRecord("filename", f"uid {uid!r} has no caption in the Pick-a-Pic captions table")
                image_uri = require_image(image_folder, f"{uid}{image_ext}", "filename")
            except BadRecord as exc:
                log.bad(record, exc)
                continue
            rows.append(
                {
                    "item_id": f"{benchmark}/{uid}",
                    "image_uri": image_uri,
                    "caption": caption_of[uid],
                    "group_id": caption_of[uid],
                    "human": human,
                }
            )
    return LoadResult(items=items_table(rows, benchmark), problems=problems)


def _intact_records(stream: BinaryIO, log: ProblemLog) -> Iterator[tuple[int, bytes]]:
    """(index, payload) up to the first damaged record, which is reported: nothing after
    it can be trusted, and everything before it passed its CRC checks."""
    try:
        yield from enumerate(read_records(stream))
    except TFRecordError as exc:
        log.add(f"record {exc.index}", None, f"{exc.reason}; the rest of the file is not read")


def _features(data: bytes) -> dict[str, list]:
    try:
        return parse_example(data)
    except ExampleError as exc:
        raise BadRecord(None, str(exc)) from None


def _single(features: dict[str, list], name: str, kind: type) -> Any:
    """The one value of a feature that RichHF stores as a single bytes or float value."""
    values = features.get(name)
    if not values or not isinstance(values[0], kind):
        raise BadRecord(name, f"expected one {kind.__name__} value, got {values!r}")
    return values[0]


def _uid(features: dict[str, list]) -> str:
    """The Pick-a-Pic image uid: the stem of the `filename` feature."""
    raw = _single(features, "filename", bytes)
    try:
        name = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise BadRecord("filename", f"not UTF-8: {raw!r}") from None
    uid = _stem(name)
    if not uid or uid in (".", ".."):
        raise BadRecord("filename", f"no image uid in {name!r}")
    return uid


def _read_captions(folder: Folder, path: str, problems: list[Problem]) -> dict[str, str]:
    """uid -> caption from the user's Pick-a-Pic table (Parquet or CSV, by extension)."""
    table = _read_table(folder, path)
    names = set(table.column_names)
    if "caption" in names and {"image_0_uid", "image_1_uid"} <= names:  # Pick-a-Pic's own rows
        uid_columns = [table["image_0_uid"].to_pylist(), table["image_1_uid"].to_pylist()]
    elif "caption" in names and "uid" in names:
        uid_columns = [table["uid"].to_pylist()]
    elif "caption" in names and "filename" in names:
        uid_columns = [[_stem(v) if isinstance(v, str) else v for v in table["filename"].to_pylist()]]
    else:
        raise FileError(
            f"{folder.uri(path)}: needs columns (uid or filename, caption) or Pick-a-Pic's "
            f"(caption, image_0_uid, image_1_uid); found {table.column_names}"
        )
    captions = table["caption"].to_pylist()
    pairs = [(f"row {i}", uid, captions[i]) for column in uid_columns for i, uid in enumerate(column)]
    log = ProblemLog(folder.uri(path), problems)
    caption_of: dict[str, str] = {}
    conflicting: set[str] = set()
    for record, uid, caption in pairs:
        try:
            uid = text_value(uid, "uid")
            caption = text_value(caption, "caption")
        except BadRecord as exc:
            log.bad(record, exc)
            continue
        if caption_of.setdefault(uid, caption) != caption:
            log.add(record, "caption", f"uid {uid!r} has two different captions: the image is skipped")
            conflicting.add(uid)
    return {uid: caption for uid, caption in caption_of.items() if uid not in conflicting}


def _stem(name: str) -> str:
    """`test/1f0e....png` -> `1f0e...`: how RichHF's filenames name Pick-a-Pic uids."""
    return posixpath.splitext(posixpath.basename(name))[0]


def _read_table(folder: Folder, path: str) -> Any:
    if not folder.fs.isfile(path):
        raise FileError(f"{folder.uri(path)}: file not found")
    reader = {".parquet": _parquet_columns, ".csv": _csv_table}.get(posixpath.splitext(path)[1].lower())
    if reader is None:
        raise FileError(f"{folder.uri(path)}: captions table must be .parquet or .csv")
    try:
        with folder.fs.open(path, "rb") as f:
            return reader(f)
    except Exception as exc:  # pyarrow raises ArrowInvalid, OSError, ...: all mean "unreadable"
        raise FileError(f"{folder.uri(path)}: cannot read the captions table ({exc})") from exc


_CAPTION_COLUMNS = ("uid", "filename", "caption", "image_0_uid", "image_1_uid")


def _parquet_columns(f) -> Any:
    """Only the id and caption columns: Pick-a-Pic's own files also hold the image bytes."""
    parquet = pq.ParquetFile(f)
    return parquet.read(columns=[c for c in _CAPTION_COLUMNS if c in parquet.schema_arrow.names])


def _csv_table(f) -> Any:
    return pacsv.read_csv(f, convert_options=pacsv.ConvertOptions(column_types={c: "string" for c in _CAPTION_COLUMNS}))
