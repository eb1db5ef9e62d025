#!/usr/bin/env bash
# Issue 15 on the GPU machine in one call: the batched step's device tests (item 2) and the
# hybrid aggregate-decode rows (item 7: 25% of the experts in VRAM, 1/4/8 streams).
#   1. llama.cpp's llama-server and llama-bench (CUDA, sm_90) build in the background from a
#      carried source tarball (LLAMA_SRC; as bench/build_llama_cuda.sh says), timed, at low
#      priority; it is stopped if it has not finished by LLAMA_DEADLINE seconds
#   2. the two issue-9-shaped models (Qwen3-30B-A3B width, LAYERS layers, uniform and
#      Zipf-biased router) are written as Q8_0 by our writer (gguf-py's Q8_0), in parallel
#   3. pytest: TESTS (the batched step's device tests first)
#   4. bench/bench_batch.py on each model: forward_batch vs one forward per sequence, hybrid at
#      25% of the experts in VRAM (run after the build has finished or stopped)
# Run from the repository root with, in $B (the carried folder, default .dev/gpubatch): Strata
# as bench/device_site.sh takes it (core.so.xz of `STRATA_DEVICE_SO=1 scripts/build_device_wheel`,
# or a wheel; an older call's site.tar.xz, the package unpacked, is unpacked first), whl/ (the
# dependency wheels), gpu-models/ (the quantized test models; the F32 one is written here),
# tests/, bench/ and llama-src.tar.xz. Results under $OUT.
set -u
R=$PWD
B=${B:-$R/.dev/gpubatch}
OUT=${OUT:-/tmp/batch-out}
LAYERS=${LAYERS:-12}
D=/tmp/bm-batch
LL=/tmp/llb
mkdir -p "$OUT" "$D"
t0=$(date +%s)
. "$R/bench/device_site.sh"
device_site "$B" || exit 2
LLAMA_SRC=${LLAMA_SRC:-$B/llama-src.tar.xz}
llpid=
if [ -f "$LLAMA_SRC" ] && [ ! -x "$LL/build/bin/llama-server" ]; then
    # its own process group (setsid), so it can be stopped whole
    setsid bash -c '
        t0=$(date +%s); LL=$1
        mkdir -p "$LL" && tar xJf "$2" -C "$LL" &&
            nice -n 19 cmake -S "$LL/llama.cpp" -B "$LL/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
                -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_NATIVE=ON -DLLAMA_BUILD_TESTS=OFF \
                -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF &&
            nice -n 19 cmake --build "$LL/build" -j"$(nproc)" --target llama-server llama-bench
        echo "llama build rc=$? after $(($(date +%s) - t0)) s"
    ' _ "$LL" "$LLAMA_SRC" >"$OUT/llbuild.log" 2>&1 &
    llpid=$!
fi
writers=()
for kind in uniform zipf; do
    (
        python3 "$R/bench/write_q8_model.py" "$D" "$LAYERS" "$kind"
        echo "write $kind rc=$? after $(($(date +%s) - t0)) s"
    ) >"$OUT/write-$kind.log" 2>&1 &
    writers+=($!)
done
export STRATA_GPU_MODELS=$B/gpu-models
# the F32 test model, written by our writer (the quantized ones came from llama.cpp, here)
(cd "$B/tests" && python3 -c "
import os, shutil
from models import TestModels
from test_gpu_model import SPEC
shutil.copyfile(TestModels.default_cache(SPEC).f32(),
                os.path.join(os.environ['STRATA_GPU_MODELS'], f'{SPEC.key()}-F32.gguf'))
")
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv | tee "$OUT/status.txt"
TESTS=${TESTS:-"$B/tests/test_batch_gpu.py $B/tests/test_gpu_model.py $B/tests/test_gpu_hybrid.py"}
# shellcheck disable=SC2086
timeout "${TEST_TIMEOUT:-300}" python3 -m pytest -m gpu -v -rs -s -p no:cacheprovider $TESTS \
    >"$OUT/pytest.log" 2>&1
echo "pytest rc=$? after $(($(date +%s) - t0)) s" | tee -a "$OUT/pytest.log"
grep -E "passed|failed|bitwise" "$OUT/pytest.log" | tail -n 8
wait "${writers[@]}"
tail -n 1 "$OUT"/write-*.log
if [ -n "$llpid" ]; then
    while kill -0 "$llpid" 2>/dev/null && [ $(($(date +%s) - t0)) -lt "${LLAMA_DEADLINE:-330}" ]; do
        sleep 2
    done
    if kill -0 "$llpid" 2>/dev/null; then
        echo "llama build not finished after $(($(date +%s) - t0)) s: stopped" | tee -a "$OUT/llbuild.log"
        kill -- -"$llpid"
    fi
    grep -E "rc=|stopped|\[[0-9]+/[0-9]+\]" "$OUT/llbuild.log" | tail -n 2
fi
for kind in uniform zipf; do
    f="$D/q3moe-${LAYERS}l-$kind-Q8_0.gguf"
    [ -f "$f" ] || continue
    echo "== $kind"
    python3 "$B/bench/bench_batch.py" --model "$f" --device cuda --vram-share 0.25 \
        --threads "$(nproc)" --streams 1,4,8 --steps "${STEPS:-32}" --reps "${REPS:-3}" 2>&1 |
        tee "$OUT/bench-$kind.log"
done
# 5. served, when llama-server built: Strata's server vs llama-server --n-cpu-moe at equal VRAM
if [ -x "$LL/build/bin/llama-server" ] && [ $(($(date +%s) - t0)) -lt "${SERVE_BY:-420}" ]; then
    timeout "${SERVE_TIMEOUT:-170}" python3 "$B/bench/bench_serve_hybrid.py" --model "$D/q3moe-${LAYERS}l-uniform-Q8_0.gguf" \
        --llama-server "$LL/build/bin/llama-server" --layers "$LAYERS" --streams 1,4,8 \
        --gen "${GEN:-64}" --reps 2 2>&1 | tee "$OUT/serve-uniform.log"
fi
# 6. issue 16 item 5: the trained default at 25% of its experts in VRAM, tokens from a
# held-out stdlib module; the adaptive tier on (16) and off (0); llama-bench at equal VRAM
DEF=$R/python/strata/models/strata-default-qwen3moe-q8_0.gguf
TXT=$(python3 -c "import sysconfig; print(sysconfig.get_paths()['stdlib'])")/statistics.py
if [ -f "$DEF" ] && [ $(($(date +%s) - t0)) -lt "${DEFAULT_BY:-500}" ]; then
    LLB=()
    [ -x "$LL/build/bin/llama-bench" ] && LLB=(--llama-bench "$LL/build/bin/llama-bench")
    for every in 16 0; do
        timeout "${DEFAULT_TIMEOUT:-80}" python3 "$B/bench/bench_hybrid.py" --model "$DEF" --text "$TXT" --pp 512 --gen 128 \
            --reps 3 --llama-reps 3 --threads "$(nproc)" --stream-chunk 0 --llama-ubatch 512 \
            --pcie-frac 0 --adapt-every "$every" "${LLB[@]}" >"$OUT/default-adapt$every.log" 2>&1
        LLB=()
        tail -n 4 "$OUT/default-adapt$every.log"
    done
fi
echo "total $(($(date +%s) - t0)) s"
tail -n 5 "$OUT"/bench-*.log "$OUT"/serve-*.log 2>/dev/null
