"""Per-kernel timings of one decode layer on Qwen3-30B-A3B shapes (run on the device):

    python bench/gpu_decode_kernels.py [--reps 200] [--ctx 8,300,2000,8000]

Each figure is µs per call with `reps` calls captured in one CUDA graph and replayed (the
way the decode step runs them: no host launch cost between kernels), so the sum over a
layer's kernels is comparable with ncu's per-kernel durations. The one-token matmuls are
also timed with each kernel forced (row per block `_r1` vs warp per row), the data for the
launcher's threshold (now: row per block below 4·SMs·4 rows), and warp per row with x staged
in shared memory (`_st`, now from 16·SMs·4 rows: the output head). Shapes: hidden 2048, 32 query
/ 4 KV heads of 128, 128 experts top-8, Q/K/V Q4_K (V Q6_K in Q4_K_M), O Q4_K, router F32;
the routed experts (gate/up + SwiGLU, down into the residual, each with its activation
quantization) with every decode kernel variant, each call routed to another expert set so the
weights come from HBM (gpu_bench_moe(graph=True); `current` is what the launcher runs).
"""

from __future__ import annotations

import argparse

from strata import _core
from strata._core import _testing

H, NH, NKV, D, E, TOPK, FF = 2048, 32, 4, 128, 128, 8, 768


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--ctx", default="1,8,64,300,2000,8000", help="decode positions to time")
    ap.add_argument("--n-ctx", type=int, default=8192, help="cache size (sets the splits)")
    a = ap.parse_args()
    print("gpu:", _core.gpu_status())
    print(f"{'kernel':52s} {'us/call':>9s}")

    def row(name: str, us: float) -> None:
        print(f"{name:52s} {us:9.2f}", flush=True)

    for fused in (False, True):
        name = "norm_add_rms" if fused else "norm_rms"
        row(f"{name} [1, {H}]", _testing.gpu_bench_norm(H, 1, fused, a.reps))
    for ty, rows, k in [
        ("Q4_K", NH * D, H),  # Q
        ("Q4_K", NKV * D, H),  # K (and V in Q4_K)
        ("Q6_K", NKV * D, H),  # V in Q4_K_M
        ("Q4_K", H, NH * D),  # O
        ("F32", E, H),  # router
        ("Q6_K", 151936, H),  # output head
    ]:
        us = _testing.gpu_bench_matmul_graph(ty, rows, k, 1, a.reps)
        row(f"quantize + matmul {ty} [{rows}, {k}] (F32: no quantize)", us)
        for r1, kind in [(True, "row per block"), (False, "warp per row")]:
            us = _testing.gpu_bench_matmul_graph(ty, rows, k, 1, a.reps, r1)
            row(f"  the same, {kind}", us)
        if ty != "F32":
            us = _testing.gpu_bench_matmul_graph(ty, rows, k, 1, a.reps, staged=True)
            row("  the same, warp per row, x and rows staged (_st)", us)
    for kv in ["f16", "q8_0"]:
        for p in (int(c) for c in a.ctx.split(",")):
            if p >= a.n_ctx:
                continue
            us = _testing.gpu_bench_attention(kv, NH, NKV, D, a.n_ctx, p, 1, a.reps)
            row(f"attn decode {kv} at position {p} (n_ctx {a.n_ctx})", us)
    row(f"router top-{TOPK} of {E}", _testing.gpu_bench_router(E, TOPK, 1, a.reps))
    for variant in ("current", "act", "v0"):
        for down in ("Q6_K", "Q4_K"):
            gu, dn, _, _ = _testing.gpu_bench_moe(
                "Q4_K", down, E, FF, H, TOPK, 1, a.reps, variant=variant, graph=True
            )
            if down == "Q6_K":
                row(f"moe gate_up Q4_K [{FF}, {H}] x{TOPK} ({variant})", gu)
            row(f"moe down {down} [{H}, {FF}] x{TOPK} ({variant})", dn)


if __name__ == "__main__":
    main()
