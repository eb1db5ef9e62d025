"""llama.cpp's own samplers run over one row of logits (llama-cpp-python's low-level API), the
oracle of the sampler tests."""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any

import llama_cpp
import numpy as np
import numpy.typing as npt


def run_chain(
    stages: Sequence[Any], x: npt.NDArray[np.float32], history: Sequence[int] = ()
) -> dict[int, float]:
    """The tokens llama.cpp's chain of `stages` (llama_sampler_init_* results) leaves with a
    finite logit, and those logits, over the row `x` [V]; the chain is first told
    `history` (its accept) and freed after."""
    n = x.shape[0]
    data = (llama_cpp.llama_token_data * n)()
    for i in range(n):
        data[i].id, data[i].logit, data[i].p = i, float(x[i]), 0.0
    arr = llama_cpp.llama_token_data_array(data, n, -1, False)
    chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
    try:
        for s in stages:
            llama_cpp.llama_sampler_chain_add(chain, s)
        for t in history:
            llama_cpp.llama_sampler_accept(chain, t)
        llama_cpp.llama_sampler_apply(chain, ctypes.byref(arr))
        return {
            int(arr.data[i].id): float(arr.data[i].logit)
            for i in range(arr.size)
            if np.isfinite(arr.data[i].logit)
        }
    finally:
        llama_cpp.llama_sampler_free(chain)


def apply_chain(chain: Any, x: npt.NDArray[np.float32]) -> Any:
    """llama.cpp's `chain` applied to the row `x` [V]: its token data array afterwards (the
    candidates left, their logits and probabilities, `selected`)."""
    n = x.shape[0]
    data = (llama_cpp.llama_token_data * n)()
    for i in range(n):
        data[i].id, data[i].logit, data[i].p = i, float(x[i]), 0.0
    arr = llama_cpp.llama_token_data_array(data, n, -1, False)
    llama_cpp.llama_sampler_apply(chain, ctypes.byref(arr))
    return arr


def survivors(got: dict[int, float]) -> tuple[list[int], npt.NDArray[np.float64]]:
    """A chain's tokens (sorted ids) and the probabilities its `dist` would draw them by."""
    ids = sorted(got)
    v = np.array([got[i] for i in ids], dtype=np.float64)
    e = np.exp(v - v.max())
    return ids, e / e.sum()
