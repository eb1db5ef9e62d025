"""Timings of the quantized GPU kernels on Qwen3-30B-A3B shapes (run on the device):

    python bench/gpu_quant_bench.py [--reps N]

Decode rows report weight GB/s (weight bytes per call / time; H200 HBM peak ≈ 4.8 TB/s);
prefill rows report TFLOP/s (2·rows·k·n_tok / time). MoE: 128 experts [768, 2048], top-8,
gate+up Q4_K and down Q6_K (Q4_K_M's usual mix); bytes count the distinct experts touched.
"""

from __future__ import annotations

import argparse

from strata import _core
from strata._core import _testing

TYPES = [
    "Q4_K", "Q5_K", "Q6_K", "Q8_0", "Q4_0", "Q5_0", "IQ4_NL", "Q2_K", "Q3_K", "IQ4_XS", "IQ3_S",
    "IQ3_XXS", "IQ2_XS", "F16", "BF16", "F32",
]  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=50)
    a = ap.parse_args()
    print("gpu:", _core.gpu_status())
    print(f"{'kernel':44s} {'us/call':>10s} {'GB/s':>8s} {'TFLOP/s':>8s}")

    def row(name: str, us: float, nbytes: int, flop: float) -> None:
        print(f"{name:44s} {us:10.2f} {nbytes / us / 1e3:8.0f} {flop / us / 1e6:8.2f}")

    for t in TYPES:
        us, nb = _testing.gpu_bench_matmul(t, 4096, 2048, 1, a.reps)
        row(f"matmul {t} [4096, 2048] n_tok=1", us, nb, 2 * 4096 * 2048)
    for t, rows, k in [("Q6_K", 151936, 2048), ("Q4_K", 2048, 4096), ("Q6_K", 512, 2048)]:
        us, nb = _testing.gpu_bench_matmul(t, rows, k, 1, a.reps)
        row(f"matmul {t} [{rows}, {k}] n_tok=1", us, nb, 2 * rows * k)
    for n in [8, 64, 512, 4096]:
        for t in ["Q4_K", "Q6_K", "Q8_0", "IQ3_S"]:
            us, nb = _testing.gpu_bench_matmul(t, 4096, 2048, n, max(a.reps // 5, 3))
            row(f"matmul {t} [4096, 2048] n_tok={n}", us, nb, 2 * 4096 * 2048 * n)
    for n in [1, 2, 8, 64, 512, 4096]:
        reps = a.reps if n <= 8 else max(a.reps // 10, 3)
        gu, dn, bgu, bdn = _testing.gpu_bench_moe("Q4_K", "Q6_K", 128, 768, 2048, 8, n, reps)
        flop = 2 * 768 * 2048 * 8 * n
        row(f"moe gate_up Q4_K n_tok={n}", gu, bgu, 2 * flop)
        row(f"moe down Q6_K n_tok={n}", dn, bdn, flop)
    # decode kernel variants, graph-timed, each call on other experts (weights from HBM)
    for variant in ["current", "act", "v0"]:
        for n in [1, 4]:
            gu, dn, bgu, bdn = _testing.gpu_bench_moe(
                "Q4_K", "Q6_K", 128, 768, 2048, 8, n, a.reps, variant=variant, graph=True
            )
            flop = 2 * 768 * 2048 * 8 * n
            row(f"moe gate_up Q4_K n_tok={n} graph {variant}", gu, bgu, 2 * flop)
            row(f"moe down Q6_K n_tok={n} graph {variant}", dn, bdn, flop)


if __name__ == "__main__":
    main()
