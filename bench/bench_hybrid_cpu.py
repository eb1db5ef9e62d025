"""Strata vs llama.cpp on a hybrid (qwen35moe) GGUF on the CPU: prefill and decode (issue 18).

    python bench/bench_hybrid_cpu.py [--model FILE.gguf] [--threads 2] [--reps 5]

Without `--model` it writes a qwen35moe file with the test writer (tests/qwen3moe_file.py, the
converter's layout): hidden 1024, 8 layers (Gated DeltaNet in 0-2 and 4-6 with Nk = 4, Nv = 8,
S = 128; gated attention in 3 and 7, 8 q / 2 kv heads of 128, 32 dims rotated), 32 experts
top-8 of width 256 and a shared expert of 256, vocabulary 8192, random F32 weights, and
quantizes it Q4_K_M with llama.cpp's quantizer; cached in `--dir` (default
/work/bench-models). Not Qwen3.5-35B-A3B's width: a small stand-in for the DeltaNet layers'
share of a step.

Each repetition runs llama.cpp (llama-cpp-python, n_threads = n_threads_batch = threads) then
Strata (threads in all) on the same file: a 256-token prompt as one batch, then 64 tokens
decoded one at a time (fixed ids, no sampling). Wall times around each call; medians.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def make_model(dir_: Path) -> Path:
    sys.path.insert(0, str(ROOT / "tests"))
    import qwen3moe_file as qf

    out = dir_ / "qwen35moe-h1024-8l-Q4_K_M.gguf"
    if out.exists():
        return out
    dir_.mkdir(parents=True, exist_ok=True)
    s = qf.Shape(
        n_layer=8, n_embd=1024, n_head=8, n_head_kv=2, head_dim=128, n_expert=32,
        n_expert_used=8, n_ff_exp=256, n_vocab=8192, rope_base=1e7, arch="qwen35moe",
        n_ff_shexp=256, n_rot=32, attn_every=4, ssm_conv=4, ssm_state=128, ssm_groups=4,
        ssm_v_heads=8, mrope=(6, 5, 5),
    )  # fmt: skip
    f32 = qf.write(dir_ / "qwen35moe-h1024-8l-F32.gguf", s, qf.random_tensors(s, 11))
    qf.quantize(f32, out, "Q4_K_M")
    f32.unlink()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path)
    ap.add_argument("--dir", type=Path, default=Path("/work/bench-models"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args()
    import llama_cpp
    from strata._core import Model

    path = str(a.model or make_model(a.dir))
    rng = np.random.default_rng(0)
    prompt = [int(t) for t in rng.integers(0, 8000, 256)]
    gen = [int(t) for t in rng.integers(0, 8000, 64)]
    ll = llama_cpp.Llama(
        path, n_ctx=512, n_batch=512, n_ubatch=512, n_threads=a.threads,
        n_threads_batch=a.threads, verbose=False,
    )  # fmt: skip
    m = Model.open(path, n_ctx=512, n_slots=1, kv_type="f16", prefill_chunk=512, threads=a.threads)
    res: dict[str, list[float]] = {"ll_pp": [], "ll_tg": [], "st_pp": [], "st_tg": []}
    for _ in range(a.reps):
        ll.reset()
        t0 = time.perf_counter()
        ll.eval(prompt)
        res["ll_pp"].append(len(prompt) / (time.perf_counter() - t0))
        t0 = time.perf_counter()
        for t in gen:
            ll.eval([t])
        res["ll_tg"].append(len(gen) / (time.perf_counter() - t0))
        m.free(0)
        t0 = time.perf_counter()
        m.forward(0, prompt, logits="last")
        res["st_pp"].append(len(prompt) / (time.perf_counter() - t0))
        t0 = time.perf_counter()
        for t in gen:
            m.forward(0, [t])
        res["st_tg"].append(len(gen) / (time.perf_counter() - t0))
    med = {k: statistics.median(v) for k, v in res.items()}
    print(f"{path}, {a.threads} threads, medians of {a.reps}")
    print("| test | llama.cpp tok/s | Strata tok/s | Strata / llama.cpp |")
    print("|---|---|---|---|")
    for name, k in ((f"pp{len(prompt)}", "pp"), (f"tg{len(gen)}", "tg")):
        st, ll_ = med[f"st_{k}"], med[f"ll_{k}"]
        print(f"| {name} | {ll_:.1f} | {st:.1f} | **{st / ll_:.2f}** |")


if __name__ == "__main__":
    main()
