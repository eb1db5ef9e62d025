"""Expert deferral against the exact hybrid step (issue 23): top-1 agreement, perplexity, KL
and decode speed.

    python bench/defer_quality.py --model FILE.gguf [--defer 1,2,8] [--share 0.25]
        [--tokens 256] [--text FILE] [--threads N] [--profile-tokens 256]

The file is opened twice on the GPU in the hybrid mode (`vram_slots` = `--share` of the routed
experts, filled hottest first along a profile of the text's first `--profile-tokens` tokens,
no adaptation (`adapt_every` 0, so both runs keep the same experts in VRAM and the same pairs
are CPU misses), `pcie_frac` 0): once exact, then with each `defer_experts` value of `--defer`
(each token's N lowest-weight CPU misses of a layer added to the residual one layer later,
`rust/src/gpu/defer.rs`; N ≥ top-k: all of them). The text (default: this
repository's docs/DESIGN.md) is tokenized and fed one token per step after a 16-token prompt
(decode steps, where deferral acts). Per position: the argmax of both runs' logits and the
log-probability of the text's next token (float64 log-softmax). Reports top-1 agreement
(argmax equal), each run's perplexity of the text, the mean KL(exact ‖ deferred) per position,
and each run's decode tok/s (the forward calls only, medians of the per-step times × steps).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
PROMPT = 16


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max()
    return x - m - np.log(np.exp(x - m).sum())


def run(path: Path, a: argparse.Namespace, ids: list[int], defer: int, profile) -> dict:
    """Teacher-forced decode of `ids` (after the prompt): per step the argmax, the log-prob
    of the next token, the log-softmax row (for the KL) and the forward time."""
    from strata._core import Model

    m = Model.open(
        path,
        n_ctx=len(ids) + 64,
        device="cuda",
        threads=a.threads,
        vram_slots=a.slots,
        adapt_every=0,
        profile=profile,
        pcie_frac=0.0,
        defer_experts=defer,
    )
    info = m.hybrid_info()
    assert info is not None and info["defer_experts"] == defer, info
    m.forward(0, ids[:PROMPT], logits="last")
    top, lp, rows, dt = [], [], [], []
    for i in range(PROMPT, len(ids) - 1):
        t0 = time.perf_counter()
        z = m.forward(0, [ids[i]], logits="last")
        dt.append(time.perf_counter() - t0)
        ls = log_softmax(np.asarray(z).reshape(-1))
        top.append(int(ls.argmax()))
        lp.append(float(ls[ids[i + 1]]))
        rows.append(ls.astype(np.float32))
    c = m.hybrid_counters()
    assert c is not None
    h, mc, _ = c.totals()
    del m
    return {
        "top": np.array(top),
        "lp": np.array(lp),
        "rows": rows,
        "tg": 1.0 / statistics.median(dt),
        "miss_share": mc / max(1, h + mc),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--defer", default="1,2,8", help="defer_experts values, comma-separated")
    ap.add_argument("--share", type=float, default=0.25, help="share of experts in VRAM")
    ap.add_argument("--tokens", type=int, default=256, help="decode steps measured")
    ap.add_argument("--text", type=Path, default=ROOT / "docs/DESIGN.md")
    ap.add_argument("--threads", type=int, default=16)
    ap.add_argument("--profile-tokens", type=int, default=256)
    a = ap.parse_args()
    from strata._core import Model, Profile
    from strata.llm import LLM

    raw = a.text.read_text(errors="replace")
    ids = LLM(a.model, n_ctx=64).encode_prompt(raw)
    need = a.profile_tokens + PROMPT + a.tokens + 1
    ids = (ids * (need // max(1, len(ids)) + 1))[:need]
    prof_ids, ids = ids[: a.profile_tokens], ids[a.profile_tokens :]
    hp = Model.open(a.model, n_ctx=64).hparams  # the CPU path only reads the shapes
    a.slots = max(1, round(a.share * int(hp["n_layer"]) * int(hp["n_expert"])))
    # the profile: the text's first tokens routed by the hybrid step (as strata-fill does)
    m = Model.open(
        a.model, n_ctx=a.profile_tokens + 8, device="cuda", threads=a.threads,
        vram_slots=a.slots, pcie_frac=0.0,
    )  # fmt: skip
    m.forward(0, prof_ids, logits="none")
    profile = Profile.from_counts(a.model, m.routing_counts(), a.profile_tokens, "text")
    del m
    ex = run(a.model, a, ids, 0, profile)
    ppl_ex = float(np.exp(-ex["lp"].mean()))
    print(
        f"{a.model.name}: {a.slots} slots ({a.share:.0%}), {len(ex['top'])} decode steps of "
        f"{a.text.name}, {a.threads} threads; CPU-miss share {ex['miss_share']:.3f}; exact: "
        f"perplexity {ppl_ex:.3f}, {ex['tg']:.1f} tok/s",
        file=sys.stderr,
    )
    print("| model | defer_experts | top-1 agreement | perplexity (exact) | mean KL | "
          "tok/s (exact) | speed ratio |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for n in [int(x) for x in a.defer.split(",") if x]:
        de = run(a.model, a, ids, n, profile)
        agree = float((ex["top"] == de["top"]).mean())
        kl = statistics.fmean(
            float((np.exp(p.astype(np.float64)) * (p.astype(np.float64) - q)).sum())
            for p, q in zip(ex["rows"], de["rows"], strict=True)
        )
        ppl = float(np.exp(-de["lp"].mean()))
        print(
            f"| {a.model.name} | {n} | {agree:.3f} | {ppl:.3f} ({ppl_ex:.3f}) | {kl:.4f} | "
            f"{de['tg']:.1f} ({ex['tg']:.1f}) | {de['tg'] / ex['tg']:.2f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
