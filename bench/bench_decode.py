"""Strata vs llama.cpp on one GGUF: prompt processing and decode, interleaved (issue 7).

    python bench/bench_decode.py [--types Q4_K_M,IQ3_S] [--layers 6] [--threads 2] [--reps 5]
    python bench/bench_decode.py --model FILE.gguf        # use this file as is
    python bench/bench_decode.py --quick                  # 1 rep, short prompts (smoke run)
    python bench/bench_decode.py --llama-bench BIN --quantize BIN   # without llama-cpp-python
    python bench/bench_decode.py --model F.gguf --llama-bench BIN --peer-args "--repack 0"
    python bench/bench_decode.py --model Q35.gguf --deltanet-chunked-ab 64  # chunked prefill A/B

Without `--model` it makes a Qwen3-30B-A3B-shaped GGUF at full width (hidden 2048, 128
experts, top-8, expert FF 768, 32 q / 4 kv heads, head dim 128, vocab 151936) with `--layers`
layers and random f16 weights, then quantizes it with llama.cpp's own quantizer; the files are
cached in `--dir` (default /work/bench-models), outside the repository.

Each repetition runs llama.cpp (llama-cpp-python, `n_threads` = `n_threads_batch` = threads)
then Strata (pool workers = threads - 1, plus the calling thread) on the same file: A B A B.
llama.cpp's times come from its own counters (`llama_perf_context`: prompt eval and eval), so
the Python wrapper's per-token work is not counted; Strata's are wall times around
`Model.forward`. Decode feeds a fixed token sequence after a 16-token prompt (no sampling).
The table gives medians, the ratio Strata ÷ llama.cpp, the bytes of weights read per decoded
token (non-expert matrices + top-k/experts of each expert tensor + the output head; the token
embedding reads one row) and the RAM read bandwidth measured in the same run at the same
thread count, whose quotient is the decode bound.

`--llama-bench BIN` (where llama-cpp-python is absent, as on the GPU machine): the peer is
llama.cpp's own `llama-bench` run once per measurement (`-r 1`, its t/s; its decode starts
from an empty context rather than after the 16-token prompt), and `--quantize BIN` makes the
quantized files with that build's `llama-quantize`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

DECODE_PROMPT = 16


def make_model(dir_: Path, layers: int, ty: str, quantizer: str | None = None) -> Path:
    from strata.modelgen import ModelSpec, write_qwen3moe

    dir_.mkdir(parents=True, exist_ok=True)
    f16 = dir_ / f"q3moe-{layers}l-f16.gguf"
    out = dir_ / f"q3moe-{layers}l-{ty}.gguf"
    if out.exists():
        return out
    if not f16.exists():
        print(f"writing {f16} ...", file=sys.stderr, flush=True)
        write_qwen3moe(f16, ModelSpec.qwen3_30b_a3b(layers=layers), dtype="f16")
    print(f"quantizing {out} ...", file=sys.stderr, flush=True)
    if quantizer:
        tmp = out.with_suffix(".part")
        subprocess.run([quantizer, str(f16), str(tmp), ty], check=True, capture_output=True)
        tmp.rename(out)
    else:
        from strata.modelgen import quantize

        quantize(f16, out, ty)
    return out


def bytes_per_token(path: Path) -> tuple[float, str]:
    """Weight bytes read per decoded token, and the file's dominant expert type."""
    from strata.gguf import GGUFFile

    with GGUFFile(path) as g:
        arch = g.metadata["general.architecture"]
        n_exp = int(g.metadata[f"{arch}.expert_count"])
        k = int(g.metadata[f"{arch}.expert_used_count"])
        total = 0.0
        exp_types: list[str] = []
        for t in g.tensors.values():
            if t.name == "token_embd.weight":
                total += t.nbytes / t.shape[0]  # one row
            elif "_exps" in t.name:
                total += t.nbytes * k / n_exp
                if t.name.endswith(".weight"):  # not gpt-oss's F32 expert biases
                    exp_types.append(t.type)
            else:
                total += t.nbytes
    return total, max(set(exp_types), key=exp_types.count) if exp_types else "?"


