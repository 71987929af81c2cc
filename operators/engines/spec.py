"""What a backbone is: the fields of one `conf/backbones/<name>.yaml`.

It is a plain dataclass so that OmegaConf can use it as a structured config (typos and
wrong types fail at load time, naming the key) while operators stay free of pipeline code.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from operators.hashing import content_key


@dataclass
class BackboneSpec:
    name: str = "???"
    # Hugging Face repo id or local directory; `builtin:tiny-vlm` is built on first use.
    model_id: str = "???"
    # Which engine runs it: a name of operators.engines.ENGINES (hf: transformers, vllm, scripted: no model,
    # world_oracle: the demo world's truth).
    engine: str = "hf"
    revision: str | None = None
    family: str = ""  # qwen3_5, internvl3_5, gemma4, ... (reports group size ladders by it)
    size: str = ""  # "4B", "27B": for size-ladder tables
    dtype: str = "bfloat16"
    tensor_parallel_size: int = 1
    # Images are resized to fit within these pixel counts before the processor sees them.
    max_image_pixels: int = 1_003_520
    min_image_pixels: int = 3_136
    # First-token spellings whose probabilities are summed for each answer.
    yes_spellings: list[str] = field(default_factory=lambda: ["Yes", "yes", " Yes", " yes", "YES"])
    no_spellings: list[str] = field(default_factory=lambda: ["No", "no", " No", " no", "NO"])
    system_prompt: str | None = None
    # Extra keyword arguments for the chat template (e.g. {enable_thinking: false}).
    chat_template_kwargs: dict = field(default_factory=dict)
    # Text appended after the generation prompt (e.g. an empty think block some models expect).
    assistant_prefix: str = ""
    # Prefixes jobs/preflight.py compares by answer mass (e.g. with and without a closed empty
    # thought block); the one with the most mass is recommended. Not part of the answer key.
    assistant_prefix_candidates: list[str] = field(default_factory=list)
    trust_remote_code: bool = False
    max_model_len: int = 8192
    # Longest prompt (tokens, image tokens included) sent to the model; longer requests are
    # error rows `prompt_too_long`. None: the engine's own limit (hf: the model's positions).
    max_prompt_tokens: int | None = None
    gpu_memory_utilization: float = 0.85
    batch_size: int = 32  # requests per engine call
    max_new_tokens: int = 512  # generation budget (questions, claims, judge)
    note: str = ""  # shown in reports, e.g. "random weights: plumbing check only"
    # False for a model trained to answer yes/no only (builtin:micro-vlm): it is refused as a
    # question generator instead of writing text no parser can read. Not part of the answer key.
    writes_questions: bool = True
    # Engine-specific settings (vllm: extra LLM(...) arguments; scripted: seed, canned generations).
    engine_options: dict = field(default_factory=dict)

    def fingerprint(self) -> str:
        """Hash of every field that can change an answer (part of each request key).

        Included: the model and its revision (for an engine that loads no model, the version
        of its answering logic, `operators.engines.engine_revision`), the engine and how it
        reads answers, dtype, pixel limits, spellings, system prompt, chat-template switches,
        assistant prefix and every engine option except those listed in `THROUGHPUT_OPTIONS` (batching, progress,
        memory, process layout), which change speed but not answers.
        """
        from operators.engines import engine_revision  # the package imports this module first

        revision = self.revision
        if self.model_id.startswith("builtin:"):  # built locally: its recipe version is its revision;
            from operators.tiny_models import builtin_revision  # shipped trained weights: their files' hash

            revision = builtin_revision(self.model_id)
        logic = engine_revision(self.engine)  # an engine without a model (the world oracle): its logic's version
        if logic is not None:
            revision = f"{revision}+logic-{logic}" if revision else f"logic-{logic}"
        return content_key(
            self.model_id,
            revision,
            self.engine,
            ANSWER_READING_VERSION,
            self.dtype,
            self.max_image_pixels,
            self.min_image_pixels,
            "|".join(self.yes_spellings),
            "|".join(self.no_spellings),
            self.system_prompt,
            _canonical(self.chat_template_kwargs),
            self.assistant_prefix,
            _canonical(answer_options(self.engine_options)),
        )


# Bump when the way an engine turns a prompt into an answer changes (tokenization, BOS,
# answer-token rules), so answers cached under the old reading are not reused.
# 2: vLLM keeps the template's BOS (no tokenizer BOS); multi-token spellings are not counted;
#    images of 16-bit/float grey, transparent and CMYK modes decode by their full range on white
#    (operators/images.py), so their answers are not reused from the old decoding either.
ANSWER_READING_VERSION = 2

# Engine options that change throughput, memory or process layout but not what is answered.
THROUGHPUT_OPTIONS = frozenset(
    {
        "max_num_seqs", "max_num_batched_tokens", "enable_chunked_prefill", "distributed_executor_backend",
        "enforce_eager", "disable_log_stats", "swap_space", "cpu_offload_gb", "block_size",
        "pipeline_parallel_size", "disable_custom_all_reduce", "max_parallel_loading_workers",
        "compilation_config", "async_scheduling", "show_progress", "progress_bars", "use_tqdm",
        "batch_size", "log_level", "prefix_reuse", "batch_invariant",
    }
)


def answer_options(options: dict) -> dict:
    """The engine options that can change an answer (all but `THROUGHPUT_OPTIONS`)."""
    return {k: v for k, v in (options or {}).items() if k not in THROUGHPUT_OPTIONS}


def _canonical(value) -> str:
    """A stable text form of nested config values (dict order does not matter)."""
    if hasattr(value, "items"):
        return "{" + ",".join(f"{k!r}:{_canonical(v)}" for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_canonical(v) for v in value) + "]"
    return repr(value)
