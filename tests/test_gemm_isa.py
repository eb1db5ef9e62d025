"""The multi-token (prefill) dot path of every ISA bitwise equal to the scalar single-token
kernels of the same float order (`_testing.multi_dot` → `MultiDot::call`): scalar, AVX2 and
the AVX-512 kernels (`gemm_avx512.rs`, VNNI and AVX-512BW variants) over random blocks, token
counts 1..33 and several row lengths. ISAs (and VNNI) this CPU lacks are skipped, with the
reason."""

from __future__ import annotations

import numpy as np
import pytest
from dot_util import ACT, random_act_f32, random_row
from strata import _core
from strata._core import _testing
from strata.errors import QuantError

TYPES = ["Q4_K", "Q6_K", "Q8_0"]
ORDERS = ["single", "many"]
COUNTS = [1, 2, 3, 4, 5, 7, 8, 9, 12, 16, 17, 31, 32, 33]
HAVE = set(_core.dot_isas())
VNNI = "avx512vnni" in _core.cpu_features()


def _case(t: str, nb: int, seed: int) -> tuple[int, bytes, list[bytes]]:
    rng = np.random.default_rng(seed)
    n = 256 * nb
    row = random_row(t, n, rng)
    acts = [_core.quantize_act(ACT[t], random_act_f32(rng, n)) for _ in range(max(COUNTS))]
    # the activation extremes: every value ±127 (Q8 never holds −128)
    x = np.where(np.arange(n) % 5 == 0, -1.0, 1.0).astype(np.float32)
    acts[2] = _core.quantize_act(ACT[t], x)
    acts[9] = _core.quantize_act(ACT[t], -x)
    return n, row, acts


def _bits(xs: list[float]) -> list[int]:
    return np.asarray(xs, np.float32).view(np.uint32).tolist()


def _variants() -> list[tuple[str, bool | None]]:
    return [("scalar", None), ("avx2", None), ("avx512", False), ("avx512", True)]


@pytest.mark.parametrize("t", TYPES)
@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize(("isa", "vnni"), _variants())
def test_multi_token_equals_scalar_single_token(
    t: str, order: str, isa: str, vnni: bool | None
) -> None:
    if isa not in HAVE:
        pytest.skip(f"this CPU lacks {isa} ({_core.cpu_features()})")
    if vnni and not VNNI:
        pytest.skip("this CPU lacks AVX-512 VNNI")
    for nb in (1, 3, 8):
        n, row, acts = _case(t, nb, 100 * nb + len(t))
        for cnt in COUNTS:
            got = _testing.multi_dot(t, n, row, acts[:cnt], order, isa, vnni)
            # the oracle: the scalar kernel of the same order, one token per call
            want = [_testing.multi_dot(t, n, row, [a], order, "scalar")[0] for a in acts[:cnt]]
            assert _bits(got) == _bits(want), f"{t} {order} {isa} vnni={vnni} n={n} cnt={cnt}"
            if order == "single":
                one = [_core.vec_dot(t, n, row, a, "scalar") for a in acts[:cnt]]
                assert _bits(want) == _bits(one)


TILE_CASES = [("Q4_K", "single"), ("Q4_K", "many"), ("IQ3_S", "many"), ("Q6_K", "many")]
# the rows × tokens schemes this CPU runs (as tests/test_isa.py reads them)
TILES = {"vnni": VNNI and "avx512" in HAVE, "amx": "amx-int8" in _core.cpu_features()}


@pytest.mark.parametrize(("t", "order"), TILE_CASES)
@pytest.mark.parametrize("tiles", ["vnni", "amx"])
def test_tiles_equal_scalar_single_token(t: str, order: str, tiles: str) -> None:
    """The rows × tokens tiles (`MultiDot::rows_call`: AMX or VNNI registers) bitwise the
    scalar single-token kernel per (row, token): row counts around the 8- and 16-row tiles,
    token counts around the 16-token tile and past the 256 tokens one call may take."""
    if not TILES[tiles]:  # a CPU feature absent here: reported as a skip, not a pass
        pytest.skip(f"this CPU lacks the {tiles} tiles ({_core.cpu_features()})")
    rng = np.random.default_rng(len(t) + len(order))
    n = 512
    nr = 19
    rows = [random_row(t, n, rng) for _ in range(nr)]
    acts = [_core.quantize_act(ACT[t], random_act_f32(rng, n)) for _ in range(270)]
    for cnt in (12, 33, 270):
        got = _testing.rows_dot(t, n, b"".join(rows), acts[:cnt], order, tiles)
        for r, row in enumerate(rows):
            want = [_testing.multi_dot(t, n, row, [a], order, "scalar")[0] for a in acts[:cnt]]
            assert _bits(got[r * cnt : (r + 1) * cnt]) == _bits(want), f"{tiles} row {r} cnt {cnt}"


def test_avx512_kernels_exist_where_the_cpu_has_avx512() -> None:
    """Where the CPU runs AVX-512 the variants are real kernels (not the AVX2 fallback):
    asking for a type without one is an error, asking for Q4_K is not."""
    if "avx512" not in HAVE:
        pytest.skip(f"this CPU lacks avx512 ({_core.cpu_features()})")
    n, row, acts = _case("Q4_K", 1, 1)
    assert len(_testing.multi_dot("Q4_K", n, row, acts[:3], "single", "avx512", False)) == 3
    with pytest.raises(QuantError):
        _testing.multi_dot("Q5_K", n, random_row("Q5_K", n, np.random.default_rng(0)),
                           acts[:3], "single", "avx512", False)  # fmt: skip


def test_bad_arguments_are_errors() -> None:
    n, row, acts = _case("Q4_K", 1, 2)
    with pytest.raises(QuantError):
        _testing.multi_dot("Q4_K", n, row[:-1], acts[:2])
    with pytest.raises(QuantError):
        _testing.multi_dot("Q4_K", n, row, [acts[0], acts[1][:-1]])
    with pytest.raises(QuantError):
        _testing.multi_dot("Q4_K", n, row, acts[:2], "sideways")
    with pytest.raises(QuantError):
        _testing.multi_dot("Q4_K", n, row, acts[:2], "single", "avx2", True)
