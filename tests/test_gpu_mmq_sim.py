"""The prefill kernels (cuda/mmq.cu dense, cuda/moe_mmq.cu grouped experts) run on the CPU
under cuda/tests/sim.h with the kernel sequence of their Rust launchers (quant_mmq.rs), and
must feed the tensor cores the CPU path's own activations for quantized weights: x̂ = d·q from
`_core.quantize_act` (q8_0 or q8_K by the weight's ggml vec_dot type), as decode does.

- Probes, bit for bit: weights that are the identity (one 1.0 per row) make the kernels' output
  the activations they were fed: y = x̂ exactly, i.e. f32(d·q) of the CPU's blocks (for q8_0
  also gguf-py's dequantization of those blocks); the int8 blocks the launch sequence wrote are
  the CPU's own. Float weights: y = f16(x·s)/s with s the row's power of two.
- Random weights: |y − Σ f16(ŵ)·x̂| ≤ (k/32 + 40)·2⁻²⁴·Σ|f16(ŵ)|·|x̂| (exact products, f32 sums
  of 32 per block, the block scale, k/32 block sums), a bound the unquantized x breaks.
- Experts (grouped by id, token tiles, absent experts): with identity gate and up, act =
  silu(x̂)·x̂ (to expf's rounding); with an identity down, its per-pair outputs are the
  SwiGLU rows quantized as the CPU does, bit for bit.

Needs g++ with C++20 (<barrier>); built once per source hash into the pytest cache.
"""

from __future__ import annotations

import ctypes

import dot_util
import numpy as np
import pytest
from cuda_sim import build_sim
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize
from gpu_quant_ref import act_kind, act_parts
from strata import _core

SOURCES = ["tests/sim.h", "tests/mmq_sim.cpp", "mmq.cu", "mmq.cuh", "moe_mmq.cu", "quantize.cu"]
SOURCES += ["vecdot.cuh", "qdecode.cuh", "common.cuh", "quant_tables.cuh"]

U8P = np.ctypeslib.ndpointer(np.uint8, flags="C_CONTIGUOUS")
F32P = np.ctypeslib.ndpointer(np.float32, flags="C_CONTIGUOUS")
I32P = np.ctypeslib.ndpointer(np.int32, flags="C_CONTIGUOUS")
U64P = np.ctypeslib.ndpointer(np.uint64, flags="C_CONTIGUOUS")
INT, STR, FLT = ctypes.c_int, ctypes.c_char_p, ctypes.c_float
U = 2.0**-24


