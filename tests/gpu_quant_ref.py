"""The int8 activations of the GPU's decode kernels (cuda/quantize.cu), shared by
tests/test_gpu_quant.py (device) and tests/test_gpu_quant_host.py (checks the kernels' math
against it): exactly what the CPU path feeds its dot products for the weight type, i.e. ggml's
vec_dot type (q8_0 for Q8_0/Q4_0/Q5_0/IQ4_NL, q8_K for the K-quants and the 256-element IQ
types), taken from the CPU quantizer itself (`_core.quantize_act`)."""

from __future__ import annotations

import numpy as np
from strata import _core

Q8K_TYPES = {"Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS", "IQ3_S", "IQ3_XXS", "IQ2_XS"}


def act_kind(t: str) -> str:
    """The activation type of weight type t: "q8_k" or "q8_0"."""
    return "q8_k" if t in Q8K_TYPES else "q8_0"


def act_parts(kind: str, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """x f32 [..., k] → (d f32 [..., k/32], q int64 [..., k/32, 32]) as the CPU quantizes it:
    one f32 scale per 32 values (q8_K's super-block scale repeated over its 8 blocks)."""
    rows = np.ascontiguousarray(x, np.float32).reshape(-1, x.shape[-1])
    ds, qs = [], []
    for r in rows:
        b = np.frombuffer(_core.quantize_act("Q8_K" if kind == "q8_k" else "Q8_0", r), np.uint8)
        if kind == "q8_k":
            blk = b.reshape(-1, 292)
            d = np.repeat(blk[:, :4].copy().view(np.float32)[:, 0], 8)
            q = blk[:, 4:260].copy().view(np.int8).reshape(-1, 32)
        else:
            blk = b.reshape(-1, 34)
            d = blk[:, :2].copy().view(np.float16)[:, 0].astype(np.float32)
            q = blk[:, 2:].copy().view(np.int8)
        ds.append(d)
        qs.append(q.astype(np.int64))
    shape = x.shape[:-1]
    return (
        np.stack(ds).reshape(*shape, -1),
        np.stack(qs).reshape(*shape, -1, 32),
    )


def act_values(t: str, x: np.ndarray) -> np.ndarray:
    """The activations d·q of x [..., k] for weight type t (float64, the shape of x)."""
    d, q = act_parts(act_kind(t), x)
    return (d.astype(np.float64)[..., None] * q).reshape(x.shape)
