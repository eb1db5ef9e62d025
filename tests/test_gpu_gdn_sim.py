"""The Gated DeltaNet kernels (cuda/deltanet.cu) run on the CPU under cuda/tests/sim.h (the
emulation of blocks, barriers and warp shuffles) against a float64 numpy reference written
from the mixer's equations (rust/src/model/deltanet.rs's docstring, llama.cpp's
delta-net-base.cpp): causal conv with the slot's rolling state, q/k L2 norm, the β and decay
gates from fused (`ssm_ba`, qwen3next) or split (`ssm_beta` / `ssm_alpha`, qwen35moe)
projections, the delta rule per value head (grouped or tiled key heads), the gated RMSNorm;
and the speculative window's checkpoints the kernels write after each token (a ring of `cap`
snapshots of the slot's whole state). test_gpu_hybrid_families.py runs the kernels on a GPU
inside whole models.

Needs g++ with C++20 (<barrier>); the library is built once per source hash into the pytest
cache.
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np
import pytest
from cuda_sim import build_sim

SOURCES = ["model.cuh", "deltanet.cu", "tests/sim.h", "tests/gdn_sim.cpp"]
F32P = np.ctypeslib.ndpointer(np.float32, flags="C_CONTIGUOUS")
I32P = np.ctypeslib.ndpointer(np.int32, flags="C_CONTIGUOUS")
U64P = np.ctypeslib.ndpointer(np.uint64, flags="C_CONTIGUOUS")
INT, F, U64 = ctypes.c_int, ctypes.c_float, ctypes.c_ulonglong
STATE = [U64P, U64P, I32P, I32P, U64, U64, INT]  # tables, (pos0, slot), flag, sb, off, cap
SIGS: dict[str, list[Any]] = {
    "sim_gdn_conv": [F32P, F32P, *STATE, INT, INT, INT],
    "sim_gdn_prep": [F32P, F32P, F32P, F32P, F32P, F32P] + [INT] * 6 + [F],
    "sim_gdn_recur": [F32P, F32P, F32P, *STATE] + [INT] * 6,
    "sim_gdn_gated_norm": [F32P, F32P, F32P, INT, INT, INT, F],
    "sim_gdn_split_q": [F32P, F32P, F32P, INT, INT],
    "sim_gdn_sigmoid_mul": [F32P, F32P, INT],
}
EPS = 1e-6


@pytest.fixture(scope="module")
def kern(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    dll = build_sim(request, tmp_path_factory, "gdn_sim.cpp", SOURCES)
    for name, args in SIGS.items():
        getattr(dll, name).argtypes = args
        getattr(dll, name).restype = None
    return dll


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def reference(
    qkv: np.ndarray,
    b: np.ndarray,
    a: np.ndarray,
    w: dict[str, np.ndarray],
    conv0: np.ndarray,
    m0: np.ndarray,
    nk: int,
    nv: int,
    s: int,
    grouped: bool,
) -> tuple[np.ndarray, list[tuple[np.ndarray, np.ndarray]]]:
    """The mixer's output before the out projection [t, Nv·S] and the (conv, delta-rule)
    state after each token, in float64. b / a: [t, Nv] β and α in value-head order."""
    t = qkv.shape[0]
    kc = w["conv"].shape[1]
    win = np.concatenate([conv0, qkv]).astype(np.float64)  # [Kc − 1 + t, C]
    m = m0.astype(np.float64).copy()  # [Nv, S(v), S(k)]
    out = np.zeros((t, nv * s))
    states = []
    for i in range(t):
        x = silu((win[i : i + kc] * w["conv"].T.astype(np.float64)).sum(0))
        q = x[: nk * s].reshape(nk, s)
        k = x[nk * s : 2 * nk * s].reshape(nk, s)
        v = x[2 * nk * s :].reshape(nv, s)
        q = q / np.sqrt((q * q).sum(1, keepdims=True) + EPS)
        k = k / np.sqrt((k * k).sum(1, keepdims=True) + EPS)
        beta = 1.0 / (1.0 + np.exp(-b[i].astype(np.float64)))
        sp = np.log1p(np.exp(a[i].astype(np.float64) + w["dt_bias"]))
        decay = np.exp(sp * w["a"])
        o = np.zeros((nv, s))
        for h in range(nv):
            kh = h // (nv // nk) if grouped else h % nk
            m[h] *= decay[h]
            d = (v[h] - m[h] @ k[kh]) * beta[h]
            m[h] += np.outer(d, k[kh])
            o[h] = m[h] @ q[kh] / np.sqrt(s)
        z = w["z"][i].reshape(nv, s).astype(np.float64)
        rms = 1.0 / np.sqrt((o * o).mean(1, keepdims=True) + EPS)
        out[i] = (o * rms * w["norm"] * silu(z)).reshape(-1)
        states.append((win[i + 1 : i + kc].copy(), m.copy()))
    return out, states


@pytest.mark.parametrize(
    "layout, s", [("qwen3next", 48), ("qwen35moe", 48), ("qwen3next", 16), ("qwen35moe", 128)]
)
def test_window_matches_the_equations_and_checkpoints(kern: Any, layout: str, s: int) -> None:
    rng = np.random.default_rng(s + len(layout))
    nk, nv, kc, t, pos0, cap = 2, 4, 4, 5, 6, 4
    grouped = layout == "qwen3next"
    c = (2 * nk + nv) * s
    cs, ss = (kc - 1) * c, nv * s * s
    sb = 2 * (cs + ss)  # two recurrent layers; this is the second
    conv_off, ssm_off = cs, 2 * cs + ss

    def f32(*shape: int, scale: float = 1.0) -> np.ndarray:
        return np.asarray(rng.normal(0, scale, shape), np.float32)

    w = {
        "conv": f32(c, kc, scale=0.5),
        "dt_bias": f32(nv),
        "a": -np.exp(f32(nv, scale=0.5)),
        "norm": f32(s, scale=0.3) + 1.0,
        "z": f32(t, nv * s),
    }
    qkv = f32(t, c)
    beta, alpha = f32(t, nv), f32(t, nv)
    r = nv // nk  # the fused rows: per key head [β r, α r]
    ba = np.concatenate([beta.reshape(t, nk, r), alpha.reshape(t, nk, r)], 2).reshape(t, -1)
    states = [np.zeros(sb, np.float32), f32(sb, scale=0.1)]
    before = [x.copy() for x in states]
    area = np.zeros((cap + 1) * sb, np.float32)
    st_tab = np.array([x.ctypes.data for x in states], np.uint64)
    ck_tab = np.array([0, area.ctypes.data], np.uint64)
    sp = np.array([pos0, 1], np.int32)
    flag = np.array([1], np.int32)
    conv0 = before[1][conv_off : conv_off + cs].reshape(kc - 1, c)
    m0 = before[1][ssm_off : ssm_off + ss].reshape(nv, s, s)
    want, snaps = reference(qkv, beta, alpha, w, conv0, m0, nk, nv, s, grouped)

    x = qkv.copy()
    gates = np.zeros((t, nv, 2), np.float32)
    core = np.zeros((t, nv * s), np.float32)
    state = (st_tab, ck_tab, sp, flag, sb)
    kern.sim_gdn_conv(x, w["conv"], *state, conv_off, cap, t, c, kc)
    if grouped:
        kern.sim_gdn_prep(x, ba, ba, w["dt_bias"], w["a"], gates, t, c, nk, nv, s, 1, EPS)
    else:
        kern.sim_gdn_prep(x, beta, alpha, w["dt_bias"], w["a"], gates, t, c, nk, nv, s, 0, EPS)
    kern.sim_gdn_recur(x, gates, core, *state, ssm_off, cap, t, c, nk, nv, s, int(grouped))
    kern.sim_gdn_gated_norm(core, w["z"], w["norm"], t, nv, s, EPS)

    assert np.abs(core - want).max() <= 2e-5 * np.abs(want).max()
    conv_end, m_end = snaps[-1]
    got = states[1]
    assert np.abs(got[conv_off : conv_off + cs] - conv_end.reshape(-1)).max() == 0.0
    err = np.abs(got[ssm_off : ssm_off + ss] - m_end.reshape(-1)).max()
    assert err <= 2e-5 * np.abs(m_end).max()
    # the layer's parts only; the other slot untouched
    assert np.array_equal(got[:conv_off], before[1][:conv_off])
    assert np.array_equal(got[2 * cs : ssm_off], before[1][2 * cs : ssm_off])
    assert np.array_equal(states[0], before[0])
    # the window's checkpoints: the last `cap` positions, at pos mod cap; the mark untouched
    snap = area.reshape(cap + 1, sb)
    for i in range(t - cap, t):
        p = pos0 + i + 1
        cv, mv = snaps[i]
        want_conv = cv.reshape(-1).astype(np.float32)
        assert np.array_equal(snap[p % cap, conv_off : conv_off + cs], want_conv)
        err = np.abs(snap[p % cap, ssm_off : ssm_off + ss] - mv.reshape(-1)).max()
        assert err <= 2e-5 * np.abs(mv).max(), (i, err)
        assert not snap[p % cap, :conv_off].any()
    assert not snap[cap].any()


def test_no_checkpoint_without_the_flag(kern: Any) -> None:
    nk, nv, s, kc, t, cap = 1, 2, 32, 3, 3, 4
    c = (2 * nk + nv) * s
    sb = (kc - 1) * c + nv * s * s
    rng = np.random.default_rng(1)
    x = np.asarray(rng.normal(0, 1, (t, c)), np.float32)
    w = np.asarray(rng.normal(0, 1, (c, kc)), np.float32)
    st = np.zeros(sb, np.float32)
    area = np.zeros((cap + 1) * sb, np.float32)
    tabs = (np.array([st.ctypes.data], np.uint64), np.array([area.ctypes.data], np.uint64))
    sp, flag = np.array([0, 0], np.int32), np.array([0], np.int32)
    kern.sim_gdn_conv(x, w, *tabs, sp, flag, sb, 0, cap, t, c, kc)
    assert st[: (kc - 1) * c].any() and not area.any()


def test_gated_attention_split_and_gate(kern: Any) -> None:
    rng = np.random.default_rng(2)
    t, nh, d = 3, 4, 32
    qg = np.asarray(rng.normal(0, 1, (t, nh, 2 * d)), np.float32)
    q = np.zeros((t, nh * d), np.float32)
    g = np.zeros((t, nh * d), np.float32)
    kern.sim_gdn_split_q(qg, q, g, t * nh * d, d)
    assert np.array_equal(q.reshape(t, nh, d), qg[:, :, :d])
    assert np.array_equal(g.reshape(t, nh, d), qg[:, :, d:])
    att = np.asarray(rng.normal(0, 1, (t, nh * d)), np.float32)
    want = att.astype(np.float64) / (1.0 + np.exp(-g.astype(np.float64)))
    kern.sim_gdn_sigmoid_mul(att, g, att.size)
    assert np.abs(att - want).max() <= 1e-6
