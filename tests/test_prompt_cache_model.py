"""The prompt cache on the real forward pass (CPU): a slot's KV exported to host RAM and
imported into another slot continues exactly as the slot that computed it. Oracle: the same
model continuing the original slot (same chunks, same positions): bitwise equal logits."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import qwen3moe_file as qf
from strata import LLM

SHAPE = qf.Shape(n_layer=2, n_embd=128, n_head=2, n_head_kv=1, n_expert=8, n_expert_used=2)
SHAPE.n_ff_exp = 128


def write_model(folder: Path) -> Path:
    """A small random qwen3moe file (two layers, one KV head)."""
    return qf.write(folder / "m.gguf", SHAPE, qf.random_tensors(SHAPE, 3))


@pytest.fixture(scope="module")
def path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_model(tmp_path_factory.mktemp("pc"))


def toks(n: int, seed: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(0, 509, n)]


@pytest.mark.parametrize("kv_type", ["f16", "q8_0", "f32"])
def test_restored_kv_gives_the_prefilled_logits_bitwise(path: Path, kv_type: str) -> None:
    llm = LLM(path, n_ctx=192, parallel=3, kv_type=kv_type, prefill_chunk=16)
    p, s = toks(30, 1), toks(9, 2)
    llm.forward_batch([(0, p, "none")])
    whole = llm.kv_export(0, 30)
    part = llm.kv_export(0, 20)
    assert len(part) < len(whole)
    ref = llm.forward_batch([(0, s, "all")])[0]
    # the whole prefix, restored into another slot
    assert llm.kv_import(1, whole) == 30 and llm.slot_len(1) == 30
    got = llm.forward_batch([(1, s, "all")])[0]
    assert got is not None and ref is not None and np.array_equal(got, ref)
    # a shorter prefix: the oracle truncates the computing slot to it and runs the rest
    llm.truncate(0, 20)
    ref2 = llm.forward_batch([(0, p[20:] + s, "all")])[0]
    assert llm.kv_import(2, part) == 20
    got2 = llm.forward_batch([(2, p[20:] + s, "all")])[0]
    assert got2 is not None and ref2 is not None and np.array_equal(got2, ref2)
    # importing replaces what a slot held
    assert llm.kv_import(1, part) == 20 and llm.slot_len(1) == 20
