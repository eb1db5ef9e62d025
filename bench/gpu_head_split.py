"""Decode µs per token on the device with the decode attention's query heads of a KV head
spread over 1, 2 or 4 blocks (`set_gpu_head_split`), every weight in VRAM, after a short and
a long prompt; the last logits of each run must be bitwise those of the one-block run.

    python3 bench/gpu_head_split.py FILE.gguf [--ctx 16,1024] [--splits 1,2,4] [--reps 4]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from strata._core import Model, set_gpu_head_split


def decode_us(m: Model, prompt: list[int], toks: list[int]) -> tuple[float, np.ndarray]:
    """µs per token over `toks` after `prompt` (graph steps, no logits but the last)."""
    m.free(0)
    m.forward(0, prompt, logits="last")
    t = time.perf_counter()
    for tok in toks[:-1]:
        m.forward(0, [tok], logits="none")
    last = m.forward(0, toks[-1:], logits="last")  # reads logits: every step before it is done
    return (time.perf_counter() - t) / len(toks) * 1e6, last


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--ctx", default="16,1024", help="prompt lengths")
    ap.add_argument("--splits", default="1,2,4")
    ap.add_argument("--reps", type=int, default=4)
    ap.add_argument("--gen", type=int, default=64)
    a = ap.parse_args()
    ctxs = [int(c) for c in a.ctx.split(",")]
    rng = np.random.default_rng(0)
    prompts = {c: rng.integers(0, 1000, c).tolist() for c in ctxs}
    toks = rng.integers(0, 1000, a.gen).tolist()
    ref: dict[int, np.ndarray] = {}
    print(f"{'blocks per KV head':>18s} " + " ".join(f"{f'ctx {c} us/tok':>16s}" for c in ctxs))
    for hs in [int(x) for x in a.splits.split(",")]:
        set_gpu_head_split(hs)
        m = Model.open(a.model, n_ctx=max(ctxs) + a.gen + 8, device="cuda")
        row = []
        for c in ctxs:
            us, last = [], None
            for _ in range(a.reps):
                u, last = decode_us(m, prompts[c], toks)
                us.append(u)
            assert last is not None
            if c in ref:
                assert np.array_equal(last, ref[c]), f"head split {hs}: logits differ at ctx {c}"
            else:
                ref[c] = last
            row.append(float(np.median(us[1:])))
        print(f"{hs:>18d} " + " ".join(f"{u:16.1f}" for u in row), flush=True)
        del m
    set_gpu_head_split(0)


if __name__ == "__main__":
    main()
