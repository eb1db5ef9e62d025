#!/usr/bin/env bash
# Per-kernel decode profile on the GPU machine: Strata vs llama.cpp (CUDA), one 4-layer
# Qwen3-30B-A3B-width Q4_K_M file, each decode kernel timed by Nsight Compute (ncu), which
# serializes kernels and flushes caches between them (so small kernels read a little slow; the
# comparison is like for like). Prints both tables (bench/ncu_table.py) and the plain decode
# speed of each (no profiler).
# Usage, from the repository root on the device, with the Strata wheel installed and the
# llama.cpp source tarball of bench/build_llama_cuda.sh:
#   bench/profile_gpu_decode.sh LLAMA_TARBALL [WORK_DIR]      (~5 minutes on 16 cores)
set -euo pipefail
tarball="$1"
work="${2:-/tmp/strata-prof}"
root="$(cd "$(dirname "$0")/.." && pwd)"
mkdir -p "$work/models"
( bash "$root/bench/build_llama_cuda.sh" "$tarball" "$work/llama" > "$work/llbuild.log" 2>&1 ) &
build=$!
python3 - "$work/models/m4-f16.gguf" <<'PY'
import sys
from pathlib import Path
from strata.modelgen import ModelSpec, write_qwen3moe
spec = ModelSpec.qwen3_30b_a3b(layers=4, vocab="small", n_vocab=151936)
write_qwen3moe(Path(sys.argv[1]), spec, dtype="f16")
PY
wait "$build" || { tail -20 "$work/llbuild.log"; exit 1; }
bin="$work/llama/build/bin"
model="$work/models/m4-q4km.gguf"
"$bin/llama-quantize" "$work/models/m4-f16.gguf" "$model" Q4_K_M > "$work/quant.log" 2>&1
cat > "$work/decode.py" <<'PY'
import sys, time
from strata._core import Model
m = Model.open(sys.argv[1], n_ctx=512, n_slots=1, prefill_chunk=512, device="cuda")
n = int(sys.argv[2])
m.forward(0, [1], logits="last")
for i in range(3):  # warm-up: graph capture
    m.forward(0, [5 + i], logits="last")
t = time.perf_counter()
for i in range(n):
    m.forward(0, [100 + i], logits="last")
dt = time.perf_counter() - t
print(f"strata decode {n / dt:.1f} tok/s ({dt / n * 1e6:.0f} us/token)")
PY
python3 "$work/decode.py" "$model" 200
"$bin/llama-bench" -m "$model" -ngl 99 -p 0 -n 128 -r 3 2>/dev/null | grep tg128
ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
prof=(--clock-control none --metrics gpu__time_duration.sum --csv)
"$ncu" "${prof[@]}" python3 "$work/decode.py" "$model" 4 > "$work/ncu_strata.csv"
"$ncu" "${prof[@]}" "$bin/llama-bench" -m "$model" -ngl 99 -p 0 -n 4 -r 1 > "$work/ncu_llama.csv"
python3 "$root/bench/ncu_table.py" "$work/ncu_strata.csv" "$work/ncu_llama.csv"
