"""Strata's one-stream decode speed at several context depths (the peer: llama-bench's
`-d`), one process per depth:

    python bench/bench_depth.py --model FILE.gguf --depths 16,2048,4000 [--gen 64] [--threads 2]
    llama-bench -m FILE.gguf -t 2 -p 0 -n 64 -d 0,2048,4000 -r 1

Each run prefills `depth` random tokens, then times `--gen` one-token steps (`forward_batch`,
the engine's step) after a short pause."""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path


def one(model: Path, depth: int, gen: int, threads: int) -> float:
    import numpy as np
    from strata._core import Model

    m = Model.open(model, n_ctx=depth + gen + 16, n_slots=1, threads=threads)
    rng = np.random.default_rng(1)
    m.forward(0, rng.integers(1, 1000, depth).tolist(), "none")
    time.sleep(0.5)
    toks = rng.integers(1, 1000, gen).tolist()
    t0 = time.perf_counter()
    for t in toks:
        m.forward_batch([(0, [t], "last")])
    return gen / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--depths", default="16,2048,4000")
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)  # a child process's depth
    a = ap.parse_args()
    if a.one is not None:
        print(f"{one(a.model, a.one, a.gen, a.threads):.2f}")
        return
    for d in (int(x) for x in a.depths.split(",")):
        cmd = [sys.executable, __file__, "--model", str(a.model), "--one", str(d)]
        cmd += ["--gen", str(a.gen), "--threads", str(a.threads)]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        print(f"depth {d}: tg{a.gen} {float(out.strip()):.1f} tok/s", flush=True)


if __name__ == "__main__":
    main()
