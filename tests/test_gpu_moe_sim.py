"""The routed-expert decode kernels (cuda/moe.cu: gate/up + SwiGLU, down into the residual) run
on the CPU under cuda/tests/sim.h, against gguf-py's dequantization and the CPU path's int8
activations (block_q8a, as in test_gpu_quant_sim.py). Every variant is checked: the launcher's
kernels (gate/up: 8 rows a block, the activations and each warp's gate and up rows staged in
shared memory; down: 4 rows a block, slots over up to 8 warps), gate/up staging only the
activations (`_act`) and the earlier forms (`_v0`). The cases cover absent experts (null
pointer, id −1), top_k above the down kernel's 8 warps, rows past the last block's end and rows
whose items do not fill a lane's pass.

Bounds (f32 scales and summation): gate/up: |act − silu(g)·u| ≤ 2⁻⁹·(1.2·|u|·Σ|Wg|·|x̂| +
|silu(g)|·Σ|Wu|·|x̂|) + 1e-6; down: |y − y₀ − Σ_j w_j·Wd_j·â_j| ≤ 2⁻⁹·Σ_j |w_j|·Σ|Wd_j|·|â_j| + 1e-6.
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
from cuda_sim import build_sim
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize
from test_gpu_quant_sim import SOURCES, q8a_blocks, weights

F32P = np.ctypeslib.ndpointer(np.float32, flags="C_CONTIGUOUS")
U64P = np.ctypeslib.ndpointer(np.uint64, flags="C_CONTIGUOUS")
I32P = np.ctypeslib.ndpointer(np.int32, flags="C_CONTIGUOUS")
INT, VP = ctypes.c_int, ctypes.c_void_p
N_EXPERT = 5
ABSENT = 3  # this expert's pointer is 0


@pytest.fixture(scope="module")
def sim(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    dll = build_sim(request, tmp_path_factory, "quant_sim.cpp", SOURCES)
    dll.sim_moe_gate_up.argtypes = [ctypes.c_char_p, INT, U64P, U64P, INT, INT, I32P, INT, VP]
    dll.sim_moe_gate_up.argtypes += [F32P, INT]
    dll.sim_moe_gate_up.restype = INT
    dll.sim_moe_down.argtypes = [ctypes.c_char_p, INT, U64P, INT, INT, I32P, F32P, INT, VP, F32P]
    dll.sim_moe_down.argtypes += [INT]
    dll.sim_moe_down.restype = INT
    dll.sim_moe_gate_up_oai.argtypes = [ctypes.c_char_p, U64P, U64P, INT, INT, I32P, INT, VP]
    dll.sim_moe_gate_up_oai.argtypes += [F32P, INT, F32P, F32P, ctypes.c_float, ctypes.c_float]
    dll.sim_moe_gate_up_oai.restype = INT
    return dll


def experts(
    ty: str, rng: np.random.Generator, rows: int, k: int
) -> tuple[list[np.ndarray], np.ndarray, np.ndarray]:
    """(the experts' GGUF bytes (kept alive), their pointer table u64 [N_EXPERT] with ABSENT's
    0, their values f64 [N_EXPERT, rows, k])."""
    make = mxfp4 if ty == "MXFP4" else (lambda r, n, m: weights(ty, r, n, m))
    mats = [np.ascontiguousarray(make(rng, rows, k)) for _ in range(N_EXPERT)]
    ptrs = np.array([m.ctypes.data for m in mats], np.uint64)
    ptrs[ABSENT] = 0
    vals = np.stack([dequantize(m, Q[ty]).astype(np.float64).reshape(rows, k) for m in mats])
    return mats, ptrs, vals


def mxfp4(rng: np.random.Generator, rows: int, k: int) -> np.ndarray:
    """Random MXFP4 rows [rows, k/32·17]: E8M0 exponents 2^-10..2^-2 (halved), any nibbles."""
    b = rng.integers(0, 256, (rows * k // 32, 17), dtype=np.uint8)
    b[:, 0] = rng.integers(118, 127, b.shape[0])
    return b.reshape(rows, -1)


def activations(ty: str, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """x f32 [n, k] in the kernels' form (int8 blocks, f32 for F32) and its values x̂."""
    if ty == "F32":
        return np.ascontiguousarray(x), x.astype(np.float64)
    xa, xv = q8a_blocks(ty, x)
    return np.ascontiguousarray(xa), xv


