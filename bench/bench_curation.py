"""Throughput of nightly curation on this machine (prints numbers; not a test).

    python bench/bench_curation.py                      # 2,000 pairs zero-cost, 200 pairs tiny VLM
    python bench/bench_curation.py --zero-cost 5000 --tiny 0
    python bench/bench_curation.py --memory 100000 1000000          # driver peak RSS per night size
    python bench/bench_curation.py --memory 60000 --set window_pairs=5000 --per-window   # what each window leaves

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

import pipeline  # noqa: E402, F401  first: it sets the allocators before pyarrow loads (pipeline/runtime.py)

# isort: split
from curation_shards import pair_rows, tar_samples, write_parquet, write_tar  # noqa: E402

from pipeline.curation.curation_config import load_curation_config  # noqa: E402
from pipeline.curation.run import run_curation  # noqa: E402
from pipeline.runtime import ensure_ray  # noqa: E402


def write_shards(folder: Path, n_pairs: int, per_shard: int, offset: int) -> None:
    for k, start in enumerate(range(0, n_pairs, per_shard)):
        indices = range(offset + start, offset + min(start + per_shard, n_pairs))
        if k % 2 == 0:
            write_parquet(folder / f"part-{k:04d}.parquet", pair_rows(indices))
        else:
            write_tar(folder / f"part-{k:04d}.tar", tar_samples(indices))


def curate(root: Path, inputs: Path, name: str, backbone: str, rows_per_part: int, extra: list[str] = ()) -> tuple[float, object]:
    cfg = load_curation_config(
        ["curation=smoke", f"root={root}", f"inputs=[{inputs}/]", f"name={name}", f"backbones=[{backbone}]",
         f"compute.rows_per_part={rows_per_part}", "compute.progress_bars=false", *extra]
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


def driver_state() -> dict:
    """What the driver holds now: RSS (MB), Arrow's pool (MB), the parsed key indexes it keeps
    (MB, pipeline/store/parts.py, bounded), threads, gc-tracked objects, and live Ray objects
    (datasets, streaming executors, object references it owns or borrows)."""
    import gc

    import pyarrow as pa
    import ray

    from pipeline.store.parts import _INDEXES

    gc.collect()
    status = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines())
    rollup = dict(line.split(":", 1) for line in Path("/proc/self/smaps_rollup").read_text().splitlines()[1:])
    mb = lambda table, key: int(table[key].split()[0]) / 1024  # noqa: E731
    objects = gc.get_objects()
    names = [type(o).__name__ for o in objects]
    return {
        "peak": mb(status, "VmHWM"),
        "rss": mb(status, "VmRSS"),
        "anon": mb(rollup, "Anonymous"),
        "shmem": mb(status, "RssShmem"),
        "file": mb(status, "RssFile"),
        "arrow": pa.total_allocated_bytes() / 2**20,
        "indexes": _INDEXES.nbytes / 2**20,
        "threads": int(status["Threads"]),
        "objects": len(objects),
        "datasets": names.count("Dataset") + names.count("MaterializedDataset"),
        "executors": names.count("StreamingExecutor"),
        "refs": len(ray._private.worker.global_worker.core_worker.get_all_reference_counts()),
    }


class PeakWhere:
    """Samples the driver's RSS every few ms in a thread and remembers where the main thread
    was (its innermost frames in pipeline/) when RSS was highest."""

    def __init__(self, every_s: float = 0.01):
        import os
        import threading

        self.every_s, self.page = every_s, os.sysconf("SC_PAGE_SIZE")
        self.main = threading.main_thread().ident
        self.peak, self.where = 0, ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        import traceback

        with open("/proc/self/statm") as statm:
            while not self._stop.wait(self.every_s):
                statm.seek(0)
                rss = int(statm.read().split()[1]) * self.page
                if rss > self.peak:
                    self.peak = rss
                    frame = sys._current_frames().get(self.main)
                    ours = [f for f in traceback.extract_stack(frame) if "/pipeline/" in f.filename] if frame else []
                    self.where = " < ".join(f"{Path(f.filename).stem}.{f.name}:{f.lineno}" for f in reversed(ours[-3:]))

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def probe_windows() -> list[dict]:
    """Print `driver_state()` after each curation window, with where its RSS peaked; returns
    the rows printed."""
    from pipeline.curation import run

    process_window, rows = run.process_window, []

    def probed(*args, **kwargs):
        Path("/proc/self/clear_refs").write_text("5")  # VmHWM from here: this window's peak
        timings = args[3].timings  # the run's CurationResult: seconds per stage, summed over windows
        before = dict(timings)
        with PeakWhere() as peak:
            errors = process_window(*args, **kwargs)
        seconds = " ".join(f"{k}={v - before.get(k, 0.0):.1f}" for k, v in timings.items() if v - before.get(k, 0.0) >= 0.05)
        rows.append(driver_state() | {"peak_at": peak.where, "seconds": seconds})
        print(f"window {len(rows):>3}: " + ", ".join(f"{k} {v:,.1f}" if isinstance(v, float) else f"{k} {v:,}" if isinstance(v, int) else f"{k} {v}" for k, v in rows[-1].items()), flush=True)
        return errors

    run.process_window = probed
    return rows


def memory_case(args) -> None:
    """Child process: one zero-cost night; prints its wall time, windows and driver peak RSS
    (and, with --per-window, the driver's state after each window and its RSS slope)."""
    import resource

    root, inputs = Path(args.work), Path(args.inputs)
    ensure_ray(num_cpus=args.num_cpus, progress_bars=False)
    curate(root, Path(args.warmup), "warmup", "zero-cost", args.rows_per_part)
    probed = probe_windows() if args.per_window else []
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    seconds, result = curate(root, inputs, "night", "zero-cost", args.rows_per_part, args.set)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    peak = max([peak] + [w["peak"] for w in probed])  # each window's probe restarts the kernel's peak
    windows = root / "curation" / "night" / "runs" / result.run_id / "windows"
    n_windows = len(list(windows.iterdir())) if windows.is_dir() else 1
    rows = result.totals()["rows_in"]
    print(f"{rows:>9,} pairs in {seconds:7.0f} s ({rows / seconds:,.0f} pairs/s), {n_windows} window(s): "
          f"driver peak RSS {peak:,.0f} MB (after warm-up {before:,.0f} MB); {result.stage('answers').sent:,} answers sent", flush=True)
    if len(probed) > 2:  # the first window warms caches and pools: the slopes are taken after it
        import numpy as np

        later = probed[1:]
        slope = {k: np.polyfit(np.arange(len(later)), [w[k] for w in later], 1)[0] for k in ("rss", "peak", "indexes")}
        print(f"{rows:>9,} pairs in windows: driver RSS slope {slope['rss']:+.1f} MB/window after windows "
              f"({slope['indexes']:+.1f} of it the key indexes kept), {slope['peak']:+.1f} "
              f"MB/window of window peaks, over windows 2-{len(probed)} (after window 1 {probed[0]['rss']:,.0f} MB, "
              f"after the last {probed[-1]['rss']:,.0f} MB)", flush=True)


def memory(args) -> None:
    """Driver peak RSS of a zero-cost night of each size, each in a fresh driver process."""
    import os
    import subprocess

    work = Path(tempfile.mkdtemp(prefix="bench-curation-memory-"))
    try:
        write_shards(work / "in-warmup", 20, 10, offset=5_000_000)
        for n in args.memory:
            inputs = work / f"in-{n}"
            start = time.perf_counter()
            write_shards(inputs, n, args.per_shard, offset=0)
            print(f"{n:,} pairs written in {time.perf_counter() - start:.0f} s", flush=True)
            cmd = [sys.executable, __file__, "--memory-case", "--work", str(work / f"work-{n}"), "--inputs", str(inputs),
                   "--warmup", str(work / "in-warmup"), "--rows-per-part", str(args.rows_per_part), *[f"--set={x}" for x in args.set]]
            if args.num_cpus:
                cmd += ["--num-cpus", str(args.num_cpus)]
            if args.per_window:
                cmd.append("--per-window")
            proc = subprocess.run(cmd, env=dict(os.environ), text=True, capture_output=True)
            shown = [ln for ln in proc.stdout.splitlines() if "pairs in" in ln or ln.startswith("window")]
            print("\n".join(shown) or proc.stderr[-3000:], flush=True)
            shutil.rmtree(inputs, ignore_errors=True)
            shutil.rmtree(work / f"work-{n}", ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--zero-cost", type=int, default=2000, help="pairs for the zero-cost engine (0: skip)")
    parser.add_argument("--tiny", type=int, default=200, help="pairs for the tiny VLM (0: skip)")
    parser.add_argument("--per-shard", type=int, default=250, help="pairs per shard")
    parser.add_argument("--rows-per-part", type=int, default=256, help="requests per engine call (the default preset's)")
    parser.add_argument("--num-cpus", type=int, default=None, help="local Ray CPUs (default: all)")
    parser.add_argument("--memory", type=int, nargs="+", default=None, help="instead: driver peak RSS of zero-cost nights of these sizes")
    parser.add_argument("--set", action="append", default=[], help="extra curation override (key=value) for --memory, repeatable")
    parser.add_argument("--per-window", action="store_true", help="with --memory: the driver's state after each window")
    parser.add_argument("--memory-case", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--work", help=argparse.SUPPRESS)
    parser.add_argument("--inputs", help=argparse.SUPPRESS)
    parser.add_argument("--warmup", help=argparse.SUPPRESS)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    if args.memory_case:
        return memory_case(args)
    if args.memory:
        if args.per_shard == 250:
            args.per_shard = 5000  # bench_scale's shards
        return memory(args)
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
