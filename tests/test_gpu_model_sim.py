"""The model kernels (cuda/{norm,rope,attention,router,elementwise}.cu) run on the CPU under
cuda/tests/sim.h, an emulation of blocks, barriers, warp shuffles and mma.sync m16n8k16, and
are compared with the numpy references of gpu_model_ref.py. This checks the kernels'
indexing, fragment layouts and numerics on any machine; test_gpu_model.py runs the same
references against the kernels on a GPU.

Needs g++ with C++20 (<barrier>); the library is built once per source hash into the pytest
cache.
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np
import pytest
from cuda_sim import build_sim
from gpu_model_cases import *  # noqa: F403  (the shared test cases)

SOURCES = [
    "model.cuh",
    "tests/sim.h",
    "tests/model_sim.cpp",
    "norm.cu",
    "rope.cu",
    "attention.cu",
    "router.cu",
    "elementwise.cu",
]

F32P = np.ctypeslib.ndpointer(np.float32, flags="C_CONTIGUOUS")
I32P = np.ctypeslib.ndpointer(np.int32, flags="C_CONTIGUOUS")
U8P = np.ctypeslib.ndpointer(np.uint8, flags="C_CONTIGUOUS")
INT, F, U64 = ctypes.c_int, ctypes.c_float, ctypes.c_ulonglong

SIGS: dict[str, list[Any]] = {
    "sim_norm_rms": [F32P, F32P, F32P, INT, INT, F],
    "sim_norm_add_rms": [F32P, F32P, F32P, F32P, INT, INT, F],
    "sim_rope_neox": [F32P, F32P, F32P, I32P, INT, INT, INT, INT, INT],
    "sim_rope_qkv": [INT] + [F32P] * 10 + [I32P, U8P, U8P, U64] + [INT] * 6 + [F] + [INT] * 3,
    "sim_attn_decode": [INT, INT, F32P, U8P, U8P, U64, I32P, F32P, F32P, F32P] + [INT] * 5 + [F],
    "sim_attn_prefill": [INT, INT, F32P, U8P, U8P, U64, I32P, F32P] + [INT] * 4 + [F],
    "sim_router_topk": [F32P, I32P, F32P, INT, INT, INT, INT],
    "sim_router_sigmoid_topk": [F32P, F32P, I32P, F32P, INT, INT, INT, INT, F],
    "sim_ffn_gate": [F32P, F32P, INT, INT],
    "sim_argmax": [F32P, I32P, INT, INT],
    "sim_add": [F32P, F32P, INT],
}


@pytest.fixture(scope="module")
def sim(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    dll = build_sim(request, tmp_path_factory, "model_sim.cpp", SOURCES)
    for name, args in SIGS.items():
        getattr(dll, name).argtypes = args
        getattr(dll, name).restype = None
    return dll


@pytest.fixture(scope="module")
def kern(sim: ctypes.CDLL) -> ctypes.CDLL:
    return sim


# ---- the routing and FFN scales of the other GPU families (emulation only) -------------


def test_router_sigmoid_topk(kern: ctypes.CDLL) -> None:
    """glm4moe's routing (llama.cpp's build_moe_ffn with sigmoid gating, exp_probs_b, weight
    norm and scale): selection by σ + bias, the unbiased σ as weights, in numpy f64."""
    rng = np.random.default_rng(8)
    t, e, k, scale = 5, 160, 8, 2.5
    logits = np.asarray(rng.normal(0, 2, (t, e)), np.float32)
    bias = np.asarray(rng.normal(0, 0.5, e), np.float32)
    logits[4] = 0.0  # exact ties: the lower ids first
    bias[:] = np.where(np.arange(e) % 7 == 0, 0.25, 0.0)
    sig = 1.0 / (1.0 + np.exp(-logits.astype(np.float64)))
    for norm in (1, 0):
        ids = np.zeros((t, k), np.int32)
        w = np.zeros((t, k), np.float32)
        kern.sim_router_sigmoid_topk(logits, bias, ids, w, t, e, k, norm, scale)
        sel = sig + bias
        want = np.argsort(-sel, axis=1, kind="stable")[:, :k]
        assert np.array_equal(ids, want)
        assert list(ids[4]) == [0, 7, 14, 21, 28, 35, 42, 49]
        p = np.take_along_axis(sig, want, 1)
        if norm:
            p = p / p.sum(1, keepdims=True)
        assert np.abs(w - p * scale).max() <= 4e-7 * scale


def test_ffn_gate_scales(kern: ctypes.CDLL) -> None:
    g = np.asarray([-3.0, -0.5, 0.0, 0.25, 4.0, 30.0], np.float32)
    sig = 1.0 / (1.0 + np.exp(-g.astype(np.float64)))
    for mode in (0, 1):  # silu(g)/g (0: the limit 1/2), σ(g)
        w = np.zeros_like(g)
        kern.sim_ffn_gate(g, w, len(g), mode)
        assert np.abs(w - sig).max() <= 2e-7, (mode, w, sig)
