"""Dot kernels against ggml itself (llama-cpp-python's libggml via ctypes):

- activation quantizers byte-equal to ggml's quantizers;
- every kernel within the derived bound of the float dot of the dequantized operands
  (weights dequantized by ggml's own `to_float`);
- every kernel within twice that bound of ggml's CPU `vec_dot`;
- every SIMD kernel bitwise equal to the scalar one (ISAs the CPU lacks are skipped).
"""

from __future__ import annotations

import struct

import numpy as np
import pytest
from dot_util import (
    ACT,
    BLOCK,
    GGML_ID,
    WEIGHT_TYPES,
    dequant_act,
    dot_bound,
    magnitude_row,
    random_act_f32,
    random_row,
)
from ggml_cpu_oracle import ggml
from strata import _core
from strata.errors import ConfigError, QuantError


def _rows(rng: np.random.Generator, n: int) -> list[np.ndarray]:
    """Random activation rows plus the edge cases: zeros, exact .5 ties, a lone outlier."""
    rows = [random_act_f32(rng, n) for _ in range(6)]
    z = random_act_f32(rng, n)
    z[:256] = 0.0
    rows.append(z)
    tie = np.zeros(n, np.float32)
    tie[0::32] = 127.0
    tie[1::32] = 2.5
    tie[2::32] = -2.5
    tie[3::32] = 0.5
    tie[4::32] = -126.5
    tie[::256] = -127.0
    rows.append(tie)
    big = rng.standard_normal(n).astype(np.float32) * 1e-3
    big[rng.integers(n)] = 1e4
    rows.append(big)
    return rows


@pytest.mark.parametrize("act", ["Q8_0", "Q8_1", "Q8_K", "F16", "BF16"])
def test_quantize_act_matches_ggml(act: str) -> None:
    """Byte-equal to what llama.cpp runs: the CPU backend's `from_float` for the Q8 types
    (on x86 its Q8_0/Q8_1 rounding differs from the reference quantizer's), and the
    reference conversion for F16/BF16."""
    g = ggml()
    rng = np.random.default_rng(1)
    for x in _rows(rng, 1024):
        ours = _core.quantize_act(act, x)
        tid = GGML_ID[act]
        cpu = act.startswith("Q8") or not g.traits(tid).from_float_ref
        want = g.quantize_cpu(tid, x) if cpu else g.quantize_ref(tid, x)
        assert ours == want, f"{act}: first difference at byte " + str(
            next(i for i, (a, b) in enumerate(zip(ours, want, strict=True)) if a != b)
        )


def _one(t: str, n: int, seed: int) -> tuple[bytes, bytes, np.ndarray]:
    rng = np.random.default_rng(seed)
    row = random_row(t, n, rng)
    act = _core.quantize_act(ACT[t], random_act_f32(rng, n))
    return row, act, dequant_act(ACT[t], act, n)


def _n(t: str) -> int:
    return 4 * max(BLOCK[t][0], 256)


@pytest.mark.parametrize("t", WEIGHT_TYPES)
def test_dot_within_bound_of_dequantized(t: str) -> None:
    g = ggml()
    n = _n(t)
    for seed in range(6):
        row, act, a = _one(t, n, seed)
        y = g.dequantize(GGML_ID[t], row, n).astype(np.float64)
        y_mag = g.dequantize(GGML_ID[t], magnitude_row(t, row), n).astype(np.float64)
        ref = float(np.dot(y, a))
        bound = dot_bound(t, n, row, act, y_mag, a)
        got = _core.vec_dot(t, n, row, act, "scalar")
        assert abs(got - ref) <= bound, f"{t} seed {seed}: {got} vs {ref}, bound {bound}"
        assert bound <= 1e-4 * max(float(np.sum(np.abs(y_mag * a))), 1e-30)


@pytest.mark.parametrize("t", WEIGHT_TYPES)
def test_dot_matches_ggml_vec_dot(t: str) -> None:
    g = ggml()
    n = _n(t)
    assert g.vec_dot_type(GGML_ID[t]) == GGML_ID[ACT[t]]
    for seed in range(6):
        row, act, a = _one(t, n, 100 + seed)
        y_mag = g.dequantize(GGML_ID[t], magnitude_row(t, row), n).astype(np.float64)
        bound = dot_bound(t, n, row, act, y_mag, a)
        want = g.vec_dot(GGML_ID[t], n, row, act)
        got = _core.vec_dot(t, n, row, act)
        assert abs(got - want) <= 2 * bound, f"{t}: {got} vs ggml {want}, 2·bound {2 * bound}"


@pytest.mark.parametrize("isa", ["avx2", "avx512"])
@pytest.mark.parametrize("t", WEIGHT_TYPES)
def test_simd_equals_scalar(isa: str, t: str) -> None:
    if isa not in _core.dot_isas():
        # Not a pass: the kernel cannot execute here. The AVX-512 cases were run on a CPU that
        # has it (docs/QUANT.md, "AVX-512 kernels verified").
        pytest.skip(f"this CPU cannot run {isa} (features: {_core.cpu_features()})")
    bs = max(BLOCK[t][0], 32)
    for nb in (1, 3, 8, 9, 17):
        n = max(nb * bs, BLOCK[t][0])
        for seed in range(3):
            row, act, _ = _one(t, n, 1000 * nb + seed)
            s = _core.vec_dot(t, n, row, act, "scalar")
            v = _core.vec_dot(t, n, row, act, isa)
            assert struct.pack("<f", v) == struct.pack("<f", s), f"{isa} {t} n={n}: {v} != {s}"


def test_bad_input_is_a_quant_error() -> None:
    x = np.zeros(256, np.float32)
    with pytest.raises(QuantError):
        _core.quantize_act("Q8_X", x)
    with pytest.raises(QuantError):
        _core.quantize_act("Q8_0", x[:33])
    with pytest.raises(QuantError):
        _core.quantize_act("Q4_K", x)
    act = _core.quantize_act("Q8_K", x)
    with pytest.raises(QuantError):
        _core.vec_dot("Q4_K", 256, bytes(143), act)
    with pytest.raises(QuantError):
        _core.vec_dot("Q4_K", 256, bytes(144), act, "sse9")
    with pytest.raises(QuantError):
        _core.vec_dot("I8", 256, bytes(256), act)
    assert _core.dot_isa() in _core.dot_isas()
    assert "scalar" in _core.dot_isas()
    _core.set_dot_isa(_core.dot_isa())  # the ISA in use: accepted
    other = next((i for i in _core.dot_isas() if i != _core.dot_isa()), None)
    if other is not None:
        with pytest.raises(ConfigError):
            _core.set_dot_isa(other)
    if "avx512" not in _core.dot_isas():
        with pytest.raises(ConfigError):
            _core.set_dot_isa("avx512")
