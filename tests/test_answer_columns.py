"""`answer_batch` works on whole columns; everything it sends and stores must equal the per-row
path it replaced: the same prompt text for every kind, byte for byte (prompts are part of what
the engine answers), the same answers and the same error rows in the same order."""
import random

import fsspec
import numpy as np
import pyarrow as pa
import pytest

from operators import images, schema
from operators.answering import ANSWER_TEMPLATES, answer_batch, answer_prompt
from operators.engines.yesno import answer_mass
from operators.hashing import keys_digest
from operators.prompts import fill, fill_column

TEMPLATES = {
    "answer_image": "Q: {question} Answer with {yes} or {no}.",
    "answer_caption": 'Text: "{caption}" {{"json": 1}} Q: {question}',
    "holistic": 'Does this figure show "{caption}"?',
    "claim": "Claim: {claim}\n}{",
}


class Engine:
    """Answers from a hash of the prompt; fails a call holding 'EXPLODE'; counts words."""

    max_prompt_tokens = 40

    def __init__(self):
        self.prompts = []

    def prompt_lengths(self, prompts):
        return [len(p.user.split()) for p in prompts]

    def score_yes_no(self, prompts):
        if any("EXPLODE" in p.user for p in prompts):
            raise RuntimeError("boom")
        self.prompts += prompts
        z = np.array([(hash((p.user, p.image_id)) % 1000) / 250.0 - 2.0 for p in prompts])
        return np.stack([-np.log1p(np.exp(-z)), -np.log1p(np.exp(z)) - 0.01], axis=1)


def loader(uri, image_hash=None):
    if uri.endswith("bad.png"):
        raise OSError(f"cannot identify image file {uri!r}")
    return f"PIXELS<{uri}>"


def requests(rows):
    full = [{"backbone": "b", "prompt_id": "v1", "image_uri": None, "image_hash": None, "caption": None} | r for r in rows]
    return schema.conform(pa.Table.from_pylist(full), schema.REQUESTS)


def random_rows(n, seed):
    rng = random.Random(seed)
    words = ["a {cat}", "two dogs", "}{", "é 日本", "{question}", "\\1", "", "x" * 3, "EXPLODE", "word " * 50]
    rows = []
    for i in range(n):
        kind = rng.choice(["image", "caption", "holistic", "claim", "image", "bogus"])
        h = rng.choice([None, "h1", "h2", "hbad"]) if rng.random() < 0.3 else f"h{i % 7}"
        rows.append({"key": f"k{i:04d}", "kind": kind, "text": rng.choice(words + [None]), "caption": rng.choice(words + [None]),
                     "image_hash": h, "image_uri": None if h is None else f"/img/{h}{'bad' if h == 'hbad' else ''}.png"})
    return rows


def reference(engine, rows, templates):
    """The per-row path: expected prompts in engine order, and (key, reason) of every error."""
    prompts, errors, ok_keys = [], [], []
    for row in rows:
        with_image = row["kind"] != "caption"
        if with_image and row["image_hash"] is None:
            errors.append((row["key"], "missing_image"))
            continue
        if with_image and row["image_uri"].endswith("bad.png"):
            errors.append((row["key"], "unreadable_image"))
            continue
        try:
            image = loader(row["image_uri"]) if with_image else None
            prompt = answer_prompt(row["kind"], row, templates, image, None)
        except (KeyError, TypeError):
            errors.append((row["key"], "bad_request"))
            continue
        if len(prompt.user.split()) > engine.max_prompt_tokens:
            errors.append((row["key"], "prompt_too_long"))
        elif "EXPLODE" in prompt.user:
            errors.append((row["key"], "engine_error"))
        else:
            prompts.append(prompt)
            ok_keys.append(row["key"])
    return prompts, errors, ok_keys


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_columnar_batch_sends_the_per_row_prompts_and_keeps_every_error(seed):
    rows = random_rows(400, seed)
    engine = Engine()
    answers, errors = answer_batch(engine, requests(rows), TEMPLATES, loader, micro_batch=10_000)
    want_prompts, want_errors, ok_keys = reference(Engine(), rows, TEMPLATES)
    assert engine.prompts == want_prompts  # text, image, image_id, system: byte for byte, in order
    assert sorted(zip(errors.column("key").to_pylist(), errors.column("reason").to_pylist())) == sorted(want_errors)
    assert answers.column("key").to_pylist() == ok_keys
    assert answers.num_rows + errors.num_rows == len(rows)
    logits = Engine().score_yes_no(want_prompts)
    assert answers.column("logp_yes").to_pylist() == logits[:, 0].tolist()
    assert answers.column("logp_no").to_pylist() == logits[:, 1].tolist()
    assert answers.column("answer_mass").to_pylist() == [float(answer_mass(y, n)) for y, n in logits]  # the per-row value
    assert answers.schema == schema.ANSWERS