def routing(rng: np.random.Generator, n_tok: int, top_k: int) -> np.ndarray:
    """ids i32 [n_tok, top_k]: every expert, the absent one and −1 among them."""
    ids = rng.integers(0, N_EXPERT, (n_tok, top_k)).astype(np.int32)
    ids[0, 0], ids[-1, -1] = ABSENT, -1
    return ids


def silu(v: np.ndarray) -> np.ndarray:
    return v / (1.0 + np.exp(-v))


@pytest.mark.parametrize("ty", ["Q4_K", "Q6_K", "Q8_0", "F32"])
def test_moe_gate_up_variants(sim: ctypes.CDLL, ty: str) -> None:
    rng = np.random.default_rng(5)
    # Q4_K, Q6_K: h = 1280, 40 items (lanes 0..7 take two, the rest one); Q4_K's rows (720
    # bytes) are staged, Q6_K's (1050) not; Q8_0: h = 1024, rows of 1088 bytes staged.
    # ff = 20: the last block half full
    n_tok, top_k, ff = 2, 3, 20
    h = 1024 if ty == "Q8_0" else 1280
    _gm, gp, gv = experts(ty, rng, ff, h)  # _gm, _um: the bytes behind the pointers
    _um, up, uv = experts(ty, rng, ff, h)
    x = rng.normal(0, 1, (n_tok, h)).astype(np.float32)
    xa, xv = activations(ty, x)
    ids = routing(rng, n_tok, top_k)
    want = np.zeros((n_tok * top_k, ff))
    bound = np.full((n_tok * top_k, ff), 1e-6)
    for p, e in enumerate(ids.reshape(-1)):
        if e < 0 or e == ABSENT:
            continue
        t = p // top_k
        g, u = gv[e] @ xv[t], uv[e] @ xv[t]
        want[p] = silu(g) * u
        mg, mu = np.abs(gv[e]) @ np.abs(xv[t]), np.abs(uv[e]) @ np.abs(xv[t])
        bound[p] += 2.0**-9 * (1.2 * np.abs(u) * mg + np.abs(silu(g)) * mu)
    ran = 0
    for variant in (0, 1, 2):
        act = np.full((n_tok * top_k, ff), np.nan, np.float32)
        rc = sim.sim_moe_gate_up(
            ty.lower().encode(), variant, gp, up, ff, h // 32, ids, top_k,
            xa.ctypes.data_as(VP), act, n_tok,
        )  # fmt: skip
        if rc == -2:
            assert ty not in ("Q4_K", "Q6_K"), f"{ty} lacks gate/up variant {variant}"
            continue
        assert rc == 0
        err = np.abs(act - want) - bound
        assert err.max() <= 0, (variant, float(err.max()))
        ran += 1
    assert ran == (3 if ty in ("Q4_K", "Q6_K") else 1)


