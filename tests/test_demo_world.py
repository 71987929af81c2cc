"""The demo world's sampler: seeded, balanced, truthful, and disjoint from the benchmark's items."""
from __future__ import annotations

import collections

import pytest

from operators import demo_world as W
from pipeline.benchmarks import demo


def _draws(seed: int, split: str, n: int = 300) -> list[W.WorldRequest]:
    sampler = W.WorldSampler(seed, split)
    return [sampler.request(kind) for _ in range(n) for kind in W.REQUEST_KINDS]


def test_same_seed_same_draws_and_splits_differ():
    assert _draws(3, "train", 50) == _draws(3, "train", 50)
    assert _draws(3, "train", 50) != _draws(4, "train", 50)
    assert _draws(3, "train", 50) != _draws(3, "heldout", 50)
    with pytest.raises(ValueError, match="unknown split"):
        W.WorldSampler(0, "benchmark")


def test_no_draw_is_a_benchmark_scene_or_caption():
    scenes, captions = W.benchmark_scenes(), W.benchmark_captions()
    assert len(scenes) > 40 and len(captions) > 40
    for r in _draws(0, "train", 600):
        assert r.scene is None or frozenset(r.scene) not in scenes
        assert r.caption is None or r.caption not in captions


def test_truths_follow_the_world_and_answers_are_balanced():
    counts = collections.Counter()
    for r in _draws(1, "heldout", 600):
        counts[r.kind, r.fact_type, r.answer] += 1
        if r.kind == "holistic":
            assert r.caption and r.question is None
        elif r.kind == "caption":
            assert r.scene is None and r.caption and r.question.endswith("?")
            assert r.answer == (r.fact_type != "negation")
        else:
            assert r.scene and r.caption is None and r.form in ("depict", "dsg")
    for kind in W.REQUEST_KINDS:
        yes = sum(v for (k, _, a), v in counts.items() if k == kind and a)
        total = sum(v for (k, _, _), v in counts.items() if k == kind)
        assert 0.4 < yes / total < 0.6, (kind, yes, total)
    for fact_type in W.FACT_TYPES.values():  # image requests: every type, both answers
        assert counts["image", fact_type, True] > 30 and counts["image", fact_type, False] > 30


def test_image_truths_recomputed_from_the_pixels_facts():
    """An image request's answer is the fact's truth on its scene, re-derived here from the
    caption-free question text through the benchmark's own question forms."""
    sampler = W.WorldSampler(5)
    for _ in range(200):
        r = sampler.request("image")
        facts = [f for f in _all_facts(r.scene) if W.fact_question(f, r.form) == r.question]
        assert facts, r
        assert {W.image_truth(f, r.form, r.scene) for f in facts} == {r.answer}


def _all_facts(scene):
    """Every fact of every type and form whose question could be asked about these shapes."""
    out = []
    for shape in W.SHAPES:
        for colour in (*W.COLOURS, None):
            out += [W.Fact("present", shape), W.Fact("absent", shape, colour)]
            if colour:
                out += [W.Fact("colour", shape, colour), W.Fact("colour", shape, colour, plural=True)]
            out += [W.Fact("count", shape, colour, count=n) for n in W.NUMBER_WORDS]
            for relation in W.RELATIONS:
                for other in W.SHAPES:
                    for other_colour in (*W.COLOURS, None):
                        out.append(W.Fact("spatial", shape, colour, relation=relation, other=(other, other_colour)))
    return out


def test_sampled_scenes_render_with_the_benchmarks_rasteriser():
    scene = W.WorldSampler(2).scene()
    assert demo.render is W.render and demo.png_bytes(demo.render(scene))[:8] == b"\x89PNG\r\n\x1a\n"
