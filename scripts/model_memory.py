#!/usr/bin/env python3
"""Anonymous resident memory of a loaded model: RssAnon growth over loading a GGUF and
generating, against the bound non-expert weights + KV cache + 10% (issue 4). Experts (and in
fact all matrices) stay in the file mapping, which counts as RssFile, not RssAnon.

    python scripts/model_memory.py MODEL.gguf [--n-ctx 4096] [--tokens 32]

Prints one table row; exits 1 when the bound is exceeded. Linux only (/proc/self/status).
"""

from __future__ import annotations

import argparse
import sys


def rss() -> dict[str, int]:
    out: dict[str, int] = {}
    with open("/proc/self/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("RssAnon", "RssFile", "VmRSS"):
                out[k] = int(v.split()[0]) * 1024
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--n-ctx", type=int, default=4096)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--kv-type", default="f16")
    a = ap.parse_args(argv)

    import numpy as np
    from strata._core import Model

    before = rss()
    m = Model.open(a.model, n_ctx=a.n_ctx, n_slots=1, kv_type=a.kv_type)
    hp = m.hparams
    prompt = [int(t) for t in np.random.default_rng(0).integers(0, hp["n_vocab"], 16)]
    logits = m.forward(0, prompt)
    for _ in range(a.tokens):
        logits = m.forward(0, [int(logits.argmax())])
    after = rss()
    anon = after["RssAnon"] - before["RssAnon"]
    bound = int(1.1 * (hp["non_expert_bytes"] + hp["kv_bytes"]))
    mib = 1 << 20
    print(
        "| RssAnon growth MiB | non-expert MiB | KV MiB | bound (+10%) MiB | expert MiB "
        "| RssFile growth MiB |\n|---|---|---|---|---|---|\n"
        f"| {anon / mib:.1f} | {hp['non_expert_bytes'] / mib:.1f} | {hp['kv_bytes'] / mib:.1f} "
        f"| {bound / mib:.1f} | {hp['expert_bytes'] / mib:.1f} "
        f"| {(after['RssFile'] - before['RssFile']) / mib:.1f} |"
    )
    return 0 if anon <= bound else 1


if __name__ == "__main__":
    sys.exit(main())
