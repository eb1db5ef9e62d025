"""Aggregate decode speed of the batched step against one forward call per sequence (issue 15).

    python bench/bench_batch.py --model FILE.gguf [--streams 1,2,4,8] [--steps 32] [--threads 2]

For each stream count N: N slots are prefilled with distinct 16-token prompts, then `--steps`
decode steps run twice, interleaved A B A B over `--reps` repetitions: (A) one
`Model.forward_batch` call with the N one-token entries per step, (B) N `Model.forward` calls
per step. Prints the median aggregate tokens/s of each and their ratio. Both runs feed fixed
token sequences (no sampling), so the work is the same.
"""

from __future__ import annotations

import argparse
import statistics
import time

from strata._core import Model

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
    ap.add_argument("--threads", type=int, default=2, help="compute threads including the caller")
    a = ap.parse_args()
    streams = [int(x) for x in a.streams.split(",")]
    m = Model.open(
        a.model, n_ctx=PROMPT + a.steps + 8, n_slots=max(streams), threads=max(a.threads - 1, 0)
    )
    for s in range(max(streams)):
        m.forward(s, [(31 * s + j) % 1000 + 1 for j in range(PROMPT)], "none")
    print(f"model {a.model}, {a.threads} threads, {a.steps} decode steps per run")
    print("streams  batched tok/s  separate tok/s  ratio")
    for n in streams:
        run(m, n, 2, True, 0)  # warm-up
        tb, ts = [], []
        for r in range(a.reps):
            tb.append(n * a.steps / run(m, n, a.steps, True, r))
            ts.append(n * a.steps / run(m, n, a.steps, False, r))
        b, s = statistics.median(tb), statistics.median(ts)
        print(f"{n:7d}  {b:13.1f}  {s:14.1f}  {b / s:5.2f}")


if __name__ == "__main__":
    main()