def test_error_rows_match_the_per_row_wording_in_order():
    rows = [
        {"key": "noimg", "kind": "holistic", "text": "c", "caption": "c"},
        {"key": "bad", "kind": "image", "text": "q", "image_hash": "hb", "image_uri": "/bad.png"},
        {"key": "kind", "kind": "bogus", "text": "q", "image_hash": "h1", "image_uri": "/a.png"},
        {"key": "long", "kind": "caption", "text": "q", "caption": "w " * 60},
        {"key": "ok", "kind": "caption", "text": "q", "caption": "c"},
        {"key": "boom", "kind": "claim", "text": "EXPLODE", "image_hash": "h1", "image_uri": "/a.png"},
    ]
    answers, errors = answer_batch(Engine(), requests(rows), TEMPLATES, loader)
    assert answers.column("key").to_pylist() == ["ok"]
    got = [{k: v for k, v in e.items() if v is not None} for e in errors.to_pylist()]
    assert got == [
        {"stage": "answers", "key": "noimg", "field": "image_hash", "reason": "missing_image", "detail": "holistic request without an image"},
        {"stage": "answers", "key": "bad", "source": "/bad.png", "field": "image_uri", "reason": "unreadable_image", "detail": "OSError: cannot identify image file '/bad.png'"},
        {"stage": "answers", "key": "kind", "field": "text", "reason": "bad_request", "detail": "'bogus'"},
        {"stage": "answers", "key": "long", "source": "b", "field": "text", "reason": "prompt_too_long", "detail": "66 prompt tokens > max_prompt_tokens 40 (backbone 'b')"},
        {"stage": "answers", "key": "boom", "source": "b", "reason": "engine_error", "detail": "RuntimeError: boom"},
    ]


def test_a_template_without_its_placeholder_is_a_bad_request_for_that_kind_only():
    templates = TEMPLATES | {"holistic": "Does this figure show it?", "claim": "Claim: {caption}"}
    rows = [{"key": "h", "kind": "holistic", "text": "c", "caption": "c", "image_hash": "h1", "image_uri": "/a.png"},
            {"key": "c", "kind": "claim", "text": "x", "image_hash": "h1", "image_uri": "/a.png"},
            {"key": "q", "kind": "image", "text": "q", "image_hash": "h1", "image_uri": "/a.png"}]
    engine = Engine()
    answers, errors = answer_batch(engine, requests(rows), templates, loader)
    assert answers.column("key").to_pylist() == ["h", "q"]  # a template may leave its value out
    assert [p.user for p in engine.prompts] == ["Does this figure show it?", "Q: q Answer with {yes} or {no}."]
    (error,) = errors.to_pylist()
    assert error["key"] == "c" and error["reason"] == "bad_request" and "template needs ['caption']" in error["detail"]


def test_an_engine_answer_of_the_wrong_shape_is_an_error_row_not_a_crash():
    class Flat(Engine):
        def score_yes_no(self, prompts):
            return np.zeros(len(prompts))  # one number per prompt, not (yes, no)

    rows = [{"key": f"k{i}", "kind": "caption", "text": "q", "caption": "c"} for i in range(3)]
    answers, errors = answer_batch(Flat(), requests(rows), TEMPLATES, loader)
    assert answers.num_rows == 0 and errors.column("reason").to_pylist() == ["engine_error"] * 3
    assert "shape (1,)" in errors.column("detail")[0].as_py()


def test_fill_column_equals_fill_on_every_row():
    rng = random.Random(3)
    parts = ["{caption}", "{question}", "{claim}", "{other}", "{{x}}", "{", "}", "text ", "é 日本", "{Caps}", "\\1", "{0}", "%s"]
    values = ["{question}", "c{", "plain", "\\1", "日本", None, "{0}", "%s", 3]
    checked = 0
    for _ in range(2000):
        template = "".join(rng.choice(parts) for _ in range(rng.randint(0, 8)))
        names = rng.sample(["caption", "question", "claim", "other"], rng.randint(1, 4))
        columns = {name: [rng.choice(values) for _ in range(5)] for name in names}
        rows = [{name: columns[name][i] for name in names} for i in range(5)]
        try:
            want = [fill(template, **row) for row in rows]
        except KeyError:
            with pytest.raises(KeyError):
                fill_column(template, columns)
            continue
        assert fill_column(template, columns) == want, (template, columns)
        checked += 1
    assert checked > 500


def test_every_kind_fills_its_template_as_answer_prompt_does():
    row = {"text": 'a "quoted" {text}', "caption": "a {caption} with }{ braces", "image_hash": "h"}
    for kind in ANSWER_TEMPLATES:
        template_name, field = ANSWER_TEMPLATES[kind]
        columns = {field: [row["text"]]} | ({"caption": [row["caption"]]} if kind == "caption" else {})
        assert fill_column(TEMPLATES[template_name], columns) == [answer_prompt(kind, row, TEMPLATES, None, None).user]


