"""Training and measuring `builtin:micro-vlm` (operators/micro_vlm_recipe.py) with the project's own parts.

`train_micro_vlm` runs the recipe with the prompt templates the sweeps use (conf/prompts).
`evaluate_micro_vlm` answers yes/no requests through an unchanged engine (`hf` or `vllm`, as
a backbone config names it) and checks each answer against the demo world's truth, on two
sets of requests:

- held-out draws: `operators.demo_world.WorldSampler(seed, "heldout")`, balanced per fact type,
  their prompts filled by `operators.answering.answer_prompt`, their images the PNG bytes the
  demo writes, decoded by `operators.images.decode_image`;
- the demo benchmark's own requests: the items, shipped questions and request plan of
  `sweep=smoke` (`pipeline.stages.answers.plan_answers`), every unique request once.

Reported per request kind and fact type: accuracy (answer = Yes when logp_yes > logp_no), the
holistic AUC (normalised P(yes) ranking true captions over false ones), the median answer
mass (P(Yes spellings) + P(No spellings)), and for caption-only questions the caption leaves
open (kind `caption_open`) the median distance of P(yes) from 0.5. `FLOORS` are what a built-in model must reach on both
sets before it ships as the default run's backbone: below them the demo's statistics would
measure the model's mistakes rather than the metrics.
"""
from __future__ import annotations

import functools
import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import polars as pl

from operators import demo_world
from operators.micro_vlm_recipe import check_train_options as check_train_options  # jobs/micro_vlm.py checks first
from operators.micro_vlm_recipe import resume_options as resume_options
from operators.run_folders import check_writable as check_writable
from pipeline import micro_vlm_views, micro_vlm_writing

FLOORS = {"image": 0.95, "image_per_type": 0.90, "caption": 0.97, "holistic_auc": 0.90, "answer_mass_median": 0.9,
          "open_gap_median": 0.15}
OPEN = "caption_open"  # the kind a summary gives caption-only requests the caption leaves open


def fact_type_weights(text: str) -> dict[str, float]:
    """`attribute:1.5,spatial:2` -> {"attribute": 1.5, "spatial": 2.0}: how much each fact type of
    the image questions weighs in the training loss; an unknown type raises ValueError naming the valid ones."""
    return _named_values(text, tuple(demo_world.FACT_TYPES.values()), "fact type", float)


def requests_per_step(text: str) -> dict[str, int]:
    """`image:64,caption:32,holistic:32` -> how many requests of each kind one training step draws."""
    from operators.micro_vlm_recipe import TRAINED_KINDS

    return _named_values(text, TRAINED_KINDS, "request kind", int)


def lessons_per_step(text: str) -> dict[str, int]:
    """`depict:2,dsg:2,judge_decomposed:1` -> how many writing lessons of each kind one step draws."""
    from operators.micro_vlm_writing import WRITE_KINDS

    return _named_values(text, WRITE_KINDS, "lesson kind", int)


def _named_values(text: str, valid: tuple[str, ...], what: str, number: type) -> dict:
    out = {}
    for part in text.split(","):
        name, _, value = part.partition(":")
        if name not in valid:
            raise ValueError(f"unknown {what} {name!r}; valid: {', '.join(valid)}")
        out[name] = number(value)
    return out


def shipped_folder() -> str:
    """Where the package's own micro VLM lives (a clone's operators/weights, or site-packages):
    what `jobs/micro_vlm.py train out=builtin` writes, and nothing else does."""
    from operators.tiny_models import SHIPPED

    return str(SHIPPED["builtin:micro-vlm"])


def train_micro_vlm(out: str, seconds: float, seed: int = 0, **options) -> dict:
    """Train the recipe for `seconds` and save it to `out`; returns the training report as a dict."""
    from operators.micro_vlm_recipe import train
    from pipeline.config import load_config

    templates = load_config([]).prompts.templates
    report = train(out, templates, seconds=seconds, seed=seed, **options)
    return {"seconds": round(report.seconds, 1), "steps": report.steps, "examples": report.examples,
            "parameters": report.parameters, "history": report.history}


