"""The quantized GPU kernels on the device (marker gpu): matmul (mmvq), routed experts (moe),
getrows, against strata's CPU dequantization (bit-exact with gguf-py) and float64 numpy.

Weights are fresh random blocks with finite f16 scales (tests/dot_util.random_row, the blocks
tests/test_dot.py uses; for the expert tests scaled to rms 1/√k like real weights, so that the
chained gate/up → down values stay finite); activations are random normals with outliers.

Error bounds (u = 2⁻²⁴), per output element:
- quantized weights: the kernels quantize x as the CPU path does for the weight type (q8_0 or
  q8_K, ggml's vec_dot type); x̂ below is the CPU quantizer's own output (gpu_quant_ref, whose
  equality with the kernels' math test_gpu_quant_host.py checks). Then
  |y − Σ ŵ·x̂| ≤ (k/32 + 10)·u·Σ T·|x̂|, T the magnitude of each weight term (dot_util);
  and against the exact x, additionally Σ |ŵ|·|x − x̂|.
- float weights (F32/F16/BF16): |y − Σ ŵ·x| ≤ (k/32 + 48)·u·Σ |ŵ|·|x|.
- prefill (n_tok > 8, the tensor-core mmq path): ŵ is rounded to f16 (ŵ₁₆), products summed
  in f32 (A = (k/16 + 16)·2⁻²¹ for the sums).
  Quantized weights: the kernels read the CPU's activations x̂ (the same q8_0 / q8_K blocks
  as decode; q exact in f16, each 32-value block's sum scaled by its d in f32):
  |y − Σ ŵ₁₆·x̂| ≤ A·Σ|ŵ₁₆|·|x̂| (checked), hence |y − Σ ŵ·x̂| ≤ (2⁻¹¹ + A)·Σ|ŵ|·|x̂| +
  2⁻²⁴·Σ|x̂| (f16 relative rounding 2⁻¹¹, 2⁻²⁵ absolute for subnormal weights), and against
  the exact x additionally Σ |ŵ|·|x − x̂|.
  Float weights: x times an exact power of two per row, rounded to f16 as well:
  |y − Σ ŵ·x| ≤ (2⁻¹⁰ + 2⁻²⁰ + A)·Σ|ŵ|·|x| + 2⁻²⁴·Σ|x| + 2⁻³⁸·max|x|·Σ|ŵ|.
- getrows: bit-exact.
- moe gate/up: the matmul bounds on g and u, propagated through silu(g)·u (|silu'| ≤ 1.1);
  moe down: from the kernel's own act (returned), the matmul bound per slot, weighted, plus
  (top_k + 2)·u·Σ|terms| for the sums into y and 16·u·Σ_j w_j·Σ T·|act| for the sums over the
  (slot, item) pairs.
"""

from __future__ import annotations

import dot_util
import numpy as np
import pytest
from gpu_quant_ref import act_values
from strata import _core
from strata._core import _testing
from strata.errors import QuantError, ShapeError

_GPU = _core.gpu_status()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not _GPU[0], reason=f"no usable GPU: {_GPU[1]}")]

TYPES = [
    "F32", "F16", "BF16", "Q8_0", "Q4_0", "Q5_0", "IQ4_NL", "MXFP4", "Q2_K", "Q3_K", "Q4_K",
    "Q5_K", "Q6_K", "IQ4_XS", "IQ3_S", "IQ3_XXS", "IQ2_XS",
]  # fmt: skip
FLOAT = {"F32", "F16", "BF16"}
U = 2.0**-24


def dequant(t: str, row: bytes, n: int) -> np.ndarray:
    return _core.dequantize_bytes(t, np.frombuffer(row, np.uint8), n).astype(np.float64)