class LlamaCpp:
    def __init__(self, path: Path, threads: int, n_ctx: int) -> None:
        import llama_cpp

        self.lc = llama_cpp
        self.llm = llama_cpp.Llama(
            model_path=str(path),
            n_ctx=n_ctx,
            n_batch=512,
            n_ubatch=512,
            n_threads=threads,
            n_threads_batch=threads,
            verbose=False,
        )
        self.ctx = self.llm._ctx.ctx

    def _reset(self) -> None:
        self.llm.reset()
        mem = self.lc.llama_get_memory(self.ctx)
        self.lc.llama_memory_clear(mem, True)
        self.lc.llama_perf_context_reset(self.ctx)

    def _perf(self) -> Any:
        return self.lc.llama_perf_context(self.ctx)

    def prefill(self, ids: list[int]) -> float:
        self._reset()
        self.llm.eval(ids)
        self.lc.llama_synchronize(self.ctx)  # the counters are updated on synchronization
        p = self._perf()
        assert p.n_p_eval == len(ids), (p.n_p_eval, len(ids))
        return len(ids) / (p.t_p_eval_ms / 1e3)

    def decode(self, prompt: list[int], toks: list[int]) -> float:
        self._reset()
        self.llm.eval(prompt)
        self.lc.llama_synchronize(self.ctx)
        self.lc.llama_perf_context_reset(self.ctx)
        for t in toks:
            self.llm.eval([t])
            self.lc.llama_synchronize(self.ctx)  # one token per counted eval
        p = self._perf()
        assert p.n_eval == len(toks), (p.n_eval, len(toks))
        return len(toks) / (p.t_eval_ms / 1e3)


class LlamaBench:
    """llama.cpp through its `llama-bench` binary: one process per measurement, `-r 1`."""

    def __init__(self, exe: str, path: Path, threads: int, extra: list[str] | None = None) -> None:
        self.base = [exe, "-m", str(path), "-t", str(threads), "-r", "1", "-o", "json"]
        self.base += ["-b", "512", "-ub", "512", *(extra or [])]

    def _ts(self, pp: int, tg: int) -> float:
        cmd = [*self.base, "-p", str(pp), "-n", str(tg)]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        return float(json.loads(out)[0]["avg_ts"])

    def prefill(self, ids: list[int]) -> float:
        return self._ts(len(ids), 0)

    def decode(self, prompt: list[int], toks: list[int]) -> float:
        return self._ts(0, len(toks))


class Strata:
    def __init__(
        self,
        path: Path,
        threads: int,
        n_ctx: int,
        cpu_repack: bool = True,
        deltanet_chunked: int = 0,
    ) -> None:
        from strata._core import Model

        # `threads` compute threads in all, the caller among them (llama.cpp's -t); one thread:
        # the serial reference.
        self.m = Model.open(
            path,
            n_ctx=n_ctx,
            n_slots=1,
            prefill_chunk=512,
            threads=-1 if threads == 1 else threads,
            cpu_repack=cpu_repack,
        )
        if deltanet_chunked:
            self.m.set_deltanet_chunked(deltanet_chunked)

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


