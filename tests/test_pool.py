"""The CPU expert pool through Python: the parity tool on a generated model (810 bitwise
comparisons), the pool against float64 numpy math on gguf-py-dequantized weights, and errors.

The generator writes a small qwen3moe-shaped GGUF with gguf-py's writer: 128 experts per layer,
three layers whose gate/up/down type mixes differ, random weights.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import gguf
import numpy as np
import numpy.typing as npt
import pytest
from strata._core import ExpertPool, MoELayer, matmul_reference, moe_reference
from strata.errors import ShapeError
from strata.gguf import GGUFFile
from strata.tools import parity

Q = gguf.GGMLQuantizationType
MIXES = [(Q.F32, Q.F32, Q.F32), (Q.Q8_0, Q.Q8_0, Q.Q8_0), (Q.Q8_0, Q.F32, Q.Q8_0)]


def _tensor(rng: np.random.Generator, ty: Q, shape: tuple[int, ...]) -> npt.NDArray[np.generic]:
    w = (rng.standard_normal(shape) * 0.1).astype(np.float32)
    return w if ty == Q.F32 else gguf.quants.quantize(w, ty)


def make_moe_gguf(
    path: Path,
    mixes: list[tuple[Q, Q, Q]] = MIXES,
    n_expert: int = 128,
    hidden: int = 64,
    inter: int = 32,
    seed: int = 0,
    tensor: Callable[[np.random.Generator, Q, tuple[int, ...]], npt.NDArray[np.generic]] = _tensor,
) -> Path:
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), "qwen3moe")
    w.add_block_count(len(mixes))
    w.add_expert_count(n_expert)
    w.add_expert_used_count(8)
    w.add_embedding_length(hidden)
    w.add_expert_feed_forward_length(inter)
    for b, (g, u, d) in enumerate(mixes):
        for name, ty, shape in (
            ("gate", g, (n_expert, inter, hidden)),
            ("up", u, (n_expert, inter, hidden)),
            ("down", d, (n_expert, hidden, inter)),
        ):
            t = tensor(rng, ty, shape)
            w.add_tensor(f"blk.{b}.ffn_{name}_exps.weight", t, raw_dtype=ty)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_moe_gguf(tmp_path_factory.mktemp("pool") / "moe.gguf")


def test_parity_tool_passes_810_on_a_generated_model(
    model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert parity.main([str(model)]) == 0
    out = capsys.readouterr().out
    assert "810/810 bitwise identical" in out
    assert "F32/F32/F32" in out and "Q8_0/Q8_0/Q8_0" in out and "Q8_0/F32/Q8_0" in out


def test_parity_tool_without_model_skips_with_77(capsys: pytest.CaptureFixture[str]) -> None:
    assert parity.main([]) == parity.SKIP
    assert "nothing was checked" in capsys.readouterr().err


def test_parity_tool_reports_a_mismatch(
    model: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A reference one ulp off in one value must fail the check (the comparison is real)."""

    def off_by_one_ulp(*args: object) -> npt.NDArray[np.float32]:
        y = moe_reference(*args)  # type: ignore[arg-type]
        y.view(np.uint32)[0, 0] ^= 1
        return y

    monkeypatch.setattr(parity, "moe_reference", off_by_one_ulp)
    monkeypatch.setattr(parity, "cases", lambda n: [parity.Case(0, 1, 2, 0)])
    assert parity.run(str(model), quiet=True) == 1
    assert "0/6 bitwise identical" in capsys.readouterr().out


def test_parity_tool_refuses_a_model_with_too_few_experts(tmp_path: Path) -> None:
    small = make_moe_gguf(tmp_path / "small.gguf", MIXES[:1], n_expert=16)
    assert parity.main([str(small)]) == 2


def _layer(f: GGUFFile, b: int) -> MoELayer:
    return next(layer for blk, layer in parity.load_layers(f) if blk == b)


def _numpy_moe(
    f: GGUFFile,
    b: int,
    x: npt.NDArray[np.float32],
    ids: npt.NDArray[np.uint32],
    w: npt.NDArray[np.float32],
) -> npt.NDArray[np.float64]:
    """float64 math on weights dequantized by gguf-py (the oracle, independent of Strata)."""

    def deq(p: str) -> npt.NDArray[np.float64]:
        t = f.tensors[f"blk.{b}.ffn_{p}_exps.weight"]
        raw = np.asarray(f.raw(t.name)).reshape(t.shape[0], t.shape[1], -1)
        return np.asarray(gguf.quants.dequantize(raw, Q[t.type]), dtype=np.float64)

    gate, up, down = deq("gate"), deq("up"), deq("down")
    y = np.zeros(x.shape, dtype=np.float64)
    for t in range(ids.shape[0]):
        for j in range(ids.shape[1]):
            e = ids[t, j]
            g = gate[e] @ x[t].astype(np.float64)
            h = g / (1 + np.exp(-g)) * (up[e] @ x[t].astype(np.float64))
            y[t] += w[t, j] * (down[e] @ h)
    return y


