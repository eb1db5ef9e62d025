"""Routing distribution of random-weight test models with and without a Zipf-biased router.

    python bench/router_zipf.py                       # measure on small models here
    python bench/router_zipf.py --make-30b DIR        # also write the Qwen3-30B-A3B-shaped
                                                      # (full width, 12 layers) biased Q4_K_M

Random routers send tokens almost uniformly to the experts; a real model's experts follow a
Zipf-like popularity, which is what makes a VRAM expert cache pay. `ModelSpec.router_zipf`
biases the routers (strata.modelgen). This script builds the same small model with
`router_zipf` 0 and the given exponent, runs real prompts through it on the CPU
(`strata.LLM`, prompt tokens and greedy decode), and prints, per layer, the share of routed
picks that land on the layer's top 25% experts (0.25 is uniform), and the share a cache of
25% of the experts would hit if it held the experts the profile ranks hottest.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

PROMPTS = [
    "The history of the printing press begins in",
    "def quicksort(xs):\n    if len(xs) <= 1:\n        return xs\n",
    "Explain why the sky is blue to a child.",
    "Translate to French: the cat sleeps on the warm windowsill.",
    "List three prime numbers greater than one hundred:",
    "In 1969 the first humans landed on",
]


def top_share(counts: Any, frac: float = 0.25) -> list[float]:
    """Per layer: the share of routed picks on the layer's top `frac` experts."""
    c = np.asarray(counts, dtype=np.float64)
    k = max(1, round(c.shape[1] * frac))
    out = []
    for row in c:
        total = row.sum()
        out.append(float(np.sort(row)[::-1][:k].sum() / total) if total > 0 else 0.0)
    return out


def zipf_share(n_expert: int, k: int, s: float, frac: float = 0.25, draws: int = 4000) -> float:
    """The top-`frac` share when each token draws `k` distinct experts from a Zipf(s) law
    (popularity ∝ (rank+1)^-s): the target the biased router approximates."""
    p = (np.arange(n_expert) + 1.0) ** -s
    p /= p.sum()
    rng = np.random.default_rng(0)
    cnt = np.zeros(n_expert)
    for _ in range(draws):
        cnt[rng.choice(n_expert, k, replace=False, p=p)] += 1
    return top_share(cnt[None, :], frac)[0]


def measure(path: Path, gen: int = 16) -> list[float]:
    from strata import LLM

    llm = LLM(path, threads=1)
    for p in PROMPTS:
        for _ in llm.generate(p, max_tokens=gen, temperature=0.0):
            pass
    return top_share(llm.routing_counts())


def small_spec(zipf: float) -> Any:
    from strata.modelgen import ModelSpec

    return ModelSpec.tiny(n_expert=32, n_expert_used=4, router_zipf=zipf)


def run(zipf: float, gen: int) -> dict[str, list[float]]:
    from strata.modelgen import write_qwen3moe

    out = {}
    with tempfile.TemporaryDirectory() as d:
        for label, z in (("uniform", 0.0), (f"zipf {zipf}", zipf)):
            path = write_qwen3moe(Path(d) / f"m-{z}.gguf", small_spec(z), dtype="f32")
            out[label] = measure(path, gen)
    return out


def make_30b(dir_: Path, zipf: float, layers: int = 12, ty: str = "Q4_K_M") -> Path:
    """The benchmark model of issue #9: Qwen3-30B-A3B widths, `layers` layers, biased router."""
    from strata.modelgen import ModelSpec, quantize, write_qwen3moe

    dir_.mkdir(parents=True, exist_ok=True)
    f16 = dir_ / f"q3moe-{layers}l-zipf{zipf}-f16.gguf"
    out = dir_ / f"q3moe-{layers}l-zipf{zipf}-{ty}.gguf"
    if out.exists():
        return out
    if not f16.exists():
        print(f"writing {f16} ...", file=sys.stderr, flush=True)
        spec = ModelSpec.qwen3_30b_a3b(layers=layers, router_zipf=zipf)
        write_qwen3moe(f16, spec, dtype="f16")
    print(f"quantizing {out} ...", file=sys.stderr, flush=True)
    quantize(f16, out, ty)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--zipf", type=float, default=1.1, help="router_zipf exponent")
    ap.add_argument("--gen", type=int, default=16, help="greedy tokens per prompt")
    ap.add_argument("--make-30b", type=Path, metavar="DIR", help="write the 30B-shaped model")
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--type", default="Q4_K_M")
    args = ap.parse_args()
    if args.make_30b:
        print(make_30b(args.make_30b, args.zipf, args.layers, args.type))
        return
    res = run(args.zipf, args.gen)
    spec = small_spec(args.zipf)
    print(
        f"share of routed picks on each layer's top 25% experts ({spec.n_expert} experts, "
        f"top-{spec.n_expert_used}; uniform routing: 0.25; drawing from Zipf({args.zipf}): "
        f"{zipf_share(spec.n_expert, spec.n_expert_used, args.zipf):.3f})"
    )
    for label, shares in res.items():
        cells = " ".join(f"{s:.3f}" for s in shares)
        print(f"  {label:>10}: mean {np.mean(shares):.3f}  per layer {cells}")


if __name__ == "__main__":
    main()
