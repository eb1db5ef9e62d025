"""Mirostat (llama.cpp's `llama_sampler_init_mirostat` and `_v2`): a draw that keeps the
text's surprise near `tau` bits by truncating the candidates with a running bound `mu`
(starting at 2·tau) and moving `mu` by `eta` × (the drawn token's surprise − tau). As in
llama.cpp's chain, it replaces the other samplers (penalties, DRY, top-k, ...) after the logit
bias; temperature scales the logits first.

v1 estimates the Zipf exponent s of the 100 likeliest tokens and keeps the top k that target
the surprise; v2 keeps the tokens whose surprise is at most mu.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import numpy.typing as npt

__all__ = ["M", "step"]

M = 100  # the tokens v1's Zipf estimate reads (llama-server's)

Ids = npt.NDArray[np.int64]
Probs = npt.NDArray[np.float64]


def _sorted(x: npt.NDArray[np.float32], temperature: float) -> tuple[Ids, Probs]:
    """The finite tokens best first (lowest id on ties) and their probabilities at the
    temperature (at 0: the best alone, as llama.cpp's temperature sampler keeps it)."""
    cand = np.nonzero(np.isfinite(x))[0]
    if cand.size == 0:
        return np.array([int(np.argmax(x))], dtype=np.int64), np.ones(1)
    v = x[cand].astype(np.float64)
    order = np.lexsort((cand, -v))
    cand, v = cand[order], v[order]
    if temperature <= 0.0:
        return cand[:1].astype(np.int64), np.ones(1)
    e = np.exp((v - v[0]) / temperature)
    return cand.astype(np.int64), e / e.sum()


def _v1_keep(prob: Probs, mu: float, n_vocab: int) -> int:
    """How many tokens v1 keeps: k from the estimated Zipf exponent and the target."""
    n = min(M - 1, prob.size - 1)
    i = np.arange(n, dtype=np.float64)
    t = np.log((i + 2) / (i + 1))
    # in float32, as llama.cpp computes it: where that overflows or divides by zero (a large
    # mu, even top probabilities) its k is not a number and it keeps one token
    f = np.float32
    with np.errstate(all="ignore"):
        b = np.log(prob[:n] / prob[1 : n + 1])
        s_hat = f(np.sum(t * b) / np.sum(t * t))
        eps = s_hat - f(1.0)
        k = np.power(
            (eps * np.power(f(2.0), f(mu))) / (f(1.0) - np.power(f(n_vocab), -eps)), f(1.0) / s_hat
        )
    return max(int(k), 1) if math.isfinite(k) and k < 2**31 else 1


def step(
    x: npt.NDArray[np.float32],
    version: int,
    temperature: float,
    tau: float,
    eta: float,
    mu: float,
    n_vocab: int,
    draw: Callable[[Ids, Probs], int],
) -> tuple[int, float, Ids]:
    """One token over the row [V]: (the token, the new mu, the ids kept, best first).
    `draw` picks from the kept ids and their renormalized probabilities."""
    cand, prob = _sorted(x, temperature)
    if version == 1:
        keep = _v1_keep(prob, mu, n_vocab)
    else:
        with np.errstate(divide="ignore"):
            over = np.nonzero(-np.log2(prob) > mu)[0]
        keep = int(over[0]) if over.size else cand.size
    keep = min(max(keep, 1), cand.size)
    cand, prob = cand[:keep], prob[:keep] / prob[:keep].sum()
    token = draw(cand, prob)
    p = float(prob[int(np.nonzero(cand == token)[0][0])])
    surprise = -math.log2(p) if p > 0 else math.inf
    return token, mu - eta * (surprise - tau), cand
