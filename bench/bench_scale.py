"""Where the pipeline's own time goes at scale (prints numbers; not a test).

    python bench/bench_scale.py                          # 100,000 pairs
    python bench/bench_scale.py --pairs 10000 100000     # several sizes, one after the other
    python bench/bench_scale.py --pairs 1000000          # opt-in: a million pairs (long)
    python bench/bench_scale.py --baseline ../main-before   # the same cases on another checkout's code, back to back
    python bench/bench_scale.py --baseline ../main-before --rounds 2   # ABBA: each checkout first once

Synthetic shards (half Parquet with embedded images, half WebDataset tars; tests/curation_shards.py)
are curated with the zero-cost scripted engine, so every second measured is the pipeline's own:
reading shards, packing and hashing images, questions, request keys, answers, scores, publishing.
Each case runs in a fresh driver process (its peak RSS is the driver's alone) and reports:

- wall seconds per stage (the curation's own timings), requests/s (generations + answers sent,
  over the whole run) and pairs/s;
- the answer actor's per-request overhead excluding the engine: the actor run in process on a
  slice of the night's requests, called as that checkout's pipeline calls it (here: Ray batches of
  `compute.rows_per_batch` rows through `PartWriter`, parts written in the background; older code:
  one call per part), minus the time inside `engine.score_yes_no`. Reported as wall and CPU
  microseconds per request, and the CPU split into image reading + decoding (which a GPU engine
  overlaps: the next micro-batch decodes in a thread while the engine runs) and the rest (the
  actor's own Python: prompts, answers, statuses, part writes). Also the answers stage's
  per-request cost on Ray (its wall time over the requests it sent);
- driver peak RSS; parts and bytes in the answer and generation stores;
- the rerun of the same night (manifest: nothing to do) and the same input under another
  curation name (every answer cached: the cost of the pipeline around a warm cache);
- the missing-key check of the night's answer keys against a store holding 10x as many keys.

Each checkout runs with its own default `compute.rows_per_part` (its conf/curation/default.yaml,
else its `ComputeSpec`) unless `--rows-per-part` is given, which then applies to every checkout.
`--actor-only` measures the answer actor alone (seconds, not minutes).

The machine is shared and noisy: compare ratios measured back to back (`--baseline`), not
absolute times across runs. What one case leaves to the disk (its store and outputs, then their
removal) slows the case after it, so the disk is synced before each case and `--rounds` repeats
the pair with the order swapped each round; it then prints the ratio of every round.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the synthetic shard writers
sys.path.insert(0, str(ROOT / "bench"))

from bench_curation import write_shards  # noqa: E402


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def _store_size(folder: Path) -> tuple[int, int]:
    """(parts, bytes) of the Parquet files under a store folder."""
    files = [p for p in folder.rglob("*.parquet")] if folder.exists() else []
    return len(files), sum(p.stat().st_size for p in files)


def own_rows_per_part(code: Path) -> int:
    """A checkout's default `compute.rows_per_part` for a curation night: its
    conf/curation/default.yaml, else its ComputeSpec default (the smoke preset these runs
    start from sets 64, a test size)."""
    import yaml

    from pipeline.config import ComputeSpec

    preset = code / "conf" / "curation" / "default.yaml"
    compute = (yaml.safe_load(preset.read_text()) or {}).get("compute") or {} if preset.exists() else {}
    return int(compute.get("rows_per_part") or ComputeSpec().rows_per_part)


def _curate(root: Path, inputs: Path, name: str, rows_per_part: int, extra: list[str]):
    from pipeline.curation.curation_config import load_curation_config
    from pipeline.curation.run import run_curation

    part = [f"compute.rows_per_part={rows_per_part}"]
    cfg = load_curation_config(
        ["curation=smoke", f"root={root}", f"inputs=[{inputs}/]", f"name={name}", "backbones=[zero-cost]",
         *part, "compute.progress_bars=false", *extra]
    )
    start = time.perf_counter()
    result = run_curation(cfg)
    return time.perf_counter() - start, result, cfg


class _TimedEngine:
    """Wraps an engine and adds up the seconds spent inside its calls."""

    def __init__(self, engine):
        self.engine = engine
        self.seconds = 0.0
        self.cpu_seconds = 0.0

    def score_yes_no(self, prompts):
        start, cpu = time.perf_counter(), time.thread_time()  # this thread's CPU: not the part writer's meanwhile
        try:
            return self.engine.score_yes_no(prompts)
        finally:
            self.seconds += time.perf_counter() - start
            self.cpu_seconds += time.thread_time() - cpu


class _TimedLoader:
    """Wraps an image loader (read + decode) and adds up the CPU seconds of its calls, on
    whichever thread they run (the prefetch and decode threads included)."""

    def __init__(self, load):
        import threading

        self.load = load
        self.lock = threading.Lock()
        self.main = threading.main_thread()
        self.cpu_seconds = 0.0  # on every thread
        self.main_cpu_seconds = 0.0  # on the engine's (main) thread: not overlapped with anything
        self.calls = 0

    def __call__(self, uri, *image_hash):
        # (uri, hash) since workers check the bytes against the hash; (uri) in older checkouts
        cpu = time.thread_time()
        try:
            return self.load(uri, *image_hash)
        finally:
            import threading

            spent = time.thread_time() - cpu
            with self.lock:
                self.cpu_seconds += spent
                self.main_cpu_seconds += spent if threading.current_thread() is self.main else 0.0
                self.calls += 1

    def __getattr__(self, name):
        return getattr(self.engine, name)


def actor_overhead(cfg, items, n_requests: int, rows_per_part: int, store_url: str) -> dict:
    """Per-request seconds of the answer actor minus its engine time, in process (no Ray).

    The actor is called as this checkout's pipeline calls it: Ray batches of whole parts
    through `PartWriter` (parts written in a background thread) where the code has it, else
    one call per part. CPU is split into image loading (read + decode, on any thread) and the
    rest; the engine's own time is left out of both.
    """
    import polars as pl
    import pyarrow as pa

    from pipeline.stages import engine_stage, engine_workers, placement
    from pipeline.stages.answers import plan_answers

    backbone = cfg.backbones["zero-cost"]
    captions = items["caption"].unique(maintain_order=True)
    texts = ["Is there a shape?", "Is the shape filled with one colour?", "Is the background plain?"]  # conf/curation/smoke.yaml
    questions = pl.concat(
        [
            pl.DataFrame({"caption": captions, "question_set": "depict", "question_id": f"q{k}", "question": text,
                          "parents": [[] for _ in range(captions.len())], "claim_type": None},
                         schema_overrides={"parents": pl.List(pl.String), "claim_type": pl.String})
            for k, text in enumerate(texts)
        ]
    )
    plan = plan_answers(items, questions, backbone, cfg.prompts, ["depict"], holistic=True)
    requests = plan.requests.slice(0, n_requests)
    kwargs = {"backbone": backbone, "templates": cfg.prompts.templates, "store_url": store_url}
    batched = hasattr(engine_stage, "PartWriter") and hasattr(engine_stage, "cut_batches")
    if batched:  # Ray batches of whole parts, as compute_blocks sends them
        writer = engine_stage.PartWriter(engine_workers.AnswerWorker, kwargs)
        worker, call = writer.worker, writer
        pool = placement.ActorPool(rows_per_batch=cfg.sweep.compute.rows_per_batch, rows_per_part=rows_per_part)
        calls = engine_stage.cut_batches(requests, pa.array([True] * requests.num_rows), pool)
    else:  # older code: one worker call per part
        worker = call = engine_workers.AnswerWorker(**kwargs)
        calls = [requests.slice(offset, rows_per_part) for offset in range(0, requests.num_rows, rows_per_part)]
    timed = _TimedEngine(worker.engine)
    worker.engine = timed
    loader = worker.load_image = _TimedLoader(worker.load_image)
    start, cpu, main = time.perf_counter(), time.process_time(), time.thread_time()
    statuses = [call(batch) for batch in calls]
    wall, cpu, main = time.perf_counter() - start, time.process_time() - cpu, time.thread_time() - main
    failed = [row for status in statuses for row in status.select(["ok", "detail"]).to_pylist() if not row["ok"]]
    if failed:  # a figure measured on requests that failed (e.g. no image loaded) would flatter the code
        raise RuntimeError(f"actor_overhead: {len(failed)} of {requests.num_rows} requests failed, e.g. {failed[0]['detail']}")
    n = max(requests.num_rows, 1)
    own_cpu = cpu - timed.cpu_seconds
    engine_thread = main - timed.cpu_seconds - loader.main_cpu_seconds  # prompts, answers, statuses
    background = cpu - main - (loader.cpu_seconds - loader.main_cpu_seconds)  # part writes (PartSink's thread)
    return {"requests": requests.num_rows, "rows_per_part": rows_per_part, "calls": len(calls), "batched": batched,
            "wall_s": wall, "engine_s": timed.seconds, "overhead_us": (wall - timed.seconds) / n * 1e6,
            "cpu_overhead_us": own_cpu / n * 1e6, "image_cpu_us": loader.cpu_seconds / n * 1e6,
            "cpu_excl_images_us": (own_cpu - loader.cpu_seconds) / n * 1e6, "images_loaded": loader.calls,
            "engine_thread_cpu_us": engine_thread / n * 1e6, "background_cpu_us": background / n * 1e6,
            "image_cpu_on_engine_thread_us": loader.main_cpu_seconds / n * 1e6,
            "us_per_image": loader.cpu_seconds / max(loader.calls, 1) * 1e6}


def missing_check(store_url: str, night_keys, factor: int, rows_per_part: int) -> dict:
    """Seconds of `missing(night keys)` against a store holding `factor` x as many other keys."""
    import pyarrow as pa

    from operators import schema
    from operators.hashing import content_key
    from pipeline.store.parts import PartStore

    store = PartStore(store_url, schema.ANSWERS)
    n_store = factor * len(night_keys)
    start = time.perf_counter()
    rng = random.Random(0)
    for offset in range(0, n_store, rows_per_part):
        n = min(rows_per_part, n_store - offset)
        keys = [content_key("bench-old-night", offset + i) for i in range(n)]
        store.write(pa.table({
            "key": keys, "backbone": ["zero-cost"] * n, "kind": ["image"] * n,
            "logp_yes": [rng.random() - 1 for _ in range(n)], "logp_no": [rng.random() - 1 for _ in range(n)],
        }))
    build = time.perf_counter() - start
    # half of the night already stored, half new
    probe = pa.array(list(night_keys[: len(night_keys) // 2]) + [content_key("bench-old-night", i) for i in range(len(night_keys) - len(night_keys) // 2)])
    start = time.perf_counter()
    mask = store.missing(probe)
    seconds = time.perf_counter() - start
    parts, size = _store_size(Path(store_url))
    out = {"store_keys": n_store, "store_parts": parts, "store_bytes": size, "build_s": build, "check_s": seconds,
           "missing": int(pa.compute.sum(mask).as_py() or 0)}
    if hasattr(store, "compact"):  # this code compacts: the same check once the store is compacted
        start = time.perf_counter()
        store.compact()
        out["compact_s"] = time.perf_counter() - start
        start = time.perf_counter()
        again = store.missing(probe)
        out["check_compacted_s"] = time.perf_counter() - start
        out["compacted_parts"] = _store_size(Path(store_url))[0]
        assert again.equals(mask), "the check after compaction disagrees with the check before it"
    return out


def one_case(args) -> dict:
    """One size on the code importable in this process; returns the figures as a dict."""
    import logging

    from pipeline.runtime import ensure_ray

    logging.basicConfig(level=logging.WARNING)
    work = Path(args.work)
    root = work / "root"
    ensure_ray(num_cpus=args.num_cpus, progress_bars=False)
    args.rows_per_part = args.rows_per_part or own_rows_per_part(Path(args.code))
    if args.actor_only:
        return actor_case(args, root, work)
    # Warm-up: Ray starts its workers on the first jobs; a night pays that once, the figures below do not.
    _curate(root, Path(args.warmup), "warmup", args.rows_per_part, args.set)
    rss_before = _peak_rss_mb()
    seconds, result, cfg = _curate(root, Path(args.inputs), "night", args.rows_per_part, args.set)
    rss = _peak_rss_mb()
    rows_per_part = args.rows_per_part
    sent = sum(r.sent for r in result.reports if r.stage in ("answers", "questions"))
    answers = result.stage("answers")
    out = {
        "code": args.code, "pairs": result.totals()["rows_in"], "rows_per_part": rows_per_part,
        "wall_s": seconds, "stages_s": {k: v for k, v in result.timings.items() if k != "total"},
        "requests_sent": sent, "requests_per_s": sent / seconds, "pairs_per_s": result.totals()["rows_in"] / seconds,
        "answers_sent": answers.sent, "answers_stage_us_per_request": answers.seconds / max(answers.sent, 1) * 1e6,
        "driver_peak_rss_mb": rss, "driver_rss_before_mb": rss_before,
    }
    store = Path(cfg.sweep.store)
    out["answer_parts"], out["answer_bytes"] = _store_size(store / "answers")
    out["generation_parts"], out["generation_bytes"] = _store_size(store / "generations")
    again, _, _ = _curate(root, Path(args.inputs), "night", args.rows_per_part, args.set)
    out["same_night_again_s"] = again
    cached_s, cached, _ = _curate(root, Path(args.inputs), "night-cached", args.rows_per_part, args.set)
    out["all_cached_rerun_s"] = cached_s
    out["all_cached_sent"] = sum(r.sent for r in cached.reports if r.stage in ("answers", "questions"))
    out["all_cached_stages_s"] = {k: v for k, v in cached.timings.items() if k != "total"}
    out["all_cached_ratio"] = cached_s / seconds
    # the actor's own overhead, on the night's items (images already extracted)
    items = _night_items(cfg, result)
    out["actor"] = actor_overhead(cfg, items, min(args.actor_requests, 4 * items.height), rows_per_part, str(work / "actor-store"))
    if args.store_factor:
        from pipeline.stages.answers import answer_store

        keys = answer_store(cfg.sweep.store, cfg.backbones["zero-cost"]).read(["key"]).column("key").to_pylist()
        out["missing_check"] = missing_check(str(work / "big-store"), keys[: args.missing_keys or len(keys)], args.store_factor, rows_per_part)
    return out


def actor_case(args, root: Path, work: Path) -> dict:
    """`--actor-only`: the answer actor's figures alone, on the first shard's items (no curation run)."""
    from pipeline.curation.curation_config import load_curation_config

    cfg = load_curation_config(["curation=smoke", f"root={root}", f"inputs=[{args.inputs}/]", "name=actor", "backbones=[zero-cost]",
                                f"compute.rows_per_part={args.rows_per_part}", "compute.progress_bars=false", *args.set])
    items = _night_items(cfg, None)
    rows_per_part = args.rows_per_part
    actor = actor_overhead(cfg, items, min(args.actor_requests, 4 * items.height), rows_per_part, str(work / "actor-store"))
    return {"code": args.code, "pairs": items.height, "rows_per_part": rows_per_part, "actor": actor}


def _night_items(cfg, result):
    """ITEMS of the night's first shard (enough for the actor's figures), read as curation reads them."""
    from pipeline.curation.rows import pairs_to_items, read_pairs
    from pipeline.curation.shards import discover
    from pipeline.stages import ingest

    shards = discover(cfg.sweep.inputs)[:1]
    items, _ = pairs_to_items(read_pairs(shards, cfg), shards)
    items, _, _ = ingest.prepare_items(items)
    return items


def print_actor(a: dict) -> None:
    print(f"    actor in process: {a['overhead_us']:.1f} us/request excluding the engine, CPU {a.get('cpu_overhead_us', float('nan')):.1f} us "
          f"({a['requests']:,} requests, engine {a['engine_s']:.2f} of {a['wall_s']:.2f} s)")
    if "image_cpu_us" in a:
        print(f"    actor CPU per request: {a['image_cpu_us']:.1f} us reading + decoding images ({a['images_loaded']:,} images, "
              f"{a['us_per_image']:.0f} us each), {a['cpu_excl_images_us']:.1f} us the rest; "
              f"{a['calls']} calls of {'Ray batches through PartWriter' if a['batched'] else 'one part'}", flush=True)
    if "engine_thread_cpu_us" in a:
        print(f"    by thread: engine thread {a['engine_thread_cpu_us']:.1f} us/request of its own Python (prompts, answers, statuses) "
              f"+ {a['image_cpu_on_engine_thread_us']:.1f} us decoding images itself; other threads {a['background_cpu_us']:.1f} us "
              f"(part writes) + {a['image_cpu_us'] - a['image_cpu_on_engine_thread_us']:.1f} us decoding ahead", flush=True)


def print_case(c: dict) -> None:
    if "wall_s" not in c:  # --actor-only
        print(f"[{c['code']}] actor only, {c['pairs']:,} items, rows_per_part {c['rows_per_part']}:")
        print_actor(c["actor"])
        return
    stages = ", ".join(f"{k} {v:.1f}" for k, v in c["stages_s"].items())
    print(f"[{c['code']}] {c['pairs']:,} pairs, rows_per_part {c['rows_per_part']}: {c['wall_s']:.1f} s; "
          f"{c['requests_per_s']:,.0f} requests/s ({c['requests_sent']:,} sent), {c['pairs_per_s']:,.0f} pairs/s", flush=True)
    print(f"    stages (s): {stages}")
    print(f"    answers stage on Ray: {c['answers_stage_us_per_request']:.1f} us/request")
    print_actor(c["actor"])
    print(f"    driver peak RSS {c['driver_peak_rss_mb']:,.0f} MB (after warm-up {c['driver_rss_before_mb']:,.0f} MB); "
          f"answers {c['answer_parts']:,} parts / {c['answer_bytes'] / 1e6:.1f} MB, generations {c['generation_parts']:,} parts / {c['generation_bytes'] / 1e6:.1f} MB")
    print(f"    same night again {c['same_night_again_s']:.1f} s; all-cached rerun {c['all_cached_rerun_s']:.1f} s "
          f"= {c['all_cached_ratio']:.0%} of the first run (sent {c['all_cached_sent']}; "
          + ", ".join(f"{k} {v:.1f}" for k, v in c["all_cached_stages_s"].items()) + ")")
    m = c.get("missing_check")
    if m:
        print(f"    missing-key check: {m['check_s']:.2f} s for the night's keys against {m['store_keys']:,} stored keys "
              f"({m['store_parts']:,} parts, {m['store_bytes'] / 1e6:.0f} MB; built in {m['build_s']:.0f} s)")
        if "check_compacted_s" in m:
            print(f"    after compaction ({m['compact_s']:.1f} s, {m['compacted_parts']:,} parts): {m['check_compacted_s']:.2f} s")


def run_case(args, base: Path, inputs: Path, n: int, code: str, rows_per_part: int | None, k: int) -> dict | None:
    """One case in a fresh driver process; its work folder is removed after it. The disk is
    synced before it starts, so writes left by the case before are not on its clock."""
    work = base / f"work-{n}-{k}"
    cmd = [sys.executable, __file__, "--one", "--code", code, "--work", str(work), "--inputs", str(inputs),
           "--warmup", str(base / "warmup"),
           "--store-factor", str(args.store_factor), "--missing-keys", str(args.missing_keys),
           "--actor-requests", str(args.actor_requests)]
    cmd += ["--rows-per-part", str(rows_per_part)] if rows_per_part else []
    cmd += ["--actor-only"] if args.actor_only else []
    cmd += [f"--set={s}" for s in args.set]
    if args.num_cpus:
        cmd += ["--num-cpus", str(args.num_cpus)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([code, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    os.sync()
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=code)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if proc.returncode or line is None:
        print(f"[{code}] {n} pairs failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}", flush=True)
        return None
    return json.loads(line[len("RESULT "):])


def compare(args, here: list[dict], n: int) -> float | None:
    """This checkout's figures over the baseline's, for the cases of one round; returns the
    requests/s ratio of this checkout at its own rows_per_part (None without one)."""
    old = next((c for c in here if c["code"] == args.baseline), None) if args.baseline else None
    if old is None:
        return None
    ratio = None
    for new in (c for c in here if c is not old):
        a, b = new["actor"], old["actor"]
        print(f"    this checkout (rows_per_part {new['rows_per_part']}) / baseline (rows_per_part {old['rows_per_part']}) at {n:,} pairs: "
              f"actor overhead x{a['overhead_us'] / b['overhead_us']:.2f} wall, x{a['cpu_overhead_us'] / b['cpu_overhead_us']:.2f} CPU", flush=True)
        if "wall_s" in new and "wall_s" in old:
            print(f"        requests/s x{new['requests_per_s'] / old['requests_per_s']:.2f}, "
                  f"driver RSS x{new['driver_peak_rss_mb'] / old['driver_peak_rss_mb']:.2f}, "
                  f"all-cached rerun x{new['all_cached_rerun_s'] / old['all_cached_rerun_s']:.2f}", flush=True)
            if ratio is None:  # the first: --also-rows-per-part's case comes after it
                ratio = new["requests_per_s"] / old["requests_per_s"]
    return ratio


def summarize_rounds(cases: list[dict], ratios: list[float], n: int) -> None:
    """Over all rounds: each checkout's first-run wall and all-cached ratio, and the
    requests/s ratio of every round (`compare`'s), with their median and minimum."""
    import statistics

    full = [c for c in cases if "wall_s" in c]
    for code in dict.fromkeys(c["code"] for c in full):
        mine = [c for c in full if c["code"] == code]
        walls = sorted(c["wall_s"] for c in mine)
        cached = sorted(c["all_cached_ratio"] for c in mine)
        print(f"[{code}] {len(mine)} rounds at {n:,} pairs: first run {walls[0]:.1f}-{walls[-1]:.1f} s (median {statistics.median(walls):.1f}), "
              f"all-cached rerun {cached[0]:.0%}-{cached[-1]:.0%} of its own first run", flush=True)
    if ratios:
        print(f"    requests/s, this checkout / baseline, per round: {', '.join(f'x{r:.2f}' for r in ratios)}; "
              f"median x{statistics.median(ratios):.2f}, min x{min(ratios):.2f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, nargs="+", default=[100_000], help="night sizes (1,000,000 is opt-in: long)")
    parser.add_argument("--per-shard", type=int, default=5000, help="pairs per shard")
    parser.add_argument("--rows-per-part", type=int, default=None, help="compute.rows_per_part for every checkout (default: each checkout's own)")
    parser.add_argument("--also-rows-per-part", type=int, default=None, help="run this checkout once more with this rows_per_part")
    parser.add_argument("--baseline", default=None, help="another checkout (e.g. ../main-before, a clone at the commit to compare): run each size on its code first")
    parser.add_argument("--store-factor", type=int, default=10, help="missing-key check against a store this many times the night (0: skip)")
    parser.add_argument("--missing-keys", type=int, default=100_000, help="night keys probed in the missing-key check")
    parser.add_argument("--actor-requests", type=int, default=20_000, help="requests for the in-process actor overhead")
    parser.add_argument("--num-cpus", type=int, default=None, help="local Ray CPUs (default: all)")
    parser.add_argument("--rounds", type=int, default=1, help="repeat each size, alternating which checkout goes first (ABBA)")
    parser.add_argument("--set", action="append", default=[], help="extra curation config override (key=value), repeatable")
    parser.add_argument("--actor-only", action="store_true", help="only the answer actor's in-process figures (no curation runs)")
    parser.add_argument("--json", default=None, help="also write every case's figures to this JSON file")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # child: one case
    parser.add_argument("--code", default=str(ROOT), help=argparse.SUPPRESS)
    parser.add_argument("--work", help=argparse.SUPPRESS)
    parser.add_argument("--inputs", help=argparse.SUPPRESS)
    parser.add_argument("--warmup", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print("RESULT " + json.dumps(one_case(args)), flush=True)
        return

    cases = []
    base = Path(tempfile.mkdtemp(prefix="bench-scale-"))
    try:
        write_shards(base / "warmup", 20, 10, offset=5_000_000)
        for n in args.pairs:
            inputs = base / f"in-{n}"
            start = time.perf_counter()
            write_shards(inputs, n, args.per_shard, offset=0)
            print(f"{n:,} pairs written in {time.perf_counter() - start:.0f} s ({inputs})", flush=True)
            pair = [(c, args.rows_per_part) for c in (args.baseline, str(ROOT)) if c]
            ratios = []
            for round_ in range(args.rounds):
                # ABBA: each checkout goes first as often as second (what the one before leaves
                # to the disk, e.g. 100k extracted images to remove, lands on the one after)
                runs = pair if round_ % 2 == 0 else pair[::-1]
                if args.also_rows_per_part:
                    runs = [*runs, (str(ROOT), args.also_rows_per_part)]
                for code, rows_per_part in runs:
                    case = run_case(args, base, inputs, n, code, rows_per_part, len(cases))
                    if case is not None:
                        cases.append(case | {"night_pairs": n, "round": round_})
                        print_case(cases[-1])
                ratio = compare(args, [c for c in cases if c["night_pairs"] == n and c["round"] == round_], n)
                ratios += [ratio] if ratio is not None else []
            if args.rounds > 1:
                summarize_rounds([c for c in cases if c["night_pairs"] == n], ratios, n)
            shutil.rmtree(inputs, ignore_errors=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)
        if args.json:
            Path(args.json).write_text(json.dumps(cases, indent=2))


if __name__ == "__main__":
    main()
