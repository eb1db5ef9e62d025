"""Aggregate decode speed of the batched step against one forward call per sequence (issue 15).

    python bench/bench_batch.py --model FILE.gguf [--streams 1,2,4,8] [--steps 32] [--threads 2]
    python bench/bench_batch.py --model FILE.gguf --device cuda --vram-share 0.25 --threads 16

For each stream count N: N slots are prefilled with distinct 16-token prompts, then `--steps`
decode steps run twice, interleaved A B A B over `--reps` repetitions: (A) one
`Model.forward_batch` call with the N one-token entries per step, (B) N `Model.forward` calls
per step. Prints the median aggregate tokens/s of each and their ratio. Both runs feed fixed
token sequences (no sampling), so the work is the same.

`--device cuda`: the GPU path; with `--vram-share S` > 0 its hybrid mode with S of all experts
in VRAM slots, filled hottest first along a profile of `--profile-tokens` random tokens routed
first (as bench/bench_hybrid.py does), the others computed by the CPU pool; the hit rate of
the measured steps is printed per stream count.
"""

from __future__ import annotations

import argparse
import statistics
import time

from strata._core import Model, Profile

PROMPT = 16


def run(m: Model, n: int, steps: int, batched: bool, base: int) -> float:
    """Seconds for `steps` decode steps of `n` sequences (slots 0..n after their prompts)."""
    for s in range(n):
        m.truncate(s, PROMPT)
    t0 = time.perf_counter()
    for i in range(steps):
        toks = [(base + 7 * s + 13 * i) % 1000 + 1 for s in range(n)]
        if batched:
            m.forward_batch([(s, [toks[s]], "last") for s in range(n)])
        else:
            for s in range(n):
                m.forward(s, [toks[s]], "last")
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", required=True)
    ap.add_argument("--streams", default="1,2,4,8")
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2, help="compute threads in all (as -t)")
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--vram-share", type=float, default=0.0, help="cuda: hybrid, experts in VRAM")
    ap.add_argument("--profile-tokens", type=int, default=512, help="hybrid: profile fill")
    a = ap.parse_args()
    streams = [int(x) for x in a.streams.split(",")]
    # threads in all, the caller among them (llama.cpp's -t), on either device
    kw: dict[str, object] = {"threads": a.threads}
    if a.device == "cuda":
        kw["device"] = "cuda"

    n_ctx = max(PROMPT + a.steps + 8, a.profile_tokens)

    def open_model(**more: object) -> Model:
        return Model.open(a.model, n_ctx=n_ctx, n_slots=max(streams), **kw, **more)

    if a.device == "cuda" and a.vram_share > 0:
        from strata.gguf import GGUFFile

        with GGUFFile(a.model) as g:
            md = g.metadata
            n_exp = int(md["qwen3moe.block_count"]) * int(md["qwen3moe.expert_count"])
        kw["vram_slots"] = round(a.vram_share * n_exp)
        probe = open_model()  # hybrid: it sees the routed ids
        # the fill order: the experts these tokens route to, hottest first
        toks = [(977 * i) % 1000 + 1 for i in range(a.profile_tokens)]
        probe.forward(0, toks, "none")
        kw["profile"] = Profile.from_counts(
            a.model, probe.routing_counts(), a.profile_tokens, "bench"
        )
        del probe
    m = open_model()
    counters = m.hybrid_counters() if a.device == "cuda" else None
    for s in range(max(streams)):
        m.forward(s, [(31 * s + j) % 1000 + 1 for j in range(PROMPT)], "none")
    print(f"model {a.model}, {a.device}, {a.threads} threads, {a.steps} decode steps per run")
    if counters is not None:
        print(f"hybrid: {kw['vram_slots']} expert slots ({a.vram_share:.0%} of the experts)")
    print("streams  batched tok/s  separate tok/s  ratio  hit rate")
    for n in streams:
        run(m, n, 2, True, 0)  # warm-up
        tb, ts = [], []
        h0 = counters.totals() if counters is not None else (0,)
        for r in range(a.reps):
            tb.append(n * a.steps / run(m, n, a.steps, True, r))
            ts.append(n * a.steps / run(m, n, a.steps, False, r))
        h1 = counters.totals() if counters is not None else (0,)
        tot = sum(h1) - sum(h0)
        hit = f"{(h1[0] - h0[0]) / tot:.3f}" if tot else "-"
        b, s = statistics.median(tb), statistics.median(ts)
        print(f"{n:7d}  {b:13.1f}  {s:14.1f}  {b / s:5.2f}  {hit}", flush=True)


if __name__ == "__main__":
    main()
