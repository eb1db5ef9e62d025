"""Expert deferral (`defer_experts`, rust/src/gpu/defer.rs) on the device, on the hybrid test
models of test_gpu_hybrid.py (3 layers of 8 experts, top-2), no adaptation (the same experts
stay in VRAM, so the same pairs are CPU misses in both runs):

- Misses only in the last layer: its deferred job lands before the final norm, where the
  exact step adds it. With every CPU pair deferred it is the same pool call and the same add:
  the logits are bitwise the exact step's (prefill chunks and per-layer-graph decode steps).
  With each token's lowest-weight CPU pair deferred, the layer's CPU part is added in two
  sums instead of one (x + a + b for x + (a + b)): equal to float rounding (1e-5), greedy equal.
- Misses in the first layer: layer 1 reads x without layer 0's CPU experts, so the logits
  differ from the exact step's (the mode is on), and stay finite.
Quality (top-1 agreement, perplexity, KL) and speed: bench/defer_quality.py.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from strata._core import Model, Profile
from test_gpu_hybrid import N_EXPERT, N_LAYER, TOP_K, open_gpu
from test_gpu_model import model_files, prompts

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def files() -> dict[str, Path]:
    return model_files(("Q4_K_M", "Q8_0"))


def open_pair(path: Path, cold_layer: int, n: int = TOP_K) -> tuple[Model, Model]:
    """Exact and deferred models with every expert in VRAM but `cold_layer`'s (the profile
    ranks that layer's experts coldest; 2 slots short of all)."""
    counts = np.full((N_LAYER, N_EXPERT), 10.0, np.float32)
    counts[cold_layer, :] = 0.0
    counts[cold_layer, 2:] = 1.0  # its experts 0 and 1 stay out
    prof = Profile.from_counts(path, counts, 100)
    kw = dict(chunk=24, vram_slots=N_LAYER * N_EXPERT - 2, adapt_every=0, profile=prof)
    return open_gpu(path, **kw), open_gpu(path, defer_experts=n, **kw)


def run(m: Model, toks: list[int], steps: int) -> list[np.ndarray]:
    m.free(0)
    out = [np.asarray(m.forward(0, toks, logits="all"))]  # chunks of 24 and 8: CPU misses
    for _ in range(steps):
        out.append(np.asarray(m.forward(0, [int(out[-1][-1].argmax())]))[None])
    return out


@pytest.mark.parametrize("n", [1, TOP_K])
@pytest.mark.parametrize("ty", ["Q4_K_M", "Q8_0"])
def test_deferring_the_last_layer_is_exact(files: dict[str, Path], ty: str, n: int) -> None:
    """(n = top-k: bitwise; n = 1: to rounding.)"""
    ex, de = open_pair(files[ty], N_LAYER - 1, n)
    assert (de.hybrid_info() or {})["defer_experts"] == n
    for toks in prompts(3, 32, seed=5, vocab=ex.n_vocab):
        for a, b in zip(run(ex, toks, 6), run(de, toks, 6), strict=True):
            if n == TOP_K:
                assert np.array_equal(a, b)
            else:
                np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5)
                assert (a.argmax(-1) == b.argmax(-1)).all()
    assert de.cuda_graph_state == "captured (per layer)"
    for m in (ex, de):
        c = m.hybrid_counters()
        assert c is not None
        _, mc, mp = c.totals()
        assert mc > 0 and mp == 0  # the last layer's misses ran on the CPU


@pytest.mark.parametrize("n", [1, TOP_K])
def test_deferring_the_first_layer_changes_the_logits(files: dict[str, Path], n: int) -> None:
    ex, de = open_pair(files["Q8_0"], 0, n)
    toks = prompts(1, 32, seed=7, vocab=ex.n_vocab)[0]
    a, b = run(ex, toks, 4), run(de, toks, 4)
    assert all(np.isfinite(x).all() for x in b)
    assert not np.array_equal(a[0], b[0])
