"""Dot-kernel throughput per weight type, beside the machine's read bandwidth.

Builds and runs the Rust example `bench_dot` (rust/examples/bench_dot.rs), which streams a
weight matrix several times the L3 (64 MiB by default) through `dot` with one quantized
activation, at 1 thread and at all threads, and measures plain read bandwidth of a buffer
of the same size in the same run. Prints a markdown table (docs/BENCHMARKS.md).

    python bench/bench_dot.py [--seconds 0.25] [--kib 65536] [--isa auto] [--types Q4_K,Q6_K]

GB/s counts weight bytes. "wall" divides by elapsed time; "cpu" by the busiest thread's
CPU time, which stays meaningful when other processes share the cores.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run(args: argparse.Namespace) -> list[dict[str, object]]:
    cargo = ["cargo", "build", "--release", "--no-default-features", "--example", "bench_dot"]
    subprocess.run(cargo, cwd=ROOT, check=True)
    target = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
    exe = target / "release" / "examples" / "bench_dot"
    cmd = [str(exe), "--seconds", str(args.seconds), "--kib", str(args.kib), "--isa", args.isa]
    cmd += ["--threads", f"1,{os.cpu_count() or 1}"]
    if args.types:
        cmd += ["--types", args.types]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def table(rows: list[dict[str, object]]) -> str:
    machine = next(r for r in rows if r["kind"] == "machine")
    bw = {int(str(r["threads"])): r for r in rows if r["kind"] == "membw"}
    threads = sorted(bw)
    lines = [
        f"ISA `{machine['isa']}`; CPU features: {machine['features']}; "
        f"buffer {int(str(machine['buffer_kib'])) // 1024} MiB; row length n = {machine['n']}.",
        "",
        "| type | " + " | ".join(f"{t} thr GB/s wall / cpu" for t in threads) + " | SIMD |",
        "|---|" + "---|" * len(threads) + "---|",
        "| *read bandwidth* | "
        + " | ".join(f"{bw[t]['gbs']:.2f} / {bw[t]['gbs_cpu']:.2f}" for t in threads)
        + " | |",
    ]
    dots: dict[str, dict[int, dict[str, object]]] = {}
    for r in rows:
        if r["kind"] == "dot":
            dots.setdefault(str(r["type"]), {})[int(str(r["threads"]))] = r
    for ty, by_t in dots.items():
        cells = [f"{by_t[t]['gbs']:.2f} / {by_t[t]['gbs_cpu']:.2f}" for t in threads]
        native = next(iter(by_t.values()))["native"]
        lines.append(f"| {ty} | " + " | ".join(cells) + f" | {'yes' if native else 'scalar'} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--seconds", type=float, default=0.25, help="time per measurement")
    p.add_argument("--kib", type=int, default=64 << 10, help="weight / bandwidth buffer size")
    p.add_argument("--isa", default="auto", help="auto, scalar, avx2 or avx512")
    p.add_argument("--types", default="", help="comma-separated weight types (default: all)")
    args = p.parse_args()
    rows = run(args)
    print(table(rows))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
