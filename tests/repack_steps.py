"""Decode steps that call the repacked Q4_K projections (`q4k_r16`), shared by
tests/test_cpu_repack.py and scripts/cpu_repack_check.py (which runs them on CPUs the CI
machine lacks, from a model path): light on imports, numpy and strata._core only."""

from __future__ import annotations

import numpy as np
from strata._core import Model

PROMPT = [1, 17, 300, 5, 99, 1024, 7, 7, 42, 511, 3, 250]


def projection_steps(path: str, **kw: object) -> tuple[list[np.ndarray], int]:
    """Four slots after their prompts, then steps of two to four one-token rows (the repacked
    projections' calls) and of one row, and a window beside one row (the original's): every
    logits row [V] in order, and the copies' bytes (`repack_proj_bytes`)."""
    m = Model.open(path, n_ctx=64, n_slots=4, **kw)  # type: ignore[arg-type]
    for s in range(4):
        m.forward(s, [p + s for p in PROMPT], logits="none")
    out: list[np.ndarray] = []
    for i, batch in enumerate([[0, 1, 2, 3], [1, 3], [0, 1, 2, 3], [2]]):
        rows = m.forward_batch([(s, [(37 * s + 11 * i) % 500 + 1], "last") for s in batch])
        out += [np.asarray(r) for r in rows]
    win = m.forward_batch([(0, [5, 6, 7], "window"), (1, [8], "last")])
    out += [np.asarray(r) for r in win]
    return out, int(m.hparams["repack_proj_bytes"])
