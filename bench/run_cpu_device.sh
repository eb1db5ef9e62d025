#!/usr/bin/env bash
# Issue 23's CPU rows on the GPU machine's host CPU (an AVX-512/AMX Xeon; the GPU unused):
# bench/bench_decode.py's pp512 and tg128 of Strata against llama.cpp's own llama-bench, built
# there natively (-DGGML_NATIVE=ON: its AVX-512 and AMX paths) from the llama-cpp-python sdist
# tree, on a Qwen3-30B-A3B-width × LAYERS model written by strata.modelgen (F16) and quantized
# by that build's llama-quantize to each of TYPES. Once with every core (threads = nproc), once
# pinned to two cores (taskset -c 0,1, 2 threads: the development VM's setting).
# ONLY_ALL=1: only the all-cores rows (not the two pinned cores); GEN: decoded tokens (128);
# PP: prompt lengths, comma-separated (512).
# SHAPE=qwen35moe-35b-a3b (a bench/write_family_model.py shape): that family's model instead,
# written F32 and quantized to Q4_K_M.
# Carried ($B, default .dev/lead): Strata as bench/device_site.sh takes it (core.so.xz or a
# wheel), whl/ (the dependency wheels) and
# llama-src.tar.xz (the sdist's vendor/llama.cpp; else llama-cuda-src.tar.xz, the same tree
# that bench/build_llama_cuda.sh takes, built here CPU-only: ~60 s on 16 cores). Results
# under $OUT.
# A CPU-only llama-src.tar.xz of ~4.3 MB (the carry's limit counts the tracked tree too), from
# the sdist's vendor/: tar -cJf llama-src.tar.xz --exclude=llama.cpp/{build,docs,models,
# examples,tests,gguf-py,media,grammars,prompts,benches,tools/ui,tools/server/webui} and
# --exclude=llama.cpp/ggml/src/ggml-{cuda,vulkan,sycl,metal,opencl,cann,musa,webgpu,hexagon,
# zdnn,hip,rpc,blas,virtgpu,openvino} llama.cpp (vendor/ stays: cmake adds its folders).
# LLAMA_BIN: a folder with llama-bench and llama-quantize already built (e.g. the CUDA build of
# bench/build_llama_cuda.sh, also -DGGML_NATIVE=ON): no build here, and the GPU is hidden from
# both engines (CUDA_VISIBLE_DEVICES empty: llama.cpp registers no CUDA device and runs its CPU
# backend; llama-info.txt names the backends it used).
set -u
R=$PWD
B=${B:-$R/.dev/lead}
OUT=${OUT:-/tmp/cpu-out}
LAYERS=${LAYERS:-4}
TYPES=${TYPES:-Q4_K_M,IQ3_S}
REPS=${REPS:-3}
D=/tmp/bm-cpu
LC=/tmp/llama-cpu
LB=${LLAMA_BIN:-$LC/build/bin}
if [ -n "${LLAMA_BIN:-}" ]; then
    [ -x "$LB/llama-bench" ] && [ -x "$LB/llama-quantize" ] ||
        { echo "LLAMA_BIN=$LB lacks llama-bench / llama-quantize" >&2; exit 2; }
    export CUDA_VISIBLE_DEVICES=
fi
mkdir -p "$OUT" "$D" "$LC"
t0=$(date +%s)
. "$R/bench/device_site.sh"
device_site "$B" || exit 2
if [ ! -x "$LB/llama-bench" ]; then
    (
        src="$B/llama-src.tar.xz"
        [ -f "$src" ] || src="$B/llama-cuda-src.tar.xz"
        tar xJf "$src" -C "$LC" &&
            cmake -S "$LC/llama.cpp" -B "$LC/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
                -DGGML_NATIVE=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
                -DLLAMA_BUILD_SERVER=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF &&
            cmake --build "$LC/build" -j"$(nproc)" --target llama-bench llama-quantize
        echo "llama build rc=$? after $(($(date +%s) - t0)) s"
    ) >"$OUT/llbuild.log" 2>&1 &
fi
if [ -n "${SHAPE:-}" ]; then
    python3 "$R/bench/write_family_model.py" "$SHAPE" "$D/$SHAPE-f32.gguf" --layers "$LAYERS"
else
    python3 - "$D/q3moe-${LAYERS}l-f16.gguf" "$LAYERS" <<'PY'
import os, sys
from strata.modelgen import ModelSpec, write_qwen3moe
if not os.path.exists(sys.argv[1]):
    write_qwen3moe(sys.argv[1], ModelSpec.qwen3_30b_a3b(layers=int(sys.argv[2])), dtype="f16")
PY
fi
wait
[ -f "$OUT/llbuild.log" ] && tail -n 1 "$OUT/llbuild.log"
grep -o -E 'AMX_INT8 = 1|AVX512_VNNI = 1|AVX512 = 1' "$OUT/llbuild.log" | sort -u
{ lscpu | grep -E 'Model name|^CPU\(s\)'; grep -o -w -E 'amx_[a-z0-9]+|avx512[a-z_0-9]*' \
    /proc/cpuinfo | sort -u | tr '\n' ' '; echo; } | tee "$OUT/cpu.txt"
BD=(python3 "$R/bench/bench_decode.py" --llama-bench "$LB/llama-bench"
    --reps "$REPS" --pp "${PP:-512}" --gen "${GEN:-128}")
if [ -n "${SHAPE:-}" ]; then
    q="$D/$SHAPE-Q4_K_M.gguf"
    [ -f "$q" ] || "$LB/llama-quantize" "$D/$SHAPE-f32.gguf" "$q" Q4_K_M \
        >"$OUT/quantize.log" 2>&1 || { tail -5 "$OUT/quantize.log"; exit 1; }
    rm -f "$D/$SHAPE-f32.gguf"
    BD+=(--model "$q")
else
    BD+=(--dir "$D" --layers "$LAYERS" --types "$TYPES" --quantize "$LB/llama-quantize")
fi
[ -n "${ONLY_ALL:-}" ] || taskset -c 0,1 "${BD[@]}" --threads 2 2>&1 | tee "$OUT/cpu-2.txt" | tail -n 8
"${BD[@]}" --threads "$(nproc)" 2>&1 | tee "$OUT/cpu-all.txt" | tail -n 8
[ -n "${SHAPE:-}" ] || "$LB/llama-bench" -m "$D/q3moe-${LAYERS}l-Q4_K_M.gguf" -p 64 -n 0 -r 1 -o json \
    2>/dev/null | grep -E '"(cpu_info|backends|build_commit)"' | tee "$OUT/llama-info.txt"
echo "done: $(($(date +%s) - t0)) s"
