#!/usr/bin/env bash
# Makes the llama.cpp source tarball the GPU machine's runners build from (it has no network):
# llama-cpp-python 0.3.36's sdist (the oracle's version) from PyPI, its vendor/llama.cpp tree
# without docs, models, media, benches and the backends other than CPU and CUDA.
# Usage: bench/make_llama_src.sh OUT.tar.xz   (~10 MB; nothing of it is committed)
set -euo pipefail
out="$1"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
url=$(curl -fsS https://pypi.org/simple/llama-cpp-python/ |
    grep -o 'https://[^"#]*llama_cpp_python-0\.3\.36\.tar\.gz' | head -n 1)
curl -fsS -o "$tmp/sdist.tar.gz" "$url"
echo "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e  $tmp/sdist.tar.gz" |
    sha256sum -c --quiet
tar xzf "$tmp/sdist.tar.gz" -C "$tmp"
src="$tmp/llama_cpp_python-0.3.36/vendor"
ex=()
for d in docs models media benches pocs gguf-py examples tests; do ex+=(--exclude="llama.cpp/$d"); done
for b in blas cann et hexagon hip metal musa opencl openvino rpc sycl virtgpu vulkan webgpu zdnn zendnn; do
    ex+=(--exclude="llama.cpp/ggml/src/ggml-$b")
done
tar cJf "$out" -C "$src" "${ex[@]}" llama.cpp
ls -la "$out"
