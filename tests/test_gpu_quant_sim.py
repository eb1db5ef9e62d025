"""The matrix-vector kernels (cuda/mmvq.cu) run on the CPU under cuda/tests/sim.h (emulated
blocks, barriers and warp shuffles), against gguf-py's dequantization: y = W·x̂ with x̂ the
int8 activation the CPU path makes for the weight type (block_q8a from gpu_quant_ref.act_parts,
i.e. `_core.quantize_act`: q8_0 or q8_K; f32 x for float weights). Every variant the
launcher picks from is checked: warp per row (`strata_mmvq_<ty>`), up to 8 tokens (`_n8`),
one row per block with the items over 4 warps (`_r1`, matrices of few rows) and warp per row
on activations staged in shared memory (`_st`, the largest matrices: equal to warp per row).

Bound: |y − W·x̂| ≤ 2⁻⁹·Σ|W|·|x̂| + 1e-6 (f32 scales and summation), and the row-per-block
kernel agrees with the warp-per-row one to f32 summation order (2⁻¹⁸·Σ|W|·|x̂|).

Needs g++ with C++20 (<barrier>); built once per source hash into the pytest cache.
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
from cuda_sim import build_sim
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize, quantize
from gpu_quant_ref import act_kind, act_parts

SOURCES = ["tests/sim.h", "tests/quant_sim.cpp", "mmvq.cu", "moe.cu", "vecdot.cuh", "qdecode.cuh"]
SOURCES += ["common.cuh", "quant_tables.cuh"]

U8P = np.ctypeslib.ndpointer(np.uint8, flags="C_CONTIGUOUS")
F32P = np.ctypeslib.ndpointer(np.float32, flags="C_CONTIGUOUS")
INT = ctypes.c_int


@pytest.fixture(scope="module")
def sim(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    dll = build_sim(request, tmp_path_factory, "quant_sim.cpp", SOURCES)
    dll.sim_mmvq.argtypes = [ctypes.c_char_p, INT, U8P, INT, INT, ctypes.c_void_p, F32P, INT]
    dll.sim_mmvq.restype = INT
    return dll


def f16_bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, np.float16).view(np.uint8).reshape(*a.shape, 2)


def weights(ty: str, rng: np.random.Generator, rows: int, k: int) -> np.ndarray:
    """W as GGUF bytes [rows, row_bytes]: F32 values, Q8_0 from gguf-py's quantizer, K-quants
    as random blocks with small finite f16 scales (gguf-py cannot quantize those)."""
    if ty == "F32":
        return rng.normal(0, 1, (rows, k)).astype(np.float32).view(np.uint8)
    if ty == "Q8_0":
        return quantize(rng.normal(0, 1, (rows, k)).astype(np.float32), Q.Q8_0)
    nb = rows * k // 256
    if ty == "Q4_K":  # d, dmin, scales[12], qs[128]
        b = rng.integers(0, 256, (nb, 144), dtype=np.uint8)
        b[:, 0:2] = f16_bits(rng.uniform(0.001, 0.01, nb))
        b[:, 2:4] = f16_bits(rng.uniform(0.001, 0.01, nb))
    else:  # Q6_K: ql[128], qh[64], scales[16] (int8), d
        b = rng.integers(0, 256, (nb, 210), dtype=np.uint8)
        b[:, 208:210] = f16_bits(rng.uniform(0.0005, 0.005, nb))
    return b.reshape(rows, -1)


def q8a_blocks(ty: str, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """x f32 [n, k] → (block_q8a bytes [n, k/32·36]: f32 d, int8 q[32]; x̂ = d·q), quantized
    as the CPU path quantizes the activations of weight type ty."""
    d, q = act_parts(act_kind(ty), x)
    blk = np.zeros((*q.shape[:-1], 36), np.uint8)
    blk[..., 0:4] = np.ascontiguousarray(d, np.float32)[..., None].view(np.uint8)
    blk[..., 4:] = q.astype(np.int8).view(np.uint8)
    xv = (d.astype(np.float64)[..., None] * q).reshape(x.shape)
    return blk.reshape(x.shape[0], -1), xv


CASES = [("F32", 128, 2048), ("Q8_0", 64, 1024), ("Q4_K", 48, 2048), ("Q6_K", 40, 1024)]
CASES += [("Q6_K", 36, 2048)]  # rows of 1680 bytes: `_st` stages them


@pytest.mark.parametrize("ty, rows, k", CASES)
def test_mmvq_variants(sim: ctypes.CDLL, ty: str, rows: int, k: int) -> None:
    rng = np.random.default_rng(11)
    wb = np.ascontiguousarray(weights(ty, rng, rows, k))
    wf = dequantize(wb, Q[ty]).astype(np.float64).reshape(rows, k)
    n_tok = 3
    x = rng.normal(0, 1, (n_tok, k)).astype(np.float32)
    if ty == "F32":
        xa, xv = np.ascontiguousarray(x), x.astype(np.float64)
    else:
        xa, xv = q8a_blocks(ty, x)
        xa = np.ascontiguousarray(xa)
    want = xv @ wf.T  # [n_tok, rows]
    mag = np.abs(xv) @ np.abs(wf).T
    ptr = xa.ctypes.data_as(ctypes.c_void_p)
    name = ty.lower().encode()
    got = {}
    for variant, nt in [(0, 1), (2, 1), (1, n_tok), (3, 1)]:
        y = np.full((nt, rows), np.nan, np.float32)
        assert sim.sim_mmvq(name, variant, wb, rows, k // 32, ptr, y, nt) == 0
        err = np.abs(y - want[:nt]) - (2.0**-9 * mag[:nt] + 1e-6)
        assert err.max() <= 0, (variant, float(err.max()))
        got[variant] = y
    assert np.all(np.abs(got[2] - got[0]) <= 2.0**-18 * mag[:1] + 1e-7)
    assert np.array_equal(got[3], got[0])  # staging moves the activations, not the sums
