"""Strata on the GPU vs llama.cpp (CUDA) on one GGUF entirely in VRAM (issue 8).

    python bench/bench_gpu.py [--layers 12] [--dir DIR] [--llama-bench PATH/llama-bench]
    python bench/bench_gpu.py --model FILE.gguf --llama-bench PATH/llama-bench

Without `--model` it makes a Qwen3-30B-A3B-shaped GGUF at full width (hidden 2048, 128
experts, top-8, expert FF 768, 32 q / 4 kv heads of 128, vocab 151936) with `--layers`
layers of random f16 weights (strata.modelgen; `--vocab small`, the default, pads a trained
vocabulary to 151936 entries), quantized to Q4_K_M by llama.cpp's quantizer:
`--llama-quantize PATH` (the llama-quantize binary of the CUDA build), else llama-cpp-python
(`strata.modelgen.quantize`). Files are cached in `--dir`.

Strata (`Model.open(..., device="cuda")`): decode = `--gen` one-token steps after a 16-token
prompt (the captured CUDA graph replayed each step, logits copied to the host each step, as
an engine needs them), prompt processing = a fresh slot fed `--pp` tokens in chunks of
`--chunk`; wall times around `Model.forward`, medians of `--reps`. The decode bound is the
weight bytes read per token (non-expert matrices + top-k/experts of each expert tensor + the
output head + one embedding row) over the device's measured copy bandwidth (read + write
bytes of a 1 GiB device-to-device copy per second).

With `--llama-bench`, llama.cpp's llama-bench runs on the same file in the same process run
(`-ngl 99 -p PP -n GEN -r REPS -o json`, plus `--llama-args`) and the table gives the ratios.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

DECODE_PROMPT = 16


def make_model(dir_: Path, layers: int, ty: str, quantizer: str | None, vocab: str) -> Path:
    from strata.modelgen import ModelSpec, quantize, write_qwen3moe

    dir_.mkdir(parents=True, exist_ok=True)
    f16 = dir_ / f"q3moe-{layers}l-{vocab}-f16.gguf"
    out = dir_ / f"q3moe-{layers}l-{vocab}-{ty}.gguf"
    if out.exists():
        return out
    if not f16.exists():
        print(f"writing {f16} ...", file=sys.stderr, flush=True)
        # "small": a trained vocabulary padded to Qwen3's 151936 entries (same shapes and
        # speed; needs no Qwen tokenizer files, which the GPU machine lacks)
        spec = ModelSpec.qwen3_30b_a3b(layers=layers, vocab=vocab, n_vocab=151936)
        write_qwen3moe(f16, spec, dtype="f16")
    print(f"quantizing {out} ...", file=sys.stderr, flush=True)
    if quantizer:
        tmp = out.with_suffix(".part")
        subprocess.run([quantizer, str(f16), str(tmp), ty], check=True)
        tmp.rename(out)
    else:
        quantize(f16, out, ty)
    return out


def bytes_per_token(path: Path) -> tuple[float, str]:
    """Weight bytes read per decoded token, and the file's dominant expert type."""
    from strata.gguf import GGUFFile

    with GGUFFile(path) as g:
        arch = g.metadata["general.architecture"]
        n_exp = int(g.metadata[f"{arch}.expert_count"])
        k = int(g.metadata[f"{arch}.expert_used_count"])
        tied = "output.weight" not in g.tensors
        total = 0.0
        exp_types: list[str] = []
        for t in g.tensors.values():
            if t.name == "token_embd.weight":
                total += t.nbytes if tied else t.nbytes / t.shape[0]  # one row (or the head)
            elif "_exps" in t.name:
                total += t.nbytes * k / n_exp
                if t.name.endswith(".weight"):  # not gpt-oss's F32 expert biases
                    exp_types.append(t.type)
            else:
                total += t.nbytes
    return total, max(set(exp_types), key=exp_types.count) if exp_types else "?"


class StrataGpu:
    def __init__(self, path: Path, n_ctx: int, chunk: int) -> None:
        from strata._core import Model

        self.m = Model.open(path, n_ctx=n_ctx, n_slots=1, prefill_chunk=chunk, device="cuda")

    def prefill(self, ids: list[int]) -> float:
        self.m.free(0)
        t = time.perf_counter()
        self.m.forward(0, ids, logits="last")
        return len(ids) / (time.perf_counter() - t)

    def decode(self, prompt: list[int], toks: list[int]) -> float:
        self.m.free(0)
        self.m.forward(0, prompt, logits="last")
        t = time.perf_counter()
        for tok in toks:
            self.m.forward(0, [tok], logits="last")
        return len(toks) / (time.perf_counter() - t)


