"""The shipped micro VLM writes the same text through both engines: greedy generation of the
three question sets and both judge verdicts, through the production generation path
(`pipeline.micro_vlm_writing`: the run's templates, the chat template, the production parsers),
by transformers (engine hf) and by the real vLLM on this CPU (engine vllm), text for text.

A writer whose text depended on the engine would make a question set, and every score built on
it, depend on where the run happened: vLLM on a cluster, transformers on a laptop."""
from __future__ import annotations

import dataclasses

import pytest

from operators.demo_generations import WRITTEN_OPEN_SHARE
from operators.engines import load_engine
from pipeline import micro_vlm_writing as MW
from pipeline.config import load_config
from tests.vllm_cpu import require_vllm_cpu

pytestmark = [pytest.mark.vllm_cpu, pytest.mark.slow]


def writings(spec, templates, pairs) -> list[MW.Written]:
    engine = load_engine(spec)
    try:
        return (MW.write_questions(engine, [c for c, _ in pairs], templates, WRITTEN_OPEN_SHARE, spec.max_new_tokens)
                + MW.write_judgements(engine, pairs, templates, spec.max_new_tokens))
    finally:
        engine.close()


def test_hf_and_vllm_write_the_same_text():
    require_vllm_cpu()
    cfg = load_config(["backbones=[micro]"])
    spec, templates = cfg.backbones["micro"], dict(cfg.prompts.templates)
    pairs = MW.heldout_pairs(4, seed=2)
    by_hf = writings(dataclasses.replace(spec, engine="hf"), templates, pairs)
    by_vllm = writings(dataclasses.replace(spec, engine="vllm"), templates, pairs)
    assert [(w.kind, w.caption) for w in by_hf] == [(w.kind, w.caption) for w in by_vllm]
    assert len(by_hf) == 5 * len(pairs) and all(w.text for w in by_hf)  # every format written, none empty
    differ = [(w.kind, w.caption, w.text, v.text) for w, v in zip(by_hf, by_vllm) if w.text != v.text]
    assert not differ, differ
    assert sum(w.parsed for w in by_hf) >= 0.9 * len(by_hf)  # the texts compared are the formats, not noise
