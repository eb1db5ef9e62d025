#!/usr/bin/env bash
# Where the hybrid layer's GPU part goes, on the device (issue 23), one call:
#   1. bench_hybrid.py --chain-timing on a Q8_0 uniform-router file of LAYERS layers at full
#      width (the small padded vocabulary, written here by bench/write_q8_model.py: no
#      llama.cpp, no carried vocabulary), 25% of the experts in VRAM, pcie_frac 0: the host's phases beside
#      the GPU part's device time (the hand-off add; attention to routing);
#   2. the same file with every weight in VRAM: decode µs per token and per layer, with and
#      without the head (its graph holds the same attention kernels, and the experts');
#   3. bench/gpu_chain_latency.cu (the per-kernel floor; launched vs queued hand-off;
#      CHAIN_BENCH=0 skips it).
# Steps 1 and 2 run once per entry of FUSION (default "on off on": the decode chain's kernel
# fusions, set_gpu_fusion, on and off alternately in the same call).
# Carried: $B (default .whl: core.so.xz and the dependency wheels; bench/device_site.sh).
# Device tool: command "bash bench/run_chain_device.sh", carry [".whl"].
set -u
R=$PWD
B=${B:-$R/.whl}
OUT=${OUT:-/tmp/o}
LAYERS=${LAYERS:-4}
D=/tmp/bm-chain
mkdir -p "$OUT" "$D"
t0=$(date +%s)
. "$R/bench/device_site.sh"
device_site "$B" || exit 2
FUSION=${FUSION:-on off on}
: >"$OUT/chain.txt"
if [ "${CHAIN_BENCH:-1}" = 1 ]; then
    ( nvcc -O3 -arch=sm_90 -lcuda -o /tmp/gcl "$R/bench/gpu_chain_latency.cu" &&
        /tmp/gcl 10 2000 >"$OUT/chain.txt" 2>&1 ) &
fi
m=$(python3 "$R/bench/write_q8_model.py" "$D" "$LAYERS" uniform q8_0 small 2>"$OUT/write.log") ||
    exit 2
wait
echo "model and chain bench $(($(date +%s) - t0))s"
for f in $FUSION; do
    nf=""
    [ "$f" = off ] && nf=--no-fusion
    echo "fusion $f" | tee -a "$OUT/hyb.txt"
    python3 "$R/bench/bench_hybrid.py" --model "$m" --layers "$LAYERS" --pcie-frac 0 --reps 3 \
        --gen 64 --pp 512 --stream-chunk 0 --chain-timing --control $nf 2>>"$OUT/hyb.err" |
        grep "Strata pcie_frac" | tee -a "$OUT/hyb.txt"
done
python3 - "$m" "$LAYERS" $FUSION <<'PY' 2>&1 | tee "$OUT/pure.txt"
import sys, time
import numpy as np
from strata._core import Model, set_gpu_fusion
for f in sys.argv[3:]:
  set_gpu_fusion(f == "on")
  m = Model.open(sys.argv[1], n_ctx=512, device="cuda")
  assert m.hybrid_info() is None, "the file must fit in VRAM"
  rng = np.random.default_rng(0)
  for mode in ("last", "none"):  # "none": no final norm and head
    us = []
    for r in range(4):
        m.free(0)
        m.forward(0, rng.integers(0, 1000, 16).tolist(), logits="last")
        t = time.perf_counter()
        toks = rng.integers(0, 1000, 64).tolist()
        for tok in toks[:-1]:
            m.forward(0, [tok], logits=mode)
        m.forward(0, toks[-1:], logits="last")  # reads logits: every step before it is done
        us.append((time.perf_counter() - t) / 64 * 1e6)
    u = float(np.median(us[1:]))
    print(f"pure GPU, fusion {f}, logits {mode} ({m.cuda_graph_state}): {u:.1f} us/token, "
          f"{u / int(sys.argv[2]):.1f} us/layer (runs {', '.join(f'{x:.1f}' for x in us)})")
  del m
PY
echo "total $(($(date +%s) - t0))s"
cat "$OUT/chain.txt"
