"""Prompt speed at depth: NEW prompt tokens after DEPTH tokens already in the slot (what a
chat's next turn prefills with prefix reuse), Strata's forward pass alone. Random token ids;
the slot is cut back to DEPTH before each timed repetition.

    python bench/prefill_depth.py MODEL.gguf --depth 3000 --new 512 --reps 3 [--threads 2]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from strata._core import Model


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--depth", type=int, default=3000, help="tokens in the slot before")
    ap.add_argument("--new", type=int, default=512, help="prompt tokens timed")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--chunk", type=int, default=512, help="prefill chunk")
    a = ap.parse_args()
    n_ctx = a.depth + a.new + 64
    m = Model.open(a.model, n_ctx=n_ctx, prefill_chunk=a.chunk, threads=a.threads)
    rng = np.random.default_rng(0)
    ids = [int(t) for t in rng.integers(100, min(20000, int(m.n_vocab)), a.depth + a.new)]
    for i in range(0, a.depth, a.chunk):
        m.forward(0, ids[i : min(i + a.chunk, a.depth)], logits="none")
    rates = []
    for _ in range(a.reps):
        m.truncate(0, a.depth)
        t0 = time.perf_counter()
        for i in range(a.depth, a.depth + a.new, a.chunk):
            m.forward(0, ids[i : min(i + a.chunk, a.depth + a.new)], logits="last")
        rates.append(a.new / (time.perf_counter() - t0))
    print(f"{a.model}: depth {a.depth}, {a.new} new tokens: {[round(r, 1) for r in rates]} tok/s")


if __name__ == "__main__":
    main()
