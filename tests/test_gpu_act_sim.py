"""The activation quantize kernels (cuda/quantize.cu: the int8 activations of the GPU's decode
matmuls and experts) run on the CPU under cuda/tests/sim.h, and must give the CPU path's own
activations for the weight type bit for bit: the same f32 scales and int8 values as
`_core.quantize_act` (q8_0 with ggml's x86 rounding, q8_K with its first-largest-element sign).
The warp reductions (max, first index of the largest magnitude) are the kernels' own code.

Needs g++ with C++20 (<barrier>); the library is built once per source hash into the pytest
cache, as test_gpu_model_sim.py does.
"""

from __future__ import annotations

import ctypes

import dot_util
import numpy as np
import pytest
from cuda_sim import build_sim
from gpu_quant_ref import act_parts

SOURCES = ["common.cuh", "qdecode.cuh", "quant_tables.cuh", "quantize.cu", "tests/sim.h"]
SOURCES += ["tests/act_sim.cpp"]


@pytest.fixture(scope="module")
def sim(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    dll = build_sim(request, tmp_path_factory, "act_sim.cpp", SOURCES)
    f32p = np.ctypeslib.ndpointer(np.float32, flags="C_CONTIGUOUS")
    u8p = np.ctypeslib.ndpointer(np.uint8, flags="C_CONTIGUOUS")
    for name in ("sim_quantize_q8_0", "sim_quantize_q8_k"):
        getattr(dll, name).argtypes = [f32p, u8p, ctypes.c_long]
        getattr(dll, name).restype = None
    return dll


def inputs(seed: int) -> np.ndarray:
    """Activations with outliers, a tiny and an all-zero super-block, a negative largest
    element, and equal largest magnitudes of both signs (the first one sets q8_K's sign)."""
    rng = np.random.default_rng(seed)
    x = np.concatenate([dot_util.random_act_f32(rng, 256 * 12), np.zeros(256, np.float32)])
    x[256 * 2 : 256 * 3] *= 1e-3
    x[256 * 4 + 77] = -np.abs(x[256 * 4 : 256 * 5]).max() * 3
    # ties of the largest magnitude (above every other element of the super-block)
    for sb, (i, j) in [(5, (3, 200)), (6, (100, 101)), (7, (40, 9))]:
        m = float(np.abs(x[256 * sb : 256 * (sb + 1)]).max()) * 2
        x[256 * sb + i], x[256 * sb + j] = m, -m
    return x


@pytest.mark.parametrize("kind", ["q8_0", "q8_k"])
def test_quantize_kernel_equals_cpu_quantizer(sim: ctypes.CDLL, kind: str) -> None:
    x = inputs(11)
    out = np.zeros(x.size // 32 * 36, np.uint8)
    if kind == "q8_0":
        sim.sim_quantize_q8_0(x, out, x.size // 32)
    else:
        sim.sim_quantize_q8_k(x, out, x.size // 256)
    b = out.reshape(-1, 36)
    d = b[:, :4].copy().view(np.float32)[:, 0]
    q = b[:, 4:].view(np.int8).astype(np.int64)
    want_d, want_q = act_parts(kind, x)
    bad = np.flatnonzero(d.view(np.uint32) != want_d.astype(np.float32).view(np.uint32))
    assert bad.size == 0, (
        f"{kind}: scales of blocks {bad[:8]} differ: {d[bad[:4]]} vs {want_d[bad[:4]]}"
    )
    bad = np.flatnonzero((q != want_q).any(axis=1))
    assert bad.size == 0, f"{kind}: quants of blocks {bad[:8]} differ"
