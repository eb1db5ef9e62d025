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
import hashlib
import shutil
import subprocess
from pathlib import Path
from typing import Any

import gpu_model_ref as ref
import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
CUDA = ROOT / "cuda"
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
    "sim_rope_neox": [F32P, F32P, F32P, I32P, INT, INT, INT, INT],
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
    gxx = shutil.which("g++")
    if gxx is None:
        pytest.skip("g++ is not installed: the CUDA emulation is built with g++")
    h = hashlib.sha256()
    for s in SOURCES:
        h.update((CUDA / s).read_bytes())
    cfg_cache = getattr(request.config, "cache", None)
    if cfg_cache is not None:
        cache = Path(cfg_cache.mkdir("gpu_model_sim"))
    else:
        cache = tmp_path_factory.mktemp("gpu_model_sim")
    lib = cache / f"modelsim-{h.hexdigest()[:16]}.so"
    if not lib.exists():
        tmp = lib.with_suffix(".tmp.so")
        cmd = [gxx, "-std=c++20", "-O1", "-pthread", "-shared", "-fPIC", "-DSTRATA_SIM"]
        cmd += ["-I", str(CUDA), str(CUDA / "tests/model_sim.cpp"), "-o", str(tmp)]
        subprocess.run(cmd, check=True)
        tmp.rename(lib)
    dll = ctypes.CDLL(str(lib))
    for name, args in SIGS.items():
        getattr(dll, name).argtypes = args
        getattr(dll, name).restype = None
    return dll


def f32(a: Any) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32)


def test_norm_rows_and_fused_add(sim: ctypes.CDLL) -> None:
    rng = np.random.default_rng(1)
    rows, n, eps = 3, 300, 1e-6  # n not a multiple of the block: strided tail
    x, y = f32(rng.normal(0, 2, (rows, n))), f32(rng.normal(0, 1, (rows, n)))
    w = f32(rng.normal(1, 0.2, n))
    out = np.zeros_like(x)
    sim.sim_norm_rms(x, w, out, rows, n, eps)
    want = ref.rms_norm(x, w, eps)
    assert np.abs(out - want).max() <= 1e-6 * np.abs(want).max()
    x2 = x.copy()
    sim.sim_norm_add_rms(x2, y, w, out, rows, n, eps)
    assert np.array_equal(x2, x + y)
    want = ref.rms_norm(x + y, w, eps)
    assert np.abs(out - want).max() <= 1e-6 * np.abs(want).max()


def rope_tables(rng: np.random.Generator, n_ctx: int, half: int) -> tuple[np.ndarray, np.ndarray]:
    th = rng.uniform(-np.pi, np.pi, (n_ctx, half))
    return f32(np.cos(th) * 1.1), f32(np.sin(th) * 1.1)  # a YaRN-like magnitude


