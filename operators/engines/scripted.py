"""A model-free engine: deterministic answers at zero cost, for pipeline tests and benchmarks.

Without rules, a prompt's yes-logit is drawn from a stable hash of (seed, image_id,
system, user), so answers differ between prompts but never between runs or machines.
`engine_options` can script semantics:

    answers:     [{contains: "red", image_id: "ab12...", p_yes: 0.9}, ...]  # first match wins
    generations: [{contains: "questions", text: "1. Is there a cat?"}, ...]  # first match wins
    seed:        0
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
from scipy.special import log_expit

from operators.engines.base import Prompt
from operators.engines.spec import BackboneSpec
from operators.hashing import content_key

LOGIT_RANGE = 4.0  # hashed logits are uniform in [-4, 4]: p_yes between ~0.02 and ~0.98


def _rules(options: Mapping, name: str, value_field: str) -> list[dict]:
    rules = [dict(rule) for rule in options.get(name) or []]
    for k, rule in enumerate(rules):
        if "contains" not in rule or value_field not in rule:
            raise ValueError(f"scripted engine: engine_options.{name}[{k}] needs 'contains' and '{value_field}'")
    return rules


class ScriptedEngine:
    def __init__(self, spec: BackboneSpec):
        self.spec = spec
        options = spec.engine_options or {}
        self.seed = int(options.get("seed", 0))
        self.answers = _rules(options, "answers", "p_yes")
        for k, rule in enumerate(self.answers):
            if not 0.0 <= float(rule["p_yes"]) <= 1.0:
                raise ValueError(f"scripted engine: engine_options.answers[{k}].p_yes must be in [0, 1]")
        self.generations = _rules(options, "generations", "text")
        self.n_scored = 0  # prompts scored
        self.n_generated = 0  # prompts generated for
        self.n_score_calls = 0
        self.n_generate_calls = 0

    def yes_logit(self, prompt: Prompt) -> float:
        """The logit log(p_yes / p_no) this engine answers with."""
        for rule in self.answers:
            if rule["contains"] in prompt.user and rule.get("image_id") in (None, prompt.image_id):
                p = float(rule["p_yes"])
                return math.inf if p == 1.0 else -math.inf if p == 0.0 else math.log(p / (1.0 - p))
        digest = content_key(self.seed, prompt.image_id, prompt.system, prompt.user)
        unit = int(digest[:13], 16) / float(16**13)  # 52 bits: exact in a float64
        return (2.0 * unit - 1.0) * LOGIT_RANGE

    def score_yes_no(self, prompts: Sequence[Prompt]) -> np.ndarray:
        self.n_score_calls += 1
        self.n_scored += len(prompts)
        logits = np.array([self.yes_logit(p) for p in prompts], dtype=np.float64)
        return np.stack([log_expit(logits), log_expit(-logits)], axis=1).reshape(len(prompts), 2)

    def generate(self, prompts: Sequence[Prompt], max_new_tokens: int) -> list[str]:
        self.n_generate_calls += 1
        self.n_generated += len(prompts)
        return [self._generation(p) for p in prompts]

    def close(self) -> None:
        pass

    def _generation(self, prompt: Prompt) -> str:
        for rule in self.generations:
            if rule["contains"] in prompt.user:
                return str(rule["text"])
        raise ValueError(
            f"scripted engine {self.spec.name!r}: no engine_options.generations rule matches "
            f"the prompt {prompt.user[:80]!r}"
        )
