"""`cpu_repack`: the Q6_K output head repacked at load (rust/src/quant/dot/q6k_repack.rs) gives
the logits of the original layout bit for bit, prefill (ggml's tiled order for >= 8 rows) and
decode (`vec_dot`'s order), and its RAM is reported."""

from __future__ import annotations

import numpy as np
from models import TestModels
from strata._core import Model
from strata.config import Config
from strata.gguf import GGUFFile

PROMPT = [1, 17, 300, 5, 99, 1024, 7, 7, 42, 511, 3, 250]


def run(path: str, **kw: object) -> tuple[np.ndarray, int]:
    m = Model.open(path, n_ctx=64, n_slots=1, **kw)  # type: ignore[arg-type]
    prefill = m.forward(0, PROMPT, logits="all")  # [T, V]: the tiled order
    steps = [m.forward(0, [t], logits="last") for t in (12, 400, 3)]  # [V] each
    return np.concatenate([prefill, np.stack(steps)]), int(m.hparams["repack_bytes"])


def test_repacked_head_is_bitwise_the_original(test_models: TestModels) -> None:
    path = str(test_models.quantized("Q4_K_M"))
    with GGUFFile(path) as g:
        head = g.tensors.get("output.weight") or g.tensors["token_embd.weight"]
        assert head.type == "Q6_K", head.type  # llama.cpp's Q4_K_M keeps the head at Q6_K
        head_bytes = head.nbytes
    ref, none = run(path, cpu_repack=False)
    assert none == 0
    for threads in (-1, 1):
        got, used = run(path, cpu_repack=True, threads=threads)
        assert used == head_bytes
        assert np.array_equal(got.view(np.uint32), ref.view(np.uint32)), threads


def test_cpu_repack_is_a_config_field() -> None:
    assert Config().cpu_repack is True
    assert Config.load({"cpu_repack": False}).cpu_repack is False
