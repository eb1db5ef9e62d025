#!/usr/bin/env bash
# The issue-9 benchmark on the GPU machine in one call (about 8-9 minutes on 16 cores):
# builds llama.cpp (CUDA) while the two F16 models (uniform and Zipf-biased router) are
# written in parallel, then runs bench/bench_hybrid.py (quantizes both with llama-quantize,
# Strata's hybrid step at 25% of the experts in VRAM vs llama-bench -ngl 99 -ncmoe N).
#
# Run from the repository root, with the wheel (scripts/build_device_wheel → .whl/) and the
# llama.cpp source tarball (bench/build_llama_cuda.sh says how to make it; default
# .devsrc/llama-cuda-src.tar.xz, override with LLAMA_SRC) carried:
#   device tool: command "bash bench/run_hybrid_device.sh", carry [".whl", ".devsrc"],
#                timeout_s 600
# Results under $OUT: bench.log (the table is its last lines), llbuild.log, write-*.log.
# Knobs (environment): REPS (Strata decode runs, 2), LLREPS (llama-bench -r, 2), PP (4096),
# GEN (64), NCMOE (default: equal VRAM ±1), THREADS (nproc).
set -u
R=$PWD
OUT=${OUT:-/tmp/hybrid-out}
mkdir -p "$OUT"
LLAMA_SRC=${LLAMA_SRC:-$R/.devsrc/llama-cuda-src.tar.xz}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site "$R"/.whl/*.whl
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
D=/tmp/bm-hybrid
mkdir -p "$D"
t0=$(date +%s)
(
    bash "$R/bench/build_llama_cuda.sh" "$LLAMA_SRC" /tmp/ll >"$OUT/llbuild.log" 2>&1
    echo "llbuild rc=$? in $(($(date +%s) - t0))s" >>"$OUT/llbuild.log"
) &
for kind in uniform zipf; do
    (
        python3 "$R/bench/bench_hybrid.py" --dir "$D" --write-f16 "$kind" >"$OUT/write-$kind.log" 2>&1
        echo "write $kind rc=$? in $(($(date +%s) - t0))s" >>"$OUT/write-$kind.log"
    ) &
done
wait
tail -2 "$OUT"/write-*.log "$OUT/llbuild.log"
ARGS=(--dir "$D" --threads "${THREADS:-$(nproc)}" --reps "${REPS:-2}" --llama-reps "${LLREPS:-2}"
    --pp "${PP:-4096}" --gen "${GEN:-64}")
[ -n "${NCMOE:-}" ] && ARGS+=(--ncmoe "$NCMOE")
if [ -x /tmp/ll/build/bin/llama-bench ]; then
    ARGS+=(--llama-quantize /tmp/ll/build/bin/llama-quantize --llama-bench /tmp/ll/build/bin/llama-bench)
else
    echo "llama.cpp did not build: Strata only, quantized by llama-cpp-python if present"
fi
python3 "$R/bench/bench_hybrid.py" "${ARGS[@]}" 2>&1 | tee "$OUT/bench.log" | tail -30
echo "total $(($(date +%s) - t0))s"
