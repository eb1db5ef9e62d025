#!/usr/bin/env bash
# The hybrid rows' llama.cpp peers on the GPU machine, in two calls on one warm machine:
#   PHASE=prep   llama.cpp (CUDA, sm_90: llama-server, llama-bench) builds from the carried
#                sdist tree while the two issue-9-shaped models (Qwen3-30B-A3B width, LAYERS
#                layers, uniform and Zipf-biased router, Q8_0 by our writer) are written; then
#                issue 16's trained row: bench/bench_hybrid.py on the shipped default with the
#                held-out statistics.py text, the adaptive tier on and off, against
#                `llama-bench -ngl 99 -ncmoe N` at equal VRAM ±1 layer.
#   PHASE=serve  issue 15's served hybrid rows: bench/bench_serve_hybrid.py on each model,
#                Strata's server at 25% of the experts in VRAM vs `llama-server -ngl 99
#                --n-cpu-moe N -np S`, 1/4/8 streams over HTTP.
# Everything is skipped when already there (the build and the models stay in /tmp while the
# machine is warm). Carried ($B, default .dev/lead): whl/ (scripts/build_device_wheel's Strata
# wheel, the shipped models stripped, and the dependency wheels) and llama-src.tar.xz (the
# llama-cpp-python 0.3.36 sdist's vendor/llama.cpp). Results under $OUT.
set -u
R=$PWD
B=${B:-$R/.dev/lead}
OUT=${OUT:-/tmp/peer-out}
PHASE=${PHASE:-prep}
LAYERS=${LAYERS:-12}
D=/tmp/bm-peer
LL=/tmp/llp
mkdir -p "$OUT" "$D"
t0=$(date +%s)
. "$R/bench/device_site.sh"
device_site "$B" || exit 2
DEFAULT=$R/python/strata/models/strata-default-qwen3moe-q8_0.gguf
STDLIB=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["stdlib"])')
if [ "$PHASE" = prep ]; then
    if [ ! -x "$LL/build/bin/llama-server" ]; then
        (
            mkdir -p "$LL" && tar xJf "$B/llama-src.tar.xz" -C "$LL" &&
                cmake -S "$LL/llama.cpp" -B "$LL/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
                    -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_NATIVE=ON \
                    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_OPENSSL=OFF \
                    -DLLAMA_CURL=OFF &&
                cmake --build "$LL/build" -j"$(nproc)" --target llama-server llama-bench
            echo "llama build rc=$? after $(($(date +%s) - t0)) s"
        ) >"$OUT/llbuild.log" 2>&1 &
    fi
    for kind in uniform zipf; do
        (
            nice -n 10 python3 "$R/bench/write_q8_model.py" "$D" "$LAYERS" "$kind"
            echo "write $kind rc=$? after $(($(date +%s) - t0)) s"
        ) >"$OUT/write-$kind.log" 2>&1 &
    done
    wait
    tail -n 1 "$OUT"/llbuild.log "$OUT"/write-*.log
    lscpu | grep -E 'Model name|^CPU\(s\)' | tee "$OUT/cpu.txt"
    [ "${SKIP_TRAINED:-0}" = 1 ] && { echo "phase prep: $(($(date +%s) - t0)) s"; exit 0; }
    H=(python3 "$R/bench/bench_hybrid.py" --model "$DEFAULT" --text "$STDLIB/statistics.py"
        --pp 512 --gen 128 --reps 3 --threads "$(nproc)" --stream-chunk 0 --pcie-frac 0)
    "${H[@]}" --adapt-every 16 --llama-bench "$LL/build/bin/llama-bench" --llama-ubatch 512 \
        --ncmoe 3,4,5 --llama-reps 3 2>&1 | tee "$OUT/trained-on.txt" | tail -n 14
    "${H[@]}" --adapt-every 0 2>&1 | tee "$OUT/trained-off.txt" | tail -n 5
else
    for kind in ${MODELS:-uniform zipf}; do
        m="$D/q3moe-${LAYERS}l-$kind-Q8_0.gguf"
        python3 "$R/bench/bench_serve_hybrid.py" --model "$m" --layers "$LAYERS" \
            --llama-server "$LL/build/bin/llama-server" --streams "${STREAMS:-1,4,8}" \
            --threads "$(nproc)" --gen 128 --reps "${REPS:-3}" 2>&1 | tee "$OUT/serve-$kind.txt"
    done
    tail -n 20 /tmp/bench_serve_*.log >"$OUT/server_logs.txt" 2>/dev/null
fi
echo "phase $PHASE: $(($(date +%s) - t0)) s"
