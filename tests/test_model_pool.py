"""The model's forward pass on the CPU expert pool equals the serial single-threaded
reference bit for bit, on float and quantized files, for every pool schedule and worker
count (the pool's determinism claim, seen end to end)."""

from __future__ import annotations

import numpy as np
import pytest
from models import TestModels
from strata._core import Model

PROMPT = [1, 17, 300, 5, 99, 1024, 7, 7, 42, 511, 3, 250]


def logits(path: str, **kw: object) -> np.ndarray:
    m = Model.open(path, n_ctx=64, n_slots=1, **kw)  # type: ignore[arg-type]
    prefill = m.forward(0, PROMPT, logits="all")  # [T, V]
    step = m.forward(0, [12], logits="last")  # [V]
    return np.concatenate([prefill, step[None]])


@pytest.mark.parametrize("kind", ["f32", "Q8_0", "Q4_K_M"])
def test_pool_equals_serial(test_models: TestModels, kind: str) -> None:
    path = str(test_models.f32() if kind == "f32" else test_models.quantized(kind))
    ref = logits(path, threads=-1)
    for threads, host, pipe in [
        (1, True, False),
        (1, True, True),
        (2, False, True),
        (3, True, False),
    ]:
        got = logits(path, threads=threads, host_participates=host, pool_pipeline=pipe)
        assert np.array_equal(got.view(np.uint32), ref.view(np.uint32)), (threads, host, pipe)
