"""Random quant blocks and the error bound of the dot kernels (docs/QUANT.md, "Dot error
bound"), shared by tests/test_dot.py and bench/bench_dot.py."""

from __future__ import annotations

import numpy as np

U = 2.0**-24  # f32 unit roundoff
U16 = 2.0**-11  # f16 unit roundoff

# (elements, bytes) per block
BLOCK = {
    "F32": (1, 4), "F16": (1, 2), "BF16": (1, 2),
    "Q4_0": (32, 18), "Q4_1": (32, 20), "Q5_0": (32, 22), "Q5_1": (32, 24), "Q8_0": (32, 34),
    "Q8_1": (32, 36), "Q2_K": (256, 84), "Q3_K": (256, 110), "Q4_K": (256, 144),
    "Q5_K": (256, 176), "Q6_K": (256, 210), "Q8_K": (256, 292), "IQ2_XXS": (256, 66),
    "IQ2_XS": (256, 74), "IQ2_S": (256, 82), "IQ3_XXS": (256, 98), "IQ3_S": (256, 110),
    "IQ1_S": (256, 50), "IQ1_M": (256, 56), "IQ4_NL": (32, 18), "IQ4_XS": (256, 136),
    "TQ1_0": (256, 54), "TQ2_0": (256, 66), "MXFP4": (32, 17), "Q2_0": (64, 18),
}  # fmt: skip
GGML_ID = {
    "F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q5_0": 6, "Q5_1": 7, "Q8_0": 8, "Q8_1": 9,
    "Q2_K": 10, "Q3_K": 11, "Q4_K": 12, "Q5_K": 13, "Q6_K": 14, "Q8_K": 15, "IQ2_XXS": 16,
    "IQ2_XS": 17, "IQ3_XXS": 18, "IQ1_S": 19, "IQ4_NL": 20, "IQ3_S": 21, "IQ2_S": 22,
    "IQ4_XS": 23, "IQ1_M": 29, "BF16": 30, "TQ1_0": 34, "TQ2_0": 35, "MXFP4": 39, "Q2_0": 42,
}  # fmt: skip
ACT = {
    **dict.fromkeys(["Q4_0", "Q5_0", "Q8_0", "IQ4_NL", "MXFP4", "Q2_0"], "Q8_0"),
    **dict.fromkeys(["Q4_1", "Q5_1"], "Q8_1"),
    **dict.fromkeys(
        ["Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS",
         "IQ3_S", "IQ1_S", "IQ1_M", "IQ4_XS", "TQ1_0", "TQ2_0"],
        "Q8_K",
    ),
    "F32": "F32", "F16": "F16", "BF16": "BF16",
}  # fmt: skip
WEIGHT_TYPES = list(ACT)

# f16 scale fields per block: (offset, role); role "d" scales, "min" is subtracted (K mins),
# "m" is added (Q4_1/Q5_1).
SCALES: dict[str, list[tuple[int, str]]] = {
    **{t: [(0, "d")] for t in ["Q4_0", "Q5_0", "Q8_0", "IQ4_NL", "Q2_0", "IQ2_XXS", "IQ2_XS",
                                "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ4_XS"]},
    "Q4_1": [(0, "d"), (2, "m")], "Q5_1": [(0, "d"), (2, "m")],
    "Q4_K": [(0, "d"), (2, "min")], "Q5_K": [(0, "d"), (2, "min")],
    "Q2_K": [(80, "d"), (82, "min")], "Q3_K": [(108, "d")], "Q6_K": [(208, "d")],
    "TQ1_0": [(52, "d")], "TQ2_0": [(64, "d")],
}  # fmt: skip


def row_bytes(t: str, n: int) -> int:
    bs, ts = BLOCK[t]
    assert n % bs == 0
    return n // bs * ts


def random_act_f32(rng: np.random.Generator, n: int) -> np.ndarray:
    x = rng.standard_normal(n).astype(np.float32)
    out = rng.random(n) < 1 / 64
    x[out] *= 20
    return x


def random_scale(rng: np.random.Generator, size: int) -> np.ndarray:
    mag = 2.0 ** rng.uniform(-12, 2, size)
    return (mag * rng.choice([-1.0, 1.0], size)).astype(np.float16)