def scaled_row(t: str, k: int, rng: np.random.Generator, rms: float) -> bytes:
    """A random row (dot_util.random_row) whose dequantized values have root-mean-square about
    `rms`: every f16 scale field is multiplied by one factor (the values are linear in them)."""
    if t in FLOAT:
        x = dot_util.random_act_f32(rng, k) * np.float32(rms)
        if t == "F32":
            return x.tobytes()
        if t == "F16":
            return x.astype(np.float16).tobytes()
        return (x.view(np.uint32) >> 16).astype(np.uint16).tobytes()
    row = dot_util.random_row(t, k, rng)
    c = rms / float(np.sqrt(np.mean(dequant(t, row, k) ** 2)))
    b = np.frombuffer(row, np.uint8).reshape(-1, dot_util.BLOCK[t][1]).copy()
    if t == "MXFP4":  # its E8M0 exponent: the nearest power of two of the factor
        e = b[:, 0].astype(np.int64) + int(np.round(np.log2(c)))
        b[:, 0] = np.clip(e, 2, 254).astype(np.uint8)
        return b.tobytes()
    for o, _ in dot_util.SCALES[t]:
        v = b[:, o : o + 2].copy().view(np.float16).astype(np.float64) * c
        b[:, o : o + 2] = v.astype(np.float16).view(np.uint8)
    return b.tobytes()


def weights(
    t: str, rows: int, k: int, rng: np.random.Generator, rms: float | None = None
) -> tuple[bytes, np.ndarray, np.ndarray]:
    """(GGUF bytes, dequantized W f64 [rows, k], term magnitudes T [rows, k]). With `rms`,
    rows scaled to that root-mean-square (scaled_row), as real weights are."""
    if rms is None:
        rs = [dot_util.random_row(t, k, rng) for _ in range(rows)]
    else:
        rs = [scaled_row(t, k, rng, rms) for _ in range(rows)]
    w = np.stack([dequant(t, r, k) for r in rs])
    mag = np.abs(np.stack([dequant(t, dot_util.magnitude_row(t, r), k) for r in rs]))
    return b"".join(rs), w, mag


def matmul_bound(
    t: str, k: int, w: np.ndarray, mag: np.ndarray, x: np.ndarray, prefill: bool
) -> np.ndarray:
    """Bound on |y − x·ŵᵀ| for x f64 [n, k] (the activations as given)."""
    if prefill and t not in FLOAT:
        xh = act_values(t, x)
        rel = 2.0**-11 + (k / 16 + 16) * 2.0**-21
        return (
            rel * (np.abs(xh) @ np.abs(w).T)
            + 2.0**-24 * np.abs(xh).sum(axis=1, keepdims=True)
            + np.abs(x - xh) @ np.abs(w).T
        )
    if prefill:
        rel = 2.0**-10 + 2.0**-20 + (k / 16 + 16) * 2.0**-21
        amax = np.abs(x).max(axis=1, keepdims=True)
        return (
            rel * (np.abs(x) @ np.abs(w).T)
            + 2.0**-24 * np.abs(x).sum(axis=1, keepdims=True)
            + 2.0**-38 * amax * np.abs(w).sum(axis=1)[None, :]
        )
    if t in FLOAT:
        return (k / 32 + 48) * U * (np.abs(x) @ np.abs(w).T)
    xh = act_values(t, x)
    return (k / 32 + 10) * U * (np.abs(xh) @ mag.T) + np.abs(x - xh) @ np.abs(w).T


@pytest.mark.parametrize("n_tok", [1, 3, 8, 37, 512])
@pytest.mark.parametrize("t", TYPES)
def test_matmul(t: str, n_tok: int) -> None:
    # one token over 67 rows: the row-per-block kernel (`_r1`, fewer than 4·SMs·4 rows)
    check_matmul(t, 67, n_tok)


@pytest.mark.parametrize("t", ["Q4_K", "Q6_K", "Q8_0", "F32"])
def test_matmul_warp_per_row(t: str) -> None:
    # more than 4·SMs·4 rows (2112 on an H200), one token: the warp-per-row kernel
    check_matmul(t, 4 * int(_core.gpu_info()["sm_count"]) * 4 + 3, 1)


@pytest.mark.parametrize("t", ["Q4_K", "Q6_K", "Q8_0"])
def test_matmul_staged(t: str) -> None:
    # at least 16·SMs·4 rows, one token: warp per row on x staged in shared memory (`_st`)
    check_matmul(t, 16 * int(_core.gpu_info()["sm_count"]) * 4 + 5, 1)


