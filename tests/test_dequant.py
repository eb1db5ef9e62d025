"""Bit-exact dequantization: strata._core.dequantize_bytes against gguf-py 0.19
(`gguf.quants.dequantize`) and against ggml's reference `to_float` (ctypes, tests/ggml_oracle.py).

Blocks are random bytes (so f16 scales take NaN/subnormal patterns), and a quarter of them get
their f16 scale fields overwritten with special values (±inf, quiet/signalling NaNs of both
signs, subnormals, ±0, ±max), so that every scale meets non-finite values and pairs of NaNs.
Results are compared as uint32 bit patterns: NaN payloads and signs must match too.
"""

from __future__ import annotations

import ggml_oracle
import numpy as np
import numpy.typing as npt
import pytest
from gguf import GGMLQuantizationType as T
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize as gguf_dequantize
from strata import _core
from strata.errors import QuantError

N_BLOCKS = 4096
SPECIAL_F16 = np.array(
    [0x7C00, 0xFC00, 0x7C01, 0xFC01, 0x7E00, 0xFE00, 0x7FFF, 0x7D55, 0x0001, 0x83FF, 0x0000,
     0x8000, 0x7BFF, 0xFBFF, 0x3C00],
    dtype=np.uint16,
)  # fmt: skip

# Byte offsets of the f16 scale fields in each block (docs/FORMATS.md §2 block table).
F16_FIELDS: dict[str, list[int]] = {
    "Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0],
    "Q2_K": [80, 82], "Q3_K": [108], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208],
    "IQ2_XXS": [0], "IQ2_XS": [0], "IQ2_S": [0], "IQ3_XXS": [0], "IQ3_S": [0], "IQ1_S": [0],
    "IQ1_M": [], "IQ4_NL": [0], "IQ4_XS": [0], "TQ1_0": [52], "TQ2_0": [64],
    "MXFP4": [], "NVFP4": [], "Q1_0": [0], "Q2_0": [0],
}  # fmt: skip
GGUF_PY_TYPES = list(F16_FIELDS)[:-2]  # all but Q1_0, Q2_0
GGML_ONLY = {"Q1_0": (41, 128, 18), "Q2_0": (42, 64, 18)}  # id, block elements, block bytes


def shape_of(name: str) -> tuple[int, int]:
    if name in GGML_ONLY:
        return GGML_ONLY[name][1:]
    blck, size = GGML_QUANT_SIZES[T[name]]
    return blck, size


def random_blocks(name: str, seed: int, n_blocks: int = N_BLOCKS) -> npt.NDArray[np.uint8]:
    """(n_blocks, type_size) random bytes, with special f16 values planted in the scales."""
    _, size = shape_of(name)
    rng = np.random.default_rng([seed, *name.encode()])
    blocks = rng.integers(0, 256, size=(n_blocks, size), dtype=np.uint8)
    special = rng.random(n_blocks) < 0.25
    for off in F16_FIELDS[name]:
        vals = rng.choice(SPECIAL_F16, size=n_blocks).astype("<u2").view(np.uint8).reshape(-1, 2)
        blocks[special, off : off + 2] = vals[special]
    if name == "IQ1_M":  # d is the top nibbles of the four u16 scale words
        vals = rng.choice(SPECIAL_F16, size=n_blocks)
        for w in range(4):
            nib = ((vals >> (4 * w)) & 0xF).astype(np.uint8)
            hi = blocks[special, 48 + 2 * w + 1]
            blocks[special, 48 + 2 * w + 1] = (hi & 0x0F) | (nib[special] << 4)
    return blocks


def strata_dequant(name: str, blocks: npt.NDArray[np.uint8]) -> npt.NDArray[np.float32]:
    blck, _ = shape_of(name)
    return _core.dequantize_bytes(name, blocks, blocks.shape[0] * blck)


def assert_bits_equal(
    name: str, got: npt.NDArray[np.float32], want: npt.NDArray[np.float32]
) -> None:
    got_bits = np.ascontiguousarray(got, dtype=np.float32).reshape(-1).view(np.uint32)
    want_bits = np.ascontiguousarray(want, dtype=np.float32).reshape(-1).view(np.uint32)
    assert got_bits.shape == want_bits.shape
    bad = np.flatnonzero(got_bits != want_bits)
    if bad.size:
        i = int(bad[0])
        raise AssertionError(
            f"{name}: {bad.size}/{got_bits.size} elements differ; first at {i}: "
            f"got {got_bits[i]:#010x} want {want_bits[i]:#010x}"
        )


@pytest.mark.parametrize("name", GGUF_PY_TYPES)
def test_matches_gguf_py(name: str) -> None:
    blocks = random_blocks(name, seed=1)
    with np.errstate(all="ignore"):  # inf/NaN scales are the point
        want = gguf_dequantize(blocks, T[name])
    assert_bits_equal(name, strata_dequant(name, blocks), want)


