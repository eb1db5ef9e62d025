"""Greedy continuations of Strata and llama.cpp (llama-cpp-python) on one GGUF, the check a
benchmark file passes before it is timed (bench/write_family_model.py's shapes): a few random
prompts, each continued greedily by both engines; a continuation counts as equal when the
tokens agree up to llama.cpp's first near-tie (top-2 logit margin < 0.1, as
tests/test_model_llamacpp.py counts it). Along llama.cpp's path it also counts how often
Strata's top-1 equals llama.cpp's choice where that choice is not a near-tie.

    python bench/family_greedy.py FILE.gguf [--prompts 3] [--len 8] [--gen 16] [--threads 2]
        [--no-repack]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

MARGIN = 0.1


def margin(row: np.ndarray) -> float:
    top2 = np.sort(row)[-2:]
    return float(top2[1] - top2[0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("--prompts", type=int, default=3)
    ap.add_argument("--len", type=int, default=8)
    ap.add_argument("--gen", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--no-repack",
        action="store_true",
        help="llama.cpp without its repacked weight buffers (llama-bench's --repack 0)",
    )
    a = ap.parse_args()

    import llama_cpp
    from strata._core import Model

    if a.no_repack:
        default = llama_cpp.llama_model_default_params

        def no_extra() -> object:
            p = default()
            p.use_extra_bufts = False
            return p

        llama_cpp.llama_model_default_params = no_extra
        llama_cpp.llama_cpp.llama_model_default_params = no_extra

    n_ctx = a.len + a.gen + 8
    ll = llama_cpp.Llama(
        str(a.model), logits_all=True, n_ctx=n_ctx, n_threads=a.threads, verbose=False,
        flash_attn=False,
    )  # fmt: skip
    m = Model.open(a.model, n_ctx=n_ctx, n_slots=1, threads=a.threads)
    rng = np.random.default_rng(2)
    same = 0
    agree: list[bool] = []
    for k in range(a.prompts):
        toks = [int(t) for t in rng.integers(0, min(m.n_vocab, 50000), a.len)]
        m.free(0)
        ours: list[int] = []
        logits = m.forward(0, toks)
        for _ in range(a.gen):
            ours.append(int(np.argmax(logits)))
            logits = m.forward(0, ours[-1:])
        ll.reset()
        ll.eval(toks)
        ref: list[int] = []
        sure: list[bool] = []
        for _ in range(a.gen):
            row = np.asarray(ll.scores[ll.n_tokens - 1])
            sure.append(margin(row) >= MARGIN)
            ref.append(int(np.argmax(row)))
            ll.eval(ref[-1:])
        cut = next((i for i, s in enumerate(sure) if not s), a.gen)
        m.free(0)
        logits = m.forward(0, toks)
        for r, ok in zip(ref, sure, strict=True):
            if ok:
                agree.append(int(np.argmax(logits)) == r)
            logits = m.forward(0, [r])
        eq = ours[:cut] == ref[:cut]
        same += eq
        print(f"prompt {k}: equal up to the first near-tie ({cut} of {a.gen}): {eq}; "
              f"in full: {ours == ref}")  # fmt: skip
        print(f"  strata    {ours}\n  llama.cpp {ref}")
    print(f"{same}/{a.prompts} equal up to the first near-tie; along llama.cpp's path top-1 "
          f"{np.mean(agree):.4f} over {len(agree)} sure steps")  # fmt: skip


if __name__ == "__main__":
    main()
