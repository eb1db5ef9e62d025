"""The model kernels' test cases, shared by the CPU emulation (test_gpu_model_sim.py) and the
GPU (test_gpu_model.py): each test takes a `kern` fixture with the entry points of
cuda/tests/model_sim.cpp (`sim_*`: host arrays in, outputs written in place), from the
emulation library or from `GpuKernels` over the device launchers. References: gpu_model_ref.
"""

from __future__ import annotations

from typing import Any

import gpu_model_ref as ref
import numpy as np
import pytest

__all__ = [
    "test_argmax_and_add",
    "test_attention_decode",
    "test_attention_over_cached_prefix_equals_fresh_rows",
    "test_attention_prefill",
    "test_norm_rows_and_fused_add",
    "test_rope_neox",
    "test_rope_qkv_writes_cache",
    "test_router_topk_and_ties",
    "test_router_topk_widths",
]


def f32(a: Any) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32)


# float4 rows in registers (n % 4 == 0, ≤ 8192), the strided loop otherwise
@pytest.mark.parametrize("n", [300, 2048, 301, 8196])
def test_norm_rows_and_fused_add(kern: Any, n: int) -> None:
    rng = np.random.default_rng(1)
    rows, eps = 3, 1e-6
    x, y = f32(rng.normal(0, 2, (rows, n))), f32(rng.normal(0, 1, (rows, n)))
    w = f32(rng.normal(1, 0.2, n))
    out = np.zeros_like(x)
    kern.sim_norm_rms(x, w, out, rows, n, eps)
    want = ref.rms_norm(x, w, eps)
    assert np.abs(out - want).max() <= 1e-6 * np.abs(want).max()
    x2 = x.copy()
    kern.sim_norm_add_rms(x2, y, w, out, rows, n, eps)
    assert np.array_equal(x2, x + y)
    want = ref.rms_norm(x + y, w, eps)
    assert np.abs(out - want).max() <= 1e-6 * np.abs(want).max()


def rope_tables(rng: np.random.Generator, n_ctx: int, half: int) -> tuple[np.ndarray, np.ndarray]:
    th = rng.uniform(-np.pi, np.pi, (n_ctx, half))
    return f32(np.cos(th) * 1.1), f32(np.sin(th) * 1.1)  # a YaRN-like magnitude


