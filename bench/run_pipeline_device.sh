#!/usr/bin/env bash
# Pipelined windows (issue 21, `pipeline_windows` 2) on the GPU machine in one call:
#   1. pytest -m gpu: TESTS (default tests/test_gpu_pipeline.py tests/test_gpu_split.py)
#   2. bench/bench_pipeline.py on the trained default (python/strata/models: the edit task and
#      a code prompt) and on the Q4_K_M test model (a repeated phrase): pipeline_windows 1 vs
#      2, tier sync vs
#      async, pure and hybrid (25% of the experts in slots, the CPU pool serving the misses)
# Run from the repository root with, in $B (the carried folder, default .dev/pipe):
# core.so.xz (bench/device_site.sh) or site.tar.xz (the strata package of
# scripts/build_device_wheel's wheel, unpacked, its .so stripped of debug info, the shipped
# models left out), whl/ (gguf, msgspec, starlette, uvicorn), gpu-models/ (the Q4_K_M and
# Q8_0 test models). Results under $OUT.
# Knobs: TESTS, BENCH=0 (skip step 2), REPS (3), TOKENS (128), THREADS (8), PROMPTS ("edit code
# phrase": phrase on the Q4_K_M test model, the others on the trained default), ARGS (more
# bench_pipeline.py arguments, e.g. "--arms --curves"), ONLY (its --only: configurations by
# name, "a|b"), BENCH_TIMEOUT (240 s a prompt), GPUS (the
# stages' devices, "0,0"; "0,1" on two cards, where the tests run with STRATA_TEST_GPUS=$GPUS).
#   device tool: command "bash bench/run_pipeline_device.sh", carry [".dev/pipe"]
set -u
R=$PWD
B=${B:-$R/.dev/pipe}
OUT=${OUT:-/tmp/pipe-out}
mkdir -p "$OUT"
t0=$(date +%s)
. "$R/bench/device_site.sh"
device_site "$B" || exit 2
export STRATA_GPU_MODELS=$B/gpu-models STRATA_TEST_GPUS=${GPUS:-0,0}
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv | tee "$OUT/status.txt"
TESTS=${TESTS:-"$R/tests/test_gpu_pipeline.py $R/tests/test_gpu_split.py"}
if [ "$TESTS" != none ]; then
    # shellcheck disable=SC2086
    timeout "${TEST_TIMEOUT:-300}" python3 -m pytest -m gpu -v -rs -p no:cacheprovider $TESTS \
        >"$OUT/pytest.log" 2>&1
    echo "pytest rc=$? after $(($(date +%s) - t0)) s" | tee -a "$OUT/pytest.log"
    grep -E "PASSED|FAILED|ERROR|passed|failed" "$OUT/pytest.log" | tail -n 40
    grep -E "^E " "$OUT/pytest.log" | head -n 30
fi
[ "${BENCH:-1}" = 1 ] || exit 0
TH=${THREADS:-8}
DEF=$R/python/strata/models/strata-default-qwen3moe-q8_0.gguf
for prompt in ${PROMPTS:-edit code phrase}; do
    model=$DEF
    [ "$prompt" = phrase ] && model=$(ls "$B"/gpu-models/*-Q4_K_M.gguf)
    # shellcheck disable=SC2086
    timeout "${BENCH_TIMEOUT:-240}" python3 "$R/bench/bench_pipeline.py" "$model" \
        --prompt "$prompt" --threads "$TH" --reps "${REPS:-3}" --tokens "${TOKENS:-128}" \
        --only "${ONLY:-}" --gpus "${GPUS:-0,0}" ${ARGS:-} 2>&1 |
        tee "$OUT/bench-$prompt.log" | tail -n 18
done
echo "total $(($(date +%s) - t0)) s"
