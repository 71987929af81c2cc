"""A model-free engine: deterministic answers at zero cost, for pipeline tests and benchmarks.

Without rules, a prompt's yes-logit is drawn from a stable hash of (seed, image_id,
system, user), so answers differ between prompts but never between runs or machines.
`engine_options` can script semantics:

    answers:     [{contains: "red", image_id: "ab12...", p_yes: 0.9}, ...]  # first match wins
    generations: [{contains: "questions", text: "1. Is there a cat?"}, ...]  # first match wins
    seed:        0
    crash_on:    "POISON"   # tests only: a call holding a prompt with this text kills the process
    crash_how:   exit       # exit (os._exit(3)) or kill (SIGKILL, as the kernel's OOM killer does)

Prompt length is counted in whitespace-separated words; `max_prompt_tokens` of the backbone
sets the limit (none by default).
"""
from __future__ import annotations

import math
import os
import signal
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
        self.crash_on = options.get("crash_on")
        self.crash_how = options.get("crash_how", "exit")
        if self.crash_how not in ("exit", "kill"):
            raise ValueError("scripted engine: engine_options.crash_how must be 'exit' or 'kill'")
        self.max_prompt_tokens = spec.max_prompt_tokens
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

    def prompt_lengths(self, prompts: Sequence[Prompt]) -> list[int]:
        return [len(f"{p.system or ''} {p.user}".split()) + (p.image is not None) for p in prompts]

    def _maybe_crash(self, prompts: Sequence[Prompt]) -> None:
        """Die like a worker hit by a segfault or the OOM killer: no exception, no cleanup."""
        if self.crash_on and any(self.crash_on in p.user for p in prompts):
            if self.crash_how == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            os._exit(3)

    def score_yes_no(self, prompts: Sequence[Prompt]) -> np.ndarray:
        self._maybe_crash(prompts)
        self.n_score_calls += 1
        self.n_scored += len(prompts)
        logits = np.array([self.yes_logit(p) for p in prompts], dtype=np.float64)
        return np.stack([log_expit(logits), log_expit(-logits)], axis=1).reshape(len(prompts), 2)

    def generate(self, prompts: Sequence[Prompt], max_new_tokens: int) -> list[str]:
        self._maybe_crash(prompts)
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
