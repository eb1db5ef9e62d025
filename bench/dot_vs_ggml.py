"""Our dot kernels against ggml's CPU `vec_dot` (llama-cpp-python's libggml-cpu, ctypes) on
one long in-cache row per type, timed by thread CPU time (robust to other load).

    python bench/dot_vs_ggml.py [--types Q4_K,Q6_K] [--blocks 2048]
"""

from __future__ import annotations

import argparse
import ctypes
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from dot_util import ACT, BLOCK, GGML_ID, random_act_f32, random_row
from ggml_cpu_oracle import VEC_DOT, ggml
from strata import _core


def ggml_dot(ty: int, n: int, row: bytes, act: bytes) -> Callable[[], object]:
    """ggml's CPU `vec_dot` of the row and activation, called on the bytes in place (the
    oracle's `Ggml.vec_dot` copies both per call, which would be timed too)."""
    fn = VEC_DOT(ggml().traits_cpu(ty).vec_dot)
    out = ctypes.c_float()
    return lambda: fn(n, ctypes.byref(out), 0, row, 0, act, 0, 1)


HOT = "Q8_0,Q4_0,Q4_K,Q5_K,Q6_K,Q3_K,Q2_K,IQ4_XS,IQ3_S,IQ3_XXS,IQ2_XXS,IQ1_S,IQ4_NL,F16,BF16"


def best_rate(f: Callable[[], object], nbytes: int) -> float:
    best = float("inf")
    for _ in range(5):
        c0 = time.thread_time()
        for _ in range(3):
            f()
        best = min(best, (time.thread_time() - c0) / 3)
    return nbytes / max(best, 1e-9) / 1e9


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--types", default=HOT)
    p.add_argument("--blocks", type=int, default=2048, help="256-element blocks per row")
    args = p.parse_args()
    rng = np.random.default_rng(0)
    n = 256 * args.blocks
    print(f"isa {_core.dot_isa()}; row of {n} elements; GB/s of weight bytes per CPU second")
    print("| type | ours | ggml | ours/ggml |\n|---|---|---|---|")
    for t in args.types.split(","):
        assert n % BLOCK[t][0] == 0
        row = random_row(t, n, rng)
        act = _core.quantize_act(ACT[t], random_act_f32(rng, n))
        ours = best_rate(lambda t=t, row=row, act=act: _core.vec_dot(t, n, row, act), len(row))
        ref = best_rate(ggml_dot(GGML_ID[t], n, row, act), len(row))
        print(f"| {t} | {ours:.2f} | {ref:.2f} | {ours / ref:.2f} |")


if __name__ == "__main__":
    main()
