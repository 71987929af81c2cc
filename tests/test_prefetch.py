"""Image decode of the next micro-batch runs while the engine works on the current one."""
import threading
import time

import numpy as np
import pyarrow as pa
import pytest

from operators import schema
from operators.answering import answer_batch
from operators.prefetch import ImageCache, micro_batch_size, pipelined, rows_of, table_of

TEMPLATES = {"answer_image": "Q: {question}", "answer_caption": 'Text: "{caption}" Q: {question}', "holistic": "H: {caption}", "claim": "C: {claim}"}
DECODE_S = 0.15
ENGINE_S = 0.15


class SlowEngine:
    """Sleeps (like a GPU call: the GIL is free) and answers from the prompt text."""

    def __init__(self, seconds):
        self.seconds = seconds
        self.calls = []

    def score_yes_no(self, prompts):
        self.calls.append(len(prompts))
        time.sleep(self.seconds)
        return np.array([[-0.1 * (len(p.user) % 7), -1.0] for p in prompts])


def slow_loader(decoded):
    def load(uri, image_hash=None):
        if uri.endswith("bad"):
            raise OSError(f"{uri}: not a decodable image")
        decoded.append((uri, threading.current_thread().name))
        time.sleep(DECODE_S)
        return f"pixels of {uri}"

    return load


def batch(n_images, per_image):
    rows = [
        {"key": f"k{i}-{q}", "backbone": "b", "kind": "image", "prompt_id": "v1:x", "image_hash": f"h{i}", "image_uri": f"/img/{i}", "caption": None, "text": f"Is there thing {q}?"}
        for i in range(n_images) for q in range(per_image)
    ]
    rows.append({"key": "kc", "backbone": "b", "kind": "caption", "prompt_id": "v1:x", "image_hash": None, "image_uri": None, "caption": "a cat", "text": "Is there a cat?"})
    rows.append({"key": "kbad", "backbone": "b", "kind": "image", "prompt_id": "v1:x", "image_hash": "hb", "image_uri": "/img/bad", "caption": None, "text": "?"})
    return schema.conform(pa.Table.from_pylist(rows), schema.REQUESTS)


def test_decode_is_hidden_behind_a_slow_engine():
    n = 4  # four micro-batches of one image (4 requests) each
    requests = batch(n, 4)
    decoded = []
    start = time.perf_counter()
    answers, errors = answer_batch(SlowEngine(ENGINE_S), requests, TEMPLATES, slow_loader(decoded), micro_batch=4)
    wall = time.perf_counter() - start
    serial = n * (DECODE_S + ENGINE_S) + ENGINE_S  # + the last micro-batch (caption row and the bad image)
    overlapped = DECODE_S + (n + 1) * ENGINE_S  # first decode, then the engine never waits
    assert wall < overlapped + 0.5 * DECODE_S * (n - 1), (wall, overlapped, serial)
    assert all(name.startswith(("prefetch", "decode")) for _, name in decoded)  # never on the engine's thread
    assert sorted(u for u, _ in decoded) == [f"/img/{i}" for i in range(n)]  # each image decoded once
    assert answers.num_rows == 4 * n + 1 and errors.column("key").to_pylist() == ["kbad"]


def test_micro_batches_give_the_same_answers_as_one_call():
    requests = batch(5, 3)
    one_answers, one_errors = answer_batch(SlowEngine(0), requests, TEMPLATES, slow_loader([]), micro_batch=10_000)
    for size in (1, 2, 7):
        engine = SlowEngine(0)
        answers, errors = answer_batch(engine, requests, TEMPLATES, slow_loader([]), micro_batch=size)
        assert answers.equals(one_answers) and errors.equals(one_errors)
        assert max(engine.calls) <= size


def test_an_image_spanning_micro_batches_is_decoded_once():
    decoded = []
    answers, _ = answer_batch(SlowEngine(0), batch(2, 5), TEMPLATES, slow_loader(decoded), micro_batch=3)
    assert sorted(u for u, _ in decoded) == ["/img/0", "/img/1"] and answers.num_rows == 11


