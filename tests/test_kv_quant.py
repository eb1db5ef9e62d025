"""The quantized KV caches' rows are what ggml writes: the first layer's keys and values (their
inputs do not depend on the cache type) stored as q4_0 / q8_0 equal gguf-py's quantization of
the same rows stored as f32, byte for byte — q4_0's after llama.cpp's Walsh-Hadamard rotation
(keys in blocks of the largest power of two dividing the head dim, values in 64s; written
here in numpy after ggml's `ggml_compute_forward_fwht`); the GPU refuses q4_0 with a clear
error."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType, quants
from models import TestModels
from strata._core import Model
from strata.config import Config
from strata.errors import ConfigError

HEADER = 40  # kv_export's header (rust/src/model/kv_blob.rs)


def fwht(x: np.ndarray, n: int) -> np.ndarray:
    """Each n-element block of each row: scaled by 1/sqrt(n), then the butterflies (float32)."""
    y = x.reshape(-1, n).astype(np.float32) * np.float32(1.0 / np.sqrt(np.float32(n)))
    length = 1
    while length < n:
        y = y.reshape(-1, n // (2 * length), 2, length)
        u, v = y[:, :, 0, :].copy(), y[:, :, 1, :].copy()
        y[:, :, 0, :], y[:, :, 1, :] = u + v, u - v
        length *= 2
    return y.reshape(x.shape)


def kv_rows(blob: bytes) -> tuple[np.ndarray, np.ndarray]:
    """(K, V) as [L, n, row_bytes] uint8 arrays of a kv_export blob."""
    head = np.frombuffer(blob[:24], dtype="<u4")
    n_layer, row_bytes, n = int(head[3]), int(head[4]), int(head[5])
    body = np.frombuffer(blob[HEADER:], dtype=np.uint8).reshape(2, n_layer, n, row_bytes)
    return body[0], body[1]


@pytest.mark.parametrize(("kv", "gtype"), [("q4_0", "Q4_0"), ("q8_0", "Q8_0")])
def test_first_layer_rows_are_ggml_quantizations(
    test_models: TestModels, kv: str, gtype: str
) -> None:
    path: Path = test_models.quantized("Q8_0")
    toks = [int(t) for t in np.random.default_rng(3).integers(0, 400, 24)]
    rows = {}
    for ty in ("f32", kv):
        m = Model.open(path, n_ctx=64, n_slots=1, kv_type=ty)
        m.forward(0, toks)
        rows[ty] = kv_rows(m.kv_export(0, len(toks)))
    d = Model.open(path, n_ctx=16).hparams["head_dim"]
    blocks = (max(b for b in (64, 128, 256) if d % b == 0), 64)  # (K's, V's) rotation
    for f32_rows, got, block in zip(rows["f32"], rows[kv], blocks, strict=True):
        x = f32_rows[0].view(np.float32)  # layer 0: [n, Nkv·D] floats
        if kv == "q4_0":
            x = fwht(x, block)
        want = quants.quantize(x, GGMLQuantizationType[gtype])
        assert np.array_equal(got[0], want)


def test_the_gpu_refuses_a_cpu_only_cache() -> None:
    with pytest.raises(ConfigError, match="kv_type: runs on the CPU path only"):
        Config.load({"device": "cuda", "kv_type": "q4_0"}, env={})
