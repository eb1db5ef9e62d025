"""`pool_pipeline_parity MODEL.gguf`: the CPU expert pool's bitwise parity check.

For three MoE layers of the model (different gate/up/down type mixes where the model has
them), it compares the pipelined schedule, the barrier schedule and the independent serial
reference, bitwise, over 1/4/17 workers x host participation on/off x 1/2/4 tokens x
1/2/7/18/97 jobs x 3 repeats = 810 comparisons, and prints `N/810 bitwise identical`.

Exit codes: 0 all identical; 1 a mismatch; 2 a model it cannot run the check on;
77 no model argument (the automake/CTest skip code: nothing was checked, nothing passed).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from strata._core import ExpertPool, MoELayer, moe_reference
from strata.errors import StrataError
from strata.gguf import GGUFFile

__all__ = ["SKIP", "Case", "cases", "load_layers", "main", "routing"]

SKIP = 77
WORKERS = (1, 4, 17)
HOSTS = (True, False)
TOKENS = (1, 2, 4)
JOBS = (1, 2, 7, 18, 97)
REPEATS = 3
N_LAYERS = 3


@dataclass(frozen=True)
class Case:
    layer: int  # index into the chosen layers
    tokens: int
    jobs: int
    repeat: int


def cases(n_layers: int = N_LAYERS) -> list[Case]:
    return [
        Case(layer, t, j, r)
        for layer in range(n_layers)
        for t in TOKENS
        for j in JOBS
        for r in range(REPEATS)
    ]


def routing(
    rng: np.random.Generator, n_expert: int, tokens: int, jobs: int
) -> tuple[npt.NDArray[np.uint32], npt.NDArray[np.float32]]:
    """ids[T,k] touching exactly `jobs` distinct experts (distinct within each token), and
    positive weights[T,k]; k = ceil(jobs / T)."""
    experts = rng.choice(n_expert, size=jobs, replace=False).astype(np.uint32)
    k = math.ceil(jobs / tokens)
    ids = np.array(
        [[experts[(t * k + j) % jobs] for j in range(k)] for t in range(tokens)], dtype=np.uint32
    )
    weights = rng.uniform(0.05, 1.0, size=(tokens, k)).astype(np.float32)
    return ids, weights


def _moe_layers(f: GGUFFile) -> list[int]:
    out = []
    for name in f.tensors:
        if name.startswith("blk.") and name.endswith(".ffn_gate_exps.weight"):
            out.append(int(name.split(".")[1]))
    return sorted(out)


def load_layers(f: GGUFFile, n: int = N_LAYERS) -> list[tuple[int, MoELayer]]:
    """The first `n` MoE layers with pairwise different type mixes; where the model has
    fewer mixes, the remaining picks are the first unused layers."""
    blocks = _moe_layers(f)
    if not blocks:
        raise StrataError(f"{f.path}: no MoE expert tensors (blk.N.ffn_gate_exps.weight)")

    def mix(b: int) -> tuple[str, ...]:
        return tuple(f.tensors[f"blk.{b}.ffn_{p}_exps.weight"].type for p in ("gate", "up", "down"))

    chosen: list[int] = []
    for b in blocks:
        if len(chosen) < n and mix(b) not in {mix(c) for c in chosen}:
            chosen.append(b)
    for b in blocks:
        if len(chosen) < n and b not in chosen:
            chosen.append(b)
    out = []
    for b in sorted(chosen):
        g, u, d = (f.tensors[f"blk.{b}.ffn_{p}_exps.weight"] for p in ("gate", "up", "down"))
        n_expert, inter, hidden = g.shape
        if u.shape != g.shape or d.shape != (n_expert, hidden, inter):
            raise StrataError(
                f"blk.{b}: expert shapes gate {g.shape}, up {u.shape}, down {d.shape} disagree"
            )
        layer = MoELayer(
            g.type,
            f.raw(g.name),
            u.type,
            f.raw(u.name),
            d.type,
            f.raw(d.name),
            n_expert,
            hidden,
            inter,
        )
        out.append((b, layer))
    return out


def _inputs(
    layer: MoELayer, case: Case, seed: int
) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.uint32], npt.NDArray[np.float32]]:
    rng = np.random.default_rng([seed, case.layer, case.tokens, case.jobs, case.repeat])
    ids, weights = routing(rng, layer.n_expert, case.tokens, case.jobs)
    x = rng.standard_normal((case.tokens, layer.hidden)).astype(np.float32)
    return x, ids, weights


def run(path: str, seed: int = 0, quiet: bool = False) -> int:
    try:
        f = GGUFFile(path)
        layers = load_layers(f)
    except (StrataError, OSError) as e:
        print(f"pool_pipeline_parity: {e}", file=sys.stderr)
        return 2
    for b, layer in layers:
        if layer.n_expert < max(JOBS):
            print(
                f"pool_pipeline_parity: blk.{b} has {layer.n_expert} experts; the check draws "
                f"up to {max(JOBS)} distinct experts per call",
                file=sys.stderr,
            )
            return 2
    print(
        "layers: "
        + ", ".join(f"blk.{b} {'/'.join(layer.types)}" for b, layer in layers)
        + f" (E={layers[0][1].n_expert}, H={layers[0][1].hidden}, I={layers[0][1].inter})"
    )
    pools = {
        (w, h, p): ExpertPool(workers=w, host_participates=h, pipelined=p, spin_us=200)
        for w in WORKERS
        for h in HOSTS
        for p in (False, True)
    }
    n_ok = n_all = 0
    t0 = time.perf_counter()
    for case in cases(len(layers)):
        b, layer = layers[case.layer]
        x, ids, weights = _inputs(layer, case, seed)
        want = moe_reference(layer, x, ids, weights).view(np.uint32)
        for w in WORKERS:
            for h in HOSTS:
                barrier = pools[(w, h, False)].moe(layer, x, ids, weights).view(np.uint32)
                piped = pools[(w, h, True)].moe(layer, x, ids, weights).view(np.uint32)
                ok = np.array_equal(barrier, want) and np.array_equal(piped, want)
                n_all += 1
                n_ok += ok
                if not ok and not quiet:
                    print(
                        f"MISMATCH blk.{b} workers={w} host={h} tokens={case.tokens} "
                        f"jobs={case.jobs} repeat={case.repeat}: barrier "
                        f"{int((barrier != want).sum())}, pipelined "
                        f"{int((piped != want).sum())} of {want.size} values differ"
                    )
    dt = time.perf_counter() - t0
    print(f"{n_ok}/{n_all} bitwise identical ({dt:.1f} s)")
    return 0 if n_ok == n_all else 1


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="pool_pipeline_parity",
        description="A parity check (a test of the CPU expert pool, not a serving command): "
        "bitwise parity of the pool's pipelined and barrier schedules and the serial "
        "reference over 3 MoE layers of a GGUF model (810 comparisons).",
    )
    ap.add_argument("model", nargs="?", help="GGUF file (any shard) with >= 97 experts a layer")
    ap.add_argument("shard", nargs="?", help="ignored (kept for the original's PACK SHARD form)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if not args.model:
        print(
            "pool_pipeline_parity: no model given, so nothing was checked (skip, exit 77). "
            "Usage: pool_pipeline_parity MODEL.gguf",
            file=sys.stderr,
        )
        return SKIP
    return run(args.model, seed=args.seed)


if __name__ == "__main__":
    sys.exit(main())
