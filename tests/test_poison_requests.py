"""A request that kills its worker, or one far too long for the model, becomes one error row:
the stage completes, everything else is computed and stored, and nothing is retried forever.
What is lost: only the poison request's answer, reported with its reason."""
from __future__ import annotations

import resource

import numpy as np
import pyarrow as pa
import pytest

from operators import schema
from operators.answering import answer_batch, generate_batch
from operators.engines.spec import BackboneSpec
from pipeline.stages.engine_stage import run_and_read, run_engine_stage
from pipeline.stages.engine_workers import AnswerWorker, GenerationWorker
from pipeline.stages.placement import ActorPool
from pipeline.store.parts import PartStore

pytestmark = pytest.mark.slow  # starts Ray actors and builds the tiny model

TEMPLATES = {"answer_caption": 'Text: "{caption}" Q: {question}', "generate_questions": "Caption: {caption}"}


def caption_requests(n: int, poison: int | None = None) -> pa.Table:
    rows = [
        {"key": f"k{i:03d}", "backbone": "s", "kind": "caption", "prompt_id": "p", "image_hash": None, "image_uri": None,
         "caption": "POISON" if i == poison else f"caption {i}", "text": f"question {i}?"}
        for i in range(n)
    ]
    return schema.conform(pa.Table.from_pylist(rows), schema.REQUESTS)


def scripted(**options) -> BackboneSpec:
    return BackboneSpec(name="s", model_id="none", engine="scripted", engine_options=options, batch_size=8)


def test_a_request_that_kills_its_worker_is_isolated_to_one_error_row(ray_session, tmp_path, caplog):
    """Before: Ray restarted the actor and retried the batch forever (the stage never ended)."""
    caplog.set_level("INFO", logger="pipeline.stages.engine_stage")
    requests = caption_requests(40, poison=21)
    backbone = scripted(crash_on="POISON", crash_how="kill")  # SIGKILL, as the OOM killer sends
    store = PartStore(str(tmp_path / "answers" / "s"), schema.ANSWERS)
    rows, report = run_and_read(
        columns=["key", "logp_yes", "logp_no"],
        stage="answers", unit="s", requests=requests, store=store, worker_cls=AnswerWorker,
        worker_kwargs={"backbone": backbone, "templates": TEMPLATES, "store_url": store.url},
        pool=ActorPool(size=1, num_cpus=0.5, rows_per_batch=8),
    )
    assert report.failed == 1
    (error,) = report.errors.to_pylist()
    assert error["key"] == "k021" and error["reason"] == "worker_died" and error["stage"] == "answers"
    assert "died" in error["detail"].lower() or "exit" in error["detail"].lower()
    # every other request was answered and stored
    assert sorted(store.keys().to_pylist()) == [f"k{i:03d}" for i in range(40) if i != 21]
    # the rows come back from the actors (main pass and isolation alike) exactly as stored, none read back
    assert "neither computed nor failed" not in caplog.text
    assert sorted(rows.to_pylist(), key=lambda r: r["key"]) == sorted(store.read(["key", "logp_yes", "logp_no"]).to_pylist(), key=lambda r: r["key"])
    # the healthy batches went through the actor pool; only those on the dying worker were redone
    assert "the actor pool stopped" not in caplog.text
    (lost,) = [r.getMessage() for r in caplog.records if "lost their worker" in r.getMessage()]
    assert int(lost.split("(")[1].split()[0]) < 40
    # no success marker: the unit did not finish cleanly, so the next run retries the poison request
    assert not list((tmp_path / "answers" / "s" / "_markers").glob("*.json"))


def test_a_generation_that_kills_its_worker_is_isolated_too(ray_session, tmp_path):
    rows = [{"key": f"g{i}", "backbone": "s", "kind": "questions", "caption": "POISON" if i == 3 else f"a cat {i}"} for i in range(6)]
    requests = pa.Table.from_pylist(rows)
    backbone = scripted(crash_on="POISON", crash_how="exit", generations=[{"contains": "Caption", "text": "1. Is there a cat?"}])
    store = PartStore(str(tmp_path / "generations" / "s"), schema.GENERATIONS)
    report = run_engine_stage(
        stage="questions", unit="s", requests=requests, store=store, worker_cls=GenerationWorker,
        worker_kwargs={"backbone": backbone, "templates": TEMPLATES, "store_url": store.url},
        pool=ActorPool(size=1, num_cpus=0.5, rows_per_batch=6),
    )
    assert [(e["key"], e["reason"]) for e in report.errors.to_pylist()] == [("g3", "worker_died")]
    assert sorted(store.keys().to_pylist()) == ["g0", "g1", "g2", "g4", "g5"]


def test_a_worker_that_cannot_start_fails_the_stage_naming_the_cause(ray_session, tmp_path):
    """Not a poison request: no bisection, no endless restarts, one clear error."""
    store = PartStore(str(tmp_path), schema.ANSWERS)
    with pytest.raises(RuntimeError, match="cannot start: .*crash_how must be"):
        run_engine_stage(
            stage="answers", unit="s", requests=caption_requests(16), store=store, worker_cls=AnswerWorker,
            worker_kwargs={"backbone": scripted(crash_on="x", crash_how="explode"), "templates": TEMPLATES, "store_url": store.url},
            pool=ActorPool(size=1, num_cpus=0.5, rows_per_batch=8),
        )


def test_the_scripted_engine_crash_option_is_checked():
    from operators.engines.scripted import ScriptedEngine

    with pytest.raises(ValueError, match="crash_how"):
        ScriptedEngine(scripted(crash_on="x", crash_how="explode"))


