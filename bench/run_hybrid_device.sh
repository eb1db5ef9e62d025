#!/usr/bin/env bash
# The issue-9 benchmark on the GPU machine in one call (about 8-9 minutes on 16 cores):
# builds llama.cpp (CUDA) while the two F16 models (uniform and Zipf-biased router) are
# written in parallel, quantizes both with llama-quantize, then runs bench/bench_hybrid.py
# (Strata's hybrid step at 25% of the experts in VRAM vs llama-bench -ngl 99 -ncmoe N).
#
# Run from the repository root, with the wheel (scripts/build_device_wheel → .whl/) and the
# llama.cpp source tarball (bench/build_llama_cuda.sh says how to make it; default
# .devsrc/llama-cuda-src.tar.xz, override with LLAMA_SRC) carried:
#   device tool: command "bash bench/run_hybrid_device.sh", carry [".whl", ".devsrc"],
#                timeout_s 600
# If one call is too short: PHASE=prep (build, write, quantize: the files stay in /tmp while
# the machine is warm), then PHASE=bench. Every step skips what is already there.
# Results under $OUT: bench.log (the table is its last lines), llbuild.log, write-*.log.
# Knobs (environment): REPS (Strata decode runs, 2), LLREPS (llama-bench -r, 2), PP (4096),
# GEN (64), NCMOE (default: equal VRAM ±1), THREADS (nproc), STREAM_CHUNK (Strata's streamed
# prefill chunk, 4096; 0: the 512 prefill chunk), UBATCH (llama-bench -ub list, "512,4096"),
# PPREPS (Strata prompt runs, 2), POOL_PIPELINE=1 (the pool's pipelined schedule),
# MODELS (uniform,zipf), SKIP_LLAMA=1 (Strata only: quick A/B runs once llama.cpp's are known),
# PCIE_FRAC (Strata's pcie_frac values, comma-separated, "-1,0": the probe's and none),
# EAGER_AB=1 (also decode without the per-layer graphs), THREADS_AB (also decode at each of
# these thread counts), DOT_PREFETCH (also decode at each of these prefetch distances, bytes),
# CONTROL=1 (the default decode once more, last: the run's drift), ADAPT_AB=1 (also decode
# with a static VRAM tier), GPUS (Strata's stages'
# devices, "0,1" on two cards; llama-bench splits over every visible card by layer, its
# default).
set -u
R=$PWD
OUT=${OUT:-/tmp/hybrid-out}
PHASE=${PHASE:-all}
MODELS=${MODELS:-uniform,zipf}
mkdir -p "$OUT"
LLAMA_SRC=${LLAMA_SRC:-$R/.devsrc/llama-cuda-src.tar.xz}
. "$R/bench/device_site.sh"
device_site "${B:-$R/.whl}" || exit 2 # Strata and its dependencies (B: the carried folder)
D=/tmp/bm-hybrid
LL=/tmp/ll/build/bin
mkdir -p "$D"
t0=$(date +%s)
ARGS=(--dir "$D" --threads "${THREADS:-$(nproc)}" --reps "${REPS:-2}" --llama-reps "${LLREPS:-2}"
    --pp "${PP:-4096}" --gen "${GEN:-64}" --stream-chunk "${STREAM_CHUNK:-4096}"
    --llama-ubatch "${UBATCH:-512,4096}" --pp-reps "${PPREPS:-2}" --pcie-frac="${PCIE_FRAC:--1,0}")
[ -n "${NCMOE:-}" ] && ARGS+=(--ncmoe "$NCMOE")
[ -n "${GPUS:-}" ] && ARGS+=(--gpus "$GPUS") # "0,1": Strata's layer split over two cards
[ "${POOL_PIPELINE:-0}" = 1 ] && ARGS+=(--pool-pipeline)
[ "${EAGER_AB:-0}" = 1 ] && ARGS+=(--eager-ab)
[ -n "${THREADS_AB:-}" ] && ARGS+=(--threads-ab "$THREADS_AB")
[ -n "${DOT_PREFETCH:-}" ] && ARGS+=(--dot-prefetch "$DOT_PREFETCH")
[ "${CONTROL:-0}" = 1 ] && ARGS+=(--control)
[ "${ADAPT_AB:-0}" = 1 ] && ARGS+=(--adapt-ab)
if [ "$PHASE" != bench ]; then
    if [ ! -x "$LL/llama-bench" ]; then
        (
            bash "$R/bench/build_llama_cuda.sh" "$LLAMA_SRC" /tmp/ll >"$OUT/llbuild.log" 2>&1
            echo "llbuild rc=$? in $(($(date +%s) - t0))s" >>"$OUT/llbuild.log"
        ) &
    fi
    for kind in ${MODELS//,/ }; do
        (
            python3 "$R/bench/bench_hybrid.py" --dir "$D" --write-f16 "$kind" >"$OUT/write-$kind.log" 2>&1
            echo "write $kind rc=$? in $(($(date +%s) - t0))s" >>"$OUT/write-$kind.log"
        ) &
    done
    wait
    tail -n 2 "$OUT"/write-*.log "$OUT/llbuild.log" 2>/dev/null
fi
ARGS+=(--models "$MODELS")
if [ -x "$LL/llama-bench" ]; then
    ARGS+=(--llama-quantize "$LL/llama-quantize")
    [ "${SKIP_LLAMA:-0}" = 1 ] || ARGS+=(--llama-bench "$LL/llama-bench")
else
    echo "llama.cpp did not build: Strata only (quantized by llama-cpp-python if present)"
fi
if [ "$PHASE" = prep ]; then
    python3 "$R/bench/bench_hybrid.py" "${ARGS[@]}" --make-only
else
    python3 "$R/bench/bench_hybrid.py" "${ARGS[@]}" 2>&1 | tee "$OUT/bench.log" | tail -n 45
fi
echo "total $(($(date +%s) - t0))s"
