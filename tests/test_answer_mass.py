"""Answer mass (stored per answer, summarised per backbone and kind), answer keys, spellings."""
from __future__ import annotations

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from operators import answer_mass, schema
from operators.answering import answer_batch
from operators.engines.scripted import ScriptedEngine
from operators.engines.spec import BackboneSpec
from operators.engines.yesno import answer_token_ids, multi_token_spellings, yes_no_token_ids
from pipeline.store.parts import PartStore

# --- answer keys -------------------------------------------------------------------------

BASE = dict(name="b", model_id="org/model", engine="vllm", engine_options={"max_num_seqs": 64})


@pytest.mark.parametrize("change", [
    {"engine": "hf"},
    {"dtype": "float16"},
    {"max_image_pixels": 500_000},
    {"min_image_pixels": 1024},
    {"assistant_prefix": "<|channel>thought\n<channel|>"},
    {"chat_template_kwargs": {"enable_thinking": True}},
    {"engine_options": {"max_num_seqs": 64, "quantization": "fp8"}},
    {"engine_options": {"max_num_seqs": 64, "kv_cache_dtype": "fp8"}},
    {"engine_options": {"max_num_seqs": 64, "mm_processor_kwargs": {"do_pan_and_scan": True}}},
    {"engine_options": {"max_num_seqs": 64, "cpu_dtype": "bfloat16"}},
    {"engine_options": {"max_num_seqs": 64, "hf_overrides": {"rope_scaling": None}}},
])
def test_answer_affecting_settings_change_the_key(change):
    assert BackboneSpec(**(BASE | change)).fingerprint() != BackboneSpec(**BASE).fingerprint()


@pytest.mark.parametrize("change", [
    {"batch_size": 8},
    {"tensor_parallel_size": 4},
    {"gpu_memory_utilization": 0.5},
    {"max_new_tokens": 64},
    {"note": "x"},
    {"engine_options": {"max_num_seqs": 8}},
    {"engine_options": {"max_num_seqs": 64, "enforce_eager": True, "disable_log_stats": False}},
    {"engine_options": {"max_num_seqs": 64, "distributed_executor_backend": "mp", "max_num_batched_tokens": 4096}},
])
def test_progress_batching_and_memory_settings_keep_the_key(change):
    assert BackboneSpec(**(BASE | change)).fingerprint() == BackboneSpec(**BASE).fingerprint()


def test_option_order_does_not_matter():
    a = BackboneSpec(**(BASE | {"engine_options": {"quantization": "fp8", "kv_cache_dtype": "fp8"}}))
    b = BackboneSpec(**(BASE | {"engine_options": {"kv_cache_dtype": "fp8", "quantization": "fp8"}}))
    assert a.fingerprint() == b.fingerprint()


# --- answer mass -------------------------------------------------------------------------

class FixedEngine:
    """Answers every prompt with the same raw log-probabilities."""

    def __init__(self, p_yes: float, p_no: float):
        self.row = np.log([p_yes, p_no])

    def score_yes_no(self, prompts):
        return np.tile(self.row, (len(prompts), 1))


def _requests(kinds: list[str]) -> pa.Table:
    rows = [{"key": f"k{i}", "backbone": "b", "kind": kind, "prompt_id": "v1", "image_hash": None, "image_uri": None,
             "caption": "a cat", "text": "Is there a cat?"} for i, kind in enumerate(kinds)]
    return pa.Table.from_pylist(rows, schema=schema.REQUESTS)


TEMPLATES = {"answer_caption": "{caption} {question}", "answer_image": "{question}", "holistic": "{caption}", "claim": "{claim}"}


def test_every_answer_stores_its_mass():
    answers, errors = answer_batch(FixedEngine(0.3, 0.2), _requests(["caption", "caption"]), TEMPLATES, load_image=None)
    assert errors.num_rows == 0
    assert answers.schema == schema.ANSWERS
    assert answers.column("answer_mass").to_pylist() == pytest.approx([0.5, 0.5])


def test_scripted_answers_have_full_mass():
    engine = ScriptedEngine(BackboneSpec(name="s", model_id="none", engine="scripted"))
    answers, _ = answer_batch(engine, _requests(["caption"] * 5), TEMPLATES, load_image=None)
    assert answers.column("answer_mass").to_pylist() == pytest.approx([1.0] * 5)


