"""How much model work the DAG saves, and how fast it moves requests.

Prints three things (numbers for reports; not a test):
1. requests our DAG sends vs a naive per-item loop, for the demo set and for the paper's
   benchmark sizes (docs/method.md, "Benchmarks and their sizes");
2. on this CPU with the tiny hf model: wall time of the DAG's answer stage vs a naive loop
   over the same items (same model; the answers are checked to be the same);
3. pipeline throughput (requests/s) with the zero-cost scripted engine.

    python bench/bench_dag.py [--throughput-requests 20000]
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import polars as pl  # noqa: E402

# -- 1. request counts -------------------------------------------------------------------

# (items, unique captions, unique images, mean questions per caption, unique (caption, question) pairs)
# from docs/method.md, "Benchmarks and their sizes" (DEPICT Tables 4 and 15). Winoground: 400 examples x 2 images x 2 captions.
# NegBench: 5,914 image rows x 4 candidate captions; its question counts are known for the
# correct captions only (11,652 pairs), so we assume distractors have as many per caption.
PAPER = {
    "GenAI-Bench": dict(items=9_600, captions=1_600, images=9_600, q=5.47, pairs=8_753),
    "TIFA160": dict(items=800, captions=160, images=800, q=4.89, pairs=875),
    "RichHF": dict(items=955, captions=493, images=955, q=5.52, pairs=3_019),
    "Winoground": dict(items=1_600, captions=800, images=800, q=4.16, pairs=3_325),
    "NegBench": dict(items=23_656, captions=23_656, images=5_914, q=11_652 / 5_914, pairs=4 * 11_652),
}
BACKBONES = 11


def paper_counts(b: dict) -> tuple[int, int]:
    """(naive, dag) yes/no requests for one backbone on one benchmark."""
    image_answers = round(b["items"] * b["q"])  # image x question: at most one per item question
    naive = 2 * image_answers + b["items"]  # image + caption-only answer per item question, + holistic
    # Caption-only answers are asked once per unique (caption, question); image answers are
    # counted without dedup (an upper bound: Winoground/NegBench images share questions across
    # their captions, which the DAG also asks once).
    dag = image_answers + b["pairs"] + b["items"]
    return naive, dag


def demo_counts(root: str) -> list[tuple[str, int, int]]:
    from pipeline.config import load_config
    from pipeline.stages import ingest
    from pipeline.stages.answers import plan_answers
    from pipeline.stages.questions import provided_questions

    cfg = load_config([f"root={root}"])
    items, shipped, _ = ingest.load_items(cfg.benchmarks)
    # hash without Ray: the demo's image files are content-addressed, their name is the hash
    from operators.hashing import image_hash

    items = items.with_columns(image_hash=pl.col("image_uri").map_elements(lambda u: image_hash(Path(u).read_bytes()), return_dtype=pl.String))
    sets = cfg.sweep.required_question_sets()
    questions, _ = provided_questions(items, shipped, sets)
    rows = []
    for name in cfg.benchmarks:
        sub = items.filter(pl.col("benchmark") == name)
        plan = plan_answers(sub, questions, cfg.backbones["smoke"], cfg.prompts, sets, holistic=True)
        q = plan.questions
        naive = q.height + q.filter(pl.col("key_t").is_not_null()).height + sub.height
        rows.append((name, naive, plan.requests.num_rows))
    return rows


def print_counts(root: str) -> None:
    print("1. yes/no requests per backbone: naive per-item loop vs this DAG")
    print(f"   {'benchmark':<16}{'naive':>10}{'DAG':>10}{'saved':>8}")
    for name, naive, dag in demo_counts(root):
        print(f"   {name:<16}{naive:>10,}{dag:>10,}{1 - dag / naive:>8.0%}   (demo, depict+dsg questions + holistic)")
    total_naive = total_dag = 0
    for name, b in PAPER.items():
        naive, dag = paper_counts(b)
        total_naive += naive
        total_dag += dag
        print(f"   {name:<16}{naive:>10,}{dag:>10,}{1 - dag / naive:>8.0%}")
    print(f"   {'paper, 1 backbone':<16}{total_naive:>10,}{total_dag:>10,}{1 - total_dag / total_naive:>8.0%}")
    print(f"   {'paper, 11 bb':<16}{total_naive * BACKBONES:>10,}{total_dag * BACKBONES:>10,}   (a rerun of the same sweep: 0)")


# -- 2. tiny model: DAG vs naive loop ----------------------------------------------------


def tiny_dag_vs_naive(root: str) -> None:
    import ray
    import torch

    from operators.answering import answer_batch
    from operators.engines import load_engine
    from operators.engines.base import Prompt
    from operators.images import decode_image, read_image_bytes
    from operators.prompts import fill
    from pipeline.config import load_config
    from pipeline.sweep import run_sweep

    torch.set_num_threads(1)
    cfg = load_config([f"root={root}/dag", "compute.progress_bars=false", "bootstrap.n_resamples=10"])
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    t0 = time.perf_counter()
    result = run_sweep(cfg)
    dag_wall = time.perf_counter() - t0
    (answers_report,) = [r for r in result.reports if r.stage == "answers"]
    ray.shutdown()

    # The naive loop: every item, every question, one request per engine call, no dedup.
    records = pl.read_parquet(f"{result.run_dir}/records/smoke.parquet")
    items = pl.read_parquet(f"{result.run_dir}/items.parquet")
    engine = load_engine(cfg.backbones["smoke"])
    t = cfg.prompts.templates
    images = {}

    def image(uri):
        if uri not in images:
            images[uri] = decode_image(read_image_bytes(uri), uri)
        return images[uri]

    uri_of = dict(zip(items["item_id"], items["image_uri"]))
    hash_of = dict(zip(items["item_id"], items["image_hash"]))
    t0 = time.perf_counter()
    naive_v, naive_t, calls = [], [], 0
    for r in records.iter_rows(named=True):
        img = image(uri_of[r["item_id"]])
        naive_v.append(engine.score_yes_no([Prompt(user=fill(t["answer_image"], question=r["question"]), image=img, image_id=hash_of[r["item_id"]])])[0])
        calls += 1
        if r["question_set"] == "depict":
            naive_t.append(engine.score_yes_no([Prompt(user=fill(t["answer_caption"], caption=r["caption"], question=r["question"]))])[0])
            calls += 1
    for r in items.iter_rows(named=True):
        engine.score_yes_no([Prompt(user=fill(t["holistic"], caption=r["caption"]), image=image(r["image_uri"]), image_id=r["image_hash"])])
        calls += 1
    naive_wall = time.perf_counter() - t0

    # The DAG's own work with the same engine object: unique requests, image-grouped batches.
    from operators import schema
    from pipeline.store.parts import PartStore

    requests = PartStore(f"{cfg.sweep.store}/answers/smoke", schema.ANSWERS).read(["key"])
    needed = pl.from_arrow(requests)
    from pipeline.stages import ingest
    from pipeline.stages.answers import plan_answers
    from pipeline.stages.questions import provided_questions

    _, shipped, _ = ingest.load_items(cfg.benchmarks)
    questions, _ = provided_questions(items, shipped, ["depict", "dsg"])
    plan = plan_answers(items, questions, cfg.backbones["smoke"], cfg.prompts, ["depict", "dsg"], holistic=True)
    rows = cfg.sweep.compute.rows_per_part
    t0 = time.perf_counter()
    for start in range(0, plan.requests.num_rows, rows):
        answer_batch(engine, plan.requests.slice(start, rows), t, image)
    batched_wall = time.perf_counter() - t0
    diff = float(np.max(np.abs(np.array(naive_v)[:, 0] - records["logp_yes_v"].to_numpy())))
    print("2. tiny hf model on this CPU (demo set): answering every item's questions")
    print(f"   naive loop          : {calls:>5} engine calls of 1 request   {naive_wall:7.1f} s")
    print(f"   DAG work, in-process: {plan.requests.num_rows:>5} unique requests, batches of {rows}   {batched_wall:7.1f} s"
          f"   ({naive_wall / batched_wall:.1f}x faster)")
    print(f"   DAG answers stage on Ray, incl. actor start-up and engine load: {answers_report.seconds:.1f} s "
          f"(whole sweep: {dag_wall:.1f} s; {needed.height} answers stored)")
    print(f"   same answers: max |logp_yes| difference naive vs DAG = {diff:.1e}")


# -- 3. zero-cost throughput -------------------------------------------------------------


def zero_cost_throughput(root: str, n_requests: int) -> None:
    import pyarrow as pa
    import ray

    from operators import schema
    from pipeline.config import load_config
    from pipeline.stages.answers import answer_store
    from pipeline.stages.engine_stage import run_engine_stage
    from pipeline.stages.engine_workers import AnswerWorker
    from pipeline.stages.placement import engine_pool

    cfg = load_config([f"root={root}/zc", "backbones=[zero-cost]", "compute.progress_bars=false", "compute.rows_per_part=1024"])
    backbone = cfg.backbones["zero-cost"]
    from pipeline.benchmarks.demo import load as load_demo

    demo = load_demo(f"{root}/zc/datasets/demo")
    uris = sorted(set(demo.items.column("image_uri").to_pylist()))
    rows = []
    for i in range(n_requests):
        if i % 2:
            rows.append({"key": f"k{i}", "backbone": "zero-cost", "kind": "caption", "prompt_id": "v1:x", "caption": f"caption {i // 7}", "text": f"Is there thing {i}?"})
        else:
            uri = uris[(i // 8) % len(uris)]
            rows.append({"key": f"k{i}", "backbone": "zero-cost", "kind": "image", "prompt_id": "v1:x", "image_hash": uri, "image_uri": uri, "text": f"Is there thing {i}?"})
    requests = schema.conform(pa.Table.from_pylist(rows), schema.REQUESTS).sort_by([("image_hash", "ascending")])
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    store = answer_store(cfg.sweep.store, backbone)
    t0 = time.perf_counter()
    report = run_engine_stage(
        stage="answers", unit="zero-cost", requests=requests, store=store, worker_cls=AnswerWorker,
        worker_kwargs={"backbone": backbone, "templates": cfg.prompts.templates, "store_url": store.url},
        pool=engine_pool(backbone, cfg.sweep.compute),
    )
    wall = time.perf_counter() - t0
    t0 = time.perf_counter()
    again = run_engine_stage(
        stage="answers", unit="zero-cost", requests=requests, store=store, worker_cls=AnswerWorker,
        worker_kwargs={"backbone": backbone, "templates": cfg.prompts.templates, "store_url": store.url},
        pool=engine_pool(backbone, cfg.sweep.compute),
    )
    cached_wall = time.perf_counter() - t0
    ray.shutdown()
    print("3. zero-cost engine (no model): pipeline overhead of the answers stage")
    print(f"   {report.sent:,} requests (half with images) in {wall:.1f} s = {report.sent / wall:,.0f} requests/s, 1 actor, "
          f"{cfg.sweep.compute.rows_per_part} rows per part")
    print(f"   rerun: {again.cached:,} cached, {again.sent} sent, in {cached_wall:.2f} s (every key found by the anti-join; markers are only notes)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--throughput-requests", type=int, default=20_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as root:
        print_counts(root)
        print()
        tiny_dag_vs_naive(root)
        print()
        zero_cost_throughput(root, args.throughput_requests)


if __name__ == "__main__":
    main()