def test_local_image_paths_are_read_without_fsspec(tmp_path, monkeypatch):
    """fsspec's URL parsing cost ~30 us per image, three times the read; plain paths use open()."""
    path = tmp_path / "a.png"
    path.write_bytes(b"\x89PNG bytes")
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)

    def no_fsspec(*args, **kwargs):
        raise AssertionError("a local path went through fsspec")

    monkeypatch.setattr(images.fsspec, "open", no_fsspec)
    assert images.read_image_bytes(str(path)) == b"\x89PNG bytes"
    assert images.read_image_bytes("a.png") == b"\x89PNG bytes"  # relative to the working directory, as fsspec reads it
    assert images.read_image_bytes("~/a.png") == b"\x89PNG bytes"
    with pytest.raises(images.ImageError, match="file not found"):
        images.read_image_bytes(str(tmp_path / "missing.png"))
    with pytest.raises(AssertionError, match="went through fsspec"):  # URLs still do
        images.read_image_bytes(path.as_uri())


def test_urls_still_read_through_fsspec(tmp_path):
    with fsspec.open("memory://bucket/answer-columns.png", "wb") as f:
        f.write(b"png")
    assert images.read_image_bytes("memory://bucket/answer-columns.png") == b"png"
    (tmp_path / "b.png").write_bytes(b"file url")
    assert images.read_image_bytes((tmp_path / "b.png").as_uri()) == b"file url"


def test_part_names_do_not_change():
    """keys_digest names stored parts: the same keys must keep giving the same name, or every
    store written so far would be read as holding other parts."""
    keys = [f"{i * 7919:032x}" for i in range(300)]
    assert keys_digest(keys) == keys_digest(list(reversed(keys))) == "bb1b6de435bfc133a4e64ddb"
    assert keys_digest(iter(keys)) == "bb1b6de435bfc133a4e64ddb"
    assert keys_digest(["b", "a"]) == keys_digest(["a", "b"]) == "2048fd15436876b1b96211b1"
    with pytest.raises(UnicodeEncodeError):  # keys are hex digests: anything else is a bug upstream
        keys_digest(["é"])
    assert keys_digest(pa.array(keys)) == "bb1b6de435bfc133a4e64ddb"  # the Arrow path: the same names
    with pytest.raises(UnicodeEncodeError):
        keys_digest(pa.array(["é", "ab"]))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_keys_digest_of_arrow_keys_equals_the_python_path(seed):
    """Arrow keys of one width are sorted by numpy as fixed-width bytes (NUL included: numpy
    compares without trailing NULs), mixed widths take the Python path; either way the name
    must be the one the list of str gives."""
    rng = random.Random(seed)
    alphabet = "0123456789abcdef\x00 ~A"
    for _ in range(300):
        n = rng.randint(1, 40)
        width = rng.choice([None, 1, 2, 32])
        keys = ["".join(rng.choice(alphabet) for _ in range(width or rng.randint(0, 6))) for _ in range(n)]
        expected = keys_digest(keys)
        array = pa.array(keys, rng.choice([pa.string(), pa.large_string()]))
        assert keys_digest(array) == expected
        assert keys_digest(pa.chunked_array([array.slice(0, n // 2), array.slice(n // 2)])) == expected
        assert keys_digest(array.slice(1)) == keys_digest(keys[1:])


def test_generation_prompts_are_filled_per_kind_as_fill_does():
    from operators.answering import GENERATION_TEMPLATES, generate_batch

    class Echo:
        def __init__(self):
            self.prompts = []

        def generate(self, prompts, max_new_tokens):
            self.prompts += prompts
            return [f"out {k}" for k in range(len(prompts))]

    templates = {"generate_questions": 'Caption: {caption}\nExample: ["Is there a {{x}}?"]', "generate_dsg": "DSG of {caption} {other}",
                 "generate_claims": "Claims: {caption}!"}
    rows = [{"key": f"g{i}", "backbone": "b", "kind": kind, "caption": caption}
            for i, (kind, caption) in enumerate([("questions", "two {red} dogs"), ("dsg", "a cat"), ("claims", None), ("questions", "é")])]
    engine = Echo()
    gens, errors = generate_batch(engine, pa.Table.from_pylist(rows), templates, max_new_tokens=8, system="S")
    assert errors.num_rows == 0
    assert [p.user for p in engine.prompts] == [fill(templates[GENERATION_TEMPLATES[r["kind"]]], caption=r["caption"]) for r in rows]
    assert {p.system for p in engine.prompts} == {"S"}
    assert gens.to_pylist() == [{"key": r["key"], "backbone": "b", "kind": r["kind"], "text": f"out {k}"} for k, r in enumerate(rows)]