def test_matches_gguf_py_f16_bf16_exhaustive() -> None:
    every = np.arange(65536, dtype="<u2").view(np.uint8)
    assert_bits_equal("F16", _core.dequantize_bytes("F16", every, 65536),
                      gguf_dequantize(every, T.F16))  # fmt: skip
    bf = every.reshape(-1, 2)
    assert_bits_equal("BF16", _core.dequantize_bytes("BF16", bf, 65536),
                      gguf_dequantize(bf, T.BF16))  # fmt: skip


def test_matches_gguf_py_f32() -> None:
    bits = np.random.default_rng(7).integers(0, 2**32, size=8192, dtype=np.uint32)
    raw = bits.astype("<u4").view(np.uint8)
    assert_bits_equal("F32", _core.dequantize_bytes("F32", raw.tobytes(), 8192),
                      gguf_dequantize(raw, T.F32))  # fmt: skip


@pytest.fixture(scope="module")
def ggml() -> ggml_oracle.Ggml:
    g = ggml_oracle.load()
    assert g is not None, "llama-cpp-python (libggml-base), a test dependency, is missing"
    return g


@pytest.mark.parametrize("name", list(GGML_ONLY))
def test_ggml_only_types_match_ggml(ggml: ggml_oracle.Ggml, name: str) -> None:
    ty, blck, size = GGML_ONLY[name]
    tr = ggml.traits(ty)
    assert (tr.type_name.decode(), tr.blck_size, tr.type_size) == (name.lower(), blck, size)
    blocks = random_blocks(name, seed=2)
    assert_bits_equal(name, strata_dequant(name, blocks), ggml.dequantize(ty, blocks))


# ggml's C reference applies IQ2/IQ3 grid signs as `x * -1.f`, which the compiler turns into a
# negation, so a NaN's sign bit flips; gguf-py multiplies by -1.0, which keeps it (x86 rule).
# Strata follows gguf-py bit for bit; against ggml these types are compared with NaNs matched
# as NaNs (positions must agree, sign/payload may not). Every other type must match ggml exactly.
GGML_NAN_SIGN_DIFFERS = {"IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S"}


@pytest.mark.parametrize("name", GGUF_PY_TYPES)
def test_matches_ggml(ggml: ggml_oracle.Ggml, name: str) -> None:
    blocks = random_blocks(name, seed=3, n_blocks=1024)
    got = strata_dequant(name, blocks)
    want = ggml.dequantize(int(T[name]), blocks)
    if name not in GGML_NAN_SIGN_DIFFERS:
        assert_bits_equal(name, got, want)
        return
    nan = np.isnan(want)
    np.testing.assert_array_equal(np.isnan(got), nan)
    assert_bits_equal(name, got[~nan], want[~nan])
    # The difference really is only the NaN sign: gguf-py and ggml disagree the same way.
    with np.errstate(all="ignore"):
        ref = gguf_dequantize(blocks, T[name]).reshape(-1)
    assert_bits_equal(name, np.abs(ref[nan]), np.abs(want[nan]))


def test_accepts_bytes_and_arrays() -> None:
    blocks = random_blocks("Q4_K", seed=4, n_blocks=8)
    a = _core.dequantize_bytes("Q4_K", blocks, 8 * 256)
    b = _core.dequantize_bytes("Q4_K", blocks.tobytes(), 8 * 256)
    c = _core.dequantize_bytes("q4_k", blocks.reshape(-1), 8 * 256)
    assert_bits_equal("Q4_K", a, b)
    assert_bits_equal("Q4_K", a, c)
    with pytest.raises(ValueError, match="contiguous"):
        _core.dequantize_bytes("Q4_K", blocks[:, ::2], 4 * 256)
    with pytest.raises(TypeError):
        _core.dequantize_bytes("Q4_K", [1, 2, 3], 256)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["Q8_1", "Q8_K", "I8", "I16", "I32", "I64", "F64"])
def test_intermediate_and_integer_types_are_quant_errors(name: str) -> None:
    blck, size = GGML_QUANT_SIZES[T[name]]
    if name == "Q8_1":  # gguf-py's size is stale (40); ggml's block is 36 bytes
        size = 36
    with pytest.raises(QuantError, match=name):
        _core.dequantize_bytes(name, bytes(size), blck)


def test_bad_lengths_are_quant_errors() -> None:
    with pytest.raises(QuantError):
        _core.dequantize_bytes("Q4_0", bytes(17), 32)
    with pytest.raises(QuantError):
        _core.dequantize_bytes("Q4_K", bytes(144), 255)
    with pytest.raises(QuantError):  # refused before allocating 2**62 floats
        _core.dequantize_bytes("Q4_0", bytes(18), 2**62)
    with pytest.raises(ValueError, match="unknown ggml type"):
        _core.dequantize_bytes("Q9_9", bytes(18), 32)
