"""Paired A/B of the hybrid decode (issue 23): the expert read-ahead's modes
(`rust/src/gpu/hybrid/read_ahead.rs`, `set_hybrid_read_ahead`: 0 off, 1 prefetcht0, 2
prefetcht1, 3 light) and the VRAM tier's start fill (`--profile-tokens`: 0 the default fill; N a
profile of N random tokens' routing, hottest first, as bench_hybrid.py and `strata-fill
profile` fill it). One model per fill, opened once at `--share` of the experts in VRAM; decode
runs of `--gen` fresh random tokens, the arms (fill × mode) interleaved round by round (each
round starts at another arm, so a drift of the host is shared). Per arm: decode tok/s (median),
the paired ratio to the first arm (median of the per-round ratios, min–max), the decode hit
rate, the host's µs per CPU-path layer by phase (`--chain-timing`: the GPU part's too), and the
read-ahead's counters (predicted missed experts a layer, the share the pool then computed, MB
read ahead a layer). `--llama-bench BIN`: llama.cpp's `-ngl 99 -ncmoe N -ub 512,4096` decode in the
same run (its best N of `--ncmoe`), for the ratio the issue asks, with the decode bound of
bench_hybrid.py (RAM probe, HBM copy) beside it.

    python bench/bench_read_ahead.py --model FILE [--modes 0,1,2] [--profile-tokens 0,512] \
        [--reps 7] [--gen 128] [--threads 16] [--share 0.25] [--pcie-frac 0] \
        [--chain-timing] [--llama-bench BIN --ncmoe 8,9]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

# bench/ is the script's folder, first on sys.path
from bench_gpu import DECODE_PROMPT
from bench_hybrid import decode_bound, layers_experts, llama_best, llama_runs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--modes", default="0,1,2")
    ap.add_argument("--profile-tokens", default="0")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--threads", type=int, default=16)
    ap.add_argument("--share", type=float, default=0.25)
    ap.add_argument("--pcie-frac", type=float, default=0.0)
    ap.add_argument("--adapt-every", type=int, default=16)
    ap.add_argument("--chain-timing", action="store_true")
    ap.add_argument("--llama-bench")
    ap.add_argument("--ncmoe", default="8,9")
    ap.add_argument("--llama-reps", type=int, default=2)
    a = ap.parse_args()
    from strata._core import (
        Model,
        Profile,
        ram_read_gbps,
        set_hybrid_chain_timing,
        set_hybrid_read_ahead,
    )
    from strata._core._testing import gpu_copy_gbps

    set_hybrid_chain_timing(a.chain_timing)
    modes = [int(x) for x in a.modes.split(",")]
    fills = [int(x) for x in a.profile_tokens.split(",")]
    n_layer, n_expert, n_dense = layers_experts(a.model)
    rng = np.random.default_rng(0)

    def open_model(profile: Profile | None) -> Model:
        return Model.open(
            a.model,
            n_ctx=max(DECODE_PROMPT + a.gen, max(fills)) + 64,
            device="cuda",
            threads=a.threads,
            vram_slots=round(a.share * (n_layer - n_dense) * n_expert),
            adapt_every=a.adapt_every,
            pcie_frac=a.pcie_frac,
            profile=profile,
        )

    models = {}
    for n in fills:
        profile = None
        if n > 0:
            m = open_model(None)
            m.forward(0, rng.integers(0, m.n_vocab, n).tolist(), logits="none")
            profile = Profile.from_counts(a.model, m.routing_counts(), n, "bench")
            del m
        models[n] = open_model(profile)

    def decode(m: Model) -> float:
        toks = rng.integers(0, m.n_vocab, DECODE_PROMPT + a.gen).tolist()
        m.free(0)
        m.forward(0, toks[:DECODE_PROMPT], logits="last")
        t = time.perf_counter()
        for tok in toks[DECODE_PROMPT:]:
            m.forward(0, [tok], logits="last")
        return a.gen / (time.perf_counter() - t)

    for m in models.values():
        decode(m)  # warm-up: first-call setup, page cache, the tier adapts
    arms = [(n, md) for n in fills for md in modes]
    tg: dict[tuple[int, int], list[float]] = {x: [] for x in arms}
    sums: dict[tuple[int, int], dict[str, float]] = {x: {} for x in arms}
    for r in range(a.reps):
        for arm in arms[r % len(arms) :] + arms[: r % len(arms)]:
            m = models[arm[0]]
            c = m.hybrid_counters()
            assert c is not None, "the hybrid mode is off"
            set_hybrid_read_ahead(arm[1])
            before = counts(c)
            tg[arm].append(decode(m))
            for k, v in counts(c).items():
                sums[arm][k] = sums[arm].get(k, 0.0) + v - before[k]
        print(f"round {r}: " + "  ".join(f"{x}:{tg[x][-1]:.1f}" for x in arms), flush=True)
    set_hybrid_read_ahead(0)
    peer = None
    if a.llama_bench:
        ns = argparse.Namespace(
            llama_ubatch="512,4096", pp=512, gen=a.gen, llama_reps=a.llama_reps, threads=a.threads
        )
        ncmoe = [int(x) for x in a.ncmoe.split(",")]
        best = llama_best(llama_runs(a.llama_bench, a.model, ns, ncmoe)).get("tg")
        peer = best[0] if best else None
        print(f"llama.cpp best tg{a.gen}: {best}", flush=True)
    ram, hbm = ram_read_gbps(a.threads), gpu_copy_gbps(1024, 10)

    print(
        f"\n{a.model.name}, {a.share:.0%} of the experts in VRAM, {a.threads} threads, "
        f"pcie_frac {a.pcie_frac}, {a.reps} rounds of {a.gen} tokens; RAM probe {ram:.1f} GB/s, "
        f"HBM copy {hbm:.0f} GB/s"
    )
    gpu = " / GPU add, attention" if a.chain_timing else ""
    print(
        "| fill (profile tokens), read-ahead | tg tok/s | ÷ first (paired) | hit rate | bound "
        f"| µs/layer between / queue / wait / cpu{gpu} | read ahead: experts/layer, computed, "
        "MB/layer |" + (" ÷ llama.cpp |" if peer else "")
    )
    base = tg[arms[0]]
    for arm in arms:
        ratios = sorted(x / b for x, b in zip(tg[arm], base, strict=True))
        s = sums[arm]
        n = max(1.0, s["layers"])
        us = " / ".join(f"{s[k] / n / 1e3:.1f}" for k in ("between", "queue", "wait", "cpu"))
        if a.chain_timing and s.get("chain_layers"):
            nc = s["chain_layers"]
            us += f" / {s['chain_add'] / nc / 1e3:.1f}, {s['chain_attention'] / nc / 1e3:.1f}"
        routed = s["hits"] + s["miss_cpu"] + s["miss_pcie"]
        hit = s["hits"] / max(1.0, routed)
        ex, done, by = s["read_ahead_experts"], s["read_ahead_hits"], s["read_ahead_bytes"]
        ra = f"{ex / n:.2f}, {done / max(1.0, ex):.1%}, {by / n / 1e6:.2f}" if ex else "—"
        med = statistics.median(tg[arm])
        row = (
            f"| {arm[0]}, {arm[1]} | {med:.1f} | {statistics.median(ratios):.3f} "
            f"({ratios[0]:.3f}–{ratios[-1]:.3f}) | {hit:.3f} "
            f"| {decode_bound(a.model, hit, ram, hbm):.0f} | {us} | {ra} |"
        )
        if peer:
            row += f" {med / peer:.2f} |"
        print(row)
    sys.stdout.flush()


def counts(c: object) -> dict[str, float]:
    """The hybrid counters a round reads (layer phases, chain times, pairs, read-ahead)."""
    out = {k: float(v) for k, v in c.layer_times().items()}  # type: ignore[attr-defined]
    out.update({f"chain_{k}": float(v) for k, v in c.chain_times().items()})  # type: ignore[attr-defined]
    h, mc, mp = c.totals()  # type: ignore[attr-defined]
    out.update(hits=float(h), miss_cpu=float(mc), miss_pcie=float(mp))
    snap = c.snapshot()  # type: ignore[attr-defined]
    for k in ("read_ahead_experts", "read_ahead_hits", "read_ahead_bytes"):
        out[k] = float(snap[k])
    return out


if __name__ == "__main__":
    main()
