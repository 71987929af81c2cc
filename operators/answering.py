"""Turn a batch of request rows into engine prompts, answers and error rows.

This is the model-agnostic heart of the answer and generation stages: it loads each image
once per batch, fills the right template for each request kind, calls the engine, and
isolates failures so that one bad image or one bad prompt never sinks its batch.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np
import pyarrow as pa

from operators import schema
from operators.engines.base import Engine, Prompt
from operators.engines.yesno import answer_mass
from operators.prefetch import ImageCache, chunks, micro_batch_size, pipelined, rows_of, table_of
from operators.prompts import fill

# request kind -> (template name, placeholder the request text fills)
ANSWER_TEMPLATES = {
    "image": ("answer_image", "question"),
    "caption": ("answer_caption", "question"),
    "holistic": ("holistic", "caption"),
    "claim": ("claim", "claim"),
}
# generation kind -> template name (the caption fills {caption})
GENERATION_TEMPLATES = {
    "questions": "generate_questions",
    "dsg": "generate_dsg",
    "claims": "generate_claims",
}

ImageLoader = Callable[[str], object]  # uri -> PIL image; raises on a bad image


def _error_rows(rows: list[dict], stage: str) -> pa.Table:
    return schema.conform(pa.Table.from_pylist(rows), schema.ERRORS, what="errors") if rows else schema.ERRORS.empty_table()


def answer_prompt(kind: str, row: Mapping, templates: Mapping[str, str], image, system: str | None) -> Prompt:
    """The engine prompt of one yes/no request (row: text, and caption for caption-only kinds)."""
    template_name, field = ANSWER_TEMPLATES[kind]
    values = {field: row["text"]}
    if kind == "caption":
        values["caption"] = row["caption"]
    return Prompt(user=fill(templates[template_name], **values), image=image, image_id=row.get("image_hash"), system=system)


def _image_problem(row: Mapping, failures: Mapping[str, str], stage: str) -> dict | None:
    """The error row of a request whose image is missing or unreadable (None when it is fine)."""
    h = row.get("image_hash")
    if h is None:
        return {"stage": stage, "key": row["key"], "field": "image_hash", "reason": "missing_image", "detail": f"{row['kind']} request without an image"}
    if h in failures:
        return {"stage": stage, "key": row["key"], "source": row.get("image_uri"), "field": "image_uri", "reason": "unreadable_image", "detail": failures[h]}
    return None


def _drop_too_long(engine: Engine, prompts: list, rows: list[dict], errors: list[dict], stage: str) -> tuple[list, list[dict]]:
    """Refuse prompts longer than the engine's limit before any model work: each becomes an
    error row `prompt_too_long` (one over-long prompt would otherwise pad a whole batch past
    the model's positions and exhaust the worker's memory)."""
    limit = getattr(engine, "max_prompt_tokens", None)
    measure = getattr(engine, "prompt_lengths", None)
    if not prompts or limit is None or measure is None:
        return prompts, rows
    try:
        lengths = measure(prompts)
    except Exception:  # measure one by one; a prompt that cannot be measured goes to the engine,
        lengths = [_length_or_zero(measure, p) for p in prompts]  # which isolates its failure
    kept_prompts, kept_rows = [], []
    for prompt, row, n in zip(prompts, rows, lengths, strict=True):
        if n > limit:
            errors.append({"stage": stage, "key": row["key"], "source": row.get("backbone"), "field": "text", "reason": "prompt_too_long", "detail": f"{n} prompt tokens > max_prompt_tokens {limit} (backbone {row.get('backbone')!r})"})
        else:
            kept_prompts.append(prompt)
            kept_rows.append(row)
    return kept_prompts, kept_rows


def _length_or_zero(measure: Callable[[list], list[int]], prompt) -> int:
    try:
        return measure([prompt])[0]
    except Exception:
        return 0


def _call_isolated(call: Callable[[list], list], prompts: list, rows: list[dict], errors: list[dict], stage: str, backbone: str):
    """Call the engine on the whole batch; if that fails, retry one by one so that only the
    prompts that really fail become error rows. Returns (results, ok flags)."""
    try:
        results = list(call(prompts))
        if len(results) != len(prompts):
            raise RuntimeError(f"engine returned {len(results)} results for {len(prompts)} prompts")
        return results, [True] * len(prompts)
    except Exception as exc:
        if len(prompts) == 1:
            detail = f"{type(exc).__name__}: {exc}"[:2000]
            errors.append({"stage": stage, "key": rows[0]["key"], "source": backbone, "reason": "engine_error", "detail": detail})
            return [None], [False]
    results, ok = [], []
    for prompt, row in zip(prompts, rows):
        r, o = _call_isolated(call, [prompt], [row], errors, stage, backbone)
        results += r
        ok += o
    return results, ok


def answer_batch(
    engine: Engine,
    batch: pa.Table,
    templates: Mapping[str, str],
    load_image: ImageLoader,
    *,
    system: str | None = None,
    micro_batch: int | None = None,
) -> tuple[pa.Table, pa.Table]:
    """Answer a batch of requests (operators.schema.REQUESTS rows).

    Returns (answers, errors): answers has operators.schema.ANSWERS rows for every request
    that was answered; every other request has exactly one row in errors. The engine is
    called per micro-batch (`micro_batch` rows, default operators.prefetch.micro_batch_size)
    while the next micro-batch's images decode in the background.
    """
    rows = rows_of(batch)
    errors: list[dict] = []
    answered: list[dict] = []
    # Micro-batches: the images of the next one decode in a thread while the engine runs this one.
    cache = ImageCache(load_image)
    pipelined(
        chunks(rows, micro_batch_size(engine, micro_batch)),
        lambda chunk: cache.load(r for r in chunk if r["kind"] != "caption"),
        lambda chunk, loaded: _answer_chunk(engine, chunk, *loaded, templates, system, errors, answered),
    )
    return table_of(answered, schema.ANSWERS), _error_rows(errors, "answers")


def _answer_chunk(engine: Engine, rows: list[dict], images: Mapping, failures: Mapping, templates: Mapping[str, str], system: str | None, errors: list[dict], answered: list[dict]) -> None:
    """Answer one micro-batch whose images are decoded; appends to `answered` and `errors`."""
    todo_rows, prompts = [], []
    for row in rows:
        problem = None if row["kind"] == "caption" else _image_problem(row, failures, "answers")
        if problem:
            errors.append(problem)
            continue
        try:
            image = None if row["kind"] == "caption" else images[row["image_hash"]]
            prompts.append(answer_prompt(row["kind"], row, templates, image, system))
        except (KeyError, TypeError) as exc:
            errors.append({"stage": "answers", "key": row["key"], "field": "text", "reason": "bad_request", "detail": str(exc)})
            continue
        todo_rows.append(row)

    prompts, todo_rows = _drop_too_long(engine, prompts, todo_rows, errors, "answers")
    if prompts:
        backbone = rows[0]["backbone"]

        def call(ps):
            return list(np.asarray(engine.score_yes_no(ps), dtype=np.float64))

        results, ok = _call_isolated(call, prompts, todo_rows, errors, "answers", backbone)
        for row, result, good in zip(todo_rows, results, ok):
            if good:
                logp_yes, logp_no = float(result[0]), float(result[1])
                answered.append({
                    "key": row["key"], "backbone": row["backbone"], "kind": row["kind"], "logp_yes": logp_yes,
                    "logp_no": logp_no, "answer_mass": float(answer_mass(logp_yes, logp_no)),
                })


def generate_batch(
    engine: Engine,
    batch: pa.Table,
    templates: Mapping[str, str],
    *,
    max_new_tokens: int,
    system: str | None = None,
) -> tuple[pa.Table, pa.Table]:
    """Greedy generations for rows with columns key, backbone, kind (questions|dsg|claims), caption."""
    rows = batch.to_pylist()
    prompts = [Prompt(user=fill(templates[GENERATION_TEMPLATES[r["kind"]]], caption=r["caption"]), system=system) for r in rows]
    errors: list[dict] = []
    generations = _generate(engine, prompts, rows, errors, "questions", max_new_tokens)
    return generations, _error_rows(errors, "questions")


def _generate(engine: Engine, prompts: list[Prompt], rows: list[dict], errors: list[dict], stage: str, max_new_tokens: int) -> pa.Table:
    """Greedy generations for `prompts` (one per row) as GENERATIONS rows; failures go to `errors`."""
    out = []
    prompts, rows = _drop_too_long(engine, prompts, rows, errors, stage)
    if prompts:
        results, ok = _call_isolated(lambda ps: engine.generate(ps, max_new_tokens), prompts, rows, errors, stage, rows[0]["backbone"])
        for row, text, good in zip(rows, results, ok):
            if good:
                out.append({"key": row["key"], "backbone": row["backbone"], "kind": row["kind"], "text": text})
    return pa.Table.from_pylist(out, schema=schema.GENERATIONS) if out else schema.GENERATIONS.empty_table()


# image generation kind -> template name (the caption fills {caption}; the image is shown first)
IMAGE_GENERATION_TEMPLATES = {
    "judge_holistic": "judge_holistic",
    "judge_decomposed": "judge_decomposed",
}


def generate_image_batch(
    engine: Engine,
    batch: pa.Table,
    templates: Mapping[str, str],
    load_image: ImageLoader,
    *,
    max_new_tokens: int,
    system: str | None = None,
    stage: str = "judge",
) -> tuple[pa.Table, pa.Table]:
    """Greedy generations that look at an image (VLM-as-judge).

    Rows have key, backbone, kind (a key of IMAGE_GENERATION_TEMPLATES), image_hash,
    image_uri and caption. Each image is decoded once per batch; an unreadable image or a
    failing prompt is one error row, and the rest of the batch is still generated.
    """
    rows = rows_of(batch)
    images, failures = ImageCache(load_image).load(rows)
    errors: list[dict] = []
    todo_rows, prompts = [], []
    for row in rows:
        problem = _image_problem(row, failures, stage)
        if problem:
            errors.append(problem)
            continue
        try:
            user = fill(templates[IMAGE_GENERATION_TEMPLATES[row["kind"]]], caption=row["caption"])
        except (KeyError, TypeError) as exc:
            errors.append({"stage": stage, "key": row["key"], "field": "kind", "reason": "bad_request", "detail": str(exc)})
            continue
        prompts.append(Prompt(user=user, image=images[row["image_hash"]], image_id=row["image_hash"], system=system))
        todo_rows.append(row)
    generations = _generate(engine, prompts, todo_rows, errors, stage, max_new_tokens)
    return generations, _error_rows(errors, stage)