def check_matmul(t: str, rows: int, n_tok: int) -> None:
    rng = np.random.default_rng([n_tok, *t.encode()])
    k = 1024
    wb, w, mag = weights(t, rows, k, rng)
    x = np.stack([dot_util.random_act_f32(rng, k) for _ in range(n_tok)])
    y = _testing.gpu_matmul(t, wb, rows, k, x).astype(np.float64)
    assert y.shape == (n_tok, rows)
    x64 = x.astype(np.float64)
    err = np.abs(y - x64 @ w.T)
    prefill = n_tok > 8
    bound = matmul_bound(t, k, w, mag, x64, prefill)
    ratio = float(np.max(err / bound))
    print(f"{t} n_tok={n_tok}: max err/bound {ratio:.3g}, max rel err "
          f"{float(np.max(err) / np.max(np.abs(x64 @ w.T))):.3g}")  # fmt: skip
    assert np.all(err <= bound), f"{t} n_tok={n_tok}: err/bound up to {ratio:.3g}"
    if t not in FLOAT and not prefill:  # the tight bound around the CPU's own activations
        xh = act_values(t, x64)
        tight = (k / 32 + 10) * U * (np.abs(xh) @ mag.T)
        assert np.all(np.abs(y - xh @ w.T) <= tight), t
    if t not in FLOAT and prefill:  # the CPU's activations times the f16-rounded weights
        xh = act_values(t, x64)
        w16 = w.astype(np.float16).astype(np.float64)
        tight = (k / 16 + 16) * 2.0**-21 * (np.abs(xh) @ np.abs(w16).T) + 1e-30
        r = float(np.max(np.abs(y - xh @ w16.T) / tight))
        print(f"{t} n_tok={n_tok}: around the CPU activations: max err/bound {r:.3g}")
        assert r <= 1, f"{t} n_tok={n_tok}: err/bound {r:.3g} around the CPU's activations"


@pytest.mark.parametrize("t", TYPES)
def test_get_rows(t: str) -> None:
    rng = np.random.default_rng([99, *t.encode()])
    rows, k = 19, 512
    rs = [dot_util.random_row(t, k, rng) for _ in range(rows)]
    want = np.stack([_core.dequantize_bytes(t, np.frombuffer(r, np.uint8), k) for r in rs])
    ids = rng.integers(0, rows, 40).astype(np.int32)
    ids[[3, 7]] = [-1, rows]  # out of range: zeros
    got = _testing.gpu_get_rows(t, b"".join(rs), rows, k, ids)
    assert got.shape == (40, k)
    ok = (ids >= 0) & (ids < rows)
    assert np.array_equal(got[ok].view(np.uint32), want[ids[ok]].view(np.uint32)), t
    assert np.all(got[~ok] == 0)


def silu(v: np.ndarray) -> np.ndarray:
    return v / (1.0 + np.exp(-v))


