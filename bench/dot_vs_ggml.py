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
from ggml_oracle import library_path
from strata import _core

_VEC_DOT = ctypes.CFUNCTYPE(
    None,
    ctypes.c_int,
    ctypes.POINTER(ctypes.c_float),
    ctypes.c_size_t,
    ctypes.c_void_p,
    ctypes.c_size_t,
    ctypes.c_void_p,
    ctypes.c_size_t,
    ctypes.c_int,
)


class _CpuTraits(ctypes.Structure):
    # ggml-cpu.h: struct ggml_type_traits_cpu
    _fields_ = [
        ("from_float", ctypes.c_void_p),
        ("vec_dot", ctypes.c_void_p),
        ("vec_dot_type", ctypes.c_int),
        ("nrows", ctypes.c_int64),
    ]


class GgmlCpu:
    """ggml's CPU `vec_dot` per type, from libggml-cpu beside the oracle's libggml-base."""

    def __init__(self) -> None:
        base = library_path()
        if base is None:
            sys.exit("no llama_cpp package with lib/libggml-base.so: install llama-cpp-python")
        ctypes.CDLL(str(base), mode=ctypes.RTLD_GLOBAL)
        self.lib = ctypes.CDLL(str(base.with_name("libggml-cpu.so")))
        self.lib.ggml_cpu_init()
        self.lib.ggml_get_type_traits_cpu.restype = ctypes.POINTER(_CpuTraits)
        self.lib.ggml_get_type_traits_cpu.argtypes = [ctypes.c_int]

    def vec_dot(self, ty: int, n: int, row: bytes, act: bytes) -> float:
        fn = _VEC_DOT(self.lib.ggml_get_type_traits_cpu(ty).contents.vec_dot)
        out = ctypes.c_float()
        fn(n, ctypes.byref(out), 0, row, 0, act, 0, 1)
        return out.value


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
    g = GgmlCpu()
    rng = np.random.default_rng(0)
    n = 256 * args.blocks
    print(f"isa {_core.dot_isa()}; row of {n} elements; GB/s of weight bytes per CPU second")
    print("| type | ours | ggml | ours/ggml |\n|---|---|---|---|")
    for t in args.types.split(","):
        assert n % BLOCK[t][0] == 0
        row = random_row(t, n, rng)
        act = _core.quantize_act(ACT[t], random_act_f32(rng, n))
        ours = best_rate(lambda t=t, row=row, act=act: _core.vec_dot(t, n, row, act), len(row))
        ref = best_rate(lambda t=t, row=row, act=act: g.vec_dot(GGML_ID[t], n, row, act), len(row))
        print(f"| {t} | {ours:.2f} | {ref:.2f} | {ours / ref:.2f} |")


if __name__ == "__main__":
    main()
