"""The micro VLM's writing lessons: question sets from a caption, judge verdicts on an image.

Each lesson is one generation request the pipeline sends — a generation template of
conf/prompts filled with a caption (and, for the judge, the scene's image), rendered by the
chat template — followed by what a faithful writer answers (`operators.demo_generations`) and
the end-of-turn token. The loss is the cross-entropy of every answer token (teacher forcing);
the prompt's tokens carry no loss. A share of lessons replaces one caption word with a word the
world does not have, answered by `demo_generations.REFUSAL`.

`exact_share` measures what matters at the end: greedy generation, text compared exactly.

Pure: torch and transformers, no Ray, no pipeline.
"""
from __future__ import annotations

import inspect
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from operators import demo_generations, demo_world
from operators.engines.base import Prompt
from operators.prompts import fill

TEMPLATES = {**demo_generations.QUESTION_TEMPLATES, **{f"judge_{k}": t for k, t in demo_generations.JUDGE_TEMPLATES.items()}}
WRITE_KINDS = tuple(TEMPLATES)  # depict, dsg, claims, judge_holistic, judge_decomposed
_LETTERS = "abcdefghijklmnopqrstuvwxyz"
SHARED_PREFIX_MIN = 16  # tokens: a shorter common opening is not worth a pass of its own
# English words a photo caption has and the world does not (an unseen word need not be made up)
_FOREIGN = ("dog", "cat", "tree", "house", "car", "man", "woman", "ball", "table", "sky", "big", "small",
            "purple", "orange", "hexagon", "oval", "under", "near", "behind", "four", "five", "one", "the")


class ImagePlaceholder:
    """Stands in for an image in a Prompt: the chat template only asks whether there is one."""


@dataclass(frozen=True)
class Lesson:
    kind: str  # one of WRITE_KINDS
    caption: str
    scene: demo_world.Scene | None  # the judge's image; None for question writing
    answer: str


def unseen_word(rng: random.Random) -> str:
    """A word outside the world: an English word it lacks, or letters made up on the spot."""
    if rng.random() < 0.5:
        return rng.choice(_FOREIGN)
    while True:
        word = "".join(rng.choice(_LETTERS) for _ in range(rng.randint(3, 9)))
        if word not in demo_generations.world_words():
            return word


def draw_lesson(sampler: demo_world.WorldSampler, kind: str, open_share: float, refusal_share: float = 0.0,
                clause_weights: Sequence[float] = demo_world.CLAUSE_WEIGHTS, repeat_share: float = 0.0) -> Lesson:
    """One lesson of `kind` on a fresh scene and caption of the sampler's split (captions of 1, 2
    and 3 clauses as often as `clause_weights` say: the world's own mix by default); at least
    `repeat_share` of them name one shape twice (`Caption.repeats_a_shape`), drawn again until
    they do (default 0: the world's own draws, unchanged)."""
    scene = sampler.scene()
    caption = sampler.caption(scene, clause_weights=clause_weights)
    if repeat_share and sampler.rng.random() < repeat_share:
        while not caption.repeats_a_shape:
            scene = sampler.scene()
            caption = sampler.caption(scene, clause_weights=clause_weights)
    image = scene if kind.startswith("judge_") else None
    if refusal_share and sampler.rng.random() < refusal_share:
        words = caption.text.split()
        words[sampler.rng.randrange(len(words))] = unseen_word(sampler.rng)
        return Lesson(kind, " ".join(words), image, demo_generations.REFUSAL)
    if kind.startswith("judge_"):
        answer = demo_generations.judge_text(caption, scene, kind.removeprefix("judge_"))
    else:
        answer = demo_generations.question_text(caption, kind, open_share)
    return Lesson(kind, caption.text, image, answer)


def prompt_text(processor, templates: Mapping[str, str], lesson: Lesson) -> str:
    """What the model reads before it writes, exactly as the generation stages render it."""
    from operators.engines.yesno import render_prompt

    user = fill(templates[TEMPLATES[lesson.kind]], caption=lesson.caption)
    return render_prompt(processor, Prompt(user=user, image=ImagePlaceholder() if lesson.scene is not None else None))


