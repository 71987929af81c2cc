"""Tiny random-weight models: they load through the real from_pretrained paths, deterministically."""
from __future__ import annotations

import os
import threading
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from operators import tiny_models
from operators.tiny_models import BUILDERS, build_tiny_vlm, resolve_model_id

# Tokenizer/processor/chat-template code: CI runs these again under the cluster pins (.ci/run).
pytestmark = pytest.mark.templates


def test_tiny_vlm_loads_as_qwen3_5(tiny_vlm_dir):
    from transformers import AutoModelForImageTextToText, AutoProcessor

    processor = AutoProcessor.from_pretrained(tiny_vlm_dir)
    model = AutoModelForImageTextToText.from_pretrained(tiny_vlm_dir)
    assert model.config.model_type == "qwen3_5"
    assert type(processor).__name__ == "Qwen3VLProcessor"
    assert type(processor.tokenizer).__name__ == "Qwen3_5Tokenizer"
    assert model.config.image_token_id == processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    assert sum(p.numel() for p in model.parameters()) < 1_000_000


def test_tiny_vlm_answer_words_are_single_tokens(tiny_vlm_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_vlm_dir)
    ids = {w: tokenizer.encode(w, add_special_tokens=False) for w in tiny_models.ANSWER_WORDS}
    assert all(len(v) == 1 for v in ids.values()), ids
    assert len({v[0] for v in ids.values()}) == len(ids)  # all distinct
    # Text round-trips through the byte-level BPE, including characters absent from the corpus.
    text = "Is the naïve café's sign 42% red? Yes."
    assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)) == text