@pytest.mark.parametrize(("block", "rel"), [(0, 1e-5), (1, 2e-2), (2, 2e-2)])
def test_pool_matches_float64_numpy(model: Path, block: int, rel: float) -> None:
    """F32 layers agree to float32 rounding; Q8_0 ones to the activation quantization."""
    f = GGUFFile(model)
    layer = _layer(f, block)
    rng = np.random.default_rng(5)
    ids, w = parity.routing(rng, layer.n_expert, 3, 12)
    x = rng.standard_normal((3, layer.hidden)).astype(np.float32)
    want = _numpy_moe(f, block, x, ids, w)
    for pool in (ExpertPool(workers=2, pipelined=True), ExpertPool(workers=0)):
        got = pool.moe(layer, x, ids, w)
        err = np.abs(got - want).max() / np.abs(want).max()
        assert err < rel, (block, err)
        assert np.array_equal(got, moe_reference(layer, x, ids, w))


def test_matmul_matches_numpy_and_reference() -> None:
    rng = np.random.default_rng(2)
    wf = (rng.standard_normal((40, 64)) * 0.1).astype(np.float32)
    wq = gguf.quants.quantize(wf, Q.Q8_0).reshape(-1)
    x = rng.standard_normal((3, 64)).astype(np.float32)
    deq = gguf.quants.dequantize(wq.reshape(40, -1), Q.Q8_0).astype(np.float64)
    want = x.astype(np.float64) @ deq.T
    got = ExpertPool(workers=1).matmul("Q8_0", wq, 40, 64, x)
    assert np.abs(got - want).max() < 2e-2 * np.abs(want).max()
    assert np.array_equal(got, matmul_reference("Q8_0", wq, 40, 64, x))


def test_bad_ids_and_shapes_raise_shape_error(model: Path) -> None:
    f = GGUFFile(model)
    layer = _layer(f, 1)
    pool = ExpertPool(workers=1)
    x = np.ones((1, layer.hidden), dtype=np.float32)
    w = np.ones((1, 1), dtype=np.float32)
    with pytest.raises(ShapeError, match="out of range"):
        pool.moe(layer, x, np.array([[128]], dtype=np.uint32), w)
    with pytest.raises(ShapeError):
        pool.moe(
            layer, np.ones((2, layer.hidden), dtype=np.float32), np.zeros((1, 1), np.uint32), w
        )
    with pytest.raises(ShapeError):
        moe_reference(layer, x, np.array([[1000]], dtype=np.uint32), w)


def test_pool_agrees_with_llama_cpp_moe(model: Path) -> None:
    """llama.cpp's own CPU MoE graph (ggml mul_mat_id through llama-cpp-python) on the same
    bytes: the same activation formats, so only the summation order separates the results."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
    from ggml_moe import GgmlMoE

    f = GGUFFile(model)
    rng = np.random.default_rng(9)
    pool = ExpertPool(workers=1, pipelined=True)
    for b, layer in parity.load_layers(f):
        mats = [np.asarray(f.raw(f"blk.{b}.ffn_{p}_exps.weight")) for p in ("gate", "up", "down")]
        oracle = GgmlMoE(layer.types, mats, layer.n_expert, layer.hidden, layer.inter)
        ids, w = parity.routing(rng, layer.n_expert, 4, 24)
        x = rng.standard_normal((4, layer.hidden)).astype(np.float32)
        want = oracle.run(x, ids, w, 2)
        got = pool.moe(layer, x, ids, w)
        assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max(), layer.types


# Where each K/IQ block keeps its f16 scales (byte offsets inside the block), so random blocks
# can be given finite, moderate scales; every other byte stays random.
_SCALES = {
    Q.Q2_K: (80, 82),
    Q.Q3_K: (108,),
    Q.Q4_K: (0, 2),
    Q.Q5_K: (0, 2),
    Q.Q6_K: (208,),
    Q.IQ3_S: (0,),
    Q.IQ3_XXS: (0,),
    Q.IQ4_XS: (0,),
    Q.IQ2_XXS: (0,),
}


def _random_blocks(
    rng: np.random.Generator, ty: Q, shape: tuple[int, ...]
) -> npt.NDArray[np.uint8]:
    """Random blocks of type `ty` for a tensor of numpy `shape` (last axis = row length)."""
    blk, size = gguf.GGML_QUANT_SIZES[ty]
    nb = int(np.prod(shape)) // blk
    raw = rng.integers(0, 256, size=(nb, size), dtype=np.uint8)
    for off in _SCALES[ty]:
        d = (rng.uniform(0.002, 0.02, nb)).astype(np.float16)
        raw[:, off : off + 2] = d.view(np.uint8).reshape(nb, 2)
    return raw.reshape(*shape[:-1], shape[-1] // blk * size)


def test_parity_tool_passes_810_on_k_and_iq_mixes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The same 810 comparisons over layers of K and IQ types (SIMD kernels on this CPU)."""
    mixes = [(Q.Q4_K, Q.Q4_K, Q.Q6_K), (Q.IQ3_S, Q.IQ3_XXS, Q.IQ4_XS), (Q.Q2_K, Q.Q3_K, Q.Q5_K)]
    path = make_moe_gguf(
        tmp_path / "moe-k.gguf", mixes, hidden=256, inter=256, seed=7, tensor=_random_blocks
    )
    assert parity.main([str(path)]) == 0
    out = capsys.readouterr().out
    assert "810/810 bitwise identical" in out
    assert "Q4_K/Q4_K/Q6_K" in out and "IQ3_S/IQ3_XXS/IQ4_XS" in out