def test_rope_neox(kern: Any) -> None:
    rng = np.random.default_rng(2)
    t, nh, d, n_rot, pos0 = 3, 5, 64, 48, 7  # partial rotation: dims ≥ n_rot untouched
    cos, sin = rope_tables(rng, 16, n_rot // 2)
    x = f32(rng.normal(0, 1, (t, nh, d)))
    got = x.copy()
    kern.sim_rope_neox(got, cos, sin, np.array([pos0, 0], np.int32), t, nh, d, n_rot, 16)
    want = ref.rope(x, cos, sin, pos0 + np.arange(t), n_rot)
    assert np.abs(got - want).max() <= 1e-6


# (q/k norm, Q/K/V biases, NEOX pairs): qwen3moe; qwen2moe; Mixtral-style llama
QKV_BLOCKS = [(True, False, True), (False, True, True), (False, False, False)]


@pytest.mark.parametrize("norm, bias, neox", QKV_BLOCKS, ids=["qwen3", "qwen2", "llama"])
@pytest.mark.parametrize("kv", ["f16", "q8_0"])
def test_rope_qkv_writes_cache(kern: Any, kv: str, norm: bool, bias: bool, neox: bool) -> None:
    rng = np.random.default_rng(3)
    t, nh, nkv, d, n_ctx, eps, pos0, slot = 3, 4, 2, 64, 16, 1e-6, 5, 1
    cos, sin = rope_tables(rng, n_ctx, d // 2)
    q = f32(rng.normal(0, 2, (t, nh, d)))
    k = f32(rng.normal(0, 2, (t, nkv, d)))
    v = f32(rng.normal(0, 1, (t, nkv, d)))
    qn, kn = f32(rng.normal(1, 0.3, d)), f32(rng.normal(1, 0.3, d))
    qb, kb, vb = (f32(rng.normal(0, 1, n * d)) for n in (nh, nkv, nkv))
    cache = ref.Cache(kv, 2, nkv, n_ctx, d)
    qg = q.copy()
    sp = np.array([pos0, slot], np.int32)
    kern.sim_rope_qkv(
        ref.KV_TYPES[kv], qg, k, v, qn, kn, qb, kb, vb, cos, sin, sp, cache.k, cache.v,
        cache.slot_stride, t, nh, nkv, d, d, n_ctx, eps, int(norm), int(bias), int(neox),
    )  # fmt: skip
    if bias:  # the biases are added in f32 before anything else
        q, k, v = (f32(a + b.reshape(a.shape[1:])) for a, b in ((q, qb), (k, kb), (v, vb)))
    if not norm:
        qn = kn = None
    pos = pos0 + np.arange(t)

    def normed(x: np.ndarray, w: np.ndarray | None) -> np.ndarray:
        return x if w is None else ref.rms_norm(x, w, eps)

    want_q = ref.rope(normed(q, qn), cos, sin, pos, d, neox)
    assert np.abs(qg - want_q).max() <= 2e-6 * np.abs(want_q).max()
    want_k = ref.rope(normed(k, kn), cos, sin, pos, d, neox)
    got_k, got_v = cache.values(slot, n_ctx)
    got_k, got_v = got_k[:, pos].transpose(1, 0, 2), got_v[:, pos].transpose(1, 0, 2)
    if kv == "f16":  # one f16 rounding of a value within f32 error of the reference
        assert np.abs(got_k - want_k).max() <= np.abs(want_k).max() * 2**-10
        assert np.array_equal(got_v, ref.f16_round(v))
    else:  # q8_0: half a step d = amax/127, plus |q| ≤ 127 times the f16 rounding of d
        amax = np.abs(want_k).reshape(t, nkv, -1, 32).max(-1)
        # each block's stored f16 scale is amax/127 rounded once (within one f16 ulp: amax
        # is the GPU's own f32 value): a scale stored with wrong bytes fails here first
        blk = cache.k[slot][:, pos].transpose(1, 0, 2).reshape(t, nkv, -1, 34)
        d16 = blk[..., :2].copy().view(np.float16)[..., 0].astype(np.float64)
        rel = np.abs(d16 / (amax / 127) - 1)
        assert rel.max() <= 2**-10, f"q8_0 K scales off by up to {rel.max():.3g} (relative)"
        step = amax.repeat(32, -1).reshape(want_k.shape) / 127
        assert np.all(np.abs(got_k - want_k) <= step * (0.5 + 127 * 2**-11) + 1e-6)
        assert np.array_equal(cache.v[slot][:, pos].transpose(1, 0, 2), ref.q8_0_bytes(v))
    other = ref.Cache(kv, 2, nkv, n_ctx, d)
    assert np.array_equal(cache.k[0], other.k[0]), "slot 0 was written"
    mask = np.ones(n_ctx, bool)
    mask[pos] = False
    assert not cache.k[slot][:, mask].any(), "positions outside pos0.. were written"


ATT_CASES = [
    # kv, d, n_head, n_kv, n_ctx, pos0, t, n_split (the most splits; the kernel takes
    # max(⌈n/n_split⌉, 32) positions a split, n = pos0 + t + 1 visible)
    ("f16", 128, 8, 1, 16, 0, 1, 32),  # n = 1: one live split writes the output
    ("q8_0", 128, 16, 2, 16, 6, 1, 8),  # n = 7
    ("f16", 64, 4, 2, 128, 63, 1, 4),  # n = 64: two splits merged by the last block
    ("f16", 64, 4, 2, 512, 300, 1, 4),
    ("f16", 128, 8, 1, 256, 0, 1, 3),
    ("q8_0", 64, 4, 2, 512, 200, 2, 5),
    ("q8_0", 128, 16, 1, 256, 130, 1, 2),
    ("f16", 64, 8, 4, 512, 297, 3, 1),  # one split over several passes of 128 positions
    ("f16", 128, 8, 1, 2048, 1999, 1, 32),  # n = 2000: 32 splits of 63
    ("q8_0", 128, 8, 1, 1024, 900, 2, 3),  # 2 tokens, 3 splits of 3 passes each
    # D = 256 (Qwen3.5 / Qwen3-Next heads), G ≤ 8
    ("f16", 256, 16, 2, 512, 300, 2, 4),
    ("q8_0", 256, 8, 1, 256, 40, 1, 2),
]


def part_sizes(t: int, nh: int, n_split: int, d: int) -> tuple[int, int]:
    """f32 elements of the decode partials: acc [t, nh, n_split, d]; per token the i32 [nh]
    finish counters, then (max, sum) [nh, n_split, 2]."""
    return t * nh * n_split * d, t * nh * (2 * n_split + 1)


@pytest.mark.parametrize("kv, d, nh, nkv, n_ctx, pos0, t, n_split", ATT_CASES)
def test_attention_decode(
    kern: Any, kv: str, d: int, nh: int, nkv: int, n_ctx: int, pos0: int, t: int,
    n_split: int,
) -> None:  # fmt: skip
    rng = np.random.default_rng(4)
    slot = 1
    cache = ref.Cache(kv, 2, nkv, n_ctx, d)
    cache.fill(rng, slot, pos0 + t, scale=0.3)
    q = f32(rng.normal(0, 1, (t, nh, d)))
    npo, npml = part_sizes(t, nh, n_split, d)
    part_o = np.zeros(npo, np.float32)
    part_ml = np.zeros(npml, np.float32)
    sp = np.array([pos0, slot], np.int32)
    want = ref.attention(q, cache, slot, pos0, q_form="f16" if kv == "f16" else "q8_0")
    for _ in range(2):  # the second launch finds the counters the first one left
        out = np.full((t, nh, d), np.nan, np.float32)
        kern.sim_attn_decode(
            ref.KV_TYPES[kv], d, q, cache.k, cache.v, cache.slot_stride, sp, part_o, part_ml,
            out, t, nh, nkv, n_ctx, n_split, 1 / np.sqrt(d),
        )  # fmt: skip
        err = np.abs(out - want).max()
        assert err <= 2e-5, err
        counters = part_ml.reshape(t, -1)[:, :nh]
        assert not counters.any(), "finish counters left non-zero"


PF_CASES = [
    # kv, d, n_head, n_kv, n_ctx, pos0, t
    ("f16", 64, 4, 2, 256, 0, 70),
    ("f16", 128, 8, 1, 256, 37, 20),
    ("q8_0", 64, 6, 2, 256, 10, 40),  # G = 3: rows of a block span token boundaries
    # D = 256: tiles of 32 positions, two blocks of 128 output dims per row block
    ("f16", 256, 16, 2, 256, 37, 45),
    ("q8_0", 256, 6, 2, 256, 10, 40),
]


@pytest.mark.parametrize("kv, d, nh, nkv, n_ctx, pos0, t", PF_CASES)
def test_attention_prefill(
    kern: Any, kv: str, d: int, nh: int, nkv: int, n_ctx: int, pos0: int, t: int
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
    kern.sim_attn_prefill(
        ref.KV_TYPES[kv], d, q, cache.k, cache.v, cache.slot_stride, sp, out, t, nh, nkv,
        n_ctx, 1 / np.sqrt(d),
    )  # fmt: skip
    if kv == "f16":
        want = ref.attention(q, cache, slot, pos0, q_form="f16", k_form="f16")
    else:  # q·k: the CPU's q8_0 block dot; values as f16
        want = ref.attention(q, cache, slot, pos0, q_form="q8_0", v_form="f16")
    err = np.abs(out - want).max()
    # probabilities enter P·V as f16 (relative 2^-11 each)
    assert err <= 2e-3 * np.abs(want).max(), err
    if kv == "q8_0":  # and q·k is the q8_0 one: nearer that than q and keys rounded to f16
        other = ref.attention(q, cache, slot, pos0, q_form="f16", k_form="f16")
        assert err < 0.5 * np.abs(out - other).max(), (err, np.abs(out - other).max())


def run_attention(kern: Any, kv: str, prefill: bool, q: np.ndarray, cache: Any, pos0: int) -> Any:
    t, nh, d = q.shape
    out = np.zeros((t, nh, d), np.float32)
    sp = np.array([pos0, 0], np.int32)
    args = (cache.k, cache.v, cache.slot_stride, sp)
    if prefill:
        kern.sim_attn_prefill(
            ref.KV_TYPES[kv], d, q, *args, out, t, nh, cache.n_kv, cache.n_ctx, 1 / np.sqrt(d)
        )
    else:
        n_split = 2
        npo, npml = part_sizes(t, nh, n_split, d)
        po, pml = np.zeros(npo, np.float32), np.zeros(npml, np.float32)
        kern.sim_attn_decode(
            ref.KV_TYPES[kv], d, q, *args, po, pml, out, t, nh, cache.n_kv, cache.n_ctx,
            n_split, 1 / np.sqrt(d),
        )  # fmt: skip
    return out


@pytest.mark.parametrize("kv", ["f16", "q8_0"])
@pytest.mark.parametrize("prefill", [True, False], ids=["prefill", "decode"])
def test_attention_over_cached_prefix_equals_fresh_rows(kern: Any, kv: str, prefill: bool) -> None:
    """A call that continues a slot (rows at positions p0.., the first p0 positions cached by
    earlier calls) gives exactly the rows of one call over the whole prefix: what a row sees
    (positions 0 ..= its own, split and tile boundaries) depends on its position only, not on
    where its call started. The model's chunking relies on it (truncate, then continue)."""
    rng = np.random.default_rng(8)
    d, nh, nkv, n_ctx = 64, 6, 2, 256
    p0, t = (37, 30) if prefill else (70, 5)
    first = 0 if prefill else p0 - 3  # decode chunks are short: a fresh call of 8 tokens
    cache = ref.Cache(kv, 1, nkv, n_ctx, d)
    cache.fill(rng, 0, p0 + t, scale=0.3)
    q = f32(rng.normal(0, 1, (p0 + t - first, nh, d)))
    whole = run_attention(kern, kv, prefill, q, cache, first)
    cont = run_attention(kern, kv, prefill, np.ascontiguousarray(q[p0 - first :]), cache, p0)
    assert np.array_equal(cont, whole[p0 - first :]), np.abs(cont - whole[p0 - first :]).max()
    q_form = "f16" if kv == "f16" else "q8_0"
    k_form = "f16" if prefill and kv == "f16" else "cache"
    want = ref.attention(q[p0 - first :], cache, 0, p0, q_form, k_form, "f16" if prefill else None)
    bound = 2e-3 * np.abs(want).max() if prefill else 2e-5
    assert np.abs(cont - want).max() <= bound


def test_router_topk_and_ties(kern: Any) -> None:
    rng = np.random.default_rng(6)
    t, e, k = 4, 128, 8
    # distinct logits 0.01 apart (no near-ties), then exact ties in the last token
    logits = f32(np.stack([rng.permutation(e) * 0.01 for _ in range(t)]))
    logits[3, :] = 0.0
    logits[3, [5, 9, 40]] = 1.0
    ids = np.zeros((t, k), np.int32)
    w = np.zeros((t, k), np.float32)
    kern.sim_router_topk(logits, ids, w, t, e, k, 1)
    want_ids, want_w = ref.route(logits, k)
    assert np.array_equal(ids, want_ids)
    assert list(ids[3]) == [5, 9, 40, 0, 1, 2, 3, 4]
    assert np.abs(w - want_w).max() <= 1e-6
    kern.sim_router_topk(logits, ids, w, t, e, k, 0)
    assert np.abs(w - ref.route(logits, k, norm=False)[1]).max() <= 1e-7


def test_router_topk_widths(kern: Any) -> None:
    """Every register width of the kernel (E ≤ 128, ≤ 256, ≤ 1024 per warp), E not a
    multiple of 32, and k above 32: the same picks and weights as the reference."""
    rng = np.random.default_rng(16)
    for e, k in [(60, 4), (128, 8), (160, 10), (256, 8), (1000, 40)]:
        t = 3
        logits = f32(np.stack([rng.permutation(e) * 0.003 for _ in range(t)]))
        logits[2, :] = 0.0
        logits[2, [e - 1, 7, e // 2]] = 2.0  # ties across lanes and registers
        ids = np.zeros((t, k), np.int32)
        w = np.zeros((t, k), np.float32)
        kern.sim_router_topk(logits, ids, w, t, e, k, 1)
        want_ids, want_w = ref.route(logits, k)
        assert np.array_equal(ids, want_ids), (e, k)
        assert sorted(ids[2, :3]) == sorted([e - 1, 7, e // 2])
        assert np.abs(w - want_w).max() <= 1e-6, (e, k)


def test_argmax_and_add(kern: Any) -> None:
    rng = np.random.default_rng(7)
    x = f32(rng.normal(0, 1, (3, 1000)))
    x[1, [10, 700]] = 9.0  # a tie: the first index wins
    out = np.zeros(3, np.int32)
    kern.sim_argmax(x, out, 3, 1000)
    assert list(out) == list(x.argmax(1)) and out[1] == 10
    y = f32(rng.normal(0, 1, 1000))
    a = x[0].copy()
    kern.sim_add(a, y, 1000)
    assert np.array_equal(a, x[0] + y)
