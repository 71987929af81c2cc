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
from operators.prefetch import ImageCache, micro_batch_size, pipelined, rows_of
from operators.prompts import fill, fill_column

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

ImageLoader = Callable[[str, str], object]  # (uri, image hash) -> PIL image; raises on a bad image (operators.images.load_image)


def _error_rows(rows: list[dict], stage: str) -> pa.Table:
    """ERRORS rows; built against the schema, since columns inferred from the first row alone
    would drop a later row's `source` or `field` when the first row has none."""
    return pa.Table.from_pylist(rows, schema=schema.ERRORS) if rows else schema.ERRORS.empty_table()


def answer_prompt(kind: str, row: Mapping, templates: Mapping[str, str], image, system: str | None) -> Prompt:
    """The engine prompt of one yes/no request (row: text, and caption for caption-only kinds).

    `answer_batch` builds the same text for whole columns (`answer_texts`)."""
    template_name, field = ANSWER_TEMPLATES[kind]
    values = {field: row["text"]}
    if kind == "caption":
        values["caption"] = row["caption"]
    return Prompt(user=fill(templates[template_name], **values), image=image, image_id=row.get("image_hash"), system=system)


def tell_templates(engine: Engine, templates: Mapping[str, str]) -> None:
    """Hand the templates that fill the prompts to an engine that reads requests back from the
    prompt text (`TemplateAware`: the world oracle); other engines need nothing."""
    use = getattr(engine, "use_templates", None)
    if use is not None:
        use(templates)


def answer_texts(kinds: list, columns: Mapping[str, list], templates: Mapping[str, str]) -> tuple[list, dict[int, str]]:
    """The user text of every request, filled per kind over whole columns (`fill_column`).

    `columns` holds the request's `text` and `caption` lists. Returns (texts, problems): a
    request whose prompt cannot be built (unknown kind, missing template or placeholder,
    missing column) has None as its text and the reason, by row index, in `problems`,
    worded as `answer_prompt` would raise it.
    """
    texts: list = [None] * len(kinds)
    problems: dict[int, str] = {}
    by_kind: dict[object, list[int]] = {}
    for i, kind in enumerate(kinds):
        by_kind.setdefault(kind, []).append(i)
    for kind, where in by_kind.items():
        try:
            template_name, field = ANSWER_TEMPLATES[kind]
            needed = {field: "text"} | ({"caption": "caption"} if kind == "caption" else {})
            for name in needed.values():
                if columns.get(name) is None:
                    raise KeyError(name)
            values = {placeholder: [columns[name][i] for i in where] for placeholder, name in needed.items()}
            filled = fill_column(templates[template_name], values)
        except (KeyError, TypeError) as exc:
            problems.update(dict.fromkeys(where, str(exc)))
            continue
        for i, text in zip(where, filled, strict=True):
            texts[i] = text
    return texts, problems


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
    the model's positions and exhaust the worker's memory). `rows` need key and backbone."""
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
        results = call(prompts)
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
        results += list(r)
        ok += o
    return results, ok


def _column(batch: pa.Table, name: str) -> list | None:
    return batch.column(name).to_pylist() if name in batch.column_names else None


def answer_batch(
    engine: Engine,
    batch: pa.Table,
    templates: Mapping[str, str],
    load_image: ImageLoader,
    *,
    system: str | None = None,
    micro_batch: int | None = None,
    cache: ImageCache | None = None,
) -> tuple[pa.Table, pa.Table]:
    """Answer a batch of requests (operators.schema.REQUESTS rows).

    Returns (answers, errors): answers has operators.schema.ANSWERS rows for every request
    that was answered; every other request has exactly one row in errors. The engine is
    called per micro-batch (`micro_batch` rows, default operators.prefetch.micro_batch_size)
    while the next micro-batch's images decode in the background. `cache` may hold images
    decoded ahead (`prefetch_images`, run by the caller while the engine works on the batch before).

    Columnar: prompt texts are filled per kind over whole columns, answers land in numpy
    arrays and leave as one Arrow table; Python objects are made per request only for what
    the engine takes (a `Prompt`) and per failing request (its error row).
    """
    n = batch.num_rows
    tell_templates(engine, templates)
    keys, kinds = _column(batch, "key"), _column(batch, "kind")
    hashes, uris = _column(batch, "image_hash") or [None] * n, _column(batch, "image_uri") or [None] * n
    texts, problems = answer_texts(kinds, {"text": _column(batch, "text"), "caption": _column(batch, "caption")}, templates)
    with_image = [kind != "caption" for kind in kinds]
    logp = np.full((n, 2), np.nan)
    answered = np.zeros(n, dtype=bool)
    errors: list[dict] = []  # per micro-batch: image and request problems in row order, then too long, then engine
    backbones = _column(batch, "backbone")

    def prepare(span: range):
        return cache.load_pairs((hashes[i], uris[i]) for i in span if with_image[i])

    def consume(span: range, loaded) -> None:
        images, failures = loaded
        todo, prompts, chunk_errors = [], [], []
        for i in span:
            image = None
            if with_image[i]:
                h = hashes[i]
                if h is None:
                    chunk_errors.append({"stage": "answers", "key": keys[i], "field": "image_hash", "reason": "missing_image", "detail": f"{kinds[i]} request without an image"})
                    continue
                if h in failures:
                    chunk_errors.append({"stage": "answers", "key": keys[i], "source": uris[i], "field": "image_uri", "reason": "unreadable_image", "detail": failures[h]})
                    continue
                image = images[h]
            if i in problems:
                chunk_errors.append({"stage": "answers", "key": keys[i], "field": "text", "reason": "bad_request", "detail": problems[i]})
                continue
            todo.append(i)
            prompts.append(Prompt(user=texts[i], image=image, image_id=hashes[i], system=system))
        rows = [{"key": keys[i], "backbone": backbones[i] if backbones else None, "i": i} for i in todo] if _may_drop(engine) else None
        if rows is not None:
            prompts, rows = _drop_too_long(engine, prompts, rows, chunk_errors, "answers")
            todo = [r["i"] for r in rows]
        if prompts:
            def call(ps):
                out = np.asarray(engine.score_yes_no(ps), dtype=np.float64)
                if out.ndim != 2 or out.shape[1] < 2:
                    raise RuntimeError(f"engine returned an array of shape {out.shape} for {len(ps)} prompts, not ({len(ps)}, 2)")
                return out

            results, ok = _call_isolated(call, prompts, [{"key": keys[i]} for i in todo], chunk_errors, "answers", backbones[span[0]] if backbones else None)
            idx = np.asarray(todo, dtype=np.int64)
            if all(ok):
                logp[idx] = np.asarray(results)[:, :2]
            else:
                good = [j for j, o in enumerate(ok) if o]
                logp[idx[good]] = np.array([results[j][:2] for j in good], dtype=np.float64).reshape(len(good), 2)
                idx = idx[good]
            answered[idx] = True
        errors.extend(chunk_errors)

    cache = cache if cache is not None else ImageCache(load_image)
    size = micro_batch_size(engine, micro_batch)
    pipelined([range(a, min(a + size, n)) for a in range(0, n, size)], prepare, consume)
    return _answers_table(batch, answered, logp), _error_rows(errors, "answers")


def prefetch_images(batch: pa.Table, load_image: ImageLoader) -> ImageCache:
    """The decoded images of a batch's image requests, ready for `answer_batch(..., cache=)`:
    a worker decodes the next part's images with this while the engine answers this part."""
    n = batch.num_rows
    kinds = _column(batch, "kind")
    hashes, uris = _column(batch, "image_hash") or [None] * n, _column(batch, "image_uri") or [None] * n
    cache = ImageCache(load_image)
    cache.load_pairs((hashes[i], uris[i]) for i in range(n) if kinds[i] != "caption")
    return cache