def test_tiny_vlm_chat_template_and_image_expansion(tiny_vlm_dir):
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(tiny_vlm_dir)
    messages = [
        {"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Is there a cat?"}]},
    ]
    text = processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>Is there a cat?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    image = Image.new("RGB", (64, 64), (200, 10, 10))
    inputs = processor(text=[text], images=[image], return_tensors="pt")
    # 64x64 pixels = 4x4 patches of 16 = 2x2 merged tokens.
    n_pad = int((inputs["input_ids"] == processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")).sum())
    assert n_pad == 4
    assert inputs["image_grid_thw"].tolist() == [[1, 4, 4]]


def _weights(path) -> dict:
    from safetensors.numpy import load_file

    return load_file(str(Path(path) / "model.safetensors"))


def test_tiny_vlm_same_seed_is_bit_identical(tiny_vlm_dir, tmp_path):
    again = build_tiny_vlm(tmp_path / "again", seed=0)
    for name in ["model.safetensors", "tokenizer.json", "config.json", "chat_template.jinja"]:
        assert (again / name).read_bytes() == (Path(tiny_vlm_dir) / name).read_bytes(), name
    other = _weights(build_tiny_vlm(tmp_path / "other", seed=1))
    base = _weights(tiny_vlm_dir)
    assert base.keys() == other.keys()
    assert any(not np.array_equal(base[k], other[k]) for k in base)


def test_tiny_grounding_dino_loads_and_detects(tiny_gdino_dir):
    import torch
    from transformers import AutoModelForZeroShotObjectDetection, AutoProcessor

    processor = AutoProcessor.from_pretrained(tiny_gdino_dir)
    model = AutoModelForZeroShotObjectDetection.from_pretrained(tiny_gdino_dir).eval()
    assert type(processor.tokenizer).__name__ == "BertTokenizer"
    # The modeling code hard-codes these ids for [CLS], [SEP], "." and "?".
    tokenizer = processor.tokenizer
    assert [tokenizer.convert_tokens_to_ids(t) for t in ["[CLS]", "[SEP]", ".", "?"]] == [101, 102, 1012, 1029]
    image = Image.new("RGB", (120, 80), (30, 120, 40))
    inputs = processor(images=image, text="a red cat. a dog.", return_tensors="pt")
    ids = inputs["input_ids"][0].tolist()
    assert ids[0] == 101 and ids[-1] == 102 and ids.count(1012) == 2
    assert tokenizer.unk_token_id not in ids  # the corpus words are in the vocab
    with torch.no_grad():
        outputs = model(**inputs)
    results = processor.post_process_grounded_object_detection(
        outputs, inputs["input_ids"], threshold=0.0, text_threshold=0.0, target_sizes=[(80, 120)]
    )
    assert results[0]["boxes"].shape[1] == 4
    assert len(results[0]["scores"]) == len(results[0]["boxes"]) > 0


def test_tiny_grounding_dino_same_seed_is_bit_identical(tiny_gdino_dir, tmp_path):
    again = tiny_models.build_tiny_grounding_dino(tmp_path / "again", seed=0)
    assert (again / "model.safetensors").read_bytes() == (Path(tiny_gdino_dir) / "model.safetensors").read_bytes()


def test_resolve_leaves_ordinary_ids_alone(tmp_path):
    assert resolve_model_id("Qwen/Qwen3.5-4B", cache_dir=tmp_path) == "Qwen/Qwen3.5-4B"
    assert resolve_model_id("/models/local", cache_dir=tmp_path) == "/models/local"
    assert list(tmp_path.iterdir()) == []


def test_resolve_rejects_unknown_builtin(tmp_path):
    with pytest.raises(ValueError, match="builtin:tiny-vlm"):
        resolve_model_id("builtin:huge-vlm", cache_dir=tmp_path)


def _counting_builder(calls: list, barrier: threading.Barrier | None = None):
    def build(path, seed=0):
        calls.append(path)
        Path(path).mkdir(parents=True, exist_ok=True)
        (Path(path) / "weights.bin").write_bytes(b"tiny" * 10)
        if barrier is not None:
            barrier.wait(timeout=10)  # every caller has built before anyone renames
        return Path(path)
    return build


def test_resolve_builds_once_into_cache(tmp_path, monkeypatch):
    calls: list = []
    monkeypatch.setitem(BUILDERS, "builtin:tiny-vlm", _counting_builder(calls))
    first = resolve_model_id("builtin:tiny-vlm", cache_dir=tmp_path)
    second = resolve_model_id("builtin:tiny-vlm", cache_dir=tmp_path)
    assert first == second and len(calls) == 1
    assert (Path(first) / "weights.bin").exists()
    assert [p.name for p in tmp_path.iterdir()] == [Path(first).name]  # no staging dirs left


def test_a_built_model_folder_gets_an_ordinary_folders_mode(tmp_path, monkeypatch):
    """mkdtemp's 0700 stayed on the folder renamed into the cache: in a shared $DEPICT_CACHE
    other users saw the model but could not read it, and never rebuilt it."""
    import stat

    monkeypatch.setitem(BUILDERS, "builtin:tiny-vlm", _counting_builder([]))
    old = os.umask(0o022)
    try:
        resolved = Path(resolve_model_id("builtin:tiny-vlm", cache_dir=tmp_path))
        (tmp_path / "plain").mkdir()
    finally:
        os.umask(old)
    assert stat.S_IMODE(resolved.stat().st_mode) == stat.S_IMODE((tmp_path / "plain").stat().st_mode) == 0o755


def test_resolve_uses_depict_cache_env(tmp_path, monkeypatch):
    monkeypatch.setitem(BUILDERS, "builtin:tiny-vlm", _counting_builder([]))
    monkeypatch.setenv("DEPICT_CACHE", str(tmp_path))
    resolved = Path(resolve_model_id("builtin:tiny-vlm"))
    assert resolved.parent == tmp_path / "builtin"


def test_resolve_concurrent_builders_agree(tmp_path, monkeypatch):
    n = 4
    calls: list = []
    monkeypatch.setitem(BUILDERS, "builtin:tiny-vlm", _counting_builder(calls, threading.Barrier(n)))
    results: list = [None] * n
    errors: list = []

    def worker(k):
        try:
            results[k] = resolve_model_id("builtin:tiny-vlm", cache_dir=tmp_path)
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(calls) == n  # all raced, one rename won
    assert len(set(results)) == 1
    assert [p.name for p in tmp_path.iterdir()] == [Path(results[0]).name]


def test_resolve_builds_real_tiny_vlm(tmp_path):
    from transformers import AutoConfig

    path = resolve_model_id("builtin:tiny-vlm", cache_dir=tmp_path)
    assert AutoConfig.from_pretrained(path).model_type == "qwen3_5"
