#!/usr/bin/env bash
# The decode attention's head split on the device (issue 23), one call: bench/gpu_head_split.py
# (pure GPU decode µs per token after a 16- and a 1024-token prompt, 1, 2 and 4 blocks per KV
# head, logits checked bitwise) on the 4-layer Q8_0 file of bench/run_chain_device.sh, then
# that script's hybrid chain timing with the default split (FUSION=on, CHAIN_BENCH=0).
# Device tool: command "bash bench/run_head_split_device.sh", carry [".whl"].
set -u
R=$PWD
B=${B:-$R/.whl}
OUT=${OUT:-/tmp/o}
mkdir -p "$OUT" /tmp/bm-chain
. "$R/bench/device_site.sh"
device_site "$B" || exit 2
m=$(python3 "$R/bench/write_q8_model.py" /tmp/bm-chain 4 uniform q8_0 small 2>"$OUT/write.log") ||
    exit 2
python3 "$R/bench/gpu_head_split.py" "$m" --ctx 16,1024 --splits 1,2,4,1 2>&1 | tee "$OUT/hs.txt"
OUT=$OUT/chain FUSION=on CHAIN_BENCH=0 bash "$R/bench/run_chain_device.sh" 2>&1 |
    grep -E "Strata|pure" | tee "$OUT/chain.txt"
