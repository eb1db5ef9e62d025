#!/usr/bin/env bash
# Issues 19 and 18's device benchmark: the gpt-oss-20b, GLM-4.5-Air and Qwen3.5-35B-A3B shapes
# (full width, truncated depth: gpt-oss 4 layers, GLM 1 dense + 4 MoE, Qwen3.5 3 DeltaNet + 1
# attention; SHAPES picks) in Strata's hybrid step at 25% of the expert
# bytes in VRAM vs llama.cpp's `-ngl 99 --n-cpu-moe N` (bench/bench_hybrid.py --model).
# Builds llama.cpp (CUDA) while the F16 (Qwen3.5: F32) files are written (bench/write_family_model.py) in
# parallel, quantizes them with llama-quantize (gpt-oss: MXFP4_MOE, GLM: Q4_K_M), then benches.
#   device tool: command "bash bench/run_family_hybrid_device.sh", carry [".dev/fam"]
# PHASE=prep (build, write, quantize; the files stay in /tmp while the machine is warm), then
# PHASE=bench; every step skips what is there. Knobs: B (folder with whl/ and
# llama-cuda-src.tar.xz, .dev/fam), SHAPES ("gpt-oss-20b glm-4.5-air"), REPS, PP, GEN, THREADS, NCMOE
# (-ncmoe list; default equal VRAM ±1), UBATCH (llama-bench -ub list), PCIE_FRAC (Strata's
# pcie_frac list), STRATA_ARGS (more bench_hybrid.py flags), PEER= (empty: no llama.cpp runs).
set -u
R=$PWD
B=${B:-$R/.dev/fam}
OUT=${OUT:-/tmp/fam-out}
PHASE=${PHASE:-all}
mkdir -p "$OUT"
. "$R/bench/device_site.sh"
device_site "$B" || exit 2
D=/tmp/bm-fam
LL=/tmp/ll/build/bin
mkdir -p "$D"
t0=$(date +%s)
declare -A LAYERS=([gpt-oss-20b]=4 [glm-4.5-air]=5 [qwen35moe-35b-a3b]=4)
declare -A TYPE=([gpt-oss-20b]=MXFP4_MOE [glm-4.5-air]=Q4_K_M [qwen35moe-35b-a3b]=Q4_K_M)
# GLM's router balanced (--balanced): at the writer's default (decisive, for greedy
# comparisons) the sigmoid saturates and the random selection bias routes nearly every token
# to the same experts (a 95% VRAM hit rate at 25% of the experts: a skew no real model has)
declare -A EXTRA=([gpt-oss-20b]="" [glm-4.5-air]="--balanced" [qwen35moe-35b-a3b]="")
SHAPES=${SHAPES:-gpt-oss-20b glm-4.5-air}
PEER=${PEER-1} # empty: Strata only (no llama-bench runs)
if [ "$PHASE" != bench ]; then
    if [ ! -x "$LL/llama-bench" ]; then
        (
            bash "$R/bench/build_llama_cuda.sh" "$B/llama-cuda-src.tar.xz" /tmp/ll >"$OUT/llbuild.log" 2>&1
            echo "llbuild rc=$? in $(($(date +%s) - t0))s" >>"$OUT/llbuild.log"
        ) &
    fi
    for s in $SHAPES; do
        src=$D/$s-src.gguf
        [ -f "$src" ] || [ -f "$D/$s-${TYPE[$s]}.gguf" ] || (
            python3 "$R/bench/write_family_model.py" "$s" "$src.part" --layers "${LAYERS[$s]}" ${EXTRA[$s]} \
                >"$OUT/write-$s.log" 2>&1 && mv "$src.part" "$src"
            echo "write $s rc=$? in $(($(date +%s) - t0))s" >>"$OUT/write-$s.log"
        ) &
    done
    wait
    tail -n 1 "$OUT"/write-*.log "$OUT/llbuild.log" 2>/dev/null
    for s in $SHAPES; do
        q=$D/$s-${TYPE[$s]}.gguf
        if [ ! -f "$q" ] && [ -x "$LL/llama-quantize" ]; then
            "$LL/llama-quantize" "$D/$s-src.gguf" "$q.part" "${TYPE[$s]}" "$(nproc)" \
                >"$OUT/quant-$s.log" 2>&1 && mv "$q.part" "$q" && rm -f "$D/$s-src.gguf"
            echo "quantize $s rc=$? in $(($(date +%s) - t0))s"
        fi
    done
    ls -la "$D"
fi
if [ "$PHASE" != prep ]; then
    for s in $SHAPES; do
        python3 "$R/bench/bench_hybrid.py" --model "$D/$s-${TYPE[$s]}.gguf" \
            ${PEER:+--llama-bench "$LL/llama-bench"} --threads "${THREADS:-$(nproc)}" \
            --reps "${REPS:-2}" --pp-reps "${PPREPS:-1}" --llama-reps "${LLREPS:-2}" \
            --pp "${PP:-4096}" --gen "${GEN:-64}" --pcie-frac="${PCIE_FRAC:--1}" \
            ${NCMOE:+--ncmoe "$NCMOE"} --llama-ubatch "${UBATCH:-512,4096}" ${STRATA_ARGS:-} \
            >"$OUT/bench-$s.log" 2>&1
        echo "bench $s rc=$? in $(($(date +%s) - t0))s"
    done
    for s in $SHAPES; do tail -n 8 "$OUT/bench-$s.log"; done
fi
echo "total $(($(date +%s) - t0))s"
