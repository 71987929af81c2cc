"""The one interface every model engine offers: yes/no log-probabilities and greedy text."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np

if TYPE_CHECKING:
    from PIL import Image


@dataclass(frozen=True)
class Prompt:
    """One request to a VLM: optional image first, then the user text."""

    user: str
    image: Image.Image | None = None
    image_id: str | None = None  # stable content hash: prefix-cache key / multimodal uuid
    system: str | None = None


class Engine(Protocol):
    def score_yes_no(self, prompts: Sequence[Prompt]) -> np.ndarray:
        """(n, 2) float64 array of raw log-probabilities: [:, 0] yes, [:, 1] no."""
        ...

    def generate(self, prompts: Sequence[Prompt], max_new_tokens: int) -> list[str]:
        """Greedy (temperature 0) completions, one per prompt."""
        ...

    def close(self) -> None: ...


class LengthAware(Protocol):
    """Optional: engines that can measure prompts let the answering layer refuse, before any
    model work, prompts longer than the model can take (`operators.answering`)."""

    max_prompt_tokens: int | None  # None: no limit known

    def prompt_lengths(self, prompts: Sequence[Prompt]) -> list[int]:
        """Tokens each prompt occupies in the model's input, image tokens included."""
        ...


class TemplateAware(Protocol):
    """Optional: an engine that reads a request back out of its prompt text (the world oracle,
    which answers from the demo world's truth) is told the templates that filled it, since the
    text alone does not say which template made it (`operators.answering.tell_templates`)."""

    def use_templates(self, templates: Mapping[str, str]) -> None: ...
