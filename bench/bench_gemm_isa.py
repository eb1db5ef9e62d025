"""Prefill kernel microbenchmark: the multi-token dot path (`MultiDot`, as the pool's tiles run
it) over one expert-sized weight matrix against T tokens, per ISA / AVX-512 variant, on the
same CPU and thread count. Prints one row per (type, order, variant): best seconds of
`--reps`, GOP/s (2·rows·n·T), and the speed-up over AVX2.

    python bench/bench_gemm_isa.py --threads 1 --tokens 32
"""

from __future__ import annotations

import argparse
import os
import platform
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
from dot_util import ACT, random_act_f32, random_row
from strata import _core
from strata._core import _testing

# (type, n = row length, rows): Qwen3-30B-A3B expert gate/up (2048 → 768) and down (768 → 2048)
SHAPES = [("Q4_K", 2048, 768), ("Q6_K", 768, 2048), ("Q8_0", 2048, 768), ("IQ3_S", 2048, 768)]


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--types", default=",".join(t for t, _, _ in SHAPES))
    args = ap.parse_args()
    have = set(_core.dot_isas())
    vnni = "avx512vnni" in _core.cpu_features()
    # "avx2-1tok": the AVX2 single-token kernel once per token (what types without a
    # multi-token kernel ran)
    variants: list[tuple[str, str, bool | None]] = [
        ("avx2", "avx2", None),
        ("avx2-1tok", "avx2", None),
    ]
    feats = _core.cpu_features()
    if "avx512" in have:
        variants.append(("avx512bw", "avx512", False))
        if vnni:
            variants.append(("avx512vnni", "avx512", True))
        if "amx-int8" in feats:
            # the AVX-512 ISA as the engine runs it: AMX tiles (rows_call, ≥ 12 tokens)
            variants.append(("avx512+amx", "avx512", None))
        if vnni:
            # the VNNI register tiles (the engine's scheme where AMX is absent)
            variants.append(("avx512+vnni-tile", "avx512", None))
    print(f"cpu: {cpu_name()}; threads {args.threads}; tokens {args.tokens}; isas {sorted(have)}")
    head = ("type", "n×rows", "order", "variant", "ms", "GOP/s", "×avx2")
    print("{:6} {:>10} {:6} {:11} {:>8} {:>8} {:>6}".format(*head))
    rng = np.random.default_rng(0)
    for t, n, rows in SHAPES:
        if t not in args.types.split(","):
            continue
        w = b"".join(random_row(t, n, rng) for _ in range(rows))
        acts = [_core.quantize_act(ACT[t], random_act_f32(rng, n)) for _ in range(args.tokens)]
        ops = 2.0 * rows * n * args.tokens
        for order in ("single", "many"):
            base = None
            for name, isa, v in variants:
                g = 1 if name.endswith("1tok") else None
                tiles = "vnni" if name.endswith("vnni-tile") else None
                try:
                    s = _testing.multi_dot_bench(
                        t, n, w, acts, order, isa, v, args.reps, args.threads, g, tiles
                    )
                except _core.QuantError:  # no tiles for this type and order
                    continue
                base = base or s
                print(
                    f"{t:6} {f'{n}×{rows}':>10} {order:6} {name:11} {1e3 * s:8.3f} "
                    f"{ops / s / 1e9:8.1f} {base / s:6.2f}"
                )


if __name__ == "__main__":
    main()
