"""The missing-key check and the keyed read of a window against big compacted stores (prints
numbers; not a test).

    python bench/bench_store.py                               # 100k-key windows vs 1M and 10M stored keys
    python bench/bench_store.py --stores 1000000 --window 10000
    python bench/bench_store.py --compare /path/to/other/checkout   # the same stores read by other code

A store of answers is built night by night, as production stores grow: each night writes
`--night` random content keys in big parts and is compacted (`PartStore.compact`, which also
writes each compacted part's key index). Then three windows of `--window` keys are looked up:

- mostly new: 1% of the window stored (spread over every night), 99% new;
- half stored, scattered: half the window drawn uniformly from every night, half new (worst
  case for value reads: hits in every row group);
- half stored, one night: half the window from the latest night, half new (an all-cached rerun
  of a night next to new work).

For each: seconds of `missing(window)` and of `read(["key", "logp_yes", "logp_no"], keys=window)`,
cold (the process reads the key indexes) and warm (a second window call: indexes parsed before,
as for a driver reading window after window), bytes the process read for each (/proc/self/io
rchar: the bytes an object store would serve; files are in the page cache here, so seconds
are CPU and parsing), the process's CPU seconds (all threads; less sensitive than wall time to
a machine shared with other work) and the reading process's peak RSS. Every case runs in a
fresh process, with this checkout's code and, with --compare, another checkout's code on the
same store (back to back). Ratios 10M/1M show how the cost grows with the store: flat is
close to 1.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WINDOWS = ("mostly_new", "half_scattered", "half_one_night")


def _keys(seed: int, n: int):
    """n random 32-hex-character keys (content keys look like this), built without per-key Python."""
    import numpy as np
    import pyarrow as pa

    data = np.random.default_rng(seed).bytes(16 * n).hex().encode()
    offsets = (np.arange(n + 1, dtype=np.int32) * 32).tobytes()
    return pa.StringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(data))


def _rchar() -> int:
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("rchar"))


def build(root: str, size: int, night: int, rows_per_part: int) -> dict:
    import numpy as np
    import pyarrow as pa

    from operators import schema
    from pipeline.store.parts import PartStore

    store = PartStore(root, schema.ANSWERS)
    write_s = compact_s = 0.0
    rng = np.random.default_rng(0)
    for n_i, offset in enumerate(range(0, size, night)):
        keys = _keys(1000 + n_i, min(night, size - offset))
        start = time.perf_counter()
        for i in range(0, len(keys), rows_per_part):
            chunk = keys.slice(i, rows_per_part)
            n = len(chunk)
            store.write(pa.table({"key": chunk, "backbone": pa.repeat("zero-cost", n), "kind": pa.repeat("image", n),
                                  "logp_yes": rng.random(n) - 1, "logp_no": rng.random(n) - 1}))
        write_s += time.perf_counter() - start
        start = time.perf_counter()
        store.compact()
        compact_s += time.perf_counter() - start
    files = [p for p in Path(root).iterdir() if p.is_file()]
    return {"write_s": write_s, "compact_s": compact_s, "nights": -(-size // night),
            "parts": sum(p.name.endswith(".parquet") for p in files), "part_bytes": sum(p.stat().st_size for p in files if p.name.endswith(".parquet")),
            "index_bytes": sum(p.stat().st_size for p in files if p.name.endswith(".keyidx")),
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def window(kind: str, size: int, night: int, n: int):
    """(window keys, how many of them are stored)."""
    import numpy as np
    import pyarrow as pa

    nights = -(-size // night)
    stored_n = n // 100 if kind == "mostly_new" else n // 2
    rng = np.random.default_rng(7)
    if kind == "half_one_night":
        last = _keys(1000 + nights - 1, min(night, size - (nights - 1) * night))
        stored = last.take(pa.array(rng.choice(len(last), stored_n, replace=False)))
    else:  # spread over every night
        per = [stored_n // nights + (i < stored_n % nights) for i in range(nights)]
        picks = []
        for i, k in enumerate(per):
            keys = _keys(1000 + i, min(night, size - i * night))
            picks.append(keys.take(pa.array(rng.choice(len(keys), k, replace=False))))
        stored = pa.concat_arrays(picks)
    new = _keys(99, n - stored_n)
    return pa.concat_arrays([stored, new]), stored_n


def measure(root: str, kind: str, size: int, night: int, n: int) -> dict:
    from operators import schema
    from pipeline.store.parts import PartStore

    keys, stored_n = window(kind, size, night, n)
    store = PartStore(root, schema.ANSWERS)
    store.missing(_keys(5, 10))  # imports and lazy initialisation, outside the timings
    out = {}
    for what, call in (("check", lambda: store.missing(keys)), ("read", lambda: store.read(["key", "logp_yes", "logp_no"], keys=keys))):
        for when in ("cold", "warm"):  # cold: this process reads the indexes; warm: it parsed them before
            if when == "cold":
                _clear_index_cache()
            io, start, cpu = _rchar(), time.perf_counter(), time.process_time()
            result = call()
            out[f"{what}_{when}_s"], out[f"{what}_{when}_cpu_s"] = time.perf_counter() - start, time.process_time() - cpu
            out[f"{what}_{when}_bytes"] = _rchar() - io
            found = n - int(result.to_numpy(zero_copy_only=False).sum()) if what == "check" else result.num_rows
            assert found == stored_n, f"{what}: {found} keys found stored, {stored_n} are"
    out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return out


def _clear_index_cache() -> None:
    """Forget parsed key indexes (code without them has nothing to forget)."""
    from pipeline.store import parts

    cache = getattr(parts, "_INDEXES", None)
    if cache is not None:
        parts._INDEXES = type(cache)(cache.max_bytes)


def _child(code: Path, *args) -> dict:
    env = {**os.environ, "PYTHONPATH": str(code)}
    done = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child", *map(str, args)], env=env, cwd=code,
                          capture_output=True, text=True, check=False)
    if done.returncode:
        raise SystemExit(f"child {args} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stores", type=int, nargs="+", default=[1_000_000, 10_000_000], help="stored keys per case")
    parser.add_argument("--night", type=int, default=1_000_000, help="keys written (and compacted) per night")
    parser.add_argument("--window", type=int, default=100_000, help="keys per looked-up window")
    parser.add_argument("--rows-per-part", type=int, default=250_000)
    parser.add_argument("--compare", type=Path, help="another checkout whose store code reads the same stores")
    parser.add_argument("--workdir", type=Path, help="where stores are built (default: a temporary folder, removed)")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        mode, root, *rest = args.child
        out = build(root, *map(int, rest)) if mode == "build" else measure(root, rest[0], *map(int, rest[1:]))
        print(json.dumps(out))
        return
    work = args.workdir or Path(tempfile.mkdtemp(prefix="bench-store-"))
    codes = {"this": ROOT} | ({"compare": args.compare.resolve()} if args.compare else {})
    results = {}
    try:
        for size in args.stores:
            root = work / f"store-{size}"
            shutil.rmtree(root, ignore_errors=True)
            built = _child(ROOT, "build", root, size, args.night, args.rows_per_part)
            print(f"store of {size:,} keys: {built['nights']} nights written in {built['write_s']:.1f} s, compacted in "
                  f"{built['compact_s']:.1f} s (peak {built['peak_rss_mb']:.0f} MB); {built['parts']} parts, "
                  f"{built['part_bytes'] / 1e6:.0f} MB, key indexes {built['index_bytes'] / 1e6:.1f} MB", flush=True)
            for kind in WINDOWS:
                for label, code in codes.items():
                    m = results[(size, kind, label)] = _child(code, "measure", root, kind, size, args.night, args.window)
                    print(f"  {kind:15s} {label:8s} " + " | ".join(
                        f"{what} {when} {m[f'{what}_{when}_s']:5.2f} s (cpu {m[f'{what}_{when}_cpu_s']:5.2f}) {m[f'{what}_{when}_bytes'] / 1e6:5.1f} MB"
                        for what in ("check", "read") for when in ("cold", "warm")) + f" | peak RSS {m['peak_rss_mb']:5.0f} MB", flush=True)
            shutil.rmtree(root, ignore_errors=True)
        if len(args.stores) > 1:
            small, big = min(args.stores), max(args.stores)
            print(f"ratio {big:,} / {small:,} stored keys (flat = 1):")
            for kind in WINDOWS:
                for label in codes:
                    a, b = results[(small, kind, label)], results[(big, kind, label)]
                    print(f"  {kind:15s} {label:8s} " + "  ".join(
                        f"{what} {when} x{b[f'{what}_{when}_s'] / a[f'{what}_{when}_s']:.2f} (cpu x{b[f'{what}_{when}_cpu_s'] / a[f'{what}_{when}_cpu_s']:.2f}, "
                        f"bytes x{b[f'{what}_{when}_bytes'] / max(a[f'{what}_{when}_bytes'], 1):.2f})"
                        for what in ("check", "read") for when in ("cold", "warm")))
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
