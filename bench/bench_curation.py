"""Throughput of nightly curation on this machine (prints numbers; not a test).

    python bench/bench_curation.py                      # 2,000 pairs zero-cost, 200 pairs tiny VLM
    python bench/bench_curation.py --zero-cost 5000 --tiny 0

Synthetic shards (half Parquet with embedded images, half WebDataset tars) are curated from
scratch, then once more under another curation name sharing the answer cache (every answer
cached: the cost of the pipeline itself). Each case reports pairs per second over the whole
run (reading shards, extracting and hashing images, questions, answers, scores, publishing,
report), after a warm-up run that starts Ray and its workers. Engines:
- zero-cost: the scripted engine, no model: what the DAG itself costs per pair;
- tiny: the random-weight tiny VLM (`smoke` backbone) answers on CPU; questions still come
  from the scripted generator (a random-weight model cannot write parseable questions).
"""
from __future__ import annotations

import argparse
import importlib.util
import logging
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if importlib.util.find_spec("pipeline") is None:  # a fresh clone without `pip install -e .`
    sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # the synthetic shard writers

from curation_shards import pair_rows, tar_samples, write_parquet, write_tar  # noqa: E402

from pipeline.curation import load_curation_config, run_curation  # noqa: E402
from pipeline.runtime import ensure_ray  # noqa: E402


def write_shards(folder: Path, n_pairs: int, per_shard: int, offset: int) -> None:
    for k, start in enumerate(range(0, n_pairs, per_shard)):
        indices = range(offset + start, offset + min(start + per_shard, n_pairs))
        if k % 2 == 0:
            write_parquet(folder / f"part-{k:04d}.parquet", pair_rows(indices))
        else:
            write_tar(folder / f"part-{k:04d}.tar", tar_samples(indices))


def curate(root: Path, inputs: Path, name: str, backbone: str, rows_per_part: int) -> tuple[float, object]:
    cfg = load_curation_config(
        ["curation=smoke", f"root={root}", f"inputs=[{inputs}/]", f"name={name}", f"backbones=[{backbone}]",
         f"compute.rows_per_part={rows_per_part}", "compute.progress_bars=false"]
    )
    start = time.perf_counter()
    result = run_curation(cfg)
    return time.perf_counter() - start, result


def bench(label: str, backbone: str, n_pairs: int, per_shard: int, work: Path, offset: int, rows_per_part: int) -> None:
    inputs = work / f"in-{label}"
    write_shards(inputs, n_pairs, per_shard, offset)
    seconds, result = curate(work, inputs, f"bench-{label}", backbone, rows_per_part)
    answers = result.stage("answers")
    rows = result.totals()["rows_in"]
    stages = ", ".join(f"{k} {v:.1f}s" for k, v in result.timings.items() if k != "total")
    print(f"{label:<10} {rows:>6} pairs in {seconds:6.1f} s = {rows / seconds:7.1f} pairs/s "
          f"({answers.sent} answers, {answers.sent / max(answers.seconds, 1e-9):.0f}/s in the answers stage; {stages})", flush=True)
    seconds, result = curate(work, inputs, f"bench-{label}-cached", backbone, rows_per_part)
    print(f"{label:<10} {rows:>6} pairs in {seconds:6.1f} s = {rows / seconds:7.1f} pairs/s with every answer cached "
          f"(sent {result.stage('answers').sent})", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--zero-cost", type=int, default=2000, help="pairs for the zero-cost engine (0: skip)")
    parser.add_argument("--tiny", type=int, default=200, help="pairs for the tiny VLM (0: skip)")
    parser.add_argument("--per-shard", type=int, default=250, help="pairs per shard")
    parser.add_argument("--rows-per-part", type=int, default=256, help="requests per engine call (the default preset's)")
    parser.add_argument("--num-cpus", type=int, default=None, help="local Ray CPUs (default: all)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    ensure_ray(num_cpus=args.num_cpus, progress_bars=False)
    work = Path(tempfile.mkdtemp(prefix="bench-curation-"))
    try:
        # Warm-up: Ray starts its worker processes on the first jobs; a nightly run pays that
        # once (a few seconds), the per-pair numbers below do not.
        write_shards(work / "in-warmup", 20, 10, offset=2_000_000)
        curate(work, work / "in-warmup", "bench-warmup", "zero-cost", args.rows_per_part)
        print("engine     pairs    wall time   throughput")
        if args.zero_cost:
            bench("zero-cost", "zero-cost", args.zero_cost, args.per_shard, work, 0, args.rows_per_part)
        if args.tiny:
            bench("tiny", "smoke", args.tiny, min(args.per_shard, max(1, args.tiny // 2)), work, 1_000_000, args.rows_per_part)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
