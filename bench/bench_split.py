"""Decode through the layer split on one GPU (issue #21): one stage vs the same GPU as two
stages (`gpus="0,0"`), pure GPU and hybrid (25% of the experts in slots, a choice after every
step, sync and async tier), greedy, on a model file given on the command line (the device
suite's test models by default). Prints tok/s and each stage's compute / waiting / copying
seconds (`Model.stages()`), a table last.

    python bench/bench_split.py [MODEL.gguf] [--tokens 256] [--vram-slots 6] [--threads 3]
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Any

from strata._core import Model


def run(path: Path, tokens: int, threads: int, **kw: Any) -> tuple[float, list[dict[str, Any]]]:
    m = Model.open(path, n_ctx=tokens + 64, device="cuda", threads=threads, pcie_frac=0.0, **kw)
    out = m.forward(0, list(range(1, 9)))
    for _ in range(8):  # warm-up: the eager step and the graph captures
        out = m.forward(0, [int(out.argmax())])
    t0 = time.perf_counter()
    for _ in range(tokens):
        out = m.forward(0, [int(out.argmax())])
    dt = time.perf_counter() - t0
    return tokens / dt, m.stages()


def main() -> None:
    ap = argparse.ArgumentParser()
    default = Path(os.environ.get("STRATA_GPU_MODELS", ".whl/gpu-models"))
    ap.add_argument("model", nargs="?", type=Path)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--vram-slots", type=int, default=6, help="hybrid: expert slots per layer")
    ap.add_argument("--threads", type=int, default=3, help="the CPU pool's threads")
    ap.add_argument("--boundary", default="1", help="two stages: the first layer of stage 1")
    a = ap.parse_args()
    path = a.model or next(default.glob("*-Q4_K_M.gguf"))
    hy = dict(vram_slots=a.vram_slots, adapt_every=1, adapt_swaps=4)
    rows = []
    for name, kw in (
        ("pure", {}),
        ("hybrid sync", hy),
        ("hybrid async", dict(hy, tier_async=True)),
    ):
        for gpus in ("0", "0,0"):
            tps, st = run(
                path,
                a.tokens,
                a.threads,
                gpus=gpus,
                layer_split="auto" if gpus == "0" else a.boundary,
                **kw,
            )
            rows.append((name, gpus, tps, st))
            print(name, gpus, f"{tps:.1f} tok/s", st, flush=True)
    print(f"\n{'mode':<14}{'gpus':<6}{'tok/s':>9}  per stage: compute / waiting / copying s")
    for name, gpus, tps, st in rows:
        per = "  ".join(
            f"[{s['layers'][0]}-{s['layers'][1]}) {s['compute_s']:.3f}/{s['waiting_s']:.3f}/"
            f"{s['copying_s']:.4f}"
            for s in st
        )
        print(f"{name:<14}{gpus:<6}{tps:>9.1f}  {per}")


if __name__ == "__main__":
    main()
