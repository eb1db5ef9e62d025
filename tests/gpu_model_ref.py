"""numpy references for the model kernels (cuda/{norm,rope,attention,router,elementwise}.cu),
shared by the emulation tests (test_gpu_model_sim.py) and the device tests (test_gpu_model.py).

Written from docs/FORMATS.md §4 and the CPU path's documented numerics (rust/src/model/ops.rs,
attention.rs, forward.rs `route`), not from the kernels: f64 where the kernels use f32, and
inputs rounded the way the documented numerics round them (q to f16 before q·k on an f16
cache, q to q8_0 on a q8_0 cache in decode). The KV cache layout is [slot][Nkv][n_ctx] head
rows (one layer) in f16 or q8_0 (34 bytes per 32 values: f16 d, int8 q[32]).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

KV_TYPES = {"f16": 0, "q8_0": 1}


def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """RMSNorm of each last-axis row, mean of squares in f64: f64 result."""
    x = x.astype(np.float64)
    ms = (x * x).mean(-1, keepdims=True)
    return x / np.sqrt(ms + eps) * w.astype(np.float64)


def rope(
    x: np.ndarray,
    cos: np.ndarray,
    sin: np.ndarray,
    pos: np.ndarray,
    n_rot: int,
    neox: bool = True,
) -> np.ndarray:
    """Rotation of x [T, H, D] (f64) with table rows cos/sin [P, n_rot/2] at pos [T]: NEOX
    pairs (i, i + n_rot/2), or NORM pairs (2i, 2i + 1) when not `neox`."""
    x = x.astype(np.float64).copy()
    half = n_rot // 2
    c = cos[pos][:, None, :].astype(np.float64)
    s = sin[pos][:, None, :].astype(np.float64)
    if not neox:
        x0, x1 = x[..., 0:n_rot:2].copy(), x[..., 1:n_rot:2].copy()
        x[..., 0:n_rot:2] = x0 * c - x1 * s
        x[..., 1:n_rot:2] = x0 * s + x1 * c
        return x
    x0, x1 = x[..., :half].copy(), x[..., half:n_rot].copy()
    x[..., :half] = x0 * c - x1 * s
    x[..., half:n_rot] = x0 * s + x1 * c
    return x


def f16_round(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, np.float32).astype(np.float16).astype(np.float64)


def q8_0_quant(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ggml x86 Q8_0 of rows whose length is a multiple of 32: (d as f64 of its f16, int q)."""
    b = np.asarray(x, np.float32).reshape(*x.shape[:-1], -1, 32)
    amax = np.abs(b).max(-1, keepdims=True)
    d = (amax / np.float32(127)).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(amax != 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    q = np.rint((b * inv).astype(np.float32)).astype(np.int32)
    return d.astype(np.float16).astype(np.float64), q


def q8_0_bytes(x: np.ndarray) -> np.ndarray:
    """Rows [..., D] as q8_0 bytes [..., D/32·34]."""
    d, q = q8_0_quant(x)
    blocks = np.concatenate(
        [d.astype(np.float16).view(np.uint8), q.astype(np.int8).view(np.uint8)], axis=-1
    )
    return blocks.reshape(*x.shape[:-1], -1)


def q8_0_values(b: np.ndarray, d: int) -> np.ndarray:
    """q8_0 bytes [..., D/32·34] back to f64 values [..., D]."""
    blk = b.reshape(*b.shape[:-1], d // 32, 34)
    scale = blk[..., :2].copy().view(np.float16).astype(np.float64)
    q = blk[..., 2:].view(np.int8).astype(np.float64)
    return (scale * q).reshape(*b.shape[:-1], d)


def head_bytes(kv: str, d: int) -> int:
    return 2 * d if kv == "f16" else d // 32 * 34


def store_rows(kv: str, x: np.ndarray) -> np.ndarray:
    """f32 rows [..., D] in the cache type, as bytes [..., head_bytes]."""
    if kv == "f16":
        return np.asarray(x, np.float32).astype(np.float16).view(np.uint8)
    return q8_0_bytes(x)


def load_rows(kv: str, b: np.ndarray, d: int) -> np.ndarray:
    if kv == "f16":
        return b.copy().view(np.float16).astype(np.float64)
    return q8_0_values(b, d)


@dataclass
class Cache:
    """One layer's K and V cache: bytes [n_slots, Nkv, n_ctx, head_bytes]."""

    kv: str
    n_slots: int
    n_kv: int
    n_ctx: int
    d: int

    def __post_init__(self) -> None:
        hb = head_bytes(self.kv, self.d)
        self.k = np.zeros((self.n_slots, self.n_kv, self.n_ctx, hb), np.uint8)
        self.v = np.zeros_like(self.k)

    @property
    def slot_stride(self) -> int:
        return int(self.k[0].nbytes)

    def fill(self, rng: np.random.Generator, slot: int, n: int, scale: float = 1.0) -> None:
        """Random keys and values at positions [0, n) of `slot`."""
        shape = (self.n_kv, n, self.d)
        self.k[slot, :, :n] = store_rows(self.kv, rng.normal(0, scale, shape).astype(np.float32))
        self.v[slot, :, :n] = store_rows(self.kv, rng.normal(0, 1, shape).astype(np.float32))

    def values(self, slot: int, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Keys and values [Nkv, n, D] as f64."""
        return (
            load_rows(self.kv, self.k[slot, :, :n], self.d),
            load_rows(self.kv, self.v[slot, :, :n], self.d),
        )


def attention(
    q: np.ndarray,
    cache: Cache,
    slot: int,
    pos0: int,
    q_form: str,
    k_form: str = "cache",
    v_form: str | None = None,
    sinks: np.ndarray | None = None,
    window: int = 0,
) -> np.ndarray:
    """Causal GQA attention of q [T, Nh, D] at positions pos0.. over the cache (f64).
    q_form: how q enters q·k: "f16" (rounded to f16), "q8_0" (quantized, as the kernels on a
    q8_0 cache do, like the CPU) or "f32". k_form / v_form "f16" round the dequantized keys /
    values to f16 (the prefill kernel's f16 tiles); v_form defaults to k_form. `sinks` [Nh]:
    one more logit per head in the softmax, with no value; `window` W > 0: a row at position
    p sees only the positions p − W < j ≤ p."""
    t_n, nh, d = q.shape
    g = nh // cache.n_kv
    if q_form == "f16":
        qq = f16_round(q)
    elif q_form == "q8_0":
        dq, qi = q8_0_quant(q)
        qq = (dq * qi).reshape(q.shape)
    else:
        qq = q.astype(np.float64)
    n = pos0 + t_n
    k, v = cache.values(slot, n)
    if k_form == "f16":
        k = f16_round(k)
    if (k_form if v_form is None else v_form) == "f16":
        v = f16_round(v)
    out = np.zeros((t_n, nh, d))
    for t in range(t_n):
        vis = pos0 + t + 1
        lo = max(0, vis - window) if window > 0 else 0
        for h in range(nh):
            kh = h // g
            s = k[kh, lo:vis] @ qq[t, h] / np.sqrt(d)
            mx = s.max() if sinks is None else max(s.max(), float(sinks[h]))
            p = np.exp(s - mx)
            den = p.sum() + (0.0 if sinks is None else np.exp(float(sinks[h]) - mx))
            out[t, h] = (p / den) @ v[kh, lo:vis]
    return out


def route(logits: np.ndarray, k: int, norm: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Softmax → top-k (ties: lower id) → renormalize, per row of logits [T, E]."""
    x = logits.astype(np.float64)
    p = np.exp(x - x.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    ids = np.argsort(-p, axis=-1, kind="stable")[:, :k]
    w = np.take_along_axis(p, ids, -1)
    if norm:
        w = w / w.sum(-1, keepdims=True)
    return ids.astype(np.int32), w
