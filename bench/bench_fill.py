"""Fill throughput of the RAM tier vs a plain sequential read of the same bytes.

    python bench/bench_fill.py [--model M.gguf] [--layers 2] [--threads 1,2,4,8] [--repeat 1]

Without --model it builds (once, cached under ~/.cache/strata/bench) a random qwen3moe GGUF
at Qwen3-30B-A3B width (hidden 2048, 128 experts of FF 768) with `--layers` layers in F16 and
a small vocabulary: ~1.2 GB of experts per layer, so the page cache matters. Every trial
starts from the same cache state: the file is evicted with posix_fadvise(POSIX_FADV_DONTNEED)
after every map of it is dropped, and the cached fraction is printed (mincore) to prove it.

Trials, all over exactly the expert bytes (every layer's ffn_{gate,up,down}_exps):
- `read`: one thread reads the expert tensors in file order with 8 MiB read() calls (what
  `cat` does): the baseline.
- `warm`: `strata-fill warm --mode mmap`'s work (prefault into the page cache) with N threads.
- `arena`: `--mode resident`'s work (copy into the anonymous arena) with N threads.
The ratio is trial throughput / baseline throughput (target >= 0.9 for warm).

Cold start to first token and decode per RAM mode: bench/bench_tier_decode.py.
"""

from __future__ import annotations

import argparse
import gc
import os
import time
from pathlib import Path

from strata import _core

GIB = float(1 << 30)
CHUNK = 8 << 20


def build_model(layers: int) -> Path:
    from strata import modelgen
    from strata.modelgen import ModelSpec

    spec = ModelSpec.qwen3_30b_a3b(layers=layers, vocab="small", n_vocab=4096)
    root = modelgen.user_cache_dir() / "bench"
    root.mkdir(parents=True, exist_ok=True)
    path = root / f"qwen3-30b-a3b-width-{layers}l-{spec.key(0, 'f16')}-F16.gguf"
    if not path.is_file():
        t = time.perf_counter()
        print(f"building {path} ...", flush=True)
        tmp = path.with_suffix(".part")
        modelgen.write_qwen3moe(tmp, spec, seed=0, dtype="f16")
        os.replace(tmp, path)
        print(f"built in {time.perf_counter() - t:.0f} s", flush=True)
    return path


def expert_ranges(path: Path) -> list[tuple[int, int]]:
    """(offset, nbytes) of every stacked expert tensor, in file order."""
    r = _core.GGUFReader(path)
    try:
        out = [
            (off, nb)
            for name, _, _, nb, _, off in r.tensor_infos()
            if name.endswith(("ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight"))
        ]
    finally:
        r.close()
    return sorted(out)


def cold(path: Path) -> float:
    """Evict the file; return the fraction of its expert bytes still cached (should be ~0)."""
    gc.collect()
    with open(path, "rb") as f:
        os.fsync(f.fileno())  # dirty pages (a freshly built file) cannot be dropped
    _core.evict_page_cache(path)
    t = _core.ExpertTier(path)
    frac = t.page_cache_fraction()
    del t
    gc.collect()
    _core.evict_page_cache(path)
    return frac


def sequential_read(path: Path, ranges: list[tuple[int, int]]) -> tuple[int, float]:
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    done = 0
    t = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        for off, nb in ranges:
            f.seek(off)
            left = nb
            while left:
                n = f.readinto(view[: min(CHUNK, left)])
                if not n:
                    raise OSError(f"short read at {off + nb - left}")
                left -= n
                done += n
    return done, time.perf_counter() - t


def tier_fill(path: Path, mode: str, threads: int) -> tuple[int, float]:
    tier = _core.ExpertTier(path, mode, lock=False)
    t = time.perf_counter()
    h = tier.fill(threads=threads)
    h.wait()
    secs = time.perf_counter() - t
    done = int(h.progress()["done_bytes"])
    del h, tier
    gc.collect()
    return done, secs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", help="GGUF to read (default: build the bench model)")
    ap.add_argument("--layers", type=int, default=2, help="layers of the built model")
    ap.add_argument("--threads", default="1,2,4,8", help="fill thread counts to try")
    ap.add_argument("--modes", default="warm,arena", help="trials (each paired with a read)")
    ap.add_argument("--repeat", type=int, default=1, help="pairs per trial (best ratio kept)")
    a = ap.parse_args()
    path = Path(a.model) if a.model else build_model(a.layers)
    ranges = expert_ranges(path)
    total = sum(nb for _, nb in ranges)
    print(
        f"model {path.name}: {path.stat().st_size / GIB:.2f} GiB file, "
        f"{total / GIB:.2f} GiB of experts"
    )
    threads = [int(x) for x in a.threads.split(",")]
    trials = [(m, n) for m in a.modes.split(",") for n in threads]
    # Paired runs: every trial is preceded by its own baseline read from the same cold state,
    # so a disk shared with other jobs drifts both figures together.
    rows = []
    for name, n in trials:
        pairs = []
        for _ in range(a.repeat):
            f0 = cold(path)
            done, secs = sequential_read(path, ranges)
            base = done / GIB / secs
            f1 = cold(path)
            mode = "mmap" if name == "warm" else "resident"
            done, secs = tier_fill(path, mode, n)
            if done != total:
                raise SystemExit(f"{name}: filled {done} bytes, expected {total}")
            pairs.append((done / GIB / secs / base, base, done / GIB / secs, max(f0, f1)))
        ratio, base, gbs, frac = max(pairs)
        rows.append((name, n, frac, base, gbs, ratio))
        print(f"  {name:<6} threads {n:>2}: {gbs:6.2f} GiB/s vs read {base:.2f} ({ratio:.2f}x)")
    print()
    print("| trial | threads | cached before | sequential read GiB/s | trial GiB/s | ratio |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for name, n, frac, base, gbs, ratio in rows:
        print(f"| {name} | {n} | {100 * frac:.1f}% | {base:.2f} | {gbs:.2f} | {ratio:.2f}x |")


if __name__ == "__main__":
    main()
