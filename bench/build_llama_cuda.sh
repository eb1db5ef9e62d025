#!/usr/bin/env bash
# Builds llama.cpp's llama-bench, llama-quantize and llama-server with CUDA (sm_90) on the GPU
# machine, the peer for bench/bench_gpu.py and the hybrid benchmarks. The source is llama-cpp-python's sdist tree (vendor/llama.cpp),
# carried as a tarball because that machine has no network; make it here with
#   pip download --no-binary :all: --no-deps llama-cpp-python==0.3.36   (then tar the
#   vendor/llama.cpp folder without docs/, models/, media/, benches/ and the non-CUDA backends)
# and carry it (e.g. .devsrc/llama-cuda-src.tar.xz, git-ignored). Nothing of it is committed.
# Usage: bench/build_llama_cuda.sh TARBALL [BUILD_DIR]   (~5 minutes on 16 cores)
set -euo pipefail
tarball="$1"
dir="${2:-/tmp/llama-cuda}"
mkdir -p "$dir"
tar xJf "$tarball" -C "$dir"
cmake -S "$dir/llama.cpp" -B "$dir/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_NATIVE=ON \
    -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF >"$dir/configure.log" 2>&1 \
    || { tail -30 "$dir/configure.log"; exit 1; }
cmake --build "$dir/build" -j"$(nproc)" --target llama-bench llama-quantize llama-server >"$dir/build.log" 2>&1 \
    || { tail -30 "$dir/build.log"; exit 1; }
ls -la "$dir/build/bin/llama-bench" "$dir/build/bin/llama-quantize" "$dir/build/bin/llama-server"
