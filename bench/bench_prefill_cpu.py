"""Prompt processing per CPU-second, Strata vs llama.cpp, same thread count (issue 7).

    python bench/bench_prefill_cpu.py --model /work/bench-models/q3moe-6l-Q4_K_M.gguf --pp 512

On a shared machine wall times swing with the load (a descheduled thread stalls its peers);
the CPU time an engine spends on a prompt swings less. Both engines run with `--threads`
threads (Strata: threads - 1 pool workers plus the calling thread; llama.cpp: `n_threads` =
`n_threads_batch`), alternated (A B A B), each after an 8-token warm-up; a prompt of n random
tokens is evaluated and n ÷ the process CPU time (`time.process_time()`, all threads, spinning
at barriers included for both) is reported as tok per CPU-second, with the wall rate beside it.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--pp", default="512", help="prompt lengths, comma-separated")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2, help="at least 2")
    args = ap.parse_args()
    import llama_cpp
    from strata._core import Model

    if args.threads < 2:
        ap.error("--threads must be at least 2 (the pool's caller plus one worker)")
    pps = [int(v) for v in args.pp.split(",")]
    n_ctx = max(pps) + 64
    sm = Model.open(args.model, n_ctx=n_ctx, n_slots=1, prefill_chunk=512, threads=args.threads)
    ll = llama_cpp.Llama(
        str(args.model),
        n_ctx=n_ctx,
        n_batch=512,
        n_ubatch=512,
        n_threads=args.threads,
        n_threads_batch=args.threads,
        verbose=False,
    )
    rng = np.random.default_rng(0)

    def strata(ids: list[int]) -> None:
        sm.free(0)
        sm.forward(0, ids, logits="last")

    def llama(ids: list[int]) -> None:
        ll.reset()
        ll.eval(ids)

    engines = {"llama.cpp": llama, "strata": strata}
    warm = rng.integers(0, sm.n_vocab, 8).tolist()
    for f in engines.values():
        f(warm)
    for n in pps:
        ids = rng.integers(0, sm.n_vocab, n).tolist()
        cpu: dict[str, list[float]] = {k: [] for k in engines}
        wall: dict[str, list[float]] = {k: [] for k in engines}
        for r in range(args.reps):
            for name, f in engines.items():
                c0, w0 = time.process_time(), time.perf_counter()
                f(ids)
                c, w = time.process_time() - c0, time.perf_counter() - w0
                cpu[name].append(n / c)
                wall[name].append(n / w)
                print(f"rep {r} pp{n} {name}: {n / c:.1f} tok/CPU-s, {n / w:.1f} tok/s wall")
        a, b = statistics.median(cpu["llama.cpp"]), statistics.median(cpu["strata"])
        print(f"pp{n} median tok per CPU-second: llama.cpp {a:.1f}, strata {b:.1f}, {b / a:.2f}x")


if __name__ == "__main__":
    main()
