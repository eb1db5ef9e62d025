"""Decode speed per RAM mode, and cold start to first token with and without a warm.

    python bench/bench_tier_decode.py [--layers 1] [--tokens 16] [--threads 2]

Model: bench_fill.py's random qwen3moe at Qwen3-30B-A3B width (F16, cached under
~/.cache/strata/bench). Decode: `mmap` with a warm page cache, then `budget` at 25/50% of the
expert bytes and `resident` (100%), each after its fill finished; greedy decode of `--tokens`
tokens after an 8-token prompt, best of 2. Cold start: the file evicted (posix_fadvise
DONTNEED), then `LLM(...)` + the prompt's prefill, without and after a whole-file
`strata-fill warm` (prefault through 4 fill threads; its time is reported apart).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from bench_fill import build_model
from strata._core import ExpertTier, evict_page_cache
from strata.llm import LLM

PROMPT = [11, 22, 33, 44, 55, 66, 77, 88]


def decode_rate(llm: LLM, n: int) -> float:
    best = 0.0
    for _ in range(2):
        llm.free(0)
        logits = llm.forward_batch([(0, PROMPT, "last")])[0]
        t0 = time.perf_counter()
        for _ in range(n):
            logits = llm.forward_batch([(0, [int(logits.argmax())], "last")])[0]
        best = max(best, n / (time.perf_counter() - t0))
    return best


def first_token(path: Path, threads: int) -> float:
    t0 = time.perf_counter()
    llm = LLM(path, n_ctx=64, parallel=1, threads=threads)
    llm.forward_batch([(0, PROMPT, "last")])[0]
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=1)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    path = build_model(a.layers)
    gib = ExpertTier(path).total_bytes / float(1 << 30)
    print(f"model {path.name}: {gib:.2f} GiB of experts")
    # Cold start to first token.
    evict_page_cache(path)
    cold = first_token(path, a.threads)
    evict_page_cache(path)
    t0 = time.perf_counter()
    assert ExpertTier(path).fill(threads=4).wait()
    warm_s = time.perf_counter() - t0
    warmed = first_token(path, a.threads)
    print(
        f"cold start to first token: {cold:.2f} s without warm, {warmed:.2f} s after warm "
        f"({warmed / cold:.2f}x; the warm itself took {warm_s:.2f} s)"
    )
    # Decode per mode (page cache warm from here on).
    print("| mode | resident | decode tok/s |\n| --- | ---: | ---: |")
    for mode, frac in (("mmap", 0.0), ("budget", 0.25), ("budget", 0.5), ("resident", 1.0)):
        llm = LLM(
            path,
            n_ctx=64,
            parallel=1,
            threads=a.threads,
            ram_mode=mode,
            ram_budget_gib=round(frac * gib, 4) if mode == "budget" else 0.0,
        )
        if llm.fill is not None:
            assert llm.fill.wait()
        n, _ = llm.tier.resident()
        share = n / (llm.tier.n_layer * llm.tier.n_expert)
        print(f"| {mode} | {share:.0%} | {decode_rate(llm, a.tokens):.2f} |", flush=True)
        del llm


if __name__ == "__main__":
    main()