@pytest.fixture(scope="module")
def sim(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    dll = build_sim(request, tmp_path_factory, "mmq_sim.cpp", SOURCES)
    dll.sim_matmul_prefill.argtypes = [STR, U8P, INT, INT, F32P, F32P, INT, F32P, U8P]
    work = [I32P, I32P, I32P, F32P, U8P]  # order, tiles (int4), n_tiles, scales, blocks
    dll.sim_moe_gate_up_prefill.argtypes = [STR, STR, U64P, U64P, INT, INT, I32P, INT, F32P, INT]
    dll.sim_moe_gate_up_prefill.argtypes += [F32P, *work]
    dll.sim_moe_down_prefill.argtypes = [STR, U64P, INT, INT, I32P, F32P, INT, F32P, INT, F32P]
    dll.sim_moe_down_prefill.argtypes += [F32P, *work]
    dll.sim_moe_gate_up_oai_prefill.argtypes = [STR, U64P, U64P, INT, INT, I32P, INT, F32P, INT]
    dll.sim_moe_gate_up_oai_prefill.argtypes += [F32P, *work, F32P, F32P, FLT, FLT]
    dll.sim_moe_bias.argtypes = [U64P, INT, I32P, F32P, F32P, INT, INT, F32P, INT]
    dll.sim_moe_bias.restype = None
    names = ("sim_matmul_prefill", "sim_moe_gate_up_prefill", "sim_moe_down_prefill")
    for f in (*names, "sim_moe_gate_up_oai_prefill"):
        getattr(dll, f).restype = INT
    return dll


def selector(ty: str, cols: np.ndarray, k: int) -> np.ndarray:
    """GGUF bytes [rows, row_bytes] of W [len(cols), k] with W[r, cols[r]] = 1, else 0 (W·x
    picks x's values at cols); checked against gguf-py's dequantization."""
    rows = len(cols)
    if ty == "F32":
        w = np.zeros((rows, k), np.float32)
        w[np.arange(rows), cols] = 1
        w = w.view(np.uint8)
    elif ty == "Q8_0":  # d f16, q[32]
        b = np.zeros((rows, k // 32, 34), np.uint8)
        b[:, :, 0:2] = np.array([1.0], np.float16).view(np.uint8)
        for r, c in enumerate(cols):
            b[r, c // 32, 2 + c % 32] = 1
        w = b.reshape(rows, -1)
    elif ty == "Q4_K":  # d, dmin, scales[12] (6-bit sc/m), qs[128]; value d·sc·q − dmin·m
        b = np.zeros((rows, k // 256, 144), np.uint8)
        b[:, :, 0:2] = np.array([1.0], np.float16).view(np.uint8)
        b[:, :, 4:8] = 1  # sc = 1, m = 0 of sub-blocks 0..3
        b[:, :, 12:16] = 1  # sc = 1, m = 0 of sub-blocks 4..7
        for r, c in enumerate(cols):
            e = c % 256  # chunk of 64: low nibbles hold its first 32, high nibbles the rest
            b[r, c // 256, 16 + 32 * (e // 64) + e % 32] = 1 << (4 * ((e % 64) // 32))
        w = b.reshape(rows, -1)
    else:
        raise AssertionError(ty)
    want = np.zeros((rows, k), np.float32)
    want[np.arange(rows), cols] = 1
    assert np.array_equal(dequantize(w, Q[ty]).reshape(rows, k), want), ty
    return np.ascontiguousarray(w)


def identity(ty: str, k: int) -> np.ndarray:
    return selector(ty, np.arange(k), k)


# 64 columns spread over 256 (every 32-value block): the rows of a one-tile probe
SPREAD = np.arange(64) * 4 + np.arange(64) % 4


def q8a_bytes(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """block_q8a bytes [..., 36] → (d f32 [...], q int64 [..., 32])."""
    b = blocks.reshape(-1, 36)
    return b[:, :4].copy().view(np.float32)[:, 0], b[:, 4:].view(np.int8).astype(np.int64)


def cpu_act(ty: str, x: np.ndarray) -> np.ndarray:
    """The CPU's activations for weight type ty as f32 values f32(d)·f32(q) [n, k]."""
    d, q = act_parts(act_kind(ty), x)
    return (d.astype(np.float32)[..., None] * q.astype(np.float32)).reshape(x.shape)


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Bit-equal f32 arrays (zeros of either sign count as one value)."""
    z = np.float32(0.0)
    return bool(np.array_equal((a + z).view(np.uint32), (b + z).view(np.uint32)))


def acts(n_tok: int, k: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = np.stack([dot_util.random_act_f32(rng, k) for _ in range(n_tok)])
    x[3] *= 1e-3  # a small row: the int8 blocks carry its scale, no f16 underflow
    return np.ascontiguousarray(x, np.float32)


def matmul(
    sim: ctypes.CDLL, ty: str, w: np.ndarray, rows: int, x: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(y f32 [n_tok, rows], the int8 blocks written) of quant_mmq::matmul_prefill."""
    n_tok, k = x.shape
    y = np.full((n_tok, rows), np.nan, np.float32)
    scales = np.zeros(n_tok, np.float32)
    blocks = np.zeros(n_tok * (k // 32) * 36, np.uint8)
    name = ty.lower().encode()
    assert sim.sim_matmul_prefill(name, w, rows, k // 32, x, y, n_tok, scales, blocks) == 0
    return y, blocks


@pytest.mark.parametrize("ty", ["Q8_0", "Q4_K"])
def test_dense_prefill_feeds_the_cpu_activations(sim: ctypes.CDLL, ty: str) -> None:
    n_tok, k = 40, 256  # > 8 tokens: the tiled path; a partial 64-token tile
    x = acts(n_tok, k, 5)
    y, blocks = matmul(sim, ty, identity(ty, k), k, x)
    # the int8 blocks the launch wrote are the CPU quantizer's
    d, q = q8a_bytes(blocks)
    want_d, want_q = act_parts(act_kind(ty), x)
    assert np.array_equal(d.view(np.uint32), want_d.reshape(-1).astype(np.float32).view(np.uint32))
    assert np.array_equal(q, want_q.reshape(-1, 32))
    # what the tensor cores were fed: exactly x̂ = d·q
    want = cpu_act(ty, x)
    assert same_bits(y, want), f"{ty}: {np.flatnonzero(y != want)[:8]}"
    if ty == "Q8_0":  # the CPU's q8_0 blocks are GGUF Q8_0 blocks: gguf-py dequantizes them
        blk = [np.frombuffer(_core.quantize_act("Q8_0", r), np.uint8) for r in x]
        gg = np.stack([dequantize(b, Q.Q8_0) for b in blk])
        assert same_bits(y, gg.astype(np.float32))
    assert not same_bits(y, x), "the probe tells x̂ from x"


def test_dense_prefill_float_weights_scale_rows(sim: ctypes.CDLL) -> None:
    n_tok, k = 24, 256
    x = acts(n_tok, k, 6)
    y, _ = matmul(sim, "F32", identity("F32", k), k, x)
    _, e = np.frexp(np.abs(x).max(axis=1))
    s = np.ldexp(np.float32(1.0), np.clip(15 - e, -120, 120)).astype(np.float32)[:, None]
    want = (x * s).astype(np.float16).astype(np.float32) / s
    assert same_bits(y, want)


@pytest.mark.parametrize("ty", ["Q4_K", "IQ3_S", "Q8_0"])
def test_dense_prefill_random_weights(sim: ctypes.CDLL, ty: str) -> None:
    rows, k, n_tok = 64, 512, 12
    rng = np.random.default_rng([7, *ty.encode()])
    rs = [dot_util.random_row(ty, k, rng) for _ in range(rows)]
    w = np.ascontiguousarray(np.frombuffer(b"".join(rs), np.uint8).reshape(rows, -1))
    w16 = dequantize(w, Q[ty]).reshape(rows, k).astype(np.float16).astype(np.float64)
    x = acts(n_tok, k, 8)
    y, _ = matmul(sim, ty, w, rows, x)
    xh = cpu_act(ty, x).astype(np.float64)
    bound = (k / 32 + 40) * U * (np.abs(xh) @ np.abs(w16).T) + 1e-30
    ratio = np.abs(y - xh @ w16.T) / bound
    assert ratio.max() <= 1, f"{ty}: err/bound {ratio.max():.3g}"
    # the bound tells the activations apart: the unquantized x breaks it
    assert (np.abs(x.astype(np.float64) @ w16.T - xh @ w16.T) / bound).max() > 10


def expert_ptrs(mats: list[np.ndarray | None]) -> np.ndarray:
    return np.array([0 if m is None else m.ctypes.data for m in mats], np.uint64)


def work(pairs: int, act_rows: int, k: int) -> list[np.ndarray]:
    return [
        np.zeros(pairs, np.int32),
        np.zeros(4 * (pairs // 32 + pairs + 2), np.int32),
        np.zeros(1, np.int32),
        np.zeros(act_rows, np.float32),
        np.zeros(act_rows * (k // 32) * 36, np.uint8),
    ]


def routing(n_tok: int, top_k: int, n_exp: int, seed: int) -> np.ndarray:
    """Ids [n_tok, top_k]: mostly expert 1 (two token tiles of it), one slot without an
    expert, the others random."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, n_exp, (n_tok, top_k)).astype(np.int32)
    ids[:, 0] = 1
    ids[: n_tok - 1, 1] = 1
    ids[0, 2] = -1
    return ids


@pytest.mark.parametrize("tg, tu", [("Q4_K", "Q4_K"), ("Q4_K", "Q8_0")])
def test_moe_gate_up_prefill_feeds_the_cpu_activations(sim: ctypes.CDLL, tg: str, tu: str) -> None:
    n_exp, top_k, h, ff, n_tok = 4, 3, 256, 64, 18  # 54 pairs, 35 of expert 1
    absent = 2
    gate = [None if e == absent else selector(tg, SPREAD, h) for e in range(n_exp)]
    up = [None if e == absent else selector(tu, SPREAD, h) for e in range(n_exp)]
    ids = routing(n_tok, top_k, n_exp, 9)
    x = acts(n_tok, h, 10)
    act = np.full((n_tok, top_k, ff), np.nan, np.float32)
    rc = sim.sim_moe_gate_up_prefill(
        tg.lower().encode(), tu.lower().encode(), expert_ptrs(gate), expert_ptrs(up), ff, h,
        ids, top_k, x, n_tok, act, *work(n_tok * top_k, n_tok, h),
    )  # fmt: skip
    assert rc == 0
    g, u = cpu_act(tg, x)[:, SPREAD], cpu_act(tu, x)[:, SPREAD]
    want = g / (np.float32(1) + np.exp(-g)) * u  # f32, the kernel's silu_mul
    bad = (ids < 0) | (ids == absent)
    assert np.all(act[bad] == 0)
    w = np.broadcast_to(want[:, None, :], act.shape)[~bad]
    err = np.abs(act[~bad] - w)
    assert np.all(err <= 8 * U * np.abs(w)), float((err / (np.abs(w) + 1e-30)).max())
    # the unquantized activations would be seen: their SwiGLU is off by far more
    xr = x[:, SPREAD]
    raw = np.broadcast_to((xr / (1 + np.exp(-xr)) * xr)[:, None, :], act.shape)[~bad]
    assert (np.abs(raw - w) > 64 * U * np.abs(w)).mean() > 0.5


@pytest.mark.parametrize("td", ["Q4_K", "Q8_0"])
def test_moe_down_prefill_feeds_the_cpu_activations(sim: ctypes.CDLL, td: str) -> None:
    n_exp, top_k, h, ff, n_tok = 4, 3, 64, 256, 18
    absent = 2
    down = [None if e == absent else selector(td, SPREAD, ff) for e in range(n_exp)]
    ids = routing(n_tok, top_k, n_exp, 11)
    pairs = n_tok * top_k
    act = acts(pairs, ff, 12)
    wts = np.random.default_rng(13).random((n_tok, top_k)).astype(np.float32)
    y = np.random.default_rng(14).standard_normal((n_tok, h)).astype(np.float32)
    y0 = y.copy()
    out = np.full((pairs, h), np.nan, np.float32)
    rc = sim.sim_moe_down_prefill(
        td.lower().encode(), expert_ptrs(down), h, ff, ids, wts, top_k, act, n_tok, y, out,
        *work(pairs, pairs, ff),
    )  # fmt: skip
    assert rc == 0
    bad = ((ids < 0) | (ids == absent)).reshape(-1)
    assert np.all(out[bad] == 0)
    want = cpu_act(td, act)
    assert same_bits(out[~bad], want[~bad][:, SPREAD]), td
    # the weighted sum into y (f32 sums of top_k terms)
    o = out.reshape(n_tok, top_k, h).astype(np.float64)
    want_y = y0 + np.einsum("tj,tjh->th", wts.astype(np.float64), o)
    mag = np.abs(y0) + np.einsum("tj,tjh->th", wts.astype(np.float64), np.abs(o))
    assert np.all(np.abs(y - want_y) <= (top_k + 2) * U * mag)


def test_moe_gate_up_oai_prefill(sim: ctypes.CDLL) -> None:
    """gpt-oss's grouped prefill: the gate tiles, then up with the gate/up biases and the
    clamped SwiGLU, on selector weights (the projections are the CPU's activations, exactly),
    against numpy's f32 swiglu_oai; both clamps are reached."""
    n_exp, top_k, h, ff, n_tok = 4, 3, 256, 64, 18
    absent, alpha, limit = 2, 1.702, 7.0
    gate = [None if e == absent else selector("Q8_0", SPREAD, h) for e in range(n_exp)]
    ids = routing(n_tok, top_k, n_exp, 15)
    x = acts(n_tok, h, 16) * np.float32(12.0)
    rng = np.random.default_rng(17)
    gb = rng.normal(0, 1, (n_exp, ff)).astype(np.float32)
    ub = rng.normal(0, 1, (n_exp, ff)).astype(np.float32)
    act = np.full((n_tok, top_k, ff), np.nan, np.float32)
    rc = sim.sim_moe_gate_up_oai_prefill(
        b"q8_0", expert_ptrs(gate), expert_ptrs(gate), ff, h, ids, top_k, x, n_tok, act,
        *work(n_tok * top_k, n_tok, h), gb, ub, alpha, limit,
    )  # fmt: skip
    assert rc == 0
    p = cpu_act("Q8_0", x)[:, SPREAD]
    bad = (ids < 0) | (ids == absent)
    assert np.all(act[bad] == 0)
    f = np.float32
    for t, j in zip(*np.nonzero(~bad), strict=True):
        e = ids[t, j]
        g, u = p[t] + gb[e], p[t] + ub[e]
        xg, yu = np.minimum(g, f(limit)), np.clip(u, f(-limit), f(limit))
        with np.errstate(over="ignore"):  # exp overflows to inf for very negative xg: 0
            want = xg / (f(1) + np.exp(f(alpha) * -xg)) * (yu + f(1))
        assert np.allclose(act[t, j], want, rtol=1e-5, atol=1e-6), (t, j)
    assert (p + gb[1] > limit).any() and (np.abs(p + ub[1]) > limit).any()


def test_moe_bias(sim: ctypes.CDLL) -> None:
    """gpt-oss's down bias: Σ_j w_j·bias[e_j] over the slots whose expert is present."""
    n_exp, top_k, h, n_tok = 4, 3, 40, 5
    rng = np.random.default_rng(18)
    ids = rng.integers(0, n_exp, (n_tok, top_k)).astype(np.int32)
    ids[0, 0] = -1
    ptrs = np.array([256, 512, 0, 768], np.uint64)  # expert 2 computed elsewhere
    wts = rng.random((n_tok, top_k)).astype(np.float32)
    bias = rng.normal(0, 1, (n_exp, h)).astype(np.float32)
    y0 = rng.normal(0, 1, (n_tok, h)).astype(np.float32)
    y = y0.copy()
    sim.sim_moe_bias(ptrs, 1, ids, wts, bias, top_k, h, y, n_tok)
    want = y0.astype(np.float64)
    for t in range(n_tok):
        for j in range(top_k):
            if ids[t, j] >= 0 and ptrs[ids[t, j]] != 0:
                want[t] += float(wts[t, j]) * bias[ids[t, j]]
    assert np.allclose(y, want, rtol=1e-6, atol=1e-6)
