"""Served aggregate decode on the GPU, hybrid at equal VRAM: Strata's server vs `llama-server
-ngl 99 --n-cpu-moe N -np S`, driven by bench/bench_serve.py's client over HTTP (issue 15).

    python bench/bench_serve_hybrid.py --model FILE.gguf --llama-server BIN [--streams 1,4,8]
        [--share 0.25] [--threads 16] [--gen 128] [--reps 3]

Strata: `--device cuda` with the VRAM budget that gives `--share` of the experts a slot at the
server's settings (found by opening the model with those settings and `vram_slots`; the slots
filled in the default order, the adaptive tier on). llama.cpp: `--n-cpu-moe N` with N = the
layers whose experts stay on the CPU at the same share (round(layers × (1 − share))). Each
stream count runs both servers, interleaved A B A B over `--reps`; aggregate decode tok/s as
bench/bench_serve.py measures it (tokens after each stream's first ÷ first-first to last-last).
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
from pathlib import Path

import bench_serve as bs

N_CTX = 1024


def strata_budget_mib(model: Path, parallel: int, share: float, threads: int) -> int:
    """The vram_budget_mib that gives `share` of the experts a slot at the server's settings."""
    from strata._core import Model

    probe = Model.open(model, n_ctx=N_CTX, n_slots=parallel, device="cuda", threads=threads)
    hp = probe.hparams
    want = round(share * hp["n_layer"] * hp["n_expert"])
    del probe
    m = Model.open(
        model, n_ctx=N_CTX, n_slots=parallel, device="cuda", threads=threads, vram_slots=want
    )
    i = m.hybrid_info()
    assert i is not None
    del m
    return math.ceil((i["fixed_bytes"] + want * i["slot_bytes"]) / 2**20) + 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--llama-server", default="")
    ap.add_argument("--streams", default="1,4,8")
    ap.add_argument("--share", type=float, default=0.25)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--layers", type=int, default=12)
    a = ap.parse_args()
    bs.THREADS = a.threads
    ncmoe = round(a.layers * (1.0 - a.share))
    print(f"model {a.model}, {a.threads} threads, share {a.share}, llama --n-cpu-moe {ncmoe}")
    print("| streams | strata tok/s | llama-server tok/s | strata ÷ llama |")
    print("|---|---|---|---|")
    for n in [int(x) for x in a.streams.split(",")]:
        mib = strata_budget_mib(a.model, n, a.share, a.threads)
        extra = ["--device", "cuda", "--threads", str(a.threads), "--vram-budget-mib", str(mib)]
        servers = [("strata", bs.strata(a.model, n, N_CTX, extra))]
        if a.llama_server:
            gpu = ["-ngl", "99", "--n-cpu-moe", str(ncmoe)]
            ll = bs.llama(a.llama_server, a.model, n, N_CTX, gpu)
            servers.append(("llama", ll))
        got: dict[str, list[float]] = {k: [] for k, _ in servers}
        failed: dict[str, list[str]] = {k: [] for k, _ in servers}
        try:
            for _ in range(a.reps):
                for k, s in servers:
                    try:
                        got[k].append(bs.decode_round(s.port, n, a.gen)[0])
                    except RuntimeError as e:  # a round without a decode span: reported
                        failed[k].append(str(e))
                        print(f"  {k}, {n} streams: round failed: {e}", file=sys.stderr)
        finally:
            for _, s in servers:
                s.stop()
        med = {k: statistics.median(v) if v else float("nan") for k, v in got.items()}
        st, lt = med["strata"], med.get("llama", float("nan"))
        bad = {k: len(v) for k, v in failed.items() if v}
        note = f"; failed rounds {bad}" if bad else ""
        print(
            f"| {n} | {st:.1f} | {lt:.1f} | {st / lt:.2f} |  (budget {mib} MiB; runs {got}{note})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
