"""One-stream decode speed by KV cache type and context depth (the peer: llama-bench with the same
cache types, which needs its flash attention for quantized V):

    python bench/bench_kv_types.py --model FILE.gguf [--kv f16,q8_0,q4_0] [--depths 64,4000]
    llama-bench -m FILE.gguf -t 2 -p 0 -n 32 -d 4000 -ctk q8_0 -ctv q8_0 -fa on -r 2

Each (type, depth) prefills `depth` random tokens, then times `--gen` one-token steps
(`forward_batch`, the engine's step) three times from the same depth; prints the best."""

from __future__ import annotations

import argparse
import time

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--kv", default="f16,q8_0,q4_0")
    ap.add_argument("--depths", default="64,4000")
    ap.add_argument("--gen", type=int, default=24)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    from strata._core import Model

    print("| KV type | depth | decode tok/s (best of 3) |")
    print("|---|---|---|")
    for kv in a.kv.split(","):
        for depth in (int(d) for d in a.depths.split(",")):
            m = Model.open(
                a.model, n_ctx=depth + a.gen + 16, n_slots=1, threads=a.threads, kv_type=kv
            )
            rng = np.random.default_rng(1)
            m.forward(0, rng.integers(1, 1000, depth).tolist(), "none")
            time.sleep(0.3)
            best = 0.0
            for _ in range(3):
                toks = rng.integers(1, 1000, a.gen).tolist()
                t0 = time.perf_counter()
                for t in toks:
                    m.forward_batch([(0, [t], "last")])
                best = max(best, a.gen / (time.perf_counter() - t0))
                m.truncate(0, depth)
            print(f"| {kv} | {depth} | {best:.1f} |", flush=True)


if __name__ == "__main__":
    main()