def random_row(t: str, n: int, rng: np.random.Generator) -> bytes:
    """A random weight row: random bytes with finite scales (floats for float types)."""
    bs, ts = BLOCK[t]
    if t == "F32":
        return random_act_f32(rng, n).tobytes()
    if t == "F16":
        return random_act_f32(rng, n).astype(np.float16).tobytes()
    if t == "BF16":
        return (random_act_f32(rng, n).view(np.uint32) >> 16).astype(np.uint16).tobytes()
    nb = n // bs
    b = rng.integers(0, 256, (nb, ts), dtype=np.uint8)
    if t == "MXFP4":
        b[:, 0] = rng.integers(110, 140, nb)
    elif t == "IQ1_M":
        d = random_scale(rng, nb).view(np.uint16)
        for i in range(4):
            o = 48 + 2 * i
            w = b[:, o : o + 2].copy().view(np.uint16)[:, 0]
            w = (w & 0x0FFF) | (((d >> (4 * i)) & 15) << 12)
            b[:, o : o + 2] = w.astype(np.uint16).view(np.uint8).reshape(nb, 2)
    for o, _ in SCALES.get(t, []):
        b[:, o : o + 2] = random_scale(rng, nb).view(np.uint8).reshape(nb, 2)
    return b.tobytes()


def magnitude_row(t: str, row: bytes) -> bytes:
    """The row with every scale made positive and the K mins negated, so that its
    dequantization is Σ|terms| per element: |d·sc·q| + |dmin·m| (or |d·q| + |m|)."""
    if t not in SCALES:
        return row
    ts = BLOCK[t][1]
    b = np.frombuffer(row, np.uint8).reshape(-1, ts).copy()
    for o, role in SCALES[t]:
        v = np.abs(b[:, o : o + 2].copy().view(np.float16))
        if role == "min":
            v = -v
        b[:, o : o + 2] = v.view(np.uint8)
    return b.tobytes()


def dequant_act(t: str, act: bytes, n: int) -> np.ndarray:
    """Activation values as float64 (â_i = d·q_i)."""
    a = np.frombuffer(act, np.uint8)
    if t == "F32":
        return a.view(np.float32).astype(np.float64)
    if t == "F16":
        return a.view(np.float16).astype(np.float64)
    if t == "BF16":
        return (a.view(np.uint16).astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    ts = BLOCK[t][1]
    b = a.reshape(-1, ts)
    if t == "Q8_K":
        d = b[:, 0:4].copy().view(np.float32)[:, 0].astype(np.float64)
        q = b[:, 4:260].view(np.int8).astype(np.float64)
    else:
        off = 2 if t == "Q8_0" else 4
        d = b[:, 0:2].copy().view(np.float16)[:, 0].astype(np.float64)
        q = b[:, off : off + 32].view(np.int8).astype(np.float64)
    return (d[:, None] * q).reshape(-1)


def dot_bound(t: str, n: int, row: bytes, act: bytes, y_mag: np.ndarray, a: np.ndarray) -> float:
    """Bound on |vec_dot − Σ ŷ_i·â_i| (ŷ the f32 dequantized weight, â the activation):

        (nb + 8)·u·Σ_i T_i·|â_i|  [+ Σ_blocks |m|·|s|·u16 for Q8_1 pairs]

    nb: blocks of the row (32-element halves for Q2_0; ⌊n/16⌋ + n mod 16 for float rows);
    u = 2^-24;
    T_i = |ŷ| of the magnitude row (twice that for IQ1_S/IQ1_M, whose ±1/8 delta is added
    to the grid value). The Q8_1 term is the f16 rounding of s = f16(d_a·Σq), which ggml's
    format stores in place of the exact sum."""
    bs, ts = BLOCK[t]
    nb = n // 16 + n % 16 if bs == 1 else n // min(bs, 32) if t == "Q2_0" else n // bs
    k = 2.0 if t in ("IQ1_S", "IQ1_M") else 1.0
    bound = (nb + 8) * U * float(np.sum(k * np.abs(y_mag) * np.abs(a)))
    if ACT[t] == "Q8_1":
        wb = np.frombuffer(row, np.uint8).reshape(-1, ts)
        ab = np.frombuffer(act, np.uint8).reshape(-1, 36)
        m = wb[:, 2:4].copy().view(np.float16)[:, 0].astype(np.float64)
        s = ab[:, 2:4].copy().view(np.float16)[:, 0].astype(np.float64)
        bound += float(np.sum(np.abs(m) * np.abs(s))) * U16
    return bound
