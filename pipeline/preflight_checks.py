"""Preflight: load each backbone's engine(s) and check its answers before a paper sweep.

A fixed small set of prompts from the demo benchmark (image, caption-only and holistic
requests, the sweep's own templates) is scored once per backbone. The report gives answer
mass per request kind, hf-vs-vLLM agreement of the answers (vLLM backbones, when
transformers can load the checkpoint too), prefix-cache hit rate, requests/s and prompt
tokens/s, GPU memory in use and, where a backbone lists `assistant_prefix_candidates`, the
answer mass under each. A check fails when the mass is low or the engines disagree beyond
the tolerance; `run_preflight` returns the report and whether every check passed.

It also measures on this machine whether a request's answer depends on what shares its call:
each prompt in a call of its own against all in one call, and the engine's prefix cache on
against off (hf: `prefix_reuse`, vLLM: `enable_prefix_caching`). The largest log-probability
differences go into the report and into an invariance record in the store
(`invariance/<backbone>.json`), which every later run's manifest.json carries for its backbones.
"""
from __future__ import annotations

import dataclasses
import gc
import logging
from dataclasses import dataclass, field
from datetime import datetime, timezone

import numpy as np
import polars as pl

from operators import answer_mass
from operators.answering import ANSWER_TEMPLATES, answer_prompt, tell_templates
from operators.engine_probe import PREFIX_CACHE_OFF, EngineRun, agreement, answers_one_at_a_time, hardware, largest_difference, score_timed
from operators.engines import load_engine
from operators.engines.base import Prompt
from operators.engines.spec import BackboneSpec
from operators.hashing import image_hash
from operators.images import decode_image, read_image_bytes
from pipeline.config import ResolvedConfig
from pipeline.model_guard import require_models
from pipeline.stages import ingest
from pipeline.store.fs import exists, read_json, write_json

log = logging.getLogger(__name__)


@dataclass
class PreflightOptions:
    min_median_mass: float = answer_mass.LOW_MEDIAN  # per request kind
    min_p5_mass: float = answer_mass.LOW_P5
    tolerance: float = 0.05  # largest allowed |P(yes) hf - P(yes) vLLM|
    compare_hf: bool = True  # vLLM backbones: also score with transformers and compare
    images: int = 3  # demo images to ask about
    questions_per_image: int = 4
    invariance: bool = True  # measure batch 1 vs all and prefix cache on vs off (one more engine load)


@dataclass
class BackboneResult:
    name: str
    lines: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    invariance: dict | None = None  # the invariance record (`invariance_record`)

    @property
    def ok(self) -> bool:
        return not self.failures


def preflight_prompts(cfg: ResolvedConfig, options: PreflightOptions, system: str | None) -> tuple[list[Prompt], list[str]]:
    """The fixed prompt set: for the first demo images, their questions on the image and from
    the caption alone, and the holistic question; returns (prompts, request kinds)."""
    items, questions, _ = ingest.load_items(cfg.benchmarks)
    if questions is None or items.height == 0:
        raise ValueError("preflight needs a benchmark that ships questions (the demo benchmark does)")
    items = items.sort("item_id").unique("image_uri", keep="first", maintain_order=True).head(options.images)
    qs = questions.filter(pl.col("question_set") == "depict")
    templates = cfg.prompts.templates
    prompts, kinds = [], []
    for item in items.iter_rows(named=True):
        data = read_image_bytes(item["image_uri"])
        image = decode_image(data, item["image_uri"])
        # the content hash is the image's id, as in the sweep (vLLM's multimodal uuid)
        row = {"caption": item["caption"], "image_hash": image_hash(data)}
        for question in qs.filter(pl.col("caption") == item["caption"])["question"].head(options.questions_per_image):
            for kind in ("image", "caption"):
                prompts.append(answer_prompt(kind, row | {"text": question}, templates, None if kind == "caption" else image, system))
                kinds.append(kind)
        if "holistic" in templates:
            prompts.append(answer_prompt("holistic", row | {"text": item["caption"]}, templates, image, system))
            kinds.append("holistic")
    assert set(kinds) <= set(ANSWER_TEMPLATES)
    return prompts, kinds


