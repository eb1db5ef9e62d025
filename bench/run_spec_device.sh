#!/usr/bin/env bash
# Speculative decoding on the GPU machine in one call (about 10 s after the install): the verify
# cost curve on the GPU (every weight in VRAM) and in the hybrid mode (SLOTS expert slots in
# VRAM: 40 = 25% of the trained default's 160 experts), the edit task in the hybrid mode, and the
# edit task on the host's CPU, all on the trained default shipped in the wheel.
# Run from the repository root with Strata carried as bench/device_site.sh takes it
# (scripts/build_device_wheel → .whl/, or WHL=DIR: a wheel or core.so.xz, and the dependency
# wheels for the device's Python):
#   device tool: command "bash bench/run_spec_device.sh > $OUT/spec_device.log 2>&1",
#                carry [".whl"], timeout_s 150
set -u
R=$PWD
WHL=${WHL:-$R/.whl}
. "$R/bench/device_site.sh"
device_site "$WHL" || exit 2
M=$(python3 -c 'from strata.modelgen import shipped_model_path; print(shipped_model_path())')
B=${BENCH:-$R/bench}
nvidia-smi --query-gpu=name,memory.used --format=csv,noheader
T=${THREADS:-4}
S=${SLOTS:-40}
echo "== cost, GPU (everything in VRAM)"
timeout 60 python3 "$B/bench_spec.py" cost --model "$M" --device cuda --threads "$T" --reps 20
echo "== cost, hybrid, vram_slots $S"
timeout 60 python3 "$B/bench_spec.py" cost --model "$M" --device cuda --vram-slots "$S" --threads "$T" --reps 20
echo "== edit, hybrid, vram_slots $S"
timeout 100 python3 "$B/bench_spec.py" edit --model "$M" --device cuda --vram-slots "$S" --threads "$T" --reps 2
echo "== edit, CPU on this host ($T threads)"
timeout 60 python3 "$B/bench_spec.py" edit --model "$M" --threads "$T" --reps 2
