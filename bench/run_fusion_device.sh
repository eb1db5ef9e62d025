#!/usr/bin/env bash
# The decode chain's kernel fusions kernel by kernel on the device (issue 23), one call:
# Nsight Compute over a 16-token prompt and STEPS one-token steps of a Q8_0 file of LAYERS
# layers at full width (bench/write_q8_model.py, the small vocabulary), every weight in VRAM
# (MODE=--pure, the default) or 25% of the experts (MODE=""), with the fusions on and off
# (set_gpu_fusion); bench/ncu_table.py sums each run by kernel.
# Carried: $B (default .whl: core.so.xz and the dependency wheels; bench/device_site.sh).
# Device tool: command "bash bench/run_fusion_device.sh", carry [".whl"].
set -u
R=$PWD
B=${B:-$R/.whl}
OUT=${OUT:-/tmp/o}
LAYERS=${LAYERS:-4}
STEPS=${STEPS:-4}
MODE=${MODE---pure}
D=/tmp/bm-chain
mkdir -p "$OUT" "$D"
. "$R/bench/device_site.sh"
device_site "$B" || exit 2
m=$(python3 "$R/bench/write_q8_model.py" "$D" "$LAYERS" uniform q8_0 small 2>"$OUT/write.log") ||
    exit 2
for f in on off; do
    nf=""
    [ "$f" = off ] && nf=--no-fusion
    ncu --clock-control none --metrics gpu__time_duration.sum --csv \
        python3 "$R/bench/ncu_hybrid_decode.py" "$m" --steps "$STEPS" $MODE $nf \
        >"$OUT/ncu_$f.csv" 2>"$OUT/ncu_$f.err"
    python3 "$R/bench/ncu_table.py" "$OUT/ncu_$f.csv" | tee "$OUT/ncu_$f.txt"
done