def _may_drop(engine: Engine) -> bool:
    """Whether prompt lengths are checked at all (an engine with a limit and a way to measure)."""
    return getattr(engine, "max_prompt_tokens", None) is not None and getattr(engine, "prompt_lengths", None) is not None


def _answers_table(batch: pa.Table, answered: np.ndarray, logp: np.ndarray) -> pa.Table:
    """ANSWERS rows of the answered requests, in batch order: whole-column take, no rows."""
    rows = pa.array(np.flatnonzero(answered), pa.int64())
    if len(rows) == 0:
        return schema.ANSWERS.empty_table()
    yes, no = logp[answered, 0], logp[answered, 1]
    columns = {name: batch.column(name).take(rows).cast(pa.string()) for name in ("key", "backbone", "kind")}
    columns |= {"logp_yes": pa.array(yes), "logp_no": pa.array(no), "answer_mass": pa.array(np.asarray(answer_mass(yes, no), dtype=np.float64))}
    return pa.table(columns, schema=schema.ANSWERS)


def generate_batch(
    engine: Engine,
    batch: pa.Table,
    templates: Mapping[str, str],
    *,
    max_new_tokens: int,
    system: str | None = None,
) -> tuple[pa.Table, pa.Table]:
    """Greedy generations for rows with columns key, backbone, kind (questions|dsg|claims), caption."""
    tell_templates(engine, templates)
    rows = rows_of(batch)
    users: list = [None] * len(rows)
    by_kind: dict[str, list[int]] = {}
    for i, row in enumerate(rows):
        by_kind.setdefault(row["kind"], []).append(i)
    for kind, where in by_kind.items():  # one template fill per kind over its captions
        for i, user in zip(where, fill_column(templates[GENERATION_TEMPLATES[kind]], {"caption": [rows[i]["caption"] for i in where]}), strict=True):
            users[i] = user
    prompts = [Prompt(user=user, system=system) for user in users]
    errors: list[dict] = []
    generations = _generate(engine, prompts, rows, errors, "questions", max_new_tokens)
    return generations, _error_rows(errors, "questions")


def _generate(engine: Engine, prompts: list[Prompt], rows: list[dict], errors: list[dict], stage: str, max_new_tokens: int) -> pa.Table:
    """Greedy generations for `prompts` (one per row) as GENERATIONS rows; failures go to `errors`."""
    prompts, rows = _drop_too_long(engine, prompts, rows, errors, stage)
    if not prompts:
        return schema.GENERATIONS.empty_table()
    results, ok = _call_isolated(lambda ps: list(engine.generate(ps, max_new_tokens)), prompts, rows, errors, stage, rows[0]["backbone"])
    done = [(row, text) for row, text, good in zip(rows, results, ok) if good]
    columns = {name: [row[name] for row, _ in done] for name in ("key", "backbone", "kind")} | {"text": [text for _, text in done]}
    return pa.table(columns, schema=schema.GENERATIONS)


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
    tell_templates(engine, templates)
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
