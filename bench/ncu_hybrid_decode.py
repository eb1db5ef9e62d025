"""A few hybrid decode steps to profile with Nsight Compute on the device (issue 23): each
kernel's device time in place (cold weights, as the step runs them), for the sums beside
bench_hybrid.py --chain-timing:

    ncu --clock-control none --metrics gpu__time_duration.sum --csv \
        python3 bench/ncu_hybrid_decode.py FILE.gguf [--steps N] [--pure] [--no-fusion] > hyb.csv
    python3 bench/ncu_table.py hyb.csv

25% of the experts in VRAM slots (`--pure`: every weight in VRAM), pcie_frac 0, a 16-token
prompt then N one-token steps (the first eager, the rest replaying the graphs); `--no-fusion`
opens the model with the decode chain's kernel fusions off (set_gpu_fusion).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from bench_hybrid import layers_experts
from strata._core import Model, set_gpu_fusion


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model", type=Path)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--pure", action="store_true", help="every weight in VRAM")
    ap.add_argument("--no-fusion", action="store_true", help="set_gpu_fusion(False)")
    a = ap.parse_args()
    set_gpu_fusion(not a.no_fusion)
    n_layer, n_expert, n_dense = layers_experts(a.model)
    n_slots = round(0.25 * (n_layer - n_dense) * n_expert)  # as bench_hybrid.py's --share
    kw = {} if a.pure else {"vram_slots": n_slots, "pcie_frac": 0.0}
    m = Model.open(str(a.model), n_ctx=256, device="cuda", **kw)
    rng = np.random.default_rng(0)
    m.forward(0, rng.integers(0, 1000, 16).tolist(), logits="last")
    for tok in rng.integers(0, 1000, a.steps).tolist():
        m.forward(0, [tok], logits="last")
    print("graph:", m.cuda_graph_state, file=sys.stderr)


if __name__ == "__main__":
    main()
