"""Decode speed by software prefetch distance: paired rounds of 1- and 4-stream
`forward_batch` steps (one-token entries) on one model, each round trying every distance in
turn, so a ratio shares its round's RAM moment. The knob is the output head kernel's
(`set_head_prefetch`, default) or the other one-token kernels' (`set_dot_prefetch`); hints
change no value, so only the speed moves. Prints the medians and, per distance, the median
of the per-round ratios to the first distance (min–max).

    python bench/bench_prefetch.py MODEL.gguf --dists 2048,64,128,256 [--knob head|dot] \
        [--steps 48] [--rounds 7] [--threads 2]
"""

from __future__ import annotations

import argparse
import statistics
import time

import strata._core as core
from strata._core import Model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--dists", default="2048,64,128,256", help="bytes; the first is the base")
    ap.add_argument("--knob", choices=("head", "dot"), default="head")
    ap.add_argument("--steps", type=int, default=48)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    dists = [int(x) for x in a.dists.split(",")]
    knob = core.set_head_prefetch if a.knob == "head" else core.set_dot_prefetch
    m = Model.open(a.model, n_ctx=1024, n_slots=4, threads=a.threads)
    for s in range(4):
        m.forward(s, [(31 * s + j) % 1000 + 1 for j in range(16)], "none")
    res: dict[tuple[int, int], list[float]] = {(d, n): [] for d in dists for n in (1, 4)}
    old = knob(dists[0])
    try:
        for _ in range(a.rounds):
            for d in dists:
                knob(d)
                for n in (1, 4):
                    for s in range(4):
                        m.truncate(s, 16)
                    t0 = time.perf_counter()
                    for i in range(a.steps):
                        m.forward_batch(
                            [(s, [(7 * s + 13 * i) % 1000 + 1], "last") for s in range(n)]
                        )
                    res[(d, n)].append(n * a.steps / (time.perf_counter() - t0))
    finally:
        knob(old)
    for d in dists:
        one, four = (statistics.median(res[(d, n)]) for n in (1, 4))
        print(f"{a.knob} prefetch {d:6d} B: 1 stream {one:.1f}, 4 streams {four:.1f} tok/s")
    for d in dists[1:]:
        for n in (1, 4):
            rs = [x / y for x, y in zip(res[(d, n)], res[(dists[0], n)], strict=True)]
            print(
                f"  {d} ÷ {dists[0]}, {n} stream(s): {statistics.median(rs):.3f} "
                f"({min(rs):.3f}–{max(rs):.3f})"
            )


if __name__ == "__main__":
    main()
