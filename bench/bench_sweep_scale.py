"""The sweep at 100k items with the zero-cost engine: wall time, driver peak RSS, and the rerun
(prints numbers; not a test).

    python bench/bench_sweep_scale.py                                  # 100,000 items, window_items 50k and one pass
    python bench/bench_sweep_scale.py --items 20000 --windows 5000 null

A synthetic GenAI-Bench folder (six generators per prompt, a distinct 8x8 image per item,
`genai_image.json` with 1-5 ratings) is swept with the scripted zero-cost engine writing three
fixed questions per caption (as `curation=smoke` does), so every second is the pipeline's own.
Each case runs in a fresh driver process (its peak RSS is the driver's alone), then runs the same
sweep again: the rerun must send nothing.
"""
from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the synthetic image writer

GENERATORS = ("DALLE_3", "SDXL_Turbo", "DeepFloyd_I_XL_v1", "Midjourney_6", "SDXL_2_1", "SDXL_Base")
QUESTIONS = '["Is there a shape?", "Is the shape filled with one colour?", "Is the background plain?"]'


def write_genai_bench(folder: Path, n_items: int) -> None:
    """`genai_image.json` and `<generator>/<prompt id>.jpeg` for n_items items (PNG bytes: the
    loader and the engine read the content, not the name)."""
    from curation_shards import image_bytes

    n_prompts = -(-n_items // len(GENERATORS))
    entries, written = {}, 0
    for p in range(n_prompts):
        prompt_id = f"{p:05d}"
        models = {}
        for k, model in enumerate(GENERATORS):
            if written == n_items:
                break
            path = folder / model / f"{prompt_id}.jpeg"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(image_bytes(written))
            models[model] = [1 + (p * 7 + k) % 5, 1 + (p * 3 + k * 5) % 5, 1 + (p + k) % 5]
            written += 1
        entries[prompt_id] = {"id": prompt_id, "prompt": f"a plain square of colour number {p} on a white background", "models": models}
    (folder / "genai_image.json").write_text(json.dumps(entries))


def _config(root: Path, data: Path, window_items: str):
    from pipeline.config import load_config

    return load_config(
        [f"root={root}", f"data_root={data}", f"window_items={window_items}", "compute.progress_bars=false", "bootstrap.n_resamples=100",
         "compute.rows_per_part=1024"],
        overrides={
            "name": "scale",
            "backbones": ["zero-cost"],
            "benchmarks": ["genai_bench"],
            "benchmark_overrides": {"genai_bench": {"options": {"skills": None}, "protocol": {"statistics": ["srcc", "plcc", "pairwise_acc"], "breakdowns": []}}},
            "metrics": ["depict", "agree", "vqascore", "soft_tifa_am"],
            "target": "depict",
            "baselines": ["vqascore", "soft_tifa_am"],
            "questions": {"source": "model", "generator": "zero-cost", "sets": ["depict"]},
            "backbone_overrides": {"zero-cost": {"engine_options": {"generations": [{"contains": "Description:", "text": QUESTIONS}]}}},
        },
    )


def one_case(args) -> dict:
    import logging

    from pipeline.sweep import run_sweep

    logging.basicConfig(level=logging.WARNING)
    cfg = _config(Path(args.work), Path(args.data), args.window)
    start = time.perf_counter()
    result = run_sweep(cfg)
    wall = time.perf_counter() - start
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    start = time.perf_counter()
    again = run_sweep(cfg)
    rerun = time.perf_counter() - start
    sent = {r.stage: r.sent for r in result.reports}
    return {
        "window_items": args.window, "items": result.counts["items"], "wall_s": wall, "driver_peak_rss_mb": rss,
        "stages_s": {k: round(v, 1) for k, v in result.timings.items()}, "sent": sent,
        "rerun_s": rerun, "rerun_sent": sum(r.sent for r in again.reports), "errors": result.counts["errors"],
        "driver_peak_rss_after_rerun_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--items", type=int, default=100_000)
    parser.add_argument("--windows", nargs="+", default=["50000", "null"], help="window_items values, one case each")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--work", help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    parser.add_argument("--window", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print("RESULT " + json.dumps(one_case(args)), flush=True)
        return
    base = Path(tempfile.mkdtemp(prefix="bench-sweep-"))
    try:
        data = base / "datasets"
        start = time.perf_counter()
        write_genai_bench(data / "GenAI-Image-1600", args.items)
        print(f"{args.items:,} items written in {time.perf_counter() - start:.0f} s", flush=True)
        for window in args.windows:
            work = base / f"work-{window}"
            cmd = [sys.executable, __file__, "--one", "--work", str(work), "--data", str(data), "--window", window]
            proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
            line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
            if proc.returncode or line is None:
                print(f"window_items={window} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}", flush=True)
                continue
            c = json.loads(line[len("RESULT "):])
            print(f"window_items={window}: {c['items']:,} items in {c['wall_s']:.0f} s, driver peak RSS {c['driver_peak_rss_mb']:,.0f} MB; "
                  f"sent {c['sent']}; errors {c['errors']}; stages {c['stages_s']}", flush=True)
            print(f"    rerun: {c['rerun_s']:.0f} s, sent {c['rerun_sent']}; peak RSS after it {c['driver_peak_rss_after_rerun_mb']:,.0f} MB", flush=True)
            shutil.rmtree(work, ignore_errors=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