@pytest.mark.parametrize("ty", ["Q4_K", "Q6_K", "Q8_0", "F32"])
@pytest.mark.parametrize("top_k", [3, 10])
def test_moe_down_variants(sim: ctypes.CDLL, ty: str, top_k: int) -> None:
    rng = np.random.default_rng(6 + top_k)
    # ff = 768: 24 items (8 lanes a row take 3); Q8_0 also 288 (9 items: passes part empty);
    # h = 10 rows: the last block of 4 half full
    n_tok, h = 2, 10
    ff = 288 if ty == "Q8_0" else 768
    _mats, ptrs, vals = experts(ty, rng, h, ff)  # _mats: the bytes behind the pointers
    a = rng.normal(0, 1, (n_tok * top_k, ff)).astype(np.float32)
    aa, av = activations(ty, a)
    ids = routing(rng, n_tok, top_k)
    wts = rng.uniform(0.05, 0.5, (n_tok, top_k)).astype(np.float32)
    y0 = rng.normal(0, 1, (n_tok, h)).astype(np.float32)
    want = y0.astype(np.float64)
    bound = np.full((n_tok, h), 1e-6) + 2.0**-23 * np.abs(want)
    for t in range(n_tok):
        for j in range(top_k):
            e, p = ids[t, j], t * top_k + j
            if e < 0 or e == ABSENT:
                continue
            want[t] += float(wts[t, j]) * (vals[e] @ av[p])
            bound[t] += 2.0**-9 * float(wts[t, j]) * (np.abs(vals[e]) @ np.abs(av[p]))
    ran = 0
    for variant in (0, 2):
        y = y0.copy()
        rc = sim.sim_moe_down(
            ty.lower().encode(), variant, ptrs, h, ff // 32, ids, wts, top_k,
            aa.ctypes.data_as(VP), y, n_tok,
        )  # fmt: skip
        if rc == -2:
            assert ty not in ("Q4_K", "Q6_K"), f"{ty} lacks down variant {variant}"
            continue
        assert rc == 0
        err = np.abs(y - want) - bound
        assert err.max() <= 0, (variant, float(err.max()))
        ran += 1
    assert ran == (2 if ty in ("Q4_K", "Q6_K") else 1)


def swiglu_oai(g: np.ndarray, u: np.ndarray, alpha: float, limit: float) -> np.ndarray:
    x, y = np.minimum(g, limit), np.clip(u, -limit, limit)
    return x / (1.0 + np.exp(-alpha * x)) * (y + 1.0)


@pytest.mark.parametrize("ty", ["MXFP4", "Q8_0"])
def test_moe_gate_up_oai(sim: ctypes.CDLL, ty: str) -> None:
    """gpt-oss's experts (ggml's swiglu_oai on the biased projections): the gate launch, then
    up with the biases and the clamp, against numpy on gguf-py's dequantization; the weights
    are scaled so that both clamps (g above 7, u beyond ±7) are reached."""
    rng = np.random.default_rng(9)
    n_tok, top_k, ff, h, alpha, limit = 3, 2, 20, 1024, 1.702, 7.0
    _gm, gp, gv = experts(ty, rng, ff, h)
    _um, up, uv = experts(ty, rng, ff, h)
    x = rng.normal(0, 1, (n_tok, h)).astype(np.float32)
    x *= np.float32(8.0 / np.sqrt(np.mean((gv[0] @ x.T.astype(np.float64)) ** 2)))
    xa, xv = activations(ty, x)
    ids = routing(rng, n_tok, top_k)
    gb = rng.normal(0, 1, (N_EXPERT, ff)).astype(np.float32)
    ub = rng.normal(0, 1, (N_EXPERT, ff)).astype(np.float32)
    want = np.zeros((n_tok * top_k, ff))
    bound = np.full((n_tok * top_k, ff), 1e-5)
    clamped = 0
    for p, e in enumerate(ids.reshape(-1)):
        if e < 0 or e == ABSENT:
            continue
        t = p // top_k
        g, u = gv[e] @ xv[t] + gb[e], uv[e] @ xv[t] + ub[e]
        want[p] = swiglu_oai(g, u, alpha, limit)
        clamped += int((g > limit).sum() + (np.abs(u) > limit).sum())
        mg, mu = np.abs(gv[e]) @ np.abs(xv[t]), np.abs(uv[e]) @ np.abs(xv[t])
        dg = 1.2 * (np.abs(np.clip(u, -limit, limit)) + 1)  # |∂/∂g| bound
        du = np.abs(swiglu_oai(g, np.zeros_like(u), alpha, limit))  # |∂/∂u|
        bound[p] += 2.0**-9 * (dg * mg + du * mu)
    assert clamped > 0
    act = np.full((n_tok * top_k, ff), np.nan, np.float32)
    rc = sim.sim_moe_gate_up_oai(
        ty.lower().encode(), gp, up, ff, h // 32, ids, top_k, xa.ctypes.data_as(VP), act,
        n_tok, gb, ub, alpha, limit,
    )  # fmt: skip
    assert rc == 0
    err = np.abs(act - want) - bound
    assert err.max() <= 0, float(err.max())
