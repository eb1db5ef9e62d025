#!/usr/bin/env bash
# The hybrid decode's expert read-ahead on the GPU machine (issue 23, bench/bench_read_ahead.py)
# in one call: bench/run_issue23_device.sh's prep (llama.cpp built, the issue-9 uniform file
# written and quantized to Q4_K_M, ~275 s), then the modes interleaved round by round, with
# llama.cpp's `-ncmoe` decode in the same run. Carried ($B, default .dev/d23): as
# run_issue23_device.sh's (core.so.xz or a wheel, whl/, llama-src.tar.xz).
# Device tool: command "bash bench/run_read_ahead_device.sh", carry [".dev/d23"];
# MODES (0,1,2), FILLS (--profile-tokens, 0), REPS (7), GEN (128), NCMOE (8,9), PEER (1: run
# llama-bench), HYB (1: bench/run_issue23_device.sh's standard hybrid row first, PCIE_FRAC 0),
# EXTRA (more arguments).
set -u
R=$PWD
B=${B:-$R/.dev/d23}
OUT=${OUT:-/tmp/o}
D=/tmp/bm-hybrid
mkdir -p "$OUT"
STAGE=prep B=$B OUT=$OUT bash "$R/bench/run_issue23_device.sh" || exit 2
if [ "${HYB:-0}" = 1 ]; then
    STAGE=hyb B=$B OUT=$OUT REPS=3 LLREPS=2 PCIE_FRAC=0 bash "$R/bench/run_issue23_device.sh" |
        grep -E 'Strata|llama.cpp|uniform:' | tail -n 20
fi
. "$R/bench/device_site.sh"
device_site "$B" || exit 2
peer=()
[ "${PEER:-1}" = 1 ] && peer=(--llama-bench /tmp/ll/build/bin/llama-bench --ncmoe "${NCMOE:-8,9}")
python3 "$R/bench/bench_read_ahead.py" --model "$D/q3moe-12l-uniform-Q4_K_M.gguf" \
    --modes "${MODES:-0,1,2}" --profile-tokens "${FILLS:-0}" ${EXTRA:-} --reps "${REPS:-7}" --gen "${GEN:-128}" --threads "$(nproc)" \
    "${peer[@]}" 2>&1 | tee "$OUT/read_ahead.txt" | tail -n 40