def test_old_parts_without_the_column_still_read_with_null_mass(tmp_path):
    old = pa.table({"key": ["a", "b"], "backbone": ["x", "x"], "kind": ["image", "caption"], "logp_yes": [-0.1, -1.0], "logp_no": [-2.5, -0.7]})
    pq.write_table(old, tmp_path / "part-old.parquet")
    store = PartStore(str(tmp_path), schema.ANSWERS)
    store.write(pa.table({"key": ["c"], "backbone": ["x"], "kind": ["image"], "logp_yes": [-0.2], "logp_no": [-1.8], "answer_mass": [0.9]}))
    table = store.read().sort_by("key")
    assert table.schema == schema.ANSWERS
    assert table.column("answer_mass").to_pylist() == [None, None, 0.9]
    assert schema.conform(old, schema.ANSWERS).column("answer_mass").null_count == 2


def test_summary_and_warning_per_kind():
    frame = pl.DataFrame({
        "kind": ["image"] * 20 + ["caption"] * 20 + ["holistic"],
        "answer_mass": [0.99] * 20 + list(np.linspace(0.01, 0.4, 20)) + [None],
    })
    summary = answer_mass.summarize(frame)
    assert summary["kind"].to_list() == ["caption", "image"]  # a null mass is not counted
    caption = summary.row(0, named=True)
    assert caption["n"] == 20 and caption["median"] == pytest.approx(0.205) and caption["p5"] == pytest.approx(np.quantile(np.linspace(0.01, 0.4, 20), 0.05))
    lines = answer_mass.summary_lines("qwen", summary)
    assert "LOW" in lines[0] and "LOW" not in lines[1]
    assert lines[-1].startswith("WARNING: qwen: low answer mass for caption") and "BOS" in lines[-1] and "template" in lines[-1]
    healthy = answer_mass.summary_lines("qwen", answer_mass.summarize(frame.filter(pl.col("kind") == "image")))
    assert len(healthy) == 1 and "WARNING" not in healthy[0]


# --- spellings ---------------------------------------------------------------------------

class PieceTokenizer:
    """Whole words from a small vocabulary are one token; anything else splits into characters."""

    vocab = {"Yes": 1, "No": 2, "yes": 3, "no": 4, "Y": 5, "E": 6, "S": 7, "N": 8, "O": 9}

    def encode(self, text, add_special_tokens=False):
        return [self.vocab[text]] if text in self.vocab else [self.vocab.get(c, 99) for c in text]

    def convert_ids_to_tokens(self, ids):
        inverse = {v: k for k, v in self.vocab.items()}
        return [inverse.get(i, "?") for i in ids] if isinstance(ids, list) else inverse.get(ids, "?")


def test_multi_token_spellings_are_not_counted_by_their_first_piece():
    tok = PieceTokenizer()
    # "YES" is Y+E+S: its first piece "Y" also starts "Yellow"; counting it was the old bug.
    assert answer_token_ids(tok, ["Yes", "yes", "YES"]) == [1, 3]
    assert multi_token_spellings(tok, ["Yes", "YES", "NO"]) == {"YES": ["Y", "E", "S"], "NO": ["N", "O"]}
    assert yes_no_token_ids(tok, ["Yes", "YES"], ["No", "NO"]) == ([1], [2])
    with pytest.raises(ValueError, match="none of the answer spellings"):
        answer_token_ids(tok, ["YES"])


def test_run_summary_reports_mass_per_backbone_and_kind(tmp_path):
    from pipeline.config import load_config
    from pipeline.stages.answers import AnswerReport
    from pipeline.sweep import RunResult, summary_text

    cfg = load_config([f"root={tmp_path}"])
    masses = pl.DataFrame({"kind": ["image"] * 10 + ["caption"] * 10, "answer_mass": [0.99] * 10 + [0.02] * 10})
    report = AnswerReport(stage="answers", unit="smoke", needed=20, cached=0, sent=20, answer_mass=answer_mass.summarize(masses))
    text = summary_text(cfg, RunResult(run_dir=str(tmp_path), reports=[report]))
    assert "answer mass smoke            caption   n=10      median 0.020  p5 0.020  LOW" in text
    assert "answer mass smoke            image     n=10      median 0.990  p5 0.990\n" in text
    assert "WARNING: smoke: low answer mass for caption" in text