def test_too_long_prompts_are_error_rows_before_any_model_work():
    from operators.engines.scripted import ScriptedEngine

    spec = scripted()
    spec.max_prompt_tokens = 12
    engine = ScriptedEngine(spec)
    batch = caption_requests(5)
    long_caption = batch.column("caption").to_pylist()
    long_caption[2] = "word " * 500
    batch = batch.set_column(batch.schema.get_field_index("caption"), "caption", pa.array(long_caption))
    answers, errors = answer_batch(engine, batch, TEMPLATES, lambda uri, h: None)
    assert [(e["key"], e["reason"]) for e in errors.to_pylist()] == [("k002", "prompt_too_long")]
    assert "max_prompt_tokens 12" in errors.column("detail")[0].as_py()
    assert answers.column("key").to_pylist() == ["k000", "k001", "k003", "k004"]
    assert engine.n_scored == 4  # the long prompt never reached the engine

    gens = pa.Table.from_pylist([{"key": "g0", "backbone": "s", "kind": "questions", "caption": "word " * 500}])
    _, errors = generate_batch(engine, gens, TEMPLATES, max_new_tokens=8)
    assert errors.column("reason").to_pylist() == ["prompt_too_long"]
    assert engine.n_generated == 0


def test_a_50kb_caption_on_the_tiny_hf_model_is_one_error_row_and_memory_stays_bounded(tiny_vlm_dir):
    """Before: batches were padded to the 50 KB caption's ~24k tokens, far past the model's
    4,096 positions, and the worker grew until Ray killed it."""
    from operators.engines.hf import HFEngine

    spec = BackboneSpec(name="s", model_id=tiny_vlm_dir, engine="hf", dtype="float32", batch_size=16,
                        yes_spellings=["Yes", "yes"], no_spellings=["No", "no"])
    engine = HFEngine(spec, device="cpu")
    assert engine.max_prompt_tokens == engine.model.config.get_text_config().max_position_embeddings
    batch = caption_requests(12)
    captions = batch.column("caption").to_pylist()
    captions[5] = ("a small red cube beside a large blue sphere, " * 1200)[:50_000]
    batch = batch.set_column(batch.schema.get_field_index("caption"), "caption", pa.array(captions))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    answers, errors = answer_batch(engine, batch, TEMPLATES, lambda uri, h: None)
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    (error,) = errors.to_pylist()
    assert error["key"] == "k005" and error["reason"] == "prompt_too_long"
    n_tokens = int(error["detail"].split()[0])
    assert n_tokens > engine.max_prompt_tokens
    assert answers.num_rows == 11 and np.isfinite(answers.column("logp_yes").to_numpy()).all()
    assert grown_mib < 300, f"peak memory grew by {grown_mib:.0f} MiB"
    # the measured length is the model's real input length
    short = engine.prompt_lengths([_caption_prompt(engine, "a cat")])[0]
    assert short == engine._encode([_caption_prompt(engine, "a cat")])["input_ids"].shape[1]


def _caption_prompt(engine, caption):
    from operators.engines.base import Prompt

    return Prompt(user=f'Text: "{caption}" Q: is it?')


def test_hf_micro_batches_are_ordered_by_length(tiny_vlm_dir):
    from operators.engines.base import Prompt
    from operators.engines.hf import HFEngine

    spec = BackboneSpec(name="s", model_id=tiny_vlm_dir, engine="hf", dtype="float32", batch_size=2,
                        yes_spellings=["Yes", "yes"], no_spellings=["No", "no"])
    engine = HFEngine(spec, device="cpu")
    prompts = [Prompt(user="x" * n) for n in (50, 1, 400, 2, 60, 3)]
    batches = list(engine._batches(prompts))
    assert batches == [[1, 3], [5, 0], [4, 2]]  # the longest is padded only against the next longest
    # order does not change answers: each prompt's result lands at its own index
    together = engine.score_yes_no(prompts)
    alone = np.concatenate([engine.score_yes_no([p]) for p in prompts])
    np.testing.assert_allclose(together, alone, atol=1e-4)


def test_a_50kb_caption_through_the_answers_stage_on_ray_is_one_error_row(ray_session, tmp_path, tiny_vlm_dir):
    """The same accident on the real path (Ray actor, tiny hf model): the stage completes."""
    spec = BackboneSpec(name="s", model_id=tiny_vlm_dir, engine="hf", dtype="float32", batch_size=16,
                        yes_spellings=["Yes", "yes"], no_spellings=["No", "no"])
    batch = caption_requests(6)
    captions = batch.column("caption").to_pylist()
    captions[4] = ("a small red cube beside a large blue sphere, " * 1200)[:50_000]
    batch = batch.set_column(batch.schema.get_field_index("caption"), "caption", pa.array(captions))
    store = PartStore(str(tmp_path), schema.ANSWERS)
    report = run_engine_stage(
        stage="answers", unit="s", requests=batch, store=store, worker_cls=AnswerWorker,
        worker_kwargs={"backbone": spec, "templates": TEMPLATES, "store_url": store.url},
        pool=ActorPool(size=1, num_cpus=1, rows_per_batch=6),
    )
    assert [(e["key"], e["reason"]) for e in report.errors.to_pylist()] == [("k004", "prompt_too_long")]
    assert sorted(store.keys().to_pylist()) == ["k000", "k001", "k002", "k003", "k005"]