def check_backbone(spec: BackboneSpec, prompts: list[Prompt], kinds: list[str], options: PreflightOptions,
                   templates: dict | None = None) -> BackboneResult:
    """`templates`: those that filled the prompts, for an engine that reads requests back from them (the world oracle)."""
    result = BackboneResult(spec.name)
    out = result.lines
    out.append(f"preflight: {spec.name}  (engine {spec.engine}, model {spec.model_id})")
    counts = {k: kinds.count(k) for k in dict.fromkeys(kinds)}
    out.append(f"  prompts            {len(prompts)} ({', '.join(f'{k} {n}' for k, n in counts.items())})")
    if spec.engine == "vllm":  # vLLM counts prefix-cache hits only with stats on (no effect on answers)
        spec = dataclasses.replace(spec, engine_options={**spec.engine_options, "disable_log_stats": False})
    try:
        engine = load_engine(spec)
    except Exception as exc:
        result.failures.append(f"engine {spec.engine} failed to load: {type(exc).__name__}: {exc}")
        return result
    if templates is not None:
        tell_templates(engine, templates)
    try:
        run = score_timed(engine, prompts, kinds)
        alone = answers_one_at_a_time(engine, prompts) if options.invariance else None
        where = hardware(engine)
        dropped = getattr(engine, "multi_token_spellings", None)
        candidates = _prefix_candidates(engine, spec, prompts, kinds) if spec.assistant_prefix_candidates else []
    finally:
        engine.close()
        del engine
        gc.collect()
    _report_run(run, result, options)
    if alone is not None:
        result.invariance = invariance_record(spec, prompts, run.logprobs, alone, where)
        out.append("  invariance         " + invariance_line(result.invariance))
    if dropped:
        out.append(f"  spellings not counted (several tokens): {dropped}")
    if candidates:
        out += candidates
    if spec.engine == "vllm" and options.compare_hf:
        _compare_with_hf(spec, prompts, run, result, options)
    elif spec.engine == "vllm":
        out.append("  hf vs vllm         not compared (compare_hf=false)")
    else:
        out.append(f"  hf vs vllm         n/a (engine {spec.engine} only)")
    out.append("  result             " + ("OK" if result.ok else "FAIL: " + "; ".join(result.failures)))
    return result


def _report_run(run: EngineRun, result: BackboneResult, options: PreflightOptions) -> None:
    out = result.lines
    low = []
    for kind, (median, p5) in run.mass_by_kind.items():
        flag = median < options.min_median_mass or p5 < options.min_p5_mass
        out.append(f"  answer mass        {kind:<9} median {median:.3f}  p5 {p5:.3f}{'  LOW' if flag else ''}")
        low += [kind] if flag else []
    if low:
        result.failures.append(
            f"low answer mass for {', '.join(low)} (median < {options.min_median_mass} or p5 < {options.min_p5_mass}); {answer_mass.LIKELY_CAUSES}"
        )
    tokens = f", {run.prompt_tokens_per_s:.0f} prompt tokens/s" if run.prompt_tokens_per_s is not None else ""
    out.append(f"  throughput         {run.requests_per_s:.1f} requests/s{tokens} ({run.seconds:.2f} s, cold: includes warm-up)")
    out.append("  prefix cache hits  " + (f"{run.prefix_cache_hit_rate:.2f}" if run.prefix_cache_hit_rate is not None else "n/a (no vLLM stats)"))
    out.append("  GPU memory in use  " + (f"{run.gpu_memory_gib:.1f} GiB" if run.gpu_memory_gib is not None else "n/a (no GPU)"))


def invariance_record(spec: BackboneSpec, prompts: list[Prompt], together: np.ndarray, alone: np.ndarray, where: str) -> dict:
    """How far one request's answer moves with what shares its call, on this machine: `together`
    (all prompts in one call) against `alone` (a call each), and against all in one call with
    the prefix cache off (one more engine load)."""
    record = {
        "backbone": spec.name, "fingerprint": spec.fingerprint(), "engine": spec.engine, "model_id": spec.model_id,
        "hardware": where, "prompts": len(prompts), "measured": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "batch_1_vs_n": _difference(together, alone),
    }
    off = PREFIX_CACHE_OFF.get(spec.engine)
    if off is None:
        record["prefix_cache_on_vs_off"] = {"not_measured": f"engine {spec.engine} has no prefix cache to turn off"}
        return record
    try:
        engine = load_engine(dataclasses.replace(spec, engine_options={**spec.engine_options, **off}))
    except Exception as exc:
        record["prefix_cache_on_vs_off"] = {"not_measured": f"the engine without its prefix cache did not load: {type(exc).__name__}: {exc}"}
        return record
    try:
        record["prefix_cache_on_vs_off"] = _difference(together, np.asarray(engine.score_yes_no(prompts), dtype=np.float64)) | {"option": off}
    finally:
        engine.close()
        del engine
        gc.collect()
    return record


def _difference(a: np.ndarray, b: np.ndarray) -> dict:
    largest = largest_difference(a, b)
    return {"max_abs_logprob": largest, "bit_identical": largest == 0.0}


