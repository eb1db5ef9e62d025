"""The hybrid step against the pure GPU path on one file (a device check for changes to the
hybrid handoff): a 32-token prefill (every row's logits) and 24 greedy steps, the hybrid
holding 25% of the routed experts in VRAM slots and the CPU pool computing the rest. The two
paths differ by the float rounding of the experts' sums only, so a broken handoff shows as
logits far off (relative difference near 1) and top-1 disagreement beyond near-ties.

    python bench/hybrid_vs_pure.py FILE.gguf [--threads 16]
"""

from __future__ import annotations

import argparse

import numpy as np
import numpy.typing as npt
from strata._core import Model


def rel(a: npt.ArrayLike, b: npt.ArrayLike) -> float:
    x, y = np.asarray(a), np.asarray(b)
    return float(np.max(np.abs(x - y)) / max(1e-6, float(np.max(np.abs(x)))))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--threads", type=int, default=16)
    a = ap.parse_args()
    pure = Model.open(a.model, n_ctx=256, device="cuda", threads=a.threads)
    hp = pure.hparams
    n_routed = hp["n_layer"] * hp["n_expert"]  # (a file with leading dense layers holds fewer)
    hyb = Model.open(a.model, n_ctx=256, device="cuda", threads=a.threads, vram_slots=n_routed // 4)
    prompt = list(range(100, 132))
    lp = pure.forward(0, prompt, logits="all")
    lh = hyb.forward(0, prompt, logits="all")
    pre = rel(lp, lh)
    pre_top = int(np.sum(np.argmax(np.asarray(lp), 1) == np.argmax(np.asarray(lh), 1)))
    worst, same = 0.0, 0
    for _ in range(24):
        worst = max(worst, rel(lp[-1], lh[-1]))
        same += int(np.argmax(np.asarray(lp[-1])) == np.argmax(np.asarray(lh[-1])))
        tok = int(np.argmax(np.asarray(lp[-1])))
        lp = pure.forward(0, [tok], logits="last")
        lh = hyb.forward(0, [tok], logits="last")
    counters = hyb.hybrid_counters()
    totals = counters.totals() if counters is not None else None
    print(
        f"hybrid vs pure GPU: prefill 32 rows top-1 equal {pre_top}/32, rel diff {pre:.2e}; "
        f"decode 24 steps top-1 equal {same}/24, worst rel diff {worst:.2e}; "
        f"hybrid (hits, cpu, pcie) {totals}"
    )


if __name__ == "__main__":
    main()
