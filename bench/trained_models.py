"""Quality and routing of the shipped trained models (docs/MODELS.md), on the CPU:

    python bench/trained_models.py            # prints the markdown tables of docs/MODELS.md

- held-out perplexity (text of held-out stdlib modules, strata.stdlib_corpus.HELDOUT, never
  trained on) of the default model, the draft, and a random-weight model of the default's
  shapes;
- the draft's greedy agreement with the default: top-1 equal, position by position, on the
  same held-out windows (teacher-forced; a proxy for speculative acceptance);
- greedy samples of the default model;
- per layer, from the experts each token is routed to (read token by token from the engine's
  routing counts): the routing entropy (bits, of the layer's expert-use distribution; log2 E
  is uniform), the share of routed pairs served by the layer's hottest 25% of experts, and
  the reuse distance (tokens until an expert is routed again, median and mean, and the share
  of a token's experts already used by the previous token), for the trained router and for
  random and Zipf-biased (router_zipf 1.1) routers of the same shapes.
"""

from __future__ import annotations

import argparse
import sysconfig
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from strata import modelgen
from strata._core import Model
from strata.tokenizer import Tokenizer

HELDOUT_FILES = ("json/decoder.py", "json/encoder.py", "textwrap.py", "heapq.py", "shlex.py")
SAMPLES = (
    "def read_lines(path):\n",
    "class Stack:\n    def __init__(self):\n",
    "import os\n\n\ndef walk_files(root):\n",
    '    """Return the number of',
)


def heldout_ids(tok: Tokenizer, n: int) -> list[int]:
    root = Path(sysconfig.get_paths()["stdlib"])
    ids: list[int] = []
    for rel in HELDOUT_FILES:
        ids += tok.encode(f"# {rel}\n" + (root / rel).read_text())
    return ids[:n]


def log_softmax(x: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    x = x.astype(np.float64)
    m = x.max(-1, keepdims=True)
    out: np.ndarray[Any, Any] = x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))
    return out


def window_logits(path: Path, ids: list[int], win: int) -> list[np.ndarray[Any, Any]]:
    m = Model.open(path, n_ctx=win, n_slots=1, kv_type="f32", prefill_chunk=128)
    out = []
    for s in range(0, len(ids) - win + 1, win):
        m.free(0)
        out.append(m.forward(0, ids[s : s + win], logits="all"))
    return out


def perplexity(logits: list[np.ndarray[Any, Any]], ids: list[int], win: int) -> float:
    nll: list[float] = []
    for i, lg in enumerate(logits):
        toks = np.asarray(ids[i * win : (i + 1) * win])
        lp = log_softmax(lg[:-1])
        nll.extend(-lp[np.arange(win - 1), toks[1:]])
    return float(np.exp(np.mean(nll)))


def routes(path: Path, ids: list[int]) -> np.ndarray[Any, Any]:
    """[T, L, E] bool: the experts each token was routed to, per layer (token by token)."""
    m = Model.open(path, n_ctx=len(ids) + 1, n_slots=1, kv_type="f32")
    prev = np.asarray(m.routing_counts(), dtype=np.float64)
    out = []
    for t in ids:
        m.forward(0, [t])
        cur = np.asarray(m.routing_counts(), dtype=np.float64)
        out.append((cur - prev) > 0.5)
        prev = cur
    return np.stack(out)


def routing_table(r: np.ndarray[Any, Any]) -> list[tuple[float, float, float, float, float]]:
    """Per layer: (entropy bits, hot-25% share, median reuse, mean reuse, reused-next share)."""
    n_tok, n_layer, n_exp = r.shape
    rows = []
    for layer in range(n_layer):
        x = r[:, layer, :]
        cnt = x.sum(0).astype(np.float64)
        p = cnt / cnt.sum()
        ent = float(-(p[p > 0] * np.log2(p[p > 0])).sum())
        hot = float(np.sort(cnt)[::-1][: max(1, round(n_exp * 0.25))].sum() / cnt.sum())
        last = np.full(n_exp, -1)
        dists: list[int] = []
        for t in range(n_tok):
            for e in np.flatnonzero(x[t]):
                if last[e] >= 0:
                    dists.append(t - last[e])
                last[e] = t
        d = np.asarray(dists)
        nxt = float((x[1:] & x[:-1]).sum() / x[1:].sum())
        rows.append((ent, hot, float(np.median(d)), float(d.mean()), nxt))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--tokens", type=int, default=2048, help="held-out tokens for perplexity")
    ap.add_argument("--route-tokens", type=int, default=1024)
    ap.add_argument("--win", type=int, default=256)
    ap.add_argument("--default", type=Path, help="default: the shipped file")
    ap.add_argument("--draft", type=Path, help="default: the shipped file")
    args = ap.parse_args()
    default = args.default or modelgen.shipped_model_path("default")
    draft = args.draft or modelgen.shipped_model_path("draft")
    tok = Tokenizer.from_gguf(default)
    ids = heldout_ids(tok, args.tokens)
    with tempfile.TemporaryDirectory() as d:
        base = dict(n_embd=256, n_layer=5, n_expert=32, n_expert_used=4, n_ff_exp=128, n_vocab=8192)
        rnd = modelgen.write_qwen3moe(Path(d) / "r.gguf", modelgen.ModelSpec(**base))  # type: ignore[arg-type]
        zipf = modelgen.write_qwen3moe(
            Path(d) / "z.gguf",
            modelgen.ModelSpec(**base, router_zipf=1.1),  # type: ignore[arg-type]
        )
        lg_def = window_logits(default, ids, args.win)
        lg_dr = window_logits(draft, ids, args.win)
        lg_rnd = window_logits(rnd, ids, args.win)
        n = len(lg_def) * args.win
        print(f"## Held-out perplexity ({n} tokens of {', '.join(HELDOUT_FILES)})\n")
        print("| model | perplexity |\n| --- | --- |")
        for name, lg in (("default (Q8_0)", lg_def), ("draft (Q8_0)", lg_dr), ("random", lg_rnd)):
            print(f"| {name} | {perplexity(lg, ids, args.win):.2f} |")
        agree = np.mean(
            [(a.argmax(1) == b.argmax(1)).mean() for a, b in zip(lg_def, lg_dr, strict=True)]
        )
        print(f"\nDraft greedy agreement with the default (teacher-forced top-1): {agree:.3f}\n")
        rid = ids[: args.route_tokens]
        print(f"## Routing, per layer ({len(rid)} held-out tokens, decoded one at a time)\n")
        print(
            "| router | layer | entropy (bits; uniform 5.00) | hot-25% share | reuse distance"
            " median / mean | reused by the next token |\n| --- | --- | --- | --- | --- | --- |"
        )
        for name, p in (("trained", default), ("random", rnd), ("zipf 1.1", zipf)):
            for layer, (ent, hot, med, mean, nxt) in enumerate(routing_table(routes(p, rid))):
                cells = f"{ent:.2f} | {hot:.3f} | {med:.0f} / {mean:.1f} | {nxt:.3f}"
                print(f"| {name} | {layer} | {cells} |")
    print("\n## Greedy samples (default model, 64 tokens)\n")
    from strata.llm import LLM

    llm = LLM(default, n_ctx=256)
    for prompt in SAMPLES:
        out = [t for t, _ in llm.generate_ids(tok.encode(prompt), max_tokens=64, temperature=0)]
        print("```python\n" + prompt + tok.decode(out) + "\n```\n")


if __name__ == "__main__":
    main()
