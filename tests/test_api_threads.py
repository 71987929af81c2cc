"""One `Scorer` called from several threads.

Notebooks and web services call from threads. The in-process executor keeps one set of
workers and one engine per scorer, and a worker's part writer is not reentrant: concurrent
calls inside it would crash (`'NoneType' object has no attribute 'shutdown'`) and lose a
caller's result. So calls take turns; each caller gets exactly the result a call of its
own, alone, would have got.
"""
from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import polars as pl
import pytest
from PIL import Image

from pipeline import Scorer

THREADS = 4
CAPTIONS = ["a red circle", "a blue square", "a green field"]
QUESTIONS = {
    "a red circle": ["Is there a circle?", "Is the circle red?"],
    "a blue square": ["Is there a square?", "Is the square blue?"],
    "a green field": ["Is there a field?", "Is the field green?"],
    "a warm-up": ["Is it warm?"],
}
COLUMNS = ["row", "image", "caption", "depict", "agree", "vqascore", "error"]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> list[list[str]]:
    """Per thread, different images (a few each, so that the calls overlap in the engine)."""
    folder = tmp_path_factory.mktemp("thread-images")
    out = []
    for t in range(THREADS):
        paths = []
        for k in range(3):
            path = folder / f"t{t}-{k}.png"
            Image.new("RGB", (40 + 8 * t, 32 + 8 * k), (60 * t % 256, 90 * k % 256, 200)).save(path)
            paths.append(str(path))
        out.append(paths)
    return out


def _score(scorer: Scorer, images: list[str]) -> pl.DataFrame:
    return scorer.score(images, CAPTIONS, questions=QUESTIONS).select(COLUMNS)


def test_concurrent_calls_each_get_their_own_sequential_result(tmp_path, tiny_vlm_dir, inputs):
    metrics = ["depict", "agree", "vqascore"]
    alone = Scorer("smoke", metrics=metrics, root=tmp_path / "alone", executor="local")
    expected = [_score(alone, images) for images in inputs]
    assert all(e["error"].null_count() == e.height for e in expected)

    shared = Scorer("smoke", metrics=metrics, root=tmp_path / "shared", executor="local")
    shared.score(inputs[0][0], "a warm-up", questions=QUESTIONS)  # load the model first
    assert shared._local.engine_loads == 1
    start = threading.Barrier(THREADS)

    def call(images: list[str]) -> pl.DataFrame:
        start.wait()  # every thread asks at once
        return _score(shared, images)

    with ThreadPoolExecutor(THREADS) as pool:
        got = list(pool.map(call, inputs))  # re-raises any thread's exception
    for t, (mine, want) in enumerate(zip(got, expected, strict=True)):
        assert mine.equals(want), f"thread {t}:\n{mine}\nalone:\n{want}"
    assert shared._local.engine_loads == 1  # still the one model, shared by the calls in turn
    assert shared.last.sent > 0  # the calls asked the engine (nothing came from a cache)
