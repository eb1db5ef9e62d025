"""A speculative window's step on the device (one piece of 2-8 rows, every row's logits)
replays CUDA graphs captured for its shape (`Stage::graph_key`, docs/GPU.md), as a decode step
of one-token pieces does: from its second step of a size on, the whole step (pure GPU) or its
per-layer graphs with the host's work between them (hybrid). Oracle: the same model opened with
`cuda_graph=False` (every kernel launched one by one) on the same windows, on the test models
of test_gpu_model.py (3 layers of 8 experts, top-2)."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from strata._core import Model
from test_gpu_hybrid import QUARTER
from test_gpu_model import N_CTX, model_files, prompts

pytestmark = pytest.mark.gpu

KINDS: dict[str, dict[str, Any]] = {
    "pure": {},
    "hybrid": dict(vram_slots=QUARTER, adapt_every=0, pcie_frac=0.0, threads=3),
}


@pytest.fixture(scope="module")
def files() -> dict[str, Path]:
    return model_files(("Q4_K_M",))


@pytest.mark.parametrize("kind", list(KINDS))
def test_window_graphs_equal_kernel_by_kernel(files: dict[str, Path], kind: str) -> None:
    kw = KINDS[kind]
    g = Model.open(files["Q4_K_M"], n_ctx=N_CTX, device="cuda", n_slots=2, **kw)
    e = Model.open(files["Q4_K_M"], n_ctx=N_CTX, device="cuda", n_slots=2, cuda_graph=False, **kw)
    toks = prompts(1, 12, seed=4, vocab=g.n_vocab)[0]
    for m in (g, e):
        m.forward(0, toks)
    rng = random.Random(7)
    worst = 0.0
    for _ in range(40):
        w = [rng.randrange(g.n_vocab) for _ in range(rng.randint(2, 8))]
        a = g.forward(0, w, logits="all")  # [t, V]
        b = e.forward(0, w, logits="all")
        worst = max(worst, float(np.abs(a - b).max()))
        assert np.allclose(a, b, rtol=0, atol=1e-5 * np.abs(b).max()), np.abs(a - b).max()
        assert (a.argmax(1) == b.argmax(1)).all()
        if g.slot_len(0) > N_CTX - 16:  # start over from the prompt (a rejection's cut)
            for m in (g, e):
                m.truncate(0, len(toks))
    shapes = g.cuda_graph_shapes
    print(f"{kind}: window graphs {shapes}, max |Δ| {worst:.3e} (bitwise: {worst == 0})")
    assert {("window", t) for t in range(2, 9)} <= set(shapes), shapes
    assert e.cuda_graph_shapes == [], e.cuda_graph_shapes