@dataclass
class Answered:
    """One request with its truth, its fact type and the engine's answer."""

    kind: str
    fact_type: str
    truth: bool | None  # None: the caption leaves it open (kind OPEN); the answer should sit near 0.5
    logp_yes: float
    logp_no: float


def heldout_requests(n_per_type: int, seed: int = 0) -> list[demo_world.WorldRequest]:
    """Balanced held-out draws: per kind and fact type, half Yes and half No where both exist."""
    sampler = demo_world.WorldSampler(seed, "heldout")
    out = []
    for fact_type in demo_world.FACT_TYPES.values():
        out += [sampler.request("image", fact_type, answer=i % 2 == 0) for i in range(n_per_type)]
        # a caption implies Yes to its facts' questions and No to its negated things'
        out += [sampler.request("caption", fact_type, answer=fact_type != "negation") for _ in range(n_per_type // 2)]
    out += [sampler.request("holistic", answer=i % 2 == 0) for i in range(2 * n_per_type)]
    out += [sampler.open_request() for _ in range(n_per_type)]
    return out


def hybrid_requests(n: int, seed: int = 0) -> list[demo_world.WorldRequest]:
    """Held-out caption-only requests about hybrid captions ("a star and no circle"): a thing
    stated beside a thing denied, the hardest kind for the caption-only answers (the shipped
    model: 0.943)."""
    sampler = demo_world.WorldSampler(seed, "heldout")
    return [sampler.request("caption", template="hybrid") for _ in range(n)]


def answer_world_requests(engine, requests: Sequence[demo_world.WorldRequest], templates: dict, system: str | None = None) -> list[Answered]:
    """Each request through the engine as the answers stage builds it (answer_prompt, decoded PNG)."""
    from operators.answering import answer_prompt, tell_templates
    from operators.hashing import image_hash
    from operators.images import decode_image

    tell_templates(engine, templates)
    prompts = []
    for r in requests:
        image, digest = None, None
        if r.kind != "caption":
            data = demo_world.png_bytes(demo_world.render(r.scene))
            image, digest = decode_image(data, "heldout.png"), image_hash(data)
        text = r.question if r.kind != "holistic" else r.caption
        prompts.append(answer_prompt(r.kind, {"text": text, "caption": r.caption, "image_hash": digest}, templates, image, system))
    logp = engine.score_yes_no(prompts)
    # image requests are typed by their wording (demo_world.question_type), as the benchmark's are
    types = [demo_world.question_type(r.facts[0], r.form) if r.kind == "image" else r.fact_type for r in requests]
    return [Answered(OPEN if r.answer is None else r.kind, t, r.answer, float(y), float(n))
            for r, t, (y, n) in zip(requests, types, logp, strict=True)]


def benchmark_requests(root: str, backbone: str = "micro", overrides: Sequence[str] = (),
                       benchmarks: Sequence[str] = ("demo", "demo_winoground", "demo_mcq")) -> tuple[pl.DataFrame, dict]:
    """The demo benchmarks' unique requests under `sweep=smoke` with `backbone` (default: the
    fixed items; the large demo's parts, demo_large*, add the drawn ones), each with its truth
    and fact type, and the loaded config's templates."""
    from operators.hashing import image_hash
    from pipeline.config import load_config
    from pipeline.scoring import needs_holistic
    from pipeline.stages import ingest
    from pipeline.stages.answers import plan_answers
    from pipeline.stages.questions import provided_questions

    cfg = load_config(["sweep=smoke", f"backbones=[{backbone}]", f"benchmarks=[{','.join(benchmarks)}]", f"root={root}", *overrides])
    items, shipped, _ = ingest.load_items(cfg.benchmarks)
    hashes = {u: image_hash(open(u, "rb").read()) for u in items["image_uri"].unique().to_list()}
    items = items.with_columns(image_hash=pl.col("image_uri").replace_strict(hashes))
    sets = cfg.sweep.required_question_sets()
    questions, _ = provided_questions(items, shipped, sets)
    plan = plan_answers(items, questions, cfg.backbones[backbone], cfg.prompts, sets, needs_holistic(cfg.sweep.metrics))
    requests = pl.from_arrow(plan.requests)

    scenes, caption_of, facts_of_question = _demo_world_index()

    truths, types = [], []
    for r in requests.iter_rows(named=True):
        if r["kind"] == "image":
            found = facts_of_question[r["text"]]
            values = {demo_world.image_truth(f, form, scenes[r["image_hash"]]) for f, form in found}
            kinds = {demo_world.question_type(f, form) for f, form in found}
        elif r["kind"] == "caption":
            cap = caption_of[r["caption"]]
            found = [f for f in cap.facts + cap.open_facts() if f.depict_question() == r["text"]]
            values = {cap.implies(f) for f in found}
            kinds = {demo_world.FACT_TYPES[f.kind] for f in found}
        else:
            values = {all(f.holds(scenes[r["image_hash"]]) for f in caption_of[r["caption"]].facts)}
            kinds = {"holistic"}
        if len(values) != 1:
            raise RuntimeError(f"request {r['text']!r} has no single truth: {values}")
        truths.append(values.pop())
        types.append("/".join(sorted(kinds)))
    requests = requests.with_columns(truth=pl.Series(truths, dtype=pl.Boolean), fact_type=pl.Series(types))
    return requests, dict(cfg.prompts.templates)


@functools.cache  # renders every demo scene: once per process
def _demo_world_index() -> tuple[dict, dict, dict]:
    """The demo benchmark's scenes by image hash, captions by text, and (fact, form) pairs by
    question text (fixed and drawn items): what a request or record of the demo is about."""
    scenes = micro_vlm_views.demo_scenes_by_hash()
    parts = (demo_world.FIXED_ITEMS, demo_world.drawn_items())
    captions = [c for items in parts for c in demo_world.item_captions(items)]
    caption_of = {c.text: c for c in captions}
    facts_of_question: dict[str, set] = {}
    for cap in captions:
        for fact in cap.facts + cap.open_facts():
            for form in ("depict", "dsg"):
                facts_of_question.setdefault(demo_world.fact_question(fact, form), set()).add((fact, form))
    return scenes, caption_of, facts_of_question


def record_truths(records: pl.DataFrame, known_only: bool = False) -> pl.DataFrame:
    """A demo run's per-question records (records/<backbone>.parquet) with each question's
    true answer on its image (`truth_v`) and the answer its caption implies (`truth_t`, DEPICT
    questions only; null where the caption leaves it open): what p_v and p_t should say.

    A record whose question is not one its caption's world asks about (a written question the
    writer got wrong) has no truth: it raises, or with `known_only` is left out, so that a
    caller can bound how many a run's writer wrote."""
    scenes, caption_of, facts_of_question = _demo_world_index()
    truth_v, truth_t, known = [], [], []
    for r in records.iter_rows(named=True):
        form = "dsg" if r["question_set"] == "dsg" else "depict"
        cap = caption_of[r["caption"]]
        asked = set(cap.facts + cap.open_facts())
        found = [f for f, fm in facts_of_question.get(r["question"], ()) if fm == form and f in asked]
        known.append(len(found) == 1 and r["image_hash"] in scenes)
        if not known[-1]:
            if known_only:
                continue
            raise ValueError(f"record {r['item_id']}/{r['question_id']} ({r['question']!r}) is not one of the demo's questions")
        truth_v.append(demo_world.image_truth(found[0], form, scenes[r["image_hash"]]))
        truth_t.append(cap.implies(found[0]) if form == "depict" else None)
    return records.filter(pl.Series(known, dtype=pl.Boolean)).with_columns(
        truth_v=pl.Series(truth_v, dtype=pl.Boolean), truth_t=pl.Series(truth_t, dtype=pl.Boolean))


def answer_benchmark_requests(engine, requests: pl.DataFrame, templates: dict, system: str | None = None) -> list[Answered]:
    from operators.answering import answer_prompt, tell_templates
    from operators.images import load_image

    tell_templates(engine, templates)
    images: dict[str, object] = {}
    prompts = []
    rows = list(requests.iter_rows(named=True))
    for r in rows:
        image = None
        if r["kind"] != "caption":
            if r["image_hash"] not in images:
                images[r["image_hash"]] = load_image(r["image_uri"], r["image_hash"])
            image = images[r["image_hash"]]
        prompts.append(answer_prompt(r["kind"], r, templates, image, system))
    logp = engine.score_yes_no(prompts)
    return [Answered(OPEN if r["kind"] == "caption" and r["truth"] is None else r["kind"], r["fact_type"], r["truth"], float(y), float(n))
            for r, (y, n) in zip(rows, logp, strict=True)]


def request_key(kind: str, scene: demo_world.Scene | None, caption: str | None, question: str | None) -> tuple:
    """What makes two requests the same request: kind, scene (as a set), caption, question."""
    return kind, None if scene is None or kind == "caption" else frozenset(scene), caption if kind != "image" else None, question


def training_keys(n: int, seed: int = 0, open_share: float = 0.3) -> set[tuple]:
    """The request keys of `n` draws from the training split, in the recipe's mix of kinds."""
    sampler = demo_world.WorldSampler(seed, "train")
    keys = set()
    for i in range(n):
        kind = demo_world.REQUEST_KINDS[i % 3]
        r = sampler.open_request() if kind == "caption" and sampler.rng.random() < open_share else sampler.request(kind)
        keys.add(request_key(r.kind, r.scene, r.caption, r.question))
    return keys


def verbatim_overlap(world: Sequence[demo_world.WorldRequest], bench: pl.DataFrame, n_train: int = 300_000, seed: int = 0) -> dict[str, int]:
    """How many held-out draws and benchmark requests repeat a request of an `n_train`-draw
    training stream word for word (the content split makes it 0; a random-stream split did not)."""
    seen = training_keys(n_train, seed)
    scenes = _demo_world_index()[0]
    bench_keys = [request_key(r["kind"], scenes.get(r["image_hash"]), r["caption"], r["text"] if r["kind"] != "holistic" else None)
                  for r in bench.iter_rows(named=True)]
    return {"training_draws": n_train,
            "heldout_repeats": sum(request_key(r.kind, r.scene, r.caption, r.question) in seen for r in world),
            "heldout_requests": len(world),
            "benchmark_repeats": sum(k in seen for k in bench_keys), "benchmark_requests": len(bench_keys)}


def auc(scores: Sequence[float], labels: Sequence[bool]) -> float | None:
    """Probability that a random positive outranks a random negative (ties: half)."""
    pos = [s for s, y in zip(scores, labels) if y]
    neg = [s for s, y in zip(scores, labels) if not y]
    if not pos or not neg:
        return None
    p, n = np.asarray(pos)[:, None], np.asarray(neg)[None, :]
    return float(((p > n).sum() + 0.5 * (p == n).sum()) / (len(pos) * len(neg)))


def summarize(answers: Sequence[Answered]) -> pl.DataFrame:
    """One row per (kind, fact type) and per kind ("all"): n, accuracy, AUC, median answer mass."""
    frame = pl.DataFrame([a.__dict__ for a in answers]).with_columns(
        correct=(pl.col("logp_yes") > pl.col("logp_no")) == pl.col("truth"),
        p_yes=1 / (1 + (pl.col("logp_no") - pl.col("logp_yes")).exp()),
        mass=pl.col("logp_yes").exp() + pl.col("logp_no").exp(),
    )
    rows = []
    for (kind, fact_type), group in sorted(
        [((k, "all"), frame.filter(pl.col("kind") == k)) for k in frame["kind"].unique().sort()]
        + [((k, t), g) for (k, t), g in frame.group_by("kind", "fact_type")],
        key=lambda kv: (kv[0][0], kv[0][1] != "all", kv[0][1]),
    ):
        decided = kind != OPEN
        rows.append({
            "kind": kind, "fact_type": fact_type, "n": group.height,
            "share_yes": round(group["truth"].mean(), 3) if decided else None,
            "accuracy": round(group["correct"].mean(), 4) if decided else None,
            "auc": _round(auc(group["p_yes"].to_list(), group["truth"].to_list())) if decided else None,
            # open questions: how far the answers sit from undecided (0 is right)
            "open_gap": None if decided else round(float((group["p_yes"] - 0.5).abs().median()), 4),
            "mass_median": round(float(group["mass"].median()), 4),
        })
    return pl.DataFrame(rows)


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def floors(table: pl.DataFrame) -> dict[str, bool]:
    """Which of `FLOORS` a summary table meets."""
    row = {(r["kind"], r["fact_type"]): r for r in table.iter_rows(named=True)}
    image_types = [r for (k, t), r in row.items() if k == "image" and t != "all"]
    masses = [r["mass_median"] for (k, t), r in row.items() if t == "all"]
    open_floor = {}
    if (OPEN, "all") in row:
        open_floor["open caption-only median |p - 0.5| <= 0.15"] = row[OPEN, "all"]["open_gap"] <= FLOORS["open_gap_median"]
    return open_floor | {
        "image >= 0.95": row["image", "all"]["accuracy"] >= FLOORS["image"],
        "image per type >= 0.90": all(r["accuracy"] >= FLOORS["image_per_type"] for r in image_types),
        "caption >= 0.97": row["caption", "all"]["accuracy"] >= FLOORS["caption"],
        "holistic AUC >= 0.90": (row["holistic", "all"]["auc"] or 0) >= FLOORS["holistic_auc"],
        "answer mass median >= 0.9": min(masses) >= FLOORS["answer_mass_median"],
    }


def _written(engine, spec, templates: dict, n: int, seed: int, open_share: float, judge: bool = True):
    """The three question sets (and with `judge`, both judge verdicts) on `n` held-out captions and scenes."""
    pairs = micro_vlm_writing.heldout_pairs(n, seed)
    written = micro_vlm_writing.write_questions(engine, [c for c, _ in pairs], templates, open_share, spec.max_new_tokens, spec.system_prompt)
    if judge:
        written += micro_vlm_writing.write_judgements(engine, pairs, templates, spec.max_new_tokens, spec.system_prompt)
    return written


def _writing_table(written) -> pl.DataFrame:
    return pl.DataFrame([{"kind": kind, **row} for kind, row in micro_vlm_writing.summary(written).items()])


def evaluate_writing(backbone: str = "micro-writer", n: int = 200, seed: int = 0, judge: bool = False) -> pl.DataFrame:
    """A writer's three question sets (and with `judge`, both judge verdicts) on `n` held-out
    captions, through its configured engine: parse rate and exact match per format, printed with
    the floors of `pipeline.micro_vlm_writing` and returned."""
    from operators.demo_generations import WRITTEN_OPEN_SHARE
    from operators.engines import load_engine
    from pipeline.config import load_config
    from pipeline.model_guard import require_models

    cfg = load_config([f"backbones=[{backbone}]"])
    spec = cfg.backbones[backbone]
    require_models([spec])
    engine = load_engine(spec)
    start = time.monotonic()
    try:
        written = _written(engine, spec, cfg.prompts.templates, n, seed, WRITTEN_OPEN_SHARE, judge)
    finally:
        engine.close()
    table = _writing_table(written)
    print(f"writing ({backbone}, engine {spec.engine}, {n} held-out captions, seed {seed}):")
    print(table)
    print("exact match by caption (its clauses; whether two mentions name one shape):")
    print(pl.DataFrame(micro_vlm_writing.by_caption(written)))
    print("writing floors:", json.dumps(micro_vlm_writing.writing_floors(micro_vlm_writing.summary(written))))
    print(f"{len(written)} generations in {time.monotonic() - start:.1f}s")
    return table


def evaluate_micro_vlm(backbone: str = "micro", n_per_type: int = 200, seed: int = 0, root: str | None = None, out: str | None = None,
                       overrides: Sequence[str] = (), n_train: int = 300_000, n_views: int = 200,
                       n_writing: int | None = None) -> dict[str, pl.DataFrame]:
    """Held-out and benchmark tables for `backbone` (a conf/backbones name), printed and returned:
    answers (held-out draws, the benchmark's requests, hybrid captions), claims on masked views
    (`pipeline.micro_vlm_views`, `n_views` claims) and, for a backbone that writes questions,
    its writing (`pipeline.micro_vlm_writing`, `n_writing` captions; default 40)."""
    import tempfile

    from operators.engines import load_engine
    from pipeline.config import load_config
    from pipeline.model_guard import require_models

    default = load_config(["sweep=demo"]).sweep  # the benchmark's items and questions as the default run has them
    if not any(o.startswith("questions.open_share=") for o in overrides):
        overrides = [*overrides, f"questions.open_share={default.questions.open_share}"]
    cfg = load_config([f"backbones=[{backbone}]", *overrides])
    spec = cfg.backbones[backbone]
    require_models([spec])
    n_writing = (40 if spec.writes_questions else 0) if n_writing is None else n_writing
    start = time.monotonic()
    engine = load_engine(spec)
    loaded = time.monotonic() - start
    try:
        with tempfile.TemporaryDirectory() as tmp:
            requests, templates = benchmark_requests(root or tmp, backbone, overrides, benchmarks=default.benchmarks)
            start = time.monotonic()
            bench = answer_benchmark_requests(engine, requests, templates, spec.system_prompt)
        held_requests = heldout_requests(n_per_type, seed)
        held = answer_world_requests(engine, held_requests, templates, spec.system_prompt)
        hybrid = answer_world_requests(engine, hybrid_requests(3 * n_per_type, seed + 1), templates, spec.system_prompt)
        viewed = micro_vlm_views.answer_views(engine, micro_vlm_views.heldout_claims(n_views, seed), templates, spec.system_prompt)
        written = _written(engine, spec, templates, n_writing, seed, default.questions.open_share) if n_writing else None
        answered = time.monotonic() - start
    finally:
        engine.close()
    tables = {"heldout": summarize(held), "benchmark": summarize(bench), "heldout_hybrid": summarize(hybrid)}
    views = micro_vlm_views.summarize_views(viewed)
    tables["views"] = pl.DataFrame([views])
    if written is not None:
        tables["writing"] = _writing_table(written)
    with pl.Config(tbl_rows=100, tbl_cols=20):
        for name, table in tables.items():
            print(f"{name} ({backbone}, engine {spec.engine}):")
            print(table)
            if name in ("heldout", "benchmark"):  # the hybrid caption-only requests have no floors of their own
                print("floors:", json.dumps(floors(table)))
        print("views floors:", json.dumps(micro_vlm_views.view_floors(views)))
        if written is not None:
            print("writing floors:", json.dumps(micro_vlm_writing.writing_floors(micro_vlm_writing.summary(written))))
    overlap = verbatim_overlap(held_requests, requests, n_train)
    print("verbatim repeats of a training stream's requests:", json.dumps(overlap))
    print(f"engine load {loaded:.1f}s; {len(held) + len(bench) + len(hybrid)} requests in {answered:.1f}s")
    if out:
        os.makedirs(out, exist_ok=True)
        for name, table in tables.items():
            table.write_csv(os.path.join(out, f"{name}.csv"))
        with open(os.path.join(out, "overlap.json"), "w") as f:
            json.dump(overlap, f, indent=1)
    return tables