def invariance_line(record: dict) -> str:
    def said(measure: dict) -> str:
        if "not_measured" in measure:
            return "not measured (" + measure["not_measured"] + ")"
        return "bit-identical" if measure["bit_identical"] else f"max |dlogprob| {measure['max_abs_logprob']:.2g}"

    return (f"batch 1 vs {record['prompts']}: {said(record['batch_1_vs_n'])}; "
            f"prefix cache on vs off: {said(record['prefix_cache_on_vs_off'])}")


def invariance_url(store: str, backbone: str) -> str:
    return f"{store}/invariance/{backbone}.json"


def invariance_for_manifest(store: str, specs: list[BackboneSpec]) -> dict:
    """Each backbone's invariance record from its last preflight on this store, where it was
    measured for the backbone as configured now (same fingerprint); else how to measure it."""
    records = {}
    for spec in specs:
        url = invariance_url(store, spec.name)
        record = read_json(url) if exists(url) else None
        if record is None or record.get("fingerprint") != spec.fingerprint():
            why = "never measured" if record is None else "measured for another configuration of it"
            record = {"not_measured": f"{why}: depict preflight backbones=[{spec.name}] (python jobs/preflight.py) measures it on this hardware"}
        records[spec.name] = record
    return records


def _prefix_candidates(engine, spec: BackboneSpec, prompts, kinds) -> list[str]:
    """Median answer mass with each candidate assistant prefix (the prefix is only rendered
    text, so the loaded engine is reused)."""
    lines, scored = [], []
    configured = engine.spec
    try:
        for prefix in dict.fromkeys([spec.assistant_prefix, *spec.assistant_prefix_candidates]):
            engine.spec = dataclasses.replace(configured, assistant_prefix=prefix)
            run = score_timed(engine, prompts, kinds)
            median = min(m for m, _ in run.mass_by_kind.values())
            scored.append((median, prefix))
            lines.append(f"  assistant prefix   {prefix!r:<34} lowest median mass {median:.3f}")
    finally:
        engine.spec = configured
    best_mass, best = max(scored)
    current = next(m for m, p in scored if p == spec.assistant_prefix)
    if best != spec.assistant_prefix and best_mass > current + 0.05:
        lines.append(f"  -> recommended: backbone_overrides.{spec.name}.assistant_prefix={best!r} (mass {current:.3f} -> {best_mass:.3f})")
    return lines


def _compare_with_hf(spec: BackboneSpec, prompts, run: EngineRun, result: BackboneResult, options: PreflightOptions) -> None:
    hf_spec = dataclasses.replace(spec, engine="hf", engine_options={})
    try:
        hf = load_engine(hf_spec)
    except Exception as exc:
        result.lines.append(f"  hf vs vllm         not compared: transformers could not load it ({type(exc).__name__}: {exc})")
        return
    try:
        hf_logprobs = hf.score_yes_no(prompts)
    finally:
        hf.close()
    diff = agreement(run.logprobs, hf_logprobs)
    result.lines.append(
        f"  hf vs vllm         max |dP(yes)| {diff['max_abs_p_yes']:.4f} (tolerance {options.tolerance}), max |dlogprob| {diff['max_abs_logprob']:.4f}"
    )
    if diff["max_abs_p_yes"] > options.tolerance:
        result.failures.append(
            f"hf and vLLM disagree: max |dP(yes)| {diff['max_abs_p_yes']:.4f} > {options.tolerance} "
            "(check dtype, quantization, tokenization/BOS and the chat template)"
        )


def run_preflight(cfg: ResolvedConfig, options: PreflightOptions) -> tuple[str, bool]:
    """Check every backbone of `cfg`; returns (report text, every check passed)."""
    require_models(cfg.backbones[name] for name in cfg.sweep.backbones)  # a model that is not there: one line, before any load
    results = []
    for name in cfg.sweep.backbones:
        spec = cfg.backbones[name]
        prompts, kinds = preflight_prompts(cfg, options, spec.system_prompt)
        results.append(check_backbone(spec, prompts, kinds, options, cfg.prompts.templates))
    lines = [line for r in results for line in (*r.lines, "")]
    for r in results:
        if r.invariance is not None:
            url = invariance_url(cfg.sweep.store, r.name)
            write_json(url, r.invariance)
            lines.append(f"invariance record: {url}  (each later run's manifest.json carries it)")
    failed = [r.name for r in results if not r.ok]
    lines.append("preflight " + ("passed" if not failed else f"FAILED for {', '.join(failed)}: do not start the sweep before fixing these"))
    return "\n".join(lines), not failed
