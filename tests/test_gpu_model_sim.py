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

import gpu_model_ref as ref
import numpy as np
import pytest
from cuda_sim import build_sim
from gpu_model_cases import *  # noqa: F403  (the shared test cases)
from gpu_model_cases import f32, part_sizes

SOURCES = [
    "model.cuh",
    "tests/sim.h",
    "tests/model_sim.cpp",
    "norm.cu",
    "quantize.cu",
    "actq.cuh",
    "quant_tables.cuh",
    "rope.cu",
    "attention.cu",
    "router.cu",
    "elementwise.cu",
    "vecdot.cuh",
    "qdecode.cuh",
    "common.cuh",
]

F32P = np.ctypeslib.ndpointer(np.float32, flags="C_CONTIGUOUS")
I32P = np.ctypeslib.ndpointer(np.int32, flags="C_CONTIGUOUS")
U8P = np.ctypeslib.ndpointer(np.uint8, flags="C_CONTIGUOUS")
INT, F, U64 = ctypes.c_int, ctypes.c_float, ctypes.c_ulonglong

SIGS: dict[str, list[Any]] = {
    "sim_norm_rms": [F32P, F32P, F32P, INT, INT, F],
    "sim_norm_add_rms": [F32P, F32P, F32P, F32P, INT, INT, F],
    "sim_norm_add_rms_copy": [F32P, F32P, F32P, F32P, F32P, INT, INT, F],
    "sim_norm_rms_act": [F32P, ctypes.c_void_p, F32P, F32P, U8P, INT, INT, F, INT],
    "sim_quantize_act": [F32P, U8P, INT, INT, INT],
    "sim_attn_decode_act": [INT, INT, F32P, U8P, U8P, U64, I32P, F32P, F32P, F32P]
    + [INT] * 5
    + [F, ctypes.c_void_p, INT, U8P, INT, INT],
    "sim_rope_neox": [F32P, F32P, F32P, I32P, INT, INT, INT, INT, INT],
    "sim_rope_qkv": [INT] + [F32P] * 10 + [I32P, U8P, U8P, U64] + [INT] * 6 + [F] + [INT] * 3,
    "sim_attn_decode": [INT, INT, F32P, U8P, U8P, U64, I32P, F32P, F32P, F32P] + [INT] * 5 + [F],
    "sim_attn_prefill": [INT, INT, F32P, U8P, U8P, U64, I32P, F32P] + [INT] * 4 + [F],
    "sim_attn_decode_sw": [INT, INT, F32P, U8P, U8P, U64, I32P, F32P, F32P, F32P]
    + [INT] * 5
    + [F, ctypes.c_void_p, INT],
    "sim_attn_prefill_sw": [INT, INT, F32P, U8P, U8P, U64, I32P, F32P]
    + [INT] * 4
    + [F, ctypes.c_void_p, INT],
    "sim_router_topk": [F32P, I32P, F32P, INT, INT, INT, INT],
    "sim_router_topk_copy": [F32P, I32P, F32P, I32P, F32P, INT, INT, INT, INT],
    "sim_router_f32_topk": [F32P, F32P, F32P, I32P, F32P, I32P, F32P] + [INT] * 4 + [I32P],
    "sim_router_topk_softmax": [F32P, I32P, F32P, INT, INT, INT],
    "sim_add_rows": [F32P, F32P, INT, INT],
    "sim_router_biased_topk": [F32P, F32P, I32P, F32P, INT, INT, INT, INT, INT, F],
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


# ---- the hybrid layer's host copies (emulation only) -----------------------------------


@pytest.mark.parametrize("n", [2048, 301])
def test_add_norm_second_copy_is_the_output(kern: ctypes.CDLL, n: int) -> None:
    """`out2` (the hybrid layer's FFN input for the host) gets exactly the rows of `out`, on
    the register path (n % 4 == 0) and the strided one; x and out are as without it."""
    rng = np.random.default_rng(21)
    rows = 3
    x = np.asarray(rng.normal(0, 2, (rows, n)), np.float32)
    y = np.asarray(rng.normal(0, 1, (rows, n)), np.float32)
    w = np.asarray(rng.normal(1, 0.2, n), np.float32)
    x1, out1 = x.copy(), np.zeros_like(x)
    kern.sim_norm_add_rms(x1, y, w, out1, rows, n, 1e-6)
    x2, out2, copy = x.copy(), np.zeros_like(x), np.full_like(x, np.nan)
    kern.sim_norm_add_rms_copy(x2, y, w, out2, copy, rows, n, 1e-6)
    assert np.array_equal(x2, x1) and np.array_equal(out2, out1)
    assert np.array_equal(copy, out1)


# ---- fused producers of quantized activations (emulation only) -------------------------
ACT = {"q8_0": 0, "q8_k": 1}  # cuda/actq.cuh's ACT_Q8_0 / ACT_Q8_K


def act_ref(kern: ctypes.CDLL, x: np.ndarray, kind: str) -> np.ndarray:
    """x f32 [rows, n] quantized by the separate kernel (`strata_quantize_q8_0/_q8_k`, which
    test_gpu_act_sim.py checks against the CPU quantizer): block_q8a bytes [rows, n / 32, 36]."""
    rows, n = x.shape
    out = np.zeros(rows * n // 32 * 36, np.uint8)
    kern.sim_quantize_act(np.ascontiguousarray(x), out, rows, n, ACT[kind])
    return out


NORM_ACT_CASES = [
    (n, add, kind)
    for kind in ("q8_0", "q8_k")
    for n, add in [(2048, False), (2048, True), (768, True), (8448, True)]
] + [(2880, True, "q8_0")]  # gpt-oss's width: 90 blocks, the last warp's octets part live


@pytest.mark.parametrize("n, add, kind", NORM_ACT_CASES)
def test_norm_act_is_norm_then_quantize(kern: ctypes.CDLL, kind: str, n: int, add: bool) -> None:
    """`strata_norm_rms_act` (the attention norm with its matmuls' activation quantization
    as its tail): out and x bitwise `strata_norm_rms` / `strata_norm_add_rms`, qout bitwise the
    separate quantize kernel on that out, on the register path (n ≤ 8192) and the strided one
    (8448)."""
    rng = np.random.default_rng(31)
    rows, eps = 3, 1e-6
    x, y = f32(rng.normal(0, 2, (rows, n))), f32(rng.normal(0, 1, (rows, n)))
    x[1, 5] = 40.0  # an outlier sets a block's scale
    w = f32(rng.normal(1, 0.2, n))
    want, xw = np.zeros_like(x), x.copy()
    if add:
        kern.sim_norm_add_rms(xw, y, w, want, rows, n, eps)
    else:
        kern.sim_norm_rms(x, w, want, rows, n, eps)
    got, xg = np.full_like(x, np.nan), x.copy()
    q = np.zeros(rows * n // 32 * 36, np.uint8)
    kern.sim_norm_rms_act(xg, y.ctypes.data if add else None, w, got, q, rows, n, eps, ACT[kind])
    assert np.array_equal(got, want) and np.array_equal(xg, xw)
    assert np.array_equal(q, act_ref(kern, want, kind))


# (kv, d, n_head, n_kv, pos0, t, n_split, kind): one live split (the block writes out) and
# several (the last block merges), G·D = 1024, 512 and 256 (q8_K's super-block)
ATT_ACT_CASES = [
    ("f16", 128, 32, 4, 20, 1, 8, "q8_k"),
    ("q8_0", 128, 32, 4, 300, 1, 8, "q8_k"),
    ("f16", 128, 32, 4, 300, 2, 8, "q8_0"),
    ("q8_0", 64, 16, 2, 70, 3, 4, "q8_0"),
    ("f16", 64, 8, 2, 5, 1, 4, "q8_k"),
    ("q8_0", 64, 6, 2, 40, 2, 4, "q8_0"),  # G·D / 32 = 6 blocks: the warp's octets part live
]


@pytest.mark.parametrize("kv, d, nh, nkv, pos0, t, n_split, kind", ATT_ACT_CASES)
def test_attention_decode_act_is_attention_then_quantize(
    kern: ctypes.CDLL, kv: str, d: int, nh: int, nkv: int, pos0: int, t: int, n_split: int,
    kind: str,
) -> None:  # fmt: skip
    """The decode attention with the output projection's activation quantization as its tail:
    out bitwise the plain launch's, qout bitwise the separate quantize kernel on it."""
    rng = np.random.default_rng(32)
    n_ctx, scale = 512, 1 / np.sqrt(d)
    cache = ref.Cache(kv, 1, nkv, n_ctx, d)
    cache.fill(rng, 0, pos0 + t, scale=0.3)
    q = f32(rng.normal(0, 1, (t, nh, d)))
    npo, npml = part_sizes(t, nh, n_split, d)
    sp = np.array([pos0, 0], np.int32)
    outs = []
    for act in (-1, ACT[kind]):
        po, pml = np.zeros(npo, np.float32), np.zeros(npml, np.float32)
        out = np.full((t, nh, d), np.nan, np.float32)
        qo = np.zeros(t * nh * d // 32 * 36, np.uint8)
        kern.sim_attn_decode_act(
            ref.KV_TYPES[kv], d, q, cache.k, cache.v, cache.slot_stride, sp, po, pml, out, t,
            nh, nkv, n_ctx, n_split, scale, None, 0, qo, act, 1,
        )  # fmt: skip
        outs.append((out, qo))
    (plain, _), (got, qo) = outs
    assert np.array_equal(got, plain)
    assert np.array_equal(qo, act_ref(kern, got.reshape(t, nh * d), kind))


# (kv, d, n_head, n_kv, pos0, t, n_split, hs): one live split and several, sinks and a window
HS_CASES = [
    ("f16", 128, 32, 4, 20, 1, 8, 2),
    ("f16", 128, 32, 4, 20, 1, 8, 4),
    ("q8_0", 128, 32, 4, 300, 2, 8, 4),
    ("q8_0", 64, 16, 2, 70, 3, 4, 2),
    ("f16", 64, 32, 2, 100, 1, 4, 2),  # G = 16 over 2 blocks: the g8 kernel
]


@pytest.mark.parametrize("kv, d, nh, nkv, pos0, t, n_split, hs", HS_CASES)
def test_attention_decode_head_split_is_bitwise_one_block_per_kv_head(
    kern: ctypes.CDLL, kv: str, d: int, nh: int, nkv: int, pos0: int, t: int, n_split: int,
    hs: int,
) -> None:  # fmt: skip
    """A KV head's query heads over hs blocks (each reading the head's K/V): every head's
    output bitwise the one-block launch's (a head's sums never mix with another's), with
    sinks and a window, and the output's q8_K quantization where G/hs heads tile it."""
    rng = np.random.default_rng(34)
    n_ctx, scale = 512, 1 / np.sqrt(d)
    cache = ref.Cache(kv, 1, nkv, n_ctx, d)
    cache.fill(rng, 0, pos0 + t, scale=0.3)
    q = f32(rng.normal(0, 1, (t, nh, d)))
    sk = f32(rng.normal(0, 2, nh))
    npo, npml = part_sizes(t, nh, n_split, d)
    sp = np.array([pos0, 0], np.int32)
    act = ACT["q8_k"] if (nh // nkv // hs) * d % 256 == 0 else ACT["q8_0"]
    outs = []
    for h in (1, hs):
        po, pml = np.zeros(npo, np.float32), np.zeros(npml, np.float32)
        out = np.full((t, nh, d), np.nan, np.float32)
        qo = np.zeros(t * nh * d // 32 * 36, np.uint8)
        kern.sim_attn_decode_act(
            ref.KV_TYPES[kv], d, q, cache.k, cache.v, cache.slot_stride, sp, po, pml, out, t,
            nh, nkv, n_ctx, n_split, scale, sk.ctypes.data, 50, qo, act, h,
        )  # fmt: skip
        assert not pml.reshape(t, -1)[:, :nh].any(), "finish counters left non-zero"
        outs.append((out, qo))
    (one, q1), (split, qs) = outs
    assert np.array_equal(split, one) and np.array_equal(qs, q1)


def test_router_topk_second_copy_is_the_routing(kern: ctypes.CDLL) -> None:
    rng = np.random.default_rng(22)
    t, e, k = 3, 128, 8
    logits = np.asarray(rng.normal(0, 2, (t, e)), np.float32)
    ids, w = np.zeros((t, k), np.int32), np.zeros((t, k), np.float32)
    kern.sim_router_topk(logits, ids, w, t, e, k, 1)
    ids1, w1 = np.zeros_like(ids), np.zeros_like(w)
    ids2, w2 = np.full_like(ids, -1), np.full_like(w, np.nan)
    kern.sim_router_topk_copy(logits, ids1, w1, ids2, w2, t, e, k, 1)
    assert np.array_equal(ids1, ids) and np.array_equal(w1, w)
    assert np.array_equal(ids2, ids) and np.array_equal(w2, w)


def test_router_f32_topk_is_the_unfused_pair(kern: ctypes.CDLL) -> None:
    """The fused decode router (`strata_router_f32_topk`: the F32 logits one row per block as
    `strata_mmvq_f32_r1` sums them, the last block to finish running the top-k): its logits
    are W·x (numpy f64, f32 rounding), and its ids and weights and their copy are bitwise
    `strata_router_topk` on those logits; its finish counter is left at zero."""
    rng = np.random.default_rng(23)
    for e, h, k in [(128, 2048, 8), (256, 512, 8), (64, 256, 4)]:
        wr = f32(rng.normal(0, 0.05, (e, h)))
        x = f32(rng.normal(0, 1, h))
        logits = np.full(e, np.nan, np.float32)
        ids, w = np.full(k, -1, np.int32), np.full(k, np.nan, np.float32)
        ids2, w2 = np.full_like(ids, -1), np.full_like(w, np.nan)
        done = np.zeros(1, np.int32)
        kern.sim_router_f32_topk(wr, x, logits, ids, w, ids2, w2, e, h, k, 1, done)
        ref = wr.astype(np.float64) @ x.astype(np.float64)
        assert np.allclose(logits, ref, rtol=1e-4, atol=1e-4), (e, h)
        assert done[0] == 0
        ids_ref, w_ref = np.zeros((1, k), np.int32), np.zeros((1, k), np.float32)
        kern.sim_router_topk(logits[None, :].copy(), ids_ref, w_ref, 1, e, k, 1)
        assert np.array_equal(ids, ids_ref[0]) and np.array_equal(w, w_ref[0]), (e, h)
        assert np.array_equal(ids2, ids) and np.array_equal(w2, w)


# ---- the routing and FFN scales of the other GPU families (emulation only) -------------


@pytest.mark.parametrize("gate", [0, 1])
def test_router_biased_topk(kern: ctypes.CDLL, gate: int) -> None:
    """glm4moe's and ERNIE 4.5's routing (llama.cpp's build_moe_ffn with sigmoid / softmax
    gating, exp_probs_b, weight norm and scale): selection by p + bias, the unbiased p as
    weights, in numpy f64."""
    rng = np.random.default_rng(8)
    t, e, k, scale = 5, 160, 8, 2.5
    logits = np.asarray(rng.normal(0, 2, (t, e)), np.float32)
    bias = np.asarray(rng.normal(0, 0.5, e), np.float32)
    logits[4] = 0.0  # exact ties: the lower ids first
    bias[:] = np.where(np.arange(e) % 7 == 0, 0.25, 0.0)
    x = logits.astype(np.float64)
    if gate == 0:
        sig = 1.0 / (1.0 + np.exp(-x))
    else:
        ex = np.exp(x - x.max(1, keepdims=True))
        sig = ex / ex.sum(1, keepdims=True)
    for norm in (1, 0):
        ids = np.zeros((t, k), np.int32)
        w = np.zeros((t, k), np.float32)
        kern.sim_router_biased_topk(logits, bias, ids, w, t, e, k, gate, norm, scale)
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


# ---- gpt-oss's attention: sinks and sliding windows (emulation only) ---------------------


SW_CASES = [
    # kv, d, n_head, n_kv, pos0, t, window (0: none), sinks
    ("f16", 64, 8, 1, 40, 1, 8, True),  # decode, the window inside one split
    ("q8_0", 64, 4, 2, 300, 3, 128, True),  # decode, the window over several splits
    ("f16", 64, 4, 2, 200, 2, 0, True),  # sinks alone
    ("f16", 64, 4, 2, 5, 1, 8, False),  # a window longer than the prefix
]


@pytest.mark.parametrize("kv, d, nh, nkv, pos0, t, window, sinks", SW_CASES)
def test_attention_decode_sinks_window(
    kern: Any, kv: str, d: int, nh: int, nkv: int, pos0: int, t: int, window: int, sinks: bool
) -> None:
    """gpt-oss's attention (llama.cpp's soft_max_ext with sinks, LLAMA_SWA_TYPE_STANDARD):
    the split decode kernel against the numpy reference."""
    rng = np.random.default_rng(14)
    n_ctx, n_split = 512, 4
    cache = ref.Cache(kv, 1, nkv, n_ctx, d)
    cache.fill(rng, 0, pos0 + t, scale=0.3)
    q = f32(rng.normal(0, 1, (t, nh, d)))
    sk = f32(rng.normal(0, 2, nh)) if sinks else None
    npo, npml = part_sizes(t, nh, n_split, d)
    po, pml = np.zeros(npo, np.float32), np.zeros(npml, np.float32)
    sp = np.array([pos0, 0], np.int32)
    out = np.full((t, nh, d), np.nan, np.float32)
    kern.sim_attn_decode_sw(
        ref.KV_TYPES[kv], d, q, cache.k, cache.v, cache.slot_stride, sp, po, pml, out, t, nh,
        nkv, n_ctx, n_split, 1 / np.sqrt(d), None if sk is None else sk.ctypes.data, window,
    )  # fmt: skip
    qf = "f16" if kv == "f16" else "q8_0"
    want = ref.attention(q, cache, 0, pos0, q_form=qf, sinks=sk, window=window)
    assert np.abs(out - want).max() <= 2e-5
    plain = ref.attention(q, cache, 0, pos0, q_form=qf)
    if (window and pos0 + 1 > window) or sinks:  # the case differs from plain attention
        assert np.abs(out - plain).max() > 1e-3


@pytest.mark.parametrize("kv", ["f16", "q8_0"])
@pytest.mark.parametrize("window", [8, 70, 0])
def test_attention_prefill_sinks_window(kern: Any, kv: str, window: int) -> None:
    """The tensor-core prefill kernel with sinks and a window: rows of a block see different
    ranges (G = 3, the window shorter than a tile and longer than one)."""
    rng = np.random.default_rng(15)
    d, nh, nkv, n_ctx, pos0, t = 64, 6, 2, 256, 30, 90
    cache = ref.Cache(kv, 1, nkv, n_ctx, d)
    cache.fill(rng, 0, pos0 + t, scale=0.3)
    q = f32(rng.normal(0, 1, (t, nh, d)))
    sk = f32(rng.normal(0, 2, nh))
    out = np.zeros((t, nh, d), np.float32)
    sp = np.array([pos0, 0], np.int32)
    kern.sim_attn_prefill_sw(
        ref.KV_TYPES[kv], d, q, cache.k, cache.v, cache.slot_stride, sp, out, t, nh, nkv,
        n_ctx, 1 / np.sqrt(d), sk.ctypes.data, window,
    )  # fmt: skip
    if kv == "f16":
        want = ref.attention(q, cache, 0, pos0, q_form="f16", k_form="f16", sinks=sk,
                             window=window)  # fmt: skip
    else:
        want = ref.attention(q, cache, 0, pos0, q_form="q8_0", v_form="f16", sinks=sk,
                             window=window)  # fmt: skip
    assert np.abs(out - want).max() <= 2e-3 * np.abs(want).max()


def test_router_topk_softmax(kern: ctypes.CDLL) -> None:
    """gpt-oss's routing (llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX_WEIGHT): the top k
    logits (ties: the lower id first), weighted by the softmax over those k, in numpy f64."""
    rng = np.random.default_rng(16)
    t, e, k = 6, 32, 4
    logits = np.asarray(rng.normal(0, 2, (t, e)), np.float32)
    logits[5] = np.where(np.arange(e) % 3 == 0, 1.5, -1.0)  # exact ties: the lower ids first
    ids = np.zeros((t, k), np.int32)
    w = np.zeros((t, k), np.float32)
    kern.sim_router_topk_softmax(logits, ids, w, t, e, k)
    for r in range(t):
        want = np.argsort(-logits[r].astype(np.float64), kind="stable")[:k]
        assert list(ids[r]) == list(want), r
        z = logits[r, want].astype(np.float64)
        p = np.exp(z - z.max())
        np.testing.assert_allclose(w[r], p / p.sum(), rtol=1e-6)


def test_add_rows(kern: ctypes.CDLL) -> None:
    rng = np.random.default_rng(17)
    x = f32(rng.normal(0, 1, (5, 40)))
    b = f32(rng.normal(0, 1, 40))
    want = x + b
    kern.sim_add_rows(x, b, 5, 40)
    assert np.array_equal(x, want)