def test_pipelined_keeps_order_and_raises():
    seen = []
    pipelined([1, 2, 3], lambda x: x * 10, lambda x, y: seen.append((x, y)))
    assert seen == [(1, 10), (2, 20), (3, 30)]
    with pytest.raises(ZeroDivisionError):
        pipelined([1, 0], lambda x: 1 / x, lambda x, y: None)


def test_row_and_table_conversions_match_arrow():
    t = batch(3, 2)
    assert rows_of(t) == t.to_pylist()
    assert table_of(t.to_pylist(), schema.REQUESTS).equals(pa.Table.from_pylist(t.to_pylist(), schema=schema.REQUESTS))
    assert table_of([], schema.ANSWERS).equals(schema.ANSWERS.empty_table())


def test_micro_batch_size_follows_the_engine():
    class Spec:
        batch_size = 16

    class Engine:
        spec = Spec()

    assert micro_batch_size(Engine()) == 128 and micro_batch_size(object()) == 256 and micro_batch_size(object(), 5) == 5
    with pytest.raises(ValueError):
        micro_batch_size(object(), 0)
    cache = ImageCache(lambda uri, h: uri.upper(), threads=2)
    images, failures = cache.load([{"image_hash": "a", "image_uri": "x"}, {"image_hash": None}, {"image_hash": "a", "image_uri": "x"}])
    assert images == {"a": "X"} and failures == {}


def test_slow_images_decode_in_threads_and_fast_ones_inline():
    def slow(uri, image_hash):
        time.sleep(0.1)
        return threading.current_thread().name

    rows = [{"image_hash": f"h{i}", "image_uri": f"/img/{i}"} for i in range(5)]
    start = time.perf_counter()
    images, _ = ImageCache(slow, threads=4).load(rows)
    assert time.perf_counter() - start < 0.1 + 2 * 0.1 + 0.1  # first alone, then four side by side (not 0.5 s)
    assert sum(name.startswith("decode") for name in images.values()) == 4
    images, _ = ImageCache(lambda uri, h: threading.current_thread().name, threads=4).load(rows)
    assert set(images.values()) == {threading.current_thread().name}  # cheap images: no hand-off


def test_the_next_parts_images_decode_while_the_engine_answers_this_part(tmp_path):
    """Parts smaller than a micro-batch (the default 256-row parts): the answer worker's next
    part is decoded in the background by PartWriter, so the engine never waits between parts."""
    from types import SimpleNamespace

    from pipeline.stages.engine_stage import PART, PartSink, PartWriter
    from pipeline.stages.engine_workers import AnswerWorker
    from pipeline.store.parts import PartStore

    n = 4
    requests = batch(n, 4).slice(0, 4 * n)  # one image per part, four requests each
    requests = requests.append_column(PART, pa.array([i // 4 for i in range(4 * n)], pa.int32()))
    decoded = []
    worker = AnswerWorker.__new__(AnswerWorker)  # the real worker's methods around a slow engine and loader
    worker.engine, worker.templates, worker.backbone = SlowEngine(ENGINE_S), TEMPLATES, SimpleNamespace(system_prompt=None)
    worker.store = PartStore(str(tmp_path / "answers"), schema.ANSWERS)
    worker.parts, worker.load_image = PartSink(worker.store), slow_loader(decoded)
    writer = PartWriter.__new__(PartWriter)
    writer.worker, writer.row_schema = worker, None

    start = time.perf_counter()
    status = writer(requests)
    wall = time.perf_counter() - start
    overlapped, serial = DECODE_S + n * ENGINE_S, n * (DECODE_S + ENGINE_S)
    assert wall < overlapped + 0.5 * DECODE_S * (n - 1), (wall, overlapped, serial)
    assert worker.engine.calls == [4] * n  # one engine call per part
    assert all(name.startswith("prefetch") for _, name in decoded)  # never on the engine's thread
    assert sorted(u for u, _ in decoded) == [f"/img/{i}" for i in range(n)]
    assert status.column("ok").to_pylist() == [True] * (4 * n)
    assert sorted(worker.store.keys().to_pylist()) == sorted(requests.column("key").to_pylist())