def run_moe(tg: str, tu: str, td: str, n_tok: int, seed: int) -> None:
    rng = np.random.default_rng([seed, n_tok, *tg.encode(), *tu.encode(), *td.encode()])
    n_exp, top_k, h, ff = 6, 4, 512, 256
    absent = 2  # expert 2 has a 0 pointer in every table
    # Realistic magnitudes (rms 1/√k): with the raw random scales of test_matmul, silu(g)·u
    # and then the down projection overflow f32 (and q8_0's f16 scale) in the reference too.
    gate = [weights(tg, ff, h, rng, h**-0.5) for _ in range(n_exp)]
    up = [weights(tu, ff, h, rng, h**-0.5) for _ in range(n_exp)]
    down = [weights(td, h, ff, rng, ff**-0.5) for _ in range(n_exp)]
    ids = rng.integers(0, n_exp, (n_tok, top_k)).astype(np.int32)  # repeats included
    ids[0, :2] = [absent, 1]
    if n_tok > 1:
        ids[1, :] = 3  # one token routed to the same expert in every slot
    wts = rng.random((n_tok, top_k)).astype(np.float32)
    x = np.stack([dot_util.random_act_f32(rng, h) for _ in range(n_tok)])
    y0 = rng.standard_normal((n_tok, h)).astype(np.float32)

    def table(ws: list[tuple[bytes, np.ndarray, np.ndarray]]) -> list[bytes | None]:
        return [None if e == absent else ws[e][0] for e in range(n_exp)]

    act, y = _testing.gpu_moe(
        tg, tu, td, table(gate), table(up), table(down), ff, h, ids, wts, x, y0
    )
    prefill = n_tok > 8  # the grouped tensor-core path
    assert act.shape == (n_tok, top_k, ff) and y.shape == (n_tok, h)
    x64 = x.astype(np.float64)
    for t in range(n_tok):
        want_y = y0[t].astype(np.float64)
        terms = np.abs(want_y)
        y_bound = np.zeros(h)
        for j in range(top_k):
            e = int(ids[t, j])
            if e == absent:
                assert np.all(act[t, j] == 0), (t, j)
                continue
            g = gate[e][1] @ x64[t]
            u = up[e][1] @ x64[t]
            bg = matmul_bound(tg, h, gate[e][1], gate[e][2], x64[t : t + 1], prefill)[0]
            bu = matmul_bound(tu, h, up[e][1], up[e][2], x64[t : t + 1], prefill)[0]
            want = silu(g) * u
            bound = 1.1 * bg * (np.abs(u) + bu) + (np.abs(silu(g)) + 1.1 * bg) * bu
            bound += 8 * U * np.abs(want) + 1e-30
            err = np.abs(act[t, j] - want)
            assert np.all(err <= bound), (
                f"act ({t}, {j}): err/bound {float(np.max(err / bound)):.3g}"
            )
            a = act[t, j].astype(np.float64)[None, :]
            d = (down[e][1] @ a[0]) * float(wts[t, j])
            want_y = want_y + d
            terms = terms + np.abs(d)
            y_bound += (
                float(wts[t, j]) * matmul_bound(td, ff, down[e][1], down[e][2], a, prefill)[0]
            )
            # The decode kernel sums w·(item dot) over all (slot, item) pairs of a lane and
            # the warp: rounding relative to the element-level magnitudes.
            y_bound += 16 * U * float(wts[t, j]) * (np.abs(a) @ down[e][2].T)[0]
        y_bound += (top_k + 2) * U * terms + 1e-30
        err = np.abs(y[t] - want_y)
        assert np.all(err <= y_bound), f"y[{t}]: err/bound {float(np.max(err / y_bound)):.3g}"


@pytest.mark.parametrize("t", TYPES)
def test_moe_each_type(t: str) -> None:
    run_moe(t, t, t, 3, seed=1)


@pytest.mark.parametrize("n_tok", [1, 8, 37])
def test_moe_q4_k_m_shape(n_tok: int) -> None:
    run_moe("Q4_K", "Q4_K", "Q6_K", n_tok, seed=2)


def test_moe_mixed_gate_up_types() -> None:
    run_moe("Q4_K", "Q5_K", "IQ4_XS", 5, seed=3)
    run_moe("F16", "Q8_0", "F32", 2, seed=4)


def test_bad_shapes_are_typed_errors() -> None:
    x = np.zeros((2, 48), np.float32)
    with pytest.raises(ShapeError):  # k not a multiple of 32: refused by the launcher
        _testing.gpu_matmul("F32", bytes(4 * 48 * 3), 3, 48, x)
    with pytest.raises(ShapeError):  # weight bytes do not match [rows, k]
        _testing.gpu_matmul("Q8_0", bytes(33), 1, 32, np.zeros((1, 32), np.float32))
    with pytest.raises(QuantError):
        _testing.gpu_matmul("Q4_1", bytes(20), 1, 32, np.zeros((1, 32), np.float32))
    with pytest.raises(ShapeError):
        _testing.gpu_matmul("Q8_0", bytes(34), 1, 32, np.zeros((1, 64), np.float32))
    with pytest.raises(ShapeError):
        _testing.gpu_get_rows("Q4_K", bytes(144), 1, 96, np.zeros(2, np.int32))
    ids = np.zeros((1, 2), np.int32)
    w2 = np.zeros((1, 2), np.float32)
    with pytest.raises(ShapeError):  # h not a multiple of the Q4_K block
        _testing.gpu_moe(
            "Q4_K", "Q4_K", "Q4_K", [None], [None], [None], 256, 128, ids, w2,
            np.zeros((1, 128), np.float32), np.zeros((1, 128), np.float32),
        )  # fmt: skip
    assert _testing.gpu_quant_supports("IQ3_S") and not _testing.gpu_quant_supports("IQ1_S")