class LessonEncoder:
    """Lessons -> right-padded inputs with labels on the answer tokens only."""

    def __init__(self, processor, templates: Mapping[str, str], pixels, image_tokens: int):
        self.processor, self.templates, self.pixels, self.image_tokens = processor, dict(templates), pixels, image_tokens
        tok = processor.tokenizer
        self.pad = tok.convert_tokens_to_ids("<|endoftext|>")
        self.end = tok.convert_tokens_to_ids("<|im_end|>")
        self.image_token = tok.convert_tokens_to_ids("<|image_pad|>")

    def prompt_ids(self, lesson: Lesson) -> list[int]:
        ids = self.processor.tokenizer(prompt_text(self.processor, self.templates, lesson), add_special_tokens=False)["input_ids"]
        return [j for i in ids for j in ([i] * self.image_tokens if i == self.image_token else [i])]

    def answer_ids(self, lesson: Lesson) -> list[int]:
        return self.processor.tokenizer(lesson.answer, add_special_tokens=False)["input_ids"] + [self.end]

    def batch(self, lessons: Sequence[Lesson], skip: int = 0, prompts: Sequence[list[int]] | None = None) -> dict:
        """`skip`: leave out each prompt's first tokens (a prefix the caller runs once for all rows);
        `prompts`: the lessons' `prompt_ids`, when the caller has them already."""
        import torch

        prompts = [self.prompt_ids(x) for x in lessons] if prompts is None else prompts
        rows = [(p[skip:], self.answer_ids(x)) for p, x in zip(prompts, lessons, strict=True)]
        width = max(len(p) + len(a) for p, a in rows)
        ids, labels, mask = [], [], []
        for p, a in rows:
            pad = width - len(p) - len(a)
            ids.append(p + a + [self.pad] * pad)
            labels.append([-100] * len(p) + a + [-100] * pad)
            mask.append([1] * (len(p) + len(a)) + [0] * pad)
        input_ids = torch.tensor(ids)
        out = {"input_ids": input_ids, "attention_mask": torch.tensor(mask), "mm_token_type_ids": (input_ids == self.image_token).int()}
        scenes = [x.scene for x in lessons if x.scene is not None]
        if scenes:
            out["pixel_values"], out["image_grid_thw"] = self.pixels.pixel_values(scenes)
        return {"inputs": out, "labels": torch.tensor(labels)}


def shared_length(prompts: Sequence[Sequence[int]]) -> int:
    """How many opening tokens every prompt has in common, leaving each at least its last token
    (whose logits predict the answer's first token)."""
    first, n = prompts[0], min(len(p) for p in prompts) - 1
    return next((i for i in range(n) if any(p[i] != first[i] for p in prompts)), n)


def lesson_loss(model, encoder: LessonEncoder, lessons: Sequence[Lesson]):
    """Mean cross-entropy over the answer tokens of the batch (each next token from its prefix).

    Question-writing prompts are the template's instructions with the caption last, so lessons
    without an image share most of their prompt (about 230 of 280 tokens). That opening goes
    through the model once, its keys and values are repeated for every row and each row runs
    only the rest: the same loss and gradients as one full pass per row
    (tests/test_micro_vlm_writing.py), about five times cheaper. Judge lessons open with their
    own image and take the full pass."""
    import torch
    import torch.nn.functional as F

    prompts = [encoder.prompt_ids(x) for x in lessons]
    shared = shared_length(prompts) if all(x.scene is None for x in lessons) else 0
    if shared < SHARED_PREFIX_MIN:
        b = encoder.batch(lessons, prompts=prompts)
        logits = model(**b["inputs"]).logits[:, :-1].float()
    else:
        opening = torch.tensor([prompts[0][:shared]])
        first = model(input_ids=opening, use_cache=True)
        cache = first.cache if hasattr(first, "cache") else first.past_key_values
        cache.batch_repeat_interleave(len(lessons))
        b = encoder.batch(lessons, skip=shared, prompts=prompts)
        ids, rest = b["inputs"]["input_ids"], b["inputs"]["attention_mask"]
        mask = torch.cat([torch.ones(len(lessons), shared, dtype=rest.dtype), rest], dim=1)
        at = torch.arange(shared, shared + ids.shape[1])
        # positions given outright: text only, they go on from the opening (a multimodal model
        # would otherwise derive them from the rope offsets its last image batch left behind)
        name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        logits = model(input_ids=ids, attention_mask=mask, position_ids=at.expand(len(lessons), -1), cache_position=at,
                       **{name: cache}).logits[:, :-1].float()
    labels = b["labels"][:, 1:]
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100)


def generate(model, encoder: LessonEncoder, lessons: Sequence[Lesson], max_new_tokens: int = 900) -> list[str]:
    """Greedy answers, one lesson at a time (no padding to reason about)."""
    import torch

    texts = []
    with torch.inference_mode():
        for lesson in lessons:
            b = encoder.batch([Lesson(lesson.kind, lesson.caption, lesson.scene, "")])
            inputs = {k: v[:, :-1] if k in ("input_ids", "attention_mask", "mm_token_type_ids") else v for k, v in b["inputs"].items()}
            out = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=encoder.end,
                                 pad_token_id=encoder.pad)
            texts.append(encoder.processor.tokenizer.decode(out[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True))
    return texts


def exact_share(model, encoder: LessonEncoder, lessons: Sequence[Lesson]) -> dict[str, float]:
    """Per kind, the share of lessons whose greedy answer is exactly the faithful one."""
    by_kind: dict[str, list[bool]] = {}
    for lesson, text in zip(lessons, generate(model, encoder, lessons)):
        by_kind.setdefault(lesson.kind, []).append(text == lesson.answer)
    return {f"write_{k}": round(sum(v) / len(v), 3) for k, v in by_kind.items()}
