"""Models whose files parse but describe nothing Strata can run safely: each is refused at
load with a typed error naming what is wrong (never a panic, an abort, a hang or a huge
allocation). Built with `strata.modelgen` (micro shapes), then one field broken."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
from strata import modelgen
from strata._core import Model
from strata.errors import ConfigError, GGUFError, ModelError
from strata.gguf import GGUFFile
from strata.llm import LLM

SPEC = modelgen.ModelSpec.micro(n_embd=64, n_ff_exp=64, head_dim=32, n_head=2, n_head_kv=1)
ARCH = "llama"  # a Mixtral-style file: the hyper-parameters' keys below are its


def write(tmp: Path, name: str, change: Any = None, extra: Any = None) -> Path:
    w = dict(modelgen.random_weights(SPEC, 0))
    if change is not None:
        change(w)
    p = tmp / f"{name}.gguf"
    modelgen.write_arrays(p, SPEC, w, arch=ARCH, extra=extra)
    return p


def test_a_zero_dimension_is_refused_naming_the_tensor(tmp_path: Path) -> None:
    def empty_vocab(w: dict[str, np.ndarray]) -> None:
        w["token_embd.weight"] = np.zeros((0, 64), np.float32)
        w["output.weight"] = np.zeros((0, 64), np.float32)

    with pytest.raises(ModelError, match=r"token_embd\.weight .*a dimension of 0"):
        Model.open(write(tmp_path, "vocab0", empty_vocab), n_ctx=64, threads=1)


def test_wrapping_head_sizes_are_refused(tmp_path: Path) -> None:
    """head_count × key_length that wrap to 0 in 64 bits would pass every shape check."""

    def heads(wr: Any) -> None:
        u64 = gguf.GGUFValueType.UINT64
        for k, v in (("head_count", 2**24), ("head_count_kv", 2**24), ("key_length", 2**40),
                     ("value_length", 2**40)):  # fmt: skip
            wr.add_key_value(f"{ARCH}.attention.{k}", v, u64)
        wr.add_key_value(f"{ARCH}.rope.dimension_count", 2, u64)

    def shapes(w: dict[str, np.ndarray]) -> None:
        for k in ("attn_q", "attn_k", "attn_v"):
            w[f"blk.0.{k}.weight"] = np.zeros((0, 64), np.float32)
        w["blk.0.attn_output.weight"] = np.zeros((64, 0), np.float32)

    with pytest.raises(ModelError, match="largest Strata runs"):
        Model.open(write(tmp_path, "wrap", shapes, heads), n_ctx=64, threads=1)


def test_a_bool_is_no_count(tmp_path: Path) -> None:
    def count(wr: Any) -> None:
        wr.add_key_value(f"{ARCH}.block_count", True, gguf.GGUFValueType.BOOL)

    with pytest.raises(ModelError, match="block_count"):
        Model.open(write(tmp_path, "bool", extra=count), n_ctx=64, threads=1)


def test_embedding_rows_must_be_the_vocabulary(tmp_path: Path) -> None:
    def rows(w: dict[str, np.ndarray]) -> None:
        rng = np.random.default_rng(5)
        w["token_embd.weight"] = rng.standard_normal((1024, 64)).astype(np.float32)
        w["output.weight"] = rng.standard_normal((1024, 64)).astype(np.float32)

    p = write(tmp_path, "rows", rows)
    with GGUFFile(p) as g:
        assert len(g.metadata["tokenizer.ggml.tokens"]) != 1024
    with pytest.raises(ModelError, match="one row per token"):
        LLM(p, n_ctx=64, threads=1)


def test_kv_of_a_model_with_other_projections_is_refused(tmp_path: Path) -> None:
    """Same shape, same norms, other K/V weights: another model's KV is no slot's."""

    def other_kv(w: dict[str, np.ndarray]) -> None:
        for k in ("attn_k", "attn_v"):
            w[f"blk.0.{k}.weight"] = w[f"blk.0.{k}.weight"] * 2

    a = Model.open(write(tmp_path, "a"), n_ctx=64, threads=1)
    b = Model.open(write(tmp_path, "b", other_kv), n_ctx=64, threads=1)
    a.forward(0, [1, 2, 3, 4], logits="none")
    blob = a.kv_export(0, 4)
    with pytest.raises(ValueError, match="another model"):
        b.kv_import(0, blob)
    assert a.kv_import(0, blob) == 4  # the model's own


def test_a_fifo_is_refused_not_waited_on(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe.gguf"
    os.mkfifo(fifo)
    code = f"""
from strata.errors import GGUFError
from strata.gguf import GGUFFile
try:
    GGUFFile({str(fifo)!r})
except GGUFError as e:
    print("refused:", e)
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "refused:" in r.stdout and "not a regular file" in r.stdout, r.stdout + r.stderr
    assert issubclass(GGUFError, Exception)


def test_too_many_slots_and_chunk_buffers_past_memory_are_config_errors(tmp_path: Path) -> None:
    p = write(tmp_path, "ok")
    with pytest.raises(ConfigError, match="n_slots"):
        Model.open(p, n_ctx=16, n_slots=1 << 20, threads=1)
    # under a 4 GiB address-space limit: the KV cache fits, the chunk's buffers do not
    code = f"""
import resource
resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
from strata._core import Model
from strata.errors import ConfigError
try:
    Model.open({str(p)!r}, n_ctx=1 << 22, prefill_chunk=1 << 22, threads=1)
except ConfigError as e:
    print("refused:", e)
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "refused:" in r.stdout, r.stdout + r.stderr[-2000:]
