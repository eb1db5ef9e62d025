"""The chunked form of the Gated DeltaNet recurrence for prefill (`Model.set_deltanet_chunked`,
rust/src/model/deltanet_chunk.rs): long prefill pieces of the hybrid families solve each
chunk of 64 tokens with matrix products instead of one state pass per token. The same sums in
another order, so within float rounding of the recurrence, not bitwise (the recurrence on
random inputs, in f64, is its oracle in the Rust unit tests).

- HF transformers' logits (tests/golden, the thresholds of tests/test_model_families.py) with
  it on, prompts as one piece (one chunk) and as pieces of 48 (a chunk carried over pieces);
- whole-model prompt logits and the decode after the prompt against the recurrence, on the F32
  golden files and on Q8_0 files with prompts of several chunks per piece;
- the one-token decode and windows keep the recurrence: a window's rows stay bitwise the
  one-token steps with it on;
- a family without DeltaNet layers refuses it (ModelError).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import qwen3moe_file as qf
from strata._core import Model
from strata.errors import ModelError
from test_model_families import ARCH, GOLDEN, GOLDEN_SHAPES, hf_worst

HYBRIDS = list(qf.HYBRIDS)


def bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).view(np.uint32)


@pytest.mark.parametrize("chunk", [64, 48])
@pytest.mark.parametrize("fam", HYBRIDS)
def test_chunked_logits_match_transformers(fam: str, chunk: int) -> None:
    assert hf_worst(fam, ARCH[fam], chunk=chunk, deltanet_chunked=2) <= 1e-4


def rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


def prompt_and_decode(m: Model, toks: list[int], n_dec: int) -> np.ndarray:
    """Every prompt row's logits, then `n_dec` greedy decode steps' logits: [T + n_dec, V]."""
    m.free(0)
    rows = [m.forward(0, toks, logits="all")]
    for _ in range(n_dec):
        nxt = int(rows[-1][-1].argmax())
        rows.append(m.forward(0, [nxt], logits="all"))
    return np.concatenate(rows)


@pytest.mark.parametrize("fam", HYBRIDS)
def test_chunked_equals_recurrence_within_rounding_f32(fam: str) -> None:
    """A 100-token prompt (chunks of 64 + 36) and 8 decode steps. Bound: half the HF test's
    1e-4; the same prompt fed token by token (the recurrence, another matmul order) is
    printed beside it as the model's float-order scale (measured: 4e-6 to 5e-6, the chunked
    form 6e-6 to 1.4e-5, and as close to HF's logits as the recurrence)."""
    m = Model.open(GOLDEN / f"{fam}_f32.gguf", n_ctx=128, kv_type="f32", prefill_chunk=128)
    toks = [int(t) for t in np.random.default_rng(1).integers(0, m.n_vocab, 100)]
    want = prompt_and_decode(m, toks, 8)
    m.free(0)
    steps = np.concatenate([m.forward(0, [t], logits="all") for t in toks])
    m.set_deltanet_chunked(16)
    got = prompt_and_decode(m, toks, 8)
    assert not np.array_equal(bits(got), bits(want))  # the chunked form ran
    print(f"{fam}: chunked {rel(got, want):.1e}, token by token {rel(steps, want[:100]):.1e}")
    assert rel(got, want) <= 5e-5
    assert (got.argmax(1) == want.argmax(1)).all()
    m.set_deltanet_chunked(0)  # off again: bitwise the recurrence
    assert np.array_equal(bits(prompt_and_decode(m, toks, 8)), bits(want))


@pytest.fixture(scope="module")
def q8(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("chunked")
    out = {}
    for fam in HYBRIDS:
        s = GOLDEN_SHAPES[fam]
        f32 = qf.write(root / f"{fam}-F32.gguf", s, qf.random_tensors(s, 5))
        out[fam] = qf.quantize(f32, root / f"{fam}-Q8_0.gguf", "Q8_0")
    return out


@pytest.mark.parametrize("fam", HYBRIDS)
def test_chunked_prompts_of_several_chunks_q8(fam: str, q8: dict[str, Path]) -> None:
    """Pieces of 150 and 200 tokens (chunks 64 + 64 + 22, 64·3 + 8), then decode: within
    rounding of the recurrence (the Q8_0 matmuls quantize their inputs, so a rounding
    difference can move a value by one step of Q8_0: the bound is looser than F32's)."""
    m = Model.open(q8[fam], n_ctx=512, kv_type="f32", prefill_chunk=256)
    rng = np.random.default_rng(2)
    for n in (150, 200):
        toks = [int(t) for t in rng.integers(0, m.n_vocab, n)]
        m.set_deltanet_chunked(0)
        want = prompt_and_decode(m, toks, 6)
        m.set_deltanet_chunked(64)
        got = prompt_and_decode(m, toks, 6)
        assert rel(got, want) <= 1e-2, n
        assert (got.argmax(1) == want.argmax(1)).mean() >= 0.98, n


@pytest.mark.parametrize("fam", HYBRIDS)
def test_windows_stay_bitwise_one_token_steps(fam: str, q8: dict[str, Path]) -> None:
    m = Model.open(q8[fam], n_ctx=256, n_slots=2, kv_type="f16", prefill_chunk=128)
    m.set_deltanet_chunked(2)
    rng = np.random.default_rng(3)
    p = [int(t) for t in rng.integers(0, m.n_vocab, 80)]  # chunked on both slots alike
    w = [int(t) for t in rng.integers(0, m.n_vocab, 9)]
    for slot in (0, 1):
        m.forward(slot, p, logits="none")
    a = m.forward_batch([(0, w, "window")])[0]
    b = np.stack([m.forward(1, [t]) for t in w])
    assert a is not None and np.array_equal(bits(a), bits(b))


def test_refused_without_deltanet_layers() -> None:
    m = Model.open(GOLDEN / "qwen2moe_f32.gguf", n_ctx=16)
    with pytest.raises(ModelError, match="no recurrent state"):
        m.set_deltanet_chunked(64)