def llama_bench(
    exe: str, path: Path, pps: list[int], gen: int, reps: int, extra: str
) -> dict[str, float]:
    """llama-bench's mean tok/s per test name (pp512, tg128, ...)."""
    cmd = [exe, "-m", str(path), "-ngl", "99", "-p", ",".join(map(str, pps)), "-n", str(gen)]
    cmd += ["-r", str(reps), "-o", "json", *shlex.split(extra)]
    print("running " + " ".join(cmd), file=sys.stderr, flush=True)
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    res: dict[str, float] = {}
    for rec in json.loads(out):
        name = f"pp{rec['n_prompt']}" if rec["n_gen"] == 0 else f"tg{rec['n_gen']}"
        res[name] = float(rec["avg_ts"])
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=Path, help="a qwen3moe GGUF to use instead of making one")
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--type", default="Q4_K_M")
    ap.add_argument("--dir", type=Path, default=Path("/work/bench-models"))
    ap.add_argument("--vocab", default="small", choices=("small", "qwen3"))
    ap.add_argument("--llama-quantize", help="llama-quantize binary used to make the file")
    ap.add_argument("--make-only", action="store_true", help="make the file, print its path")
    ap.add_argument("--llama-bench", help="llama-bench binary (CUDA build) to compare with")
    ap.add_argument("--llama-args", default="", help="extra llama-bench arguments")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--pp", default="512,4096", help="prompt lengths")
    ap.add_argument("--gen", type=int, default=128, help="decoded tokens")
    ap.add_argument("--chunk", type=int, default=512, help="Strata's prefill chunk")
    a = ap.parse_args()
    pps = [int(x) for x in a.pp.split(",")]
    path = a.model or make_model(a.dir, a.layers, a.type, a.llama_quantize, a.vocab)
    if a.make_only:
        print(path)
        return

    from strata._core._testing import gpu_copy_gbps, gpu_status

    ok, why = gpu_status()
    if not ok:
        sys.exit(f"no usable GPU: {why}")
    print(f"device: {why}", file=sys.stderr)
    bpt, ety = bytes_per_token(path)
    gbps = gpu_copy_gbps(1024, 20)
    rng = np.random.default_rng(0)
    s = StrataGpu(path, n_ctx=max([*pps, DECODE_PROMPT + a.gen]) + 64, chunk=a.chunk)
    n_vocab = s.m.n_vocab
    prompts = {n: rng.integers(0, n_vocab, n).tolist() for n in pps}
    dprompt = rng.integers(0, n_vocab, DECODE_PROMPT).tolist()
    gen = rng.integers(0, n_vocab, a.gen).tolist()
    s.decode(dprompt, gen[:8])  # warm-up: graph capture, first-call setup
    s.prefill(prompts[pps[0]])
    res: dict[str, list[float]] = {}
    for r in range(a.reps):
        for n in pps:
            res.setdefault(f"pp{n}", []).append(s.prefill(prompts[n]))
        res.setdefault(f"tg{a.gen}", []).append(s.decode(dprompt, gen))
        print(
            f"  rep {r}: " + ", ".join(f"{k} {v[-1]:.1f}" for k, v in res.items()), file=sys.stderr
        )
    ll = llama_bench(a.llama_bench, path, pps, a.gen, a.reps, a.llama_args) if a.llama_bench else {}
    gbps2 = gpu_copy_gbps(1024, 20)
    bound = gbps * 1e9 / bpt
    print(f"{path.name} ({ety}): {bpt / 1e6:.0f} MB of weights read per decoded token")
    print(f"device copy bandwidth (read+write) before/after: {gbps:.0f} / {gbps2:.0f} GB/s")
    print(f"HBM decode bound: {bound:.0f} tok/s; Strata prefill chunk {a.chunk}")
    hdr = ["test", "strata tok/s", "llama.cpp tok/s", "strata/llama", "decode bound tok/s"]
    print("| " + " | ".join(hdr) + " |")
    print("|" + "---|" * len(hdr))
    for name, v in res.items():
        ours = statistics.median(v)
        theirs = ll.get(name)
        row = [
            name,
            f"{ours:.1f}",
            f"{theirs:.1f}" if theirs else "-",
            f"{ours / theirs:.2f}" if theirs else "-",
            f"{bound:.0f} ({100 * ours / bound:.0f}% of it)" if name.startswith("tg") else "",
        ]
        print("| " + " | ".join(row) + " |")
    print(f"medians of {a.reps} reps")


if __name__ == "__main__":
    main()
