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
    # Which engine runs it: hf (transformers), vllm, scripted (deterministic, no model).
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
    trust_remote_code: bool = False
    max_model_len: int = 8192
    # Longest prompt (tokens, image tokens included) sent to the model; longer requests are
    # error rows `prompt_too_long`. None: the engine's own limit (hf: the model's positions).
    max_prompt_tokens: int | None = None
    gpu_memory_utilization: float = 0.85
    batch_size: int = 32  # requests per engine call
    max_new_tokens: int = 512  # generation budget (questions, claims, judge)
    note: str = ""  # shown in reports, e.g. "random weights: plumbing check only"
    # Engine-specific settings (vllm: extra LLM(...) arguments; scripted: seed, canned generations).
    engine_options: dict = field(default_factory=dict)

    def fingerprint(self) -> str:
        """Hash of every field that can change an answer (part of each request key)."""
        revision = self.revision
        if self.model_id.startswith("builtin:"):  # built locally: its recipe version is its revision
            from operators.tiny_models import RECIPE_VERSION

            revision = f"recipe-{RECIPE_VERSION}"
        return content_key(
            self.model_id,
            revision,
            self.dtype,
            self.max_image_pixels,
            self.min_image_pixels,
            "|".join(self.yes_spellings),
            "|".join(self.no_spellings),
            self.system_prompt,
            repr(sorted(self.chat_template_kwargs.items())),
            self.assistant_prefix,
            # A scripted engine's options ARE its answers; a real engine's options (batching,
            # memory) do not change what it answers, so they stay out of the key.
            repr(sorted(self.engine_options.items())) if self.engine == "scripted" else None,
        )
