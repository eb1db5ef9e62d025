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
    "sim_rope_qkv": [INT, F32P, F32P, F32P, F32P, F32P, F32P, F32P, I32P, U8P, U8P, U64]
    + [INT] * 6
    + [F],
    "sim_attn_decode": [INT, INT, F32P, U8P, U8P, U64, I32P, F32P, F32P, F32P] + [INT] * 5 + [F],
    "sim_attn_prefill": [INT, INT, F32P, U8P, U8P, U64, I32P, F32P] + [INT] * 4 + [F],
    "sim_router_topk": [F32P, I32P, F32P, INT, INT, INT, INT],
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