def test_rope_neox(sim: ctypes.CDLL) -> None:
    rng = np.random.default_rng(2)
    t, nh, d, n_rot, pos0 = 3, 5, 64, 48, 7  # partial rotation: dims ≥ n_rot untouched
    cos, sin = rope_tables(rng, 16, n_rot // 2)
    x = f32(rng.normal(0, 1, (t, nh, d)))
    got = x.copy()
    sim.sim_rope_neox(got, cos, sin, np.array([pos0, 0], np.int32), t, nh, d, n_rot)
    want = ref.rope(x, cos, sin, pos0 + np.arange(t), n_rot)
    assert np.abs(got - want).max() <= 1e-6


@pytest.mark.parametrize("kv", ["f16", "q8_0"])
def test_rope_qkv_writes_cache(sim: ctypes.CDLL, kv: str) -> None:
    rng = np.random.default_rng(3)
    t, nh, nkv, d, n_ctx, eps, pos0, slot = 3, 4, 2, 64, 16, 1e-6, 5, 1
    cos, sin = rope_tables(rng, n_ctx, d // 2)
    q = f32(rng.normal(0, 2, (t, nh, d)))
    k = f32(rng.normal(0, 2, (t, nkv, d)))
    v = f32(rng.normal(0, 1, (t, nkv, d)))
    qn, kn = f32(rng.normal(1, 0.3, d)), f32(rng.normal(1, 0.3, d))
    cache = ref.Cache(kv, 2, nkv, n_ctx, d)
    qg = q.copy()
    sp = np.array([pos0, slot], np.int32)
    sim.sim_rope_qkv(
        ref.KV_TYPES[kv], qg, k, v, qn, kn, cos, sin, sp, cache.k, cache.v,
        cache.slot_stride, t, nh, nkv, d, d, n_ctx, eps,
    )  # fmt: skip
    pos = pos0 + np.arange(t)
    want_q = ref.rope(ref.rms_norm(q, qn, eps), cos, sin, pos, d)
    assert np.abs(qg - want_q).max() <= 2e-6 * np.abs(want_q).max()
    want_k = ref.rope(ref.rms_norm(k, kn, eps), cos, sin, pos, d)
    got_k, got_v = cache.values(slot, n_ctx)
    got_k, got_v = got_k[:, pos].transpose(1, 0, 2), got_v[:, pos].transpose(1, 0, 2)
    if kv == "f16":  # one f16 rounding of a value within f32 error of the reference
        assert np.abs(got_k - want_k).max() <= np.abs(want_k).max() * 2**-10
        assert np.array_equal(got_v, ref.f16_round(v))
    else:  # q8_0: half a step d = amax/127, plus |q| ≤ 127 times the f16 rounding of d
        amax = np.abs(want_k).reshape(t, nkv, -1, 32).max(-1)
        step = amax.repeat(32, -1).reshape(want_k.shape) / 127
        assert np.all(np.abs(got_k - want_k) <= step * (0.5 + 127 * 2**-11) + 1e-6)
        assert np.array_equal(cache.v[slot][:, pos].transpose(1, 0, 2), ref.q8_0_bytes(v))
    other = ref.Cache(kv, 2, nkv, n_ctx, d)
    assert np.array_equal(cache.k[0], other.k[0]), "slot 0 was written"
    mask = np.ones(n_ctx, bool)
    mask[pos] = False
    assert not cache.k[slot][:, mask].any(), "positions outside pos0.. were written"


ATT_CASES = [
    # kv, d, n_head, n_kv, n_ctx, pos0, t, n_split
    ("f16", 64, 4, 2, 512, 300, 1, 4),
    ("f16", 128, 8, 1, 256, 0, 1, 3),
    ("q8_0", 64, 4, 2, 512, 200, 2, 5),
    ("q8_0", 128, 16, 1, 256, 130, 1, 2),
]


@pytest.mark.parametrize("kv, d, nh, nkv, n_ctx, pos0, t, n_split", ATT_CASES)
def test_attention_decode(
    sim: ctypes.CDLL, kv: str, d: int, nh: int, nkv: int, n_ctx: int, pos0: int, t: int,
    n_split: int,
) -> None:  # fmt: skip
    rng = np.random.default_rng(4)
    slot = 1
    cache = ref.Cache(kv, 2, nkv, n_ctx, d)
    cache.fill(rng, slot, pos0 + t, scale=0.3)
    q = f32(rng.normal(0, 1, (t, nh, d)))
    part_o = np.zeros(t * nh * n_split * d, np.float32)
    part_ml = np.zeros(t * nh * n_split * 2, np.float32)
    out = np.zeros((t, nh, d), np.float32)
    sp = np.array([pos0, slot], np.int32)
    sim.sim_attn_decode(
        ref.KV_TYPES[kv], d, q, cache.k, cache.v, cache.slot_stride, sp, part_o, part_ml,
        out, t, nh, nkv, n_ctx, n_split, 1 / np.sqrt(d),
    )  # fmt: skip
    want = ref.attention(q, cache, slot, pos0, q_form="f16" if kv == "f16" else "q8_0")
    err = np.abs(out - want).max()
    assert err <= 2e-5, err


PF_CASES = [
    # kv, d, n_head, n_kv, n_ctx, pos0, t
    ("f16", 64, 4, 2, 256, 0, 70),
    ("f16", 128, 8, 1, 256, 37, 20),
    ("q8_0", 64, 6, 2, 256, 10, 40),  # G = 3: rows of a block span token boundaries
]


@pytest.mark.parametrize("kv, d, nh, nkv, n_ctx, pos0, t", PF_CASES)
def test_attention_prefill(
    sim: ctypes.CDLL, kv: str, d: int, nh: int, nkv: int, n_ctx: int, pos0: int, t: int
) -> None:
    rng = np.random.default_rng(5)
    slot = 0
    cache = ref.Cache(kv, 1, nkv, n_ctx, d)
    cache.fill(rng, slot, pos0 + t, scale=0.3)
    # garbage (NaN bit patterns) past the visible positions must not leak in
    cache.k[slot, :, pos0 + t :] = 0xFF
    cache.v[slot, :, pos0 + t :] = 0xFF
    q = f32(rng.normal(0, 1, (t, nh, d)))
    out = np.zeros((t, nh, d), np.float32)
    sp = np.array([pos0, slot], np.int32)
    sim.sim_attn_prefill(
        ref.KV_TYPES[kv], d, q, cache.k, cache.v, cache.slot_stride, sp, out, t, nh, nkv,
        n_ctx, 1 / np.sqrt(d),
    )  # fmt: skip
    want = ref.attention(q, cache, slot, pos0, q_form="f16", k_form="f16")
    err = np.abs(out - want).max()
    # probabilities enter P·V as f16 (relative 2^-11 each)
    assert err <= 2e-3 * np.abs(want).max(), err


def test_router_topk_and_ties(sim: ctypes.CDLL) -> None:
    rng = np.random.default_rng(6)
    t, e, k = 4, 128, 8
    # distinct logits 0.01 apart (no near-ties), then exact ties in the last token
    logits = f32(np.stack([rng.permutation(e) * 0.01 for _ in range(t)]))
    logits[3, :] = 0.0
    logits[3, [5, 9, 40]] = 1.0
    ids = np.zeros((t, k), np.int32)
    w = np.zeros((t, k), np.float32)
    sim.sim_router_topk(logits, ids, w, t, e, k, 1)
    want_ids, want_w = ref.route(logits, k)
    assert np.array_equal(ids, want_ids)
    assert list(ids[3]) == [5, 9, 40, 0, 1, 2, 3, 4]
    assert np.abs(w - want_w).max() <= 1e-6
    sim.sim_router_topk(logits, ids, w, t, e, k, 0)
    assert np.abs(w - ref.route(logits, k, norm=False)[1]).max() <= 1e-7


def test_argmax_and_add(sim: ctypes.CDLL) -> None:
    rng = np.random.default_rng(7)
    x = f32(rng.normal(0, 1, (3, 1000)))
    x[1, [10, 700]] = 9.0  # a tie: the first index wins
    out = np.zeros(3, np.int32)
    sim.sim_argmax(x, out, 3, 1000)
    assert list(out) == list(x.argmax(1)) and out[1] == 10
    y = f32(rng.normal(0, 1, 1000))
    a = x[0].copy()
    sim.sim_add(a, y, 1000)
    assert np.array_equal(a, x[0] + y)
