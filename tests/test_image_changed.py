"""An image whose bytes changed after they were hashed is never answered under the old hash.

Requests are keyed by the image hash taken at ingest, and the model reads the image again by
URI later. An answer computed from other bytes would be stored under the old hash for good
and served to every later run, so the workers check the bytes they read against the hash.
"""
import io

import pyarrow as pa
import pytest
from PIL import Image

from operators import schema
from operators.hashing import image_hash, is_own_image_hash
from operators.images import ImageError, load_image
from pipeline.store.folder import Folder
from pipeline.store.image_packs import ImagePack

TEMPLATES = {"answer_image": "Q: {question}", "answer_caption": 'Text: "{caption}" Q: {question}', "holistic": "H: {caption}", "claim": "C: {claim}"}


def bmp(colour) -> bytes:
    """Uncompressed, so two colours of one size have the same length (a same-size overwrite)."""
    out = io.BytesIO()
    Image.new("RGB", (8, 8), colour).save(out, format="BMP")
    return out.getvalue()


RED, BLUE = bmp((255, 0, 0)), bmp((0, 0, 255))


def test_own_hashes_are_checked_and_a_shard_columns_hash_is_not():
    assert len(RED) == len(BLUE) and RED != BLUE
    assert is_own_image_hash(image_hash(RED))
    for foreign in (None, "", "sha256:" + "ab" * 32, image_hash(RED).upper(), image_hash(RED)[:31], image_hash(RED) + "0"):
        assert not is_own_image_hash(foreign)


def test_a_file_rewritten_after_hashing_is_an_error_naming_both_hashes(tmp_path):
    path = tmp_path / "a.bmp"
    path.write_bytes(RED)
    h = image_hash(RED)
    assert load_image(str(path), h).getpixel((0, 0)) == (255, 0, 0)
    path.write_bytes(BLUE)  # replaced in place, same size
    with pytest.raises(ImageError, match=f"changed since it was hashed: its bytes hash to {image_hash(BLUE)}, not to {h}"):
        load_image(str(path), h)
    # the hash its bytes have now, a shard column's hash, or none: read as they are
    assert load_image(str(path), image_hash(BLUE)).getpixel((0, 0)) == (0, 0, 255)
    assert load_image(str(path), "sha256:feed").getpixel((0, 0)) == (0, 0, 255)
    assert load_image(str(path)).getpixel((0, 0)) == (0, 0, 255)


def test_an_image_overwritten_inside_its_pack_is_an_error(tmp_path):
    pack = ImagePack()
    hashes = [pack.add(RED), pack.add(bmp((0, 255, 0)))]
    url = pack.write(Folder(str(tmp_path / "images")))
    uri = pack.image_uri(url, hashes[0])
    assert load_image(uri, hashes[0]).getpixel((0, 0)) == (255, 0, 0)
    data = bytearray(open(url, "rb").read())
    start = bytes(data).index(RED)
    data[start : start + len(BLUE)] = BLUE  # the pack keeps its size: the pairs cache still trusts it
    open(url, "wb").write(bytes(data))
    with pytest.raises(ImageError, match="changed since it was hashed"):
        load_image(uri, hashes[0])
    assert load_image(pack.image_uri(url, hashes[1]), hashes[1]).getpixel((0, 0)) == (0, 255, 0)


class Recording:
    """The worker's own engine, with the prompts it was given kept."""

    def __init__(self, engine):
        self.engine, self.prompts = engine, []

    def score_yes_no(self, prompts):
        self.prompts += prompts
        return self.engine.score_yes_no(prompts)


def test_the_answer_worker_stores_no_answer_for_a_changed_image(tmp_path):
    """The real worker, built as a Ray actor builds it (its loader, prefetch and part writes),
    with the zero-cost engine."""
    from pipeline.config import load_config
    from pipeline.stages.engine_stage import PART, PartWriter
    from pipeline.stages.engine_workers import AnswerWorker

    changed, kept = tmp_path / "changed.bmp", tmp_path / "kept.bmp"
    changed.write_bytes(RED)
    kept.write_bytes(RED)
    h = image_hash(RED)  # both were hashed before the first was rewritten
    changed.write_bytes(BLUE)
    # one hash, two files (as when one image sits under two paths): each request reads its own URI
    requests = schema.conform(pa.Table.from_pylist([
        {"key": key, "backbone": "zero-cost", "kind": "image", "prompt_id": "v1:x", "image_hash": h, "image_uri": str(path), "caption": None, "text": "Is it red?"}
        for key, path in (("k-changed", changed), ("k-kept", kept))
    ]), schema.REQUESTS)
    cfg = load_config([f"root={tmp_path}", "backbones=[zero-cost]"])
    writer = PartWriter(AnswerWorker, {"backbone": cfg.backbones["zero-cost"], "templates": TEMPLATES, "store_url": str(tmp_path / "answers")})
    worker = writer.worker
    worker.engine = Recording(worker.engine)
    for i in range(2):  # one part per request: each reads its own file
        status = writer(requests.slice(i, 1).append_column(PART, pa.array([0], pa.int32())))
        (row,) = status.to_pylist()
        if i == 0:
            assert not row["ok"] and row["reason"] == "unreadable_image" and "changed since it was hashed" in row["detail"]
        else:
            assert row["ok"], row
    assert worker.store.keys().to_pylist() == ["k-kept"]  # nothing stored under the old hash from the new bytes
    assert [p.image.getpixel((0, 0)) for p in worker.engine.prompts] == [(255, 0, 0)]


def test_a_stored_copy_damaged_on_disk_is_written_again_when_its_image_is_extracted(tmp_path, caplog):
    """The API and benchmark loaders store images by content; a stored copy damaged since (same
    name and size, other bytes) would be hashed anew at ingest and scored as other pixels."""
    from pipeline.store.folder import extract_image

    folder = Folder(str(tmp_path / "images"))
    uri = extract_image(folder, RED)
    assert uri.endswith(f"{image_hash(RED)}.bmp")
    open(uri, "wb").write(BLUE)  # the same size: nothing but the bytes tells
    assert extract_image(folder, RED) == uri
    assert open(uri, "rb").read() == RED and "writing it again" in caplog.text
    assert load_image(uri, image_hash(RED)).getpixel((0, 0)) == (255, 0, 0)


def test_the_cure_is_named_for_each_kind_of_image(tmp_path):
    path = tmp_path / "user.bmp"
    path.write_bytes(BLUE)
    with pytest.raises(ImageError, match="touch the file, then run again .*retry_failed=true"):
        load_image(str(path), image_hash(RED))
    stored = tmp_path / "store" / "images" / image_hash(RED)[:2] / f"{image_hash(RED)}.bmp"
    stored.parent.mkdir(parents=True)
    stored.write_bytes(BLUE)
    with pytest.raises(ImageError, match="store's copy was damaged on disk: `python jobs/store.py verify store=<store> repair=true`"):
        load_image(str(stored), image_hash(RED))
