"""The RAM tier on a multi-layer model: cold start, fill throughput, decode per RAM mode with
and without read-ahead.

    python bench/bench_tier.py [--model M.gguf] [--parts a,b,c] [--tokens 16] [--reps 2]

Default model: /work/bench-models/q3moe-6l-Q4_K_M.gguf (random weights at Qwen3-30B-A3B
width, 6 layers). Parts:

a. Cold start to first token: the file evicted (posix_fadvise DONTNEED, with no map of it
   alive in this process), then a child process times `LLM(path)` + the prefill of an 8-token
   prompt. Once straight from cold, once after `strata-fill warm --model M` (its own wall time,
   process start included, is reported apart). Repeated `--reps` times, alternating.
b. Fill throughput: `strata-fill warm`'s work (prefault through the map, `--fill-threads`
   threads) vs one thread reading the same expert bytes with 8 MiB read() calls, each from the
   evicted state, in pairs (bench_fill.py's trials).
c. Decode tok/s. `mmap` with a warm page cache (read-ahead off and on), then `budget` with
   25%, 50% and 100% of the expert bytes resident. Budget protocol: after the fill, the
   mapped (non-resident) experts' pages are dropped from the map and the page cache
   (`ExpertTier.evict()`: MADV_DONTNEED + posix_fadvise DONTNEED on their ranges), then
   - `cold once`: `--tokens` greedy tokens are timed after that one eviction (later tokens
     find the experts earlier ones read);
   - `cold each`: the eviction is repeated before every token (untimed), as on a machine
     whose RAM cannot keep the mapped experts: every mapped expert comes from the disk.
   Read-ahead off and on alternate on the same model (`Model.set_readahead`), `--reps` times;
   the best rep is shown. All runs must give the same greedy tokens.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from bench_fill import cold, expert_ranges, sequential_read, tier_fill
from strata._core import ExpertTier, evict_page_cache
from strata.llm import LLM

GIB = float(1 << 30)
PROMPT = [11, 22, 33, 44, 55, 66, 77, 88]
DEFAULT_MODEL = "/work/bench-models/q3moe-6l-Q4_K_M.gguf"


def load() -> str:
    return f"{os.getloadavg()[0]:.1f}"


# ---- a: cold start -------------------------------------------------------------------------

CHILD = """
import json, sys, time
t0 = time.perf_counter()
from strata.llm import LLM
t1, c1 = time.perf_counter(), time.process_time()
llm = LLM(sys.argv[1], n_ctx=64, parallel=1, threads=int(sys.argv[2]))
t2 = time.perf_counter()
logits = llm.forward_batch([(0, json.loads(sys.argv[3]), "last")])[0]
t3, c3 = time.perf_counter(), time.process_time()
out = {"import_s": t1 - t0, "load_s": t2 - t1, "first_token_s": t3 - t1, "cpu_s": c3 - c1}
print(json.dumps({**out, "token": int(logits.argmax())}))
"""


def evict_all(path: Path) -> float:
    """Evict the whole file; the fraction of its expert bytes still cached."""
    gc.collect()
    evict_page_cache(path)
    t = ExpertTier(path)
    frac = t.page_cache_fraction()
    del t
    gc.collect()
    return frac


def child_first_token(path: Path, threads: int) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(path), str(threads), json.dumps(PROMPT)],
        check=True,
        capture_output=True,
        text=True,
    )
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def split(r: dict[str, Any]) -> str:
    t, load_s = r["first_token_s"], r["load_s"]
    return f"{t:.2f} s ({load_s:.2f} + {t - load_s:.2f}; CPU {r['cpu_s']:.2f} s)"


def part_a(path: Path, threads: int, reps: int) -> None:
    print(f"\n## a. cold start to first token (load {load()})")
    print(
        "| rep | cached before | without warm (load + prefill; CPU) | warm (strata-fill warm) "
        "| after warm (load + prefill; CPU) | ratio |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    tokens = set()
    for r in range(reps):
        f0 = evict_all(path)
        a = child_first_token(path, threads)
        f1 = evict_all(path)
        t = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "strata.cli.fill", "warm", "--model", str(path)],
            check=True,
            capture_output=True,
        )
        warm_s = time.perf_counter() - t
        b = child_first_token(path, threads)
        tokens |= {a["token"], b["token"]}
        ratio = b["first_token_s"] / a["first_token_s"]
        print(
            f"| {r + 1} | {100 * max(f0, f1):.1f}% | {split(a)} | {warm_s:.2f} s "
            f"| {split(b)} | {ratio:.2f}x |",
            flush=True,
        )
    assert len(tokens) == 1, f"first tokens differ: {tokens}"


# ---- b: fill throughput --------------------------------------------------------------------


def part_b(path: Path, fill_threads: list[int], reps: int) -> None:
    ranges = expert_ranges(path)
    total = sum(nb for _, nb in ranges)
    print(f"\n## b. fill vs sequential read of {total / GIB:.2f} GiB of experts (load {load()})")
    print("| threads | pair | cached before | sequential read GiB/s | warm GiB/s | ratio |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: |")
    for n in fill_threads:
        for r in range(reps):
            f0 = cold(path)
            done, secs = sequential_read(path, ranges)
            base = done / GIB / secs
            f1 = cold(path)
            done, secs = tier_fill(path, "mmap", n)
            assert done == total, (done, total)
            gbs = done / GIB / secs
            print(
                f"| {n} | {r + 1} | {100 * max(f0, f1):.1f}% | {base:.2f} | {gbs:.2f} "
                f"| {gbs / base:.2f}x |",
                flush=True,
            )


# ---- c: decode -----------------------------------------------------------------------------


def decode(llm: LLM, n: int, evict_each: bool) -> tuple[float, list[int], float]:
    """Greedy decode of `n` tokens after PROMPT: seconds spent in decode calls only, the
    tokens, and the largest fraction of expert bytes cached right after an eviction."""
    llm.free(0)
    logits = llm.forward_batch([(0, PROMPT, "last")])[0]
    cached = 0.0

    def evict() -> None:
        nonlocal cached
        llm.tier.evict(all=True)  # the resident experts' file pages too: they are not read
        cached = max(cached, llm.tier.page_cache_fraction())

    if not evict_each:
        evict()
    toks: list[int] = []
    secs = 0.0
    for _ in range(n):
        tok = int(logits.argmax())
        toks.append(tok)
        if evict_each:
            evict()
        t = time.perf_counter()
        logits = llm.forward_batch([(0, [tok], "last")])[0]
        secs += time.perf_counter() - t
    return secs, toks, cached


def part_c(path: Path, threads: int, ra_threads: int, extras: list[int], n: int, reps: int) -> None:
    gib = ExpertTier(path).total_bytes / GIB
    # Read-ahead settings: off, then on with each number of extra guesses per token.
    settings = [(0, 0)] + [(ra_threads, x) for x in extras]
    names = ["off"] + [f"on +{x}" if x else "on" for x in extras]
    print(f"\n## c. decode tok/s, {n} tokens, {threads} pool threads (load {load()})")
    print(
        f"| mode | experts resident | protocol | {' | '.join(names)} tok/s "
        f"| hit / late / miss ({' ; '.join(names[1:])}) | loads |"
    )
    print("| --- | ---: | --- |" + " ---: |" * len(names) + " --- | --- |")
    ref: list[int] | None = None
    configs: list[tuple[str, float, tuple[bool, ...]]] = [
        ("mmap", 0.0, (False,)),
        ("budget", 0.25, (False, True)),
        ("budget", 0.5, (False, True)),
        ("budget", 1.0, (False,)),
    ]
    for mode, frac, protocols in configs:
        # 100%: the record alignment needs a little more than the raw bytes.
        budget = frac * gib * (1.002 if frac == 1.0 else 1.0)
        llm = LLM(
            path,
            n_ctx=256,
            parallel=1,
            threads=threads,
            ram_mode=mode,
            ram_budget_gib=round(budget, 4) if mode == "budget" else 0.0,
            readahead="off",
        )
        if llm.fill is not None:
            assert llm.fill.wait()
        else:
            assert llm.tier.fill(threads=4).wait()  # mmap: a warm page cache
        n_res, b_res = llm.tier.resident()
        share = b_res / llm.tier.total_bytes
        for evict_each in protocols:
            proto = "warm" if mode == "mmap" else ("cold each" if evict_each else "cold once")
            best = [0.0] * len(settings)
            hlm = [""] * len(settings)
            loads = []
            # Cold protocols: the most expert bytes cached after an eviction (should be ~0);
            # warm: the least cached during the run (should be 100%).
            worst = 0.0 if mode != "mmap" else 1.0
            for _ in range(reps):
                for i, (ra, extra) in enumerate(settings):
                    llm.model.set_readahead(ra, extra)
                    loads.append(load())
                    if mode == "mmap":
                        secs, toks = _warm_decode(llm, n)
                        cached = llm.tier.page_cache_fraction()
                    else:
                        secs, toks, cached = decode(llm, n, evict_each)
                    worst = max(worst, cached) if mode != "mmap" else min(worst, cached)
                    if ref is None:
                        ref = toks
                    assert toks == ref, f"{mode} {frac} read-ahead {ra}+{extra}: tokens differ"
                    best[i] = max(best[i], n / secs)
                    st = llm.model.readahead_stats()
                    if st:
                        hlm[i] = f"{st['hits']}/{st['late']}/{st['misses']}"
            llm.model.set_readahead(0)
            print(
                f"| {mode} | {100 * share:.0f}% ({n_res}) | {proto} ({100 * worst:.1f}% cached) | "
                + " | ".join(f"{b:.2f}" for b in best)
                + f" | {' ; '.join(hlm[1:])} | {', '.join(loads)} |",
                flush=True,
            )
        del llm
        gc.collect()


def _warm_decode(llm: LLM, n: int) -> tuple[float, list[int]]:
    llm.free(0)
    logits = llm.forward_batch([(0, PROMPT, "last")])[0]
    toks: list[int] = []
    t = time.perf_counter()
    for _ in range(n):
        tok = int(logits.argmax())
        toks.append(tok)
        logits = llm.forward_batch([(0, [tok], "last")])[0]
    return time.perf_counter() - t, toks


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--parts", default="a,b,c")
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2, help="pool threads")
    ap.add_argument("--readahead-threads", type=int, default=2)
    ap.add_argument(
        "--readahead-extra", default="0", help="part c: extra guesses per token to try (list)"
    )
    ap.add_argument("--fill-threads", default="4", help="part b: fill thread counts")
    ap.add_argument("--reps", type=int, default=2)
    a = ap.parse_args()
    path = Path(a.model)
    ranges = expert_ranges(path)
    print(
        f"model {path.name}: {path.stat().st_size / GIB:.2f} GiB file, "
        f"{sum(nb for _, nb in ranges) / GIB:.2f} GiB of experts; load {load()}"
    )
    parts = a.parts.split(",")
    if "a" in parts:
        part_a(path, a.threads, a.reps)
    if "b" in parts:
        part_b(path, [int(x) for x in a.fill_threads.split(",")], a.reps)
    if "c" in parts:
        extras = [int(x) for x in a.readahead_extra.split(",")]
        part_c(path, a.threads, a.readahead_threads, extras, a.tokens, a.reps)


if __name__ == "__main__":
    main()
