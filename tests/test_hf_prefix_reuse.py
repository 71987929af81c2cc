"""The hf engine's image-prefix reuse (operators/engines/hf_prefix.py) answers as the plain path
does, for every family it is on for, with several images and questions per batch, chunks of
suffixes that reuse one prefix, an image's questions beside a prompt worded otherwise (the
questions then share their instruction too), caption-only prompts about two captions, a lone
image and a system turn mixed in."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from PIL import Image

from operators.engines import hf_prefix
from operators.engines.base import Prompt
from operators.engines.hf import HFEngine
from operators.engines.spec import BackboneSpec

# The cache classes it copies are transformers internals: checked again under the cluster's pinned
# transformers (.ci/run's second pass).
pytestmark = pytest.mark.templates

FAMILIES = ["builtin:tiny-vlm", "builtin:tiny-qwen3vl", "builtin:tiny-qwen2vl"]  # Qwen3.5 (hybrid), Qwen3-VL, Qwen2-VL
QUESTIONS = ["Is there a red circle?", "Is the square blue?", "Are there two triangles?", "Is the circle left of the big square?", "No?"]
ASK = "Look at the image and answer the question about it.\nQuestion: {}\nReply with a single word: Yes or No."


def prompts() -> list[Prompt]:
    rng = np.random.default_rng(0)
    images = [Image.fromarray(rng.integers(0, 255, (48 + 16 * i, 64, 3), dtype=np.uint8)) for i in range(3)]
    out = [Prompt(user=ASK.format(q), image=image, image_id=f"img{i}") for i, image in enumerate(images) for q in QUESTIONS]
    out += [Prompt(user='Does this figure show "a red circle"? Please answer yes or no.', image=images[i], image_id=f"img{i}") for i in (0, 1)]
    for caption in ("a red circle above a small blue square", "two green triangles and no circle"):  # caption-only
        out += [Prompt(user=f'Here is a description of a picture you cannot see: "{caption}". Judging only from it: {q}') for q in QUESTIONS[:3]]
    out.append(Prompt(user="Is it red?"))  # a short caption-only prompt that shares only the chat header
    out += [Prompt(user=QUESTIONS[0], image=images[0], image_id="img0", system="Answer yes or no.") for _ in range(2)]  # another system turn
    out.append(Prompt(user=QUESTIONS[1], image=images[2], image_id="lone", system="Be brief."))  # an image asked once
    return out


@pytest.mark.parametrize("model_id", FAMILIES)
def test_reuse_gives_the_answers_of_the_plain_path(model_id, monkeypatch):
    # batched rows (batch_invariant off): 5 questions per image make 2 chunks per prefix
    spec = BackboneSpec(name="t", model_id=model_id, engine="hf", batch_size=3, engine_options={"batch_invariant": False})
    plain = HFEngine(BackboneSpec(name="t", model_id=model_id, engine="hf", batch_size=3,
                                  engine_options={"prefix_reuse": False, "batch_invariant": False}))
    reused = HFEngine(spec)
    assert reused.prefix_reuse and not plain.prefix_reuse
    shared, levels = [], []
    original, level = hf_prefix.PrefixScorer.last_logits, hf_prefix.PrefixScorer._level
    monkeypatch.setattr(hf_prefix.PrefixScorer, "last_logits", lambda self, groups: shared.extend(len(g["input_ids"]) for g in groups) or original(self, groups))
    monkeypatch.setattr(hf_prefix.PrefixScorer, "_level", lambda self, nodes, out: levels.append(level(self, nodes, out)) or levels[-1])
    batch = prompts()
    expected, got = plain.score_yes_no(batch), reused.score_yes_no(batch)
    # three images' questions, the system-turn pair and each caption's questions shared a prefix
    assert sorted(shared) == [2, 3, 3, 5, 6, 6]
    # beside the holistic prompt, two images' questions went on from the image by their instruction
    assert sum(len(children) for children in levels) == 2
    assert np.abs(got - expected).max() < 1e-5
    assert np.abs(np.exp(got) - np.exp(expected)).max() < 1e-6
    assert reused.prompt_tokens == plain.prompt_tokens  # throughput reports count the same tokens


@pytest.mark.parametrize("model_id", FAMILIES)
def test_reuse_cut_per_prompt_gives_the_answers_of_the_plain_path(model_id, monkeypatch):
    """Batch-invariant (a CPU's default): every image prompt, the lone one too, runs its image's
    prefix (ending where the image does) and then its own suffix, one row per pass."""
    plain = HFEngine(BackboneSpec(name="t", model_id=model_id, engine="hf", engine_options={"prefix_reuse": False}))
    reused = HFEngine(BackboneSpec(name="t", model_id=model_id, engine="hf"))
    assert reused.batch_invariant and reused.prefix_reuse
    shared = []
    original = hf_prefix.PrefixScorer.last_logits
    monkeypatch.setattr(hf_prefix.PrefixScorer, "last_logits", lambda self, groups: shared.extend(len(g["input_ids"]) for g in groups) or original(self, groups))
    batch = prompts()
    expected, got = plain.score_yes_no(batch), reused.score_yes_no(batch)
    assert sorted(shared) == [1, 2, 5, 6, 6]  # the lone image too; caption-only prompts run whole
    assert np.abs(got - expected).max() < 1e-5
    assert reused.prompt_tokens == plain.prompt_tokens


def test_groups_are_one_image_and_system_turn_asked_more_than_once():
    image = Image.new("RGB", (8, 8))
    batch = [Prompt(user="a", image=image, image_id="x"), Prompt(user="b"), Prompt(user="c", image=image, image_id="x"),
             Prompt(user="d", image=image, image_id="x", system="s"), Prompt(user="e", image=image, image_id="y")]
    assert hf_prefix.shared_image_groups(batch) == ([[0, 2]], [1, 3, 4])
    assert hf_prefix.shared_image_groups(batch, min_size=1) == ([[0, 2], [3], [4]], [1])


def test_caption_only_prompts_share_what_saves_most():
    header, a, b = [1, 2, 3, 4], [5, 6, 7, 8, 9], [15, 16, 17, 18, 19]
    rows = [header + a + [20], header + b + [21], header + a + [22], header + [30], header + b + [23], header + a + [24, 25]]
    # the six share the 4-token header (5 x 4 = 20 skipped); cutting by caption skips 2 x 9 + 1 x 9 = 27
    assert hf_prefix.shared_text_groups(rows, min_shared=4) == [[0, 2, 5], [1, 4]]
    assert hf_prefix.shared_text_groups(rows, min_shared=10) == []  # nothing shares 10 tokens
    assert hf_prefix.shared_text_groups([header + [30], header + [31], header + [32]], min_shared=4) == [[0, 1, 2]]
    assert hf_prefix.shared_text_groups([], min_shared=4) == []
    # captions that themselves start alike: all five share 7 tokens (4 x 7 = 28 skipped), more than 2 x 9 + 9
    b = [5, 6, 7, 10, 11]
    rows = [header + a + [20], header + b + [21], header + a + [22], header + b + [23], header + a + [24, 25]]
    assert hf_prefix.shared_text_groups(rows, min_shared=4) == [[0, 1, 2, 3, 4]]


def test_the_common_prefix_leaves_every_row_its_last_token():
    rows = [torch.tensor([1, 2, 3, 4]), torch.tensor([1, 2, 3, 9, 9]), torch.tensor([1, 2, 3, 4, 5])]
    assert hf_prefix.common_prefix_length(rows) == 3
    assert hf_prefix.common_prefix_length([torch.tensor([1, 2, 3]), torch.tensor([1, 2, 3])]) == 2  # identical rows


@pytest.mark.parametrize("model_id", FAMILIES[:2])
def test_groups_of_one_prefix_length_share_their_passes(model_id):
    """Three same-size images, three questions each: one prefix pass for the three images, one
    pass for the nine suffixes (a forward pass on a CPU costs the weights it reads, whatever its rows).
    Batch-invariant (a CPU's default), every pass runs one row: three prefixes, nine suffixes."""
    spec = BackboneSpec(name="t", model_id=model_id, engine="hf", batch_size=16, engine_options={"batch_invariant": False})
    plain = HFEngine(BackboneSpec(name="t", model_id=model_id, engine="hf", engine_options={"prefix_reuse": False}))
    reused = HFEngine(spec)
    rng = np.random.default_rng(1)
    images = [Image.fromarray(rng.integers(0, 255, (64, 64, 3), dtype=np.uint8)) for _ in range(3)]
    batch = [Prompt(user=ASK.format(q), image=image, image_id=f"img{i}") for i, image in enumerate(images) for q in QUESTIONS[:3]]
    calls = []
    forward = reused.model.forward
    reused.model.forward = lambda *a, **k: calls.append(len(k["input_ids"])) or forward(*a, **k)
    expected, got = plain.score_yes_no(batch), reused.score_yes_no(batch)
    assert calls == [3, 9]
    assert np.abs(got - expected).max() < 1e-5
    alone = HFEngine(dataclasses.replace(spec, engine_options={}))
    forward = alone.model.forward
    calls.clear()
    alone.model.forward = lambda *a, **k: calls.append(len(k["input_ids"])) or forward(*a, **k)
    assert np.abs(alone.score_yes_no(batch) - expected).max() < 1e-5
    assert calls == [1] * 12


def test_a_gathered_cache_takes_rows_of_several_banks_and_leaves_them_intact():
    class Layer:
        def __init__(self, rows: int, start: float):
            self.keys = torch.arange(start, start + rows).view(rows, 1, 1).repeat(1, 2, 3)
            self.recurrent_states = {0: torch.full((rows, 4), start)}
            self.is_initialized = True

    def cache(rows: int, start: float):
        made = type("Cache", (), {})()
        made.layers = [Layer(rows, start)]
        return made

    first, second = hf_prefix.Bank(cache(2, 0.0), 2), hf_prefix.Bank(cache(1, 10.0), 1)
    twin = hf_prefix.gather_cache([(first, 1), (second, 0), (first, 1), (first, 0)])
    assert twin.layers[0].keys[:, 0, 0].tolist() == [1.0, 10.0, 1.0, 0.0] and twin.layers[0].keys.shape == (4, 2, 3)
    assert twin.layers[0].recurrent_states[0][:, 0].tolist() == [0.0, 10.0, 0.0, 0.0] and twin.layers[0].is_initialized
    twin.layers[0].keys += 100
    assert first.cache.layers[0].keys[:, 0, 0].tolist() == [0.0, 1.0] and second.cache.layers[0].keys.shape == (1, 2, 3)
