"""Benchmark of the CPU expert pool on Qwen3-30B-A3B expert shapes (H 2048, I 768, 128
experts, top-8): time per MoE layer for T tokens, weight GB/s against the measured RAM read
bandwidth at the same thread count, and pipelined ÷ barrier.

    python bench/bench_pool.py [--types Q8_0,Q4_K,IQ3_S] [--tokens 1,4,8,32] [--threads 1,2]

Weights: one expert per matrix is quantized (by ggml through llama-cpp-python's libggml-base,
or gguf-py) and repeated over the 128 experts, so every expert is its own memory but the
setup stays fast. Types without a dot kernel in this build are listed and skipped. With
`--model MODEL.gguf --layer N` the layer's real expert tensors are used instead.
Each point alternates barrier and pipelined calls with fresh random routing (k distinct
experts per token), `--reps` times, and reports medians; before each timed call the other
pool's workers are left to park and one untimed call wakes this pool's (before 2026-12-05 the
two pools' spinning workers shared the cores when every core was taken). `--llama` also
times llama.cpp's CPU MoE (ggml `mul_mat_id` graph, bench/ggml_moe.py) on the same bytes,
inputs and thread count;
"pool ÷ llama.cpp" is llama.cpp time ÷ pool barrier time (> 1: the pool is faster).
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from strata._core import ExpertPool, MoELayer, pool_supports, ram_read_gbps

# ggml type ids and (block elements, block bytes) of the types this script can make
# (the ggml ids are the GGUF `ggml_type` values, docs/FORMATS.md §2).
TYPES = {"F32": (0, 1, 4), "Q8_0": (8, 32, 34), "Q4_K": (12, 256, 144), "IQ3_S": (21, 256, 110)}


def _q8_0(w: npt.NDArray[np.float32]) -> npt.NDArray[np.uint8]:
    """Q8_0 in numpy (d = amax/127, q = round(x/d)), for machines without ggml or gguf-py."""
    rows, cols = w.shape
    b = w.reshape(rows, cols // 32, 32)
    d = np.abs(b).max(axis=2, keepdims=True) / 127
    q = np.round(np.divide(b, d, out=np.zeros_like(b), where=d > 0)).astype(np.int8)
    out = np.concatenate([d.astype(np.float16).view(np.uint8), q.view(np.uint8)], axis=2)
    return out.reshape(rows, -1)


def _ggml_quantize(w: npt.NDArray[np.float32], ty: str) -> npt.NDArray[np.uint8] | None:
    """Rows of `w` quantized by ggml itself (any type), or None without llama-cpp-python."""
    try:
        import llama_cpp
    except ImportError:
        return None
    lib = ctypes.CDLL(str(Path(llama_cpp.__file__).parent / "lib" / "libggml-base.so"))
    lib.ggml_quantize_chunk.restype = ctypes.c_size_t
    lib.ggml_quantize_chunk.argtypes = [
        ctypes.c_int,
        ctypes.c_void_p,
        ctypes.c_void_p,
        ctypes.c_int64,
        ctypes.c_int64,
        ctypes.c_int64,
        ctypes.c_void_p,
    ]
    rows, cols = w.shape
    tid, bs, ts = TYPES[ty]
    out = np.zeros((rows, cols // bs * ts), dtype=np.uint8)
    src = np.ascontiguousarray(w, dtype=np.float32)
    lib.ggml_quantize_chunk(tid, src.ctypes.data, out.ctypes.data, 0, rows, cols, None)
    return out


def quantize(w: npt.NDArray[np.float32], ty: str) -> npt.NDArray[np.uint8]:
    if ty == "F32":
        return w.view(np.uint8).reshape(w.shape[0], -1)
    q = _ggml_quantize(w, ty)
    if q is None and ty == "Q8_0":
        q = _q8_0(w)
    if q is None:
        raise SystemExit(f"{ty}: needs llama-cpp-python (ggml) to quantize")
    return q


def synthetic_layer(
    ty: str, n_expert: int, hidden: int, inter: int, seed: int = 0
) -> tuple[MoELayer, list[npt.NDArray[np.uint8]]]:
    rng = np.random.default_rng(seed)
    mats = []
    for rows, cols in ((inter, hidden), (inter, hidden), (hidden, inter)):
        one = quantize((rng.standard_normal((rows, cols)) * 0.05).astype(np.float32), ty)
        mats.append(np.ascontiguousarray(np.tile(one.reshape(-1), n_expert)))
    return MoELayer(ty, mats[0], ty, mats[1], ty, mats[2], n_expert, hidden, inter), mats


def model_layer(path: str, block: int) -> tuple[MoELayer, list[npt.NDArray[np.uint8]]]:
    from strata.gguf import GGUFFile

    f = GGUFFile(path)
    ts = [f.tensors[f"blk.{block}.ffn_{p}_exps.weight"] for p in ("gate", "up", "down")]
    mats = [f.raw(t.name) for t in ts]
    n_expert, inter, hidden = ts[0].shape
    layer = MoELayer(
        ts[0].type, mats[0], ts[1].type, mats[1], ts[2].type, mats[2], n_expert, hidden, inter
    )
    return layer, mats


# Longer than an idle worker spins before it parks (ExpertPool's spin_us, 2000 µs).
SPIN_S = 0.003


def bench_point(
    layers: list[MoELayer],
    pools: tuple[ExpertPool, ExpertPool],
    tokens: int,
    k: int,
    reps: int,
    rng: np.random.Generator,
    ggml: list[Any] | None = None,
    threads: int = 1,
) -> tuple[float, float, float, float]:
    """Median seconds per call (barrier, pipelined, llama.cpp or nan) and mean distinct
    experts per call."""
    times: list[list[float]] = [[], [], []]
    distinct = []
    for rep in range(reps + 2):
        layer = layers[rep % len(layers)]
        ids = np.stack(
            [rng.choice(layer.n_expert, size=k, replace=False) for _ in range(tokens)]
        ).astype(np.uint32)
        w = rng.uniform(0.05, 1.0, size=(tokens, k)).astype(np.float32)
        x = rng.standard_normal((tokens, layer.hidden)).astype(np.float32)
        order = (0, 1) if rep % 2 == 0 else (1, 0)
        for n in order:
            # the other pool's workers park first (they spin SPIN_S after a call, and with
            # every core taken they would share the cores with this call); then one untimed
            # call wakes this pool's workers, so the timed call meets them spinning, as a
            # decode step's calls do
            time.sleep(SPIN_S)
            pools[n].moe(layer, x, ids, w)
            t0 = time.perf_counter()
            pools[n].moe(layer, x, ids, w)
            dt = time.perf_counter() - t0
            if rep >= 2:  # the first two rounds warm up
                times[n].append(dt)
        if ggml is not None:
            t0 = time.perf_counter()
            ggml[rep % len(ggml)].run(x, ids, w, threads)
            if rep >= 2:
                times[2].append(time.perf_counter() - t0)
        distinct.append(len(np.unique(ids)))
    tl = statistics.median(times[2]) if times[2] else float("nan")
    return statistics.median(times[0]), statistics.median(times[1]), tl, statistics.mean(distinct)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--types", default="Q8_0,Q4_K,IQ3_S")
    ap.add_argument("--tokens", default="1,4,8,32")
    ap.add_argument("--threads", default="", help="total threads (host included); default 1..all")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--experts", type=int, default=128)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--inter", type=int, default=768)
    ap.add_argument("-k", type=int, default=8)
    ap.add_argument("--model", default="", help="GGUF file: bench its layer --layer instead")
    ap.add_argument("--layer", type=int, default=0)
    ap.add_argument("--ram-mib", type=int, default=1024)
    ap.add_argument(
        "--copies", type=int, default=1, help="synthetic layers to rotate (defeat a big L3)"
    )
    ap.add_argument(
        "--llama", action="store_true", help="also time llama.cpp's ggml MoE graph (ggml_moe.py)"
    )
    ap.add_argument(
        "--geometry-ab",
        action="store_true",
        help="the second pool: barrier schedule with ~3 tiles per thread for decode calls too "
        "(balanced=False) instead of the pipelined schedule; its columns are then that pool's",
    )
    args = ap.parse_args()
    if args.geometry_ab:
        print("second pool: balanced=False (the 'pipelined' columns are the unbalanced tiles)")

    probe = ExpertPool()
    all_threads = probe.workers + 1
    del probe
    threads = [int(t) for t in args.threads.split(",")] if args.threads else []
    threads = threads or list(range(1, all_threads + 1))
    tokens = [int(t) for t in args.tokens.split(",")]
    ram = {n: ram_read_gbps(n, args.ram_mib) for n in threads}
    print("RAM read bandwidth (GB/s): " + ", ".join(f"{n} thr {g:.1f}" for n, g in ram.items()))

    if args.model:
        one, mats = model_layer(args.model, args.layer)
        layers = [(f"{args.model}:blk.{args.layer}", [one], [mats])]
    else:
        layers = []
        for name in args.types.split(","):
            if not pool_supports(name):
                print(f"{name}: no dot kernel in this build, skipped")
                continue
            made = [
                synthetic_layer(name, args.experts, args.hidden, args.inter, seed=c)
                for c in range(args.copies)
            ]
            layers.append((name, [m[0] for m in made], [m[1] for m in made]))
    print(
        "| weights | T | threads | experts/call | barrier ms | pipelined ms "
        "| pipelined ÷ barrier | GB/s (barrier) | % of RAM | llama.cpp ms | pool ÷ llama.cpp |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    rng = np.random.default_rng(1)
    for name, layer, mats_list in layers:
        mats = mats_list[0]
        expert_bytes = sum(m.nbytes for m in mats) // layer[0].n_expert
        ggml = None
        if args.llama:
            from ggml_moe import GgmlMoE

            first = layer[0]
            ggml = [
                GgmlMoE(first.types, ms, first.n_expert, first.hidden, first.inter)
                for ms in mats_list
            ]
        for n in threads:
            pools = (
                ExpertPool(workers=n - 1, pipelined=False),
                ExpertPool(workers=n - 1, balanced=False)
                if args.geometry_ab
                else ExpertPool(workers=n - 1, pipelined=True),
            )
            for t in tokens:
                reps = max(5, args.reps // max(1, t // 4))
                tb, tp, tl, distinct = bench_point(layer, pools, t, args.k, reps, rng, ggml, n)
                gbps = distinct * expert_bytes / tb / 1e9
                print(
                    f"| {name} | {t} | {n} | {distinct:.1f} | {tb * 1e3:.2f} | {tp * 1e3:.2f} "
                    f"| {tb / tp:.3f} | {gbps:.1f} | {100 * gbps / ram[n]:.0f}% "
                    f"| {tl * 1e3:.2f} | {tl / tb:.2f} |",
                    flush=True,
                )
            del pools


if __name__ == "__main__":
    main()
