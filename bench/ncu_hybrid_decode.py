"""A few hybrid decode steps to profile with Nsight Compute on the device (issue 23): each
kernel's device time in place (cold weights, as the step runs them), for the sums beside
bench_hybrid.py --chain-timing:

    ncu --clock-control none --metrics gpu__time_duration.sum --csv \
        python3 bench/ncu_hybrid_decode.py FILE.gguf [STEPS] > hyb.csv
    python3 bench/ncu_table.py hyb.csv

25% of the experts in VRAM slots, pcie_frac 0, a 16-token prompt then STEPS one-token steps
(the first eager, the rest replaying the per-layer graphs).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from bench_hybrid import layers_experts
from strata._core import Model


def main() -> None:
    path, steps = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 4
    n_layer, n_expert, n_dense = layers_experts(Path(path))
    n_slots = round(0.25 * (n_layer - n_dense) * n_expert)  # as bench_hybrid.py's --share
    m = Model.open(path, n_ctx=256, device="cuda", vram_slots=n_slots, pcie_frac=0.0)
    rng = np.random.default_rng(0)
    m.forward(0, rng.integers(0, 1000, 16).tolist(), logits="last")
    for tok in rng.integers(0, 1000, steps).tolist():
        m.forward(0, [tok], logits="last")
    print("graph:", m.cuda_graph_state, file=sys.stderr)


if __name__ == "__main__":
    main()