def run_file(
    path: Path,
    threads: int,
    reps: int,
    pps: list[int],
    n_gen: int,
    gbps: float,
    repack_ab: bool = False,
    llama_bench: str | None = None,
    chunked_ab: int = 0,
    peer: bool = True,
    peer_args: list[str] | None = None,
) -> list[list[str]]:
    rng = np.random.default_rng(0)
    bpt, ety = bytes_per_token(path)
    n_ctx = max([*pps, DECODE_PROMPT + n_gen]) + 64
    engines: dict[str, Any] = {}
    if peer:
        engines["llama.cpp"] = (
            LlamaBench(llama_bench, path, threads, peer_args)
            if llama_bench
            else LlamaCpp(path, threads, n_ctx)
        )
    engines["strata"] = Strata(path, threads, n_ctx)
    base = "llama.cpp" if peer else "strata"  # what the ratio column divides by
    if repack_ab:  # the same engine without the load-time repack (`cpu_repack`)
        engines["strata no-repack"] = Strata(path, threads, n_ctx, cpu_repack=False)
    if chunked_ab:  # the same engine with the chunked DeltaNet prefill
        engines["strata chunked"] = Strata(path, threads, n_ctx, deltanet_chunked=chunked_ab)
    n_vocab = engines["strata"].m.n_vocab
    prompts = {n: rng.integers(0, n_vocab, n).tolist() for n in pps}
    dprompt = rng.integers(0, n_vocab, DECODE_PROMPT).tolist()
    gen = rng.integers(0, n_vocab, n_gen).tolist()
    tests: list[tuple[str, Callable[[Any], float]]] = [
        (f"pp{n}", lambda e, n=n: e.prefill(prompts[n])) for n in pps
    ]
    if n_gen > 0:  # --gen 0: prompts only
        tests.append((f"tg{n_gen}", lambda e: e.decode(dprompt, gen)))
    res: dict[tuple[str, str], list[float]] = {}
    for e in engines.values():  # warm-up: page in the weights, first-call setup
        if n_gen > 0:
            e.decode(dprompt, gen[:4])
        else:
            e.prefill(dprompt)
    for r in range(reps):
        for name, f in tests:
            for ename, e in engines.items():
                v = f(e)
                res.setdefault((name, ename), []).append(v)
                print(f"  rep {r} {name} {ename}: {v:.1f} tok/s", file=sys.stderr, flush=True)
    rows = []
    for name, _ in tests:
        a = statistics.median(res[(name, base)])
        for ename in [e for e in engines if e != base]:
            b = statistics.median(res[(name, ename)])
            bound = f"{gbps * 1e9 / bpt:.1f}" if name.startswith("tg") else ""
            label = "" if ename == "strata" else f" [{ename}]"
            rows.append(
                [
                    f"{path.name} ({ety}){label}",
                    name,
                    f"{a:.1f}",
                    f"{b:.1f}",
                    f"{b / a:.2f}",
                    f"{bpt / 1e6:.0f}",
                    f"{gbps:.1f}",
                    bound,
                ]
            )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=Path, help="a GGUF (any family) to use instead of making one")
    ap.add_argument("--types", default="Q4_K_M,IQ3_S")
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--dir", type=Path, default=Path("/work/bench-models"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--pp", default="512,2048", help="prompt lengths")
    ap.add_argument("--gen", type=int, default=128, help="decoded tokens")
    ap.add_argument("--quick", action="store_true", help="1 rep, pp 64, 16 decoded tokens")
    ap.add_argument(
        "--repack-ab",
        action="store_true",
        help="also run Strata with cpu_repack off (a third engine, interleaved)",
    )
    ap.add_argument(
        "--deltanet-chunked-ab",
        type=int,
        default=0,
        metavar="N",
        help="also run Strata with the chunked DeltaNet prefill for pieces of ≥ N tokens "
        "(hybrid families; a third engine, interleaved)",
    )
    ap.add_argument("--llama-bench", help="llama.cpp's llama-bench binary as the peer")
    ap.add_argument(
        "--no-peer",
        action="store_true",
        help="no llama.cpp: the A/B engines against Strata's default (the peer columns then "
        "hold Strata's default)",
    )
    ap.add_argument(
        "--peer-args",
        default="",
        help='more llama-bench arguments, e.g. "--repack 0" (where its repacked path crashes)',
    )
    ap.add_argument("--quantize", help="llama.cpp's llama-quantize binary to make the files")
    a = ap.parse_args()
    if a.quick:
        a.reps, a.pp, a.gen = 1, "64", 16
    pps = [int(x) for x in a.pp.split(",") if x]  # --pp "": decode only
    types = a.types.split(",")
    files = [a.model] if a.model else [make_model(a.dir, a.layers, t, a.quantize) for t in types]

    from strata._core import ram_read_gbps

    gbps = ram_read_gbps(a.threads)
    print(f"RAM read bandwidth, {a.threads} threads: {gbps:.1f} GB/s", file=sys.stderr)
    rows = []
    for f in files:
        rows += run_file(
            f, a.threads, a.reps, pps, a.gen, gbps, a.repack_ab, a.llama_bench,
            a.deltanet_chunked_ab, not a.no_peer, a.peer_args.split(),
        )  # fmt: skip
    gbps2 = ram_read_gbps(a.threads)
    peer, ratio = ("llama.cpp", "strata/llama") if not a.no_peer else ("strata default", "A/B")
    hdr = [
        "file",
        "test",
        f"{peer} tok/s",
        "strata tok/s",
        ratio,
        "MB/token",
        "RAM GB/s",
        "decode bound tok/s",
    ]
    print(f"threads {a.threads}, medians of {a.reps} interleaved reps")
    print(f"RAM read GB/s before/after: {gbps:.1f} / {gbps2:.1f}")
    print("| " + " | ".join(hdr) + " |")
    print("|" + "---|" * len(hdr))
    for r in rows:
        print("| " + " | ".join(r) + " |")


if __name__ == "__main__":
    main()
