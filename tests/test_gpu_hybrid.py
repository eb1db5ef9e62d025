"""The hybrid GPU step (`Model.open(..., device="cuda", vram_slots=N | vram_budget_mib=M)`,
rust/src/gpu/hybrid.rs, docs/TIERS_VRAM.md) on the device, against the pure-GPU path (every
weight in VRAM) on the test models of test_gpu_model.py (3 layers of 8 experts, top-2).

- With every expert in a slot the GPU computes exactly what the pure path computes (same
  kernels, same ids; only the expert addresses differ): the logits are bitwise equal.
- With 25% of the experts in slots (6 of 24), the CPU pool computes the missed pairs (its own
  activation quantization, q8_K / q8_0, and summation order; added to the GPU's sum), so
  near-ties may flip: the protocol of test_gpu_model.py with the pure-GPU path as the
  reference (greedy 64-token continuations identical up to the reference's first near-tie on
  ≥ 9 of 10 prompts; top-1 ≥ 99% along the reference's path at its sure steps), for the sync
  and the async tier with a choice after every step (`adapt_every=1`: swaps on most steps,
  each one under the fence protocol), prefill chunks (> 8 tokens: the grouped kernels) and
  decode steps.
- The counters add up (every routed pair is a hit or a miss), swaps happen and the slots stay
  full, and `strata.LLM` exposes them (`hybrid`, `/v1/status`'s `tiers.vram`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from strata import _core
from strata._core import Model
from test_gpu_model import MARGIN, N_CTX, margin, model_files, prompts

pytestmark = pytest.mark.gpu

N_LAYER, N_EXPERT, TOP_K = 3, 8, 2
QUARTER = N_LAYER * N_EXPERT // 4  # 6 slots: 25% of the experts


@pytest.fixture(scope="module")
def files() -> dict[str, Path]:
    return model_files(("Q4_K_M", "Q8_0"))


def open_gpu(path: Path, chunk: int = 64, **kw: Any) -> Model:
    kw.setdefault("pcie_frac", 0.0)  # every miss on the CPU unless a test asks for PCIe
    return Model.open(path, n_ctx=N_CTX, prefill_chunk=chunk, device="cuda", threads=3, **kw)


def routed_pairs(c: Any) -> int:
    h, mc, mp = c.totals()
    return int(h + mc + mp)


@pytest.mark.parametrize("ty", ["Q4_K_M", "Q8_0"])
def test_all_experts_resident_is_bitwise_the_pure_path(files: dict[str, Path], ty: str) -> None:
    pure = open_gpu(files[ty], chunk=24)
    hy = open_gpu(files[ty], chunk=24, vram_slots=N_LAYER * N_EXPERT, adapt_every=0)
    info = hy.hybrid_info()
    assert info is not None and info["n_slots"] == info["n_experts"] == N_LAYER * N_EXPERT
    assert info["resident"] == N_LAYER * N_EXPERT
    assert pure.hybrid_info() is None and pure.hybrid_counters() is None
    for toks in prompts(3, 32, seed=11, vocab=pure.n_vocab):
        pure.free(0)
        hy.free(0)
        a = pure.forward(0, toks, logits="all")  # chunks of 24 (grouped kernels) and 8
        b = hy.forward(0, toks, logits="all")
        assert np.array_equal(a, b)
        for _ in range(4):
            nxt = [int(a[-1].argmax())]
            a = pure.forward(0, nxt)[None]
            b = hy.forward(0, nxt)[None]
            assert np.array_equal(a, b)
    c = hy.hybrid_counters()
    assert c is not None
    h, mc, mp = c.totals()
    assert mc == mp == 0 and h == 3 * (32 + 4) * N_LAYER * TOP_K
    # one-token steps after the first replay per-layer graphs: still bitwise the pure path
    assert hy.cuda_graph_state == "captured (per layer)"


@pytest.mark.parametrize("stream_chunk", [24, 48], ids=["two-chunks", "long-chunk"])
@pytest.mark.parametrize("ty", ["Q4_K_M", "Q8_0"])
def test_streamed_prefill_is_bitwise_the_pure_path(
    files: dict[str, Path], ty: str, stream_chunk: int
) -> None:
    """Chunks of ≥ stream_min_tokens copy the missing experts into VRAM (through the
    page-locked bounce buffers, double-buffered staging) and run every pair with the pure
    path's kernels on the same bytes: bitwise the pure path's logits at the same chunking.
    `stream_chunk` 48 (above prefill_chunk = 24): the 48-token prompts run as one chunk, the
    buffers sized for it."""
    pure = open_gpu(files[ty], chunk=stream_chunk)
    hy = open_gpu(
        files[ty],
        chunk=24,
        vram_slots=QUARTER,
        adapt_every=1,
        stream_min_tokens=16,
        stream_chunk=stream_chunk,
        stream_threads=3,
    )
    info = hy.hybrid_info()
    assert info is not None and info["stream_min_tokens"] == 16
    assert info["stream_chunk"] == stream_chunk and info["stream_areas"] == 2
    assert info["stream_threads"] == 3
    for toks in prompts(4, 48, seed=16, vocab=pure.n_vocab):  # 48 // stream_chunk chunks
        pure.free(0)
        hy.free(0)
        assert np.array_equal(pure.forward(0, toks, logits="all"), hy.forward(0, toks, "all"))
    c = hy.hybrid_counters()
    assert c is not None
    h, mc, mp = c.totals()
    snap = c.snapshot()
    assert mc == 0 and h + mp == 4 * 48 * N_LAYER * TOP_K and mp > 0
    # at most every expert of every layer once per chunk (fewer: the resident ones)
    eb = info["expert_bytes_total"] // (N_LAYER * N_EXPERT)
    assert 0 < snap["pcie_bytes"] <= 4 * (48 // stream_chunk) * N_LAYER * N_EXPERT * eb
    # a streamed chunk then decode steps (misses on the CPU) agree at sure positions
    toks = prompts(1, 24, seed=17, vocab=pure.n_vocab)[0]
    pure.free(0)
    hy.free(0)
    a, b = pure.forward(0, toks), hy.forward(0, toks)
    assert np.array_equal(a, b)
    agree = []
    for _ in range(16):
        nxt = [int(a.argmax())]
        a, b = pure.forward(0, nxt), hy.forward(0, nxt)
        if margin(a) >= MARGIN:
            agree.append(a.argmax() == b.argmax())
    assert np.mean(agree) >= 0.99


@pytest.mark.parametrize("ty", ["Q4_K_M", "Q8_0"])
def test_prefill_logits_agree_with_pure_gpu(files: dict[str, Path], ty: str) -> None:
    pure = open_gpu(files[ty], chunk=24)
    hy = open_gpu(files[ty], chunk=24, vram_slots=QUARTER, adapt_every=0)
    top1, sure = [], []
    for toks in prompts(10, 32, seed=12, vocab=pure.n_vocab):
        pure.free(0)
        hy.free(0)
        ref = pure.forward(0, toks, logits="all")
        ours = hy.forward(0, toks, logits="all")
        assert np.isfinite(ours).all()
        top1.extend(ours.argmax(1) == ref.argmax(1))
        sure.extend(margin(ref) >= MARGIN)
    t, s = np.array(top1), np.array(sure)
    print(f"{ty}: top-1 {t[s].mean():.4f} over {s.sum()} sure positions ({t.mean():.4f} all)")
    assert t[s].mean() >= 0.99
    c = hy.hybrid_counters()
    assert c is not None
    h, mc, mp = c.totals()
    assert h + mc == 10 * 32 * N_LAYER * TOP_K and mp == 0
    assert 0 < h < h + mc  # both sides ran


def greedy_vs_pure(pure: Model, hy: Model, n: int, steps: int) -> tuple[int, list[int], float]:
    """test_gpu_model.py's protocol with the pure path as the reference, over `n` 8-token
    prompts: how many greedy `steps`-token continuations are identical up to the reference's
    first near-tie (and those cuts), and top-1 along the reference's path at its sure steps."""
    same = 0
    cuts: list[int] = []
    forced: list[bool] = []
    for toks in prompts(n, 8, seed=13, vocab=pure.n_vocab):
        refs: list[int] = []
        sure: list[bool] = []
        pure.free(0)
        logits = pure.forward(0, toks)
        cut = steps
        for i in range(steps):
            sure.append(bool(margin(logits) >= MARGIN))
            if cut == steps and not sure[-1]:
                cut = i
            refs.append(int(logits.argmax()))
            logits = pure.forward(0, refs[-1:])
        hy.free(0)
        ours: list[int] = []
        logits = hy.forward(0, toks)
        for _ in range(steps):
            ours.append(int(logits.argmax()))
            logits = hy.forward(0, ours[-1:])
        hy.free(0)
        logits = hy.forward(0, toks)
        for r, ok in zip(refs, sure, strict=True):
            if ok:
                forced.append(int(logits.argmax()) == r)
            logits = hy.forward(0, [r])
        same += ours[:cut] == refs[:cut]
        cuts.append(cut)
    return same, cuts, float(np.mean(forced))


@pytest.mark.parametrize("tier_async", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("ty", ["Q4_K_M", "Q8_0"])
def test_greedy_matches_pure_gpu_with_swaps_every_step(
    files: dict[str, Path], ty: str, tier_async: bool
) -> None:
    pure = open_gpu(files[ty])
    hy = open_gpu(
        files[ty], vram_slots=QUARTER, adapt_every=1, adapt_swaps=4, tier_async=tier_async
    )
    same, cuts, agree = greedy_vs_pure(pure, hy, 10, 64)
    c = hy.hybrid_counters()
    info = hy.hybrid_info()
    assert c is not None and info is not None
    snap = c.snapshot()
    print(
        f"{ty} {'async' if tier_async else 'sync'}: {same}/10 identical up to the first "
        f"near-tie {cuts}; top-1 along the pure path {agree:.4f}; "
        f"swaps {snap['swaps']}, hit rate {sum(snap['hits']) / routed_pairs(c):.3f}"
    )
    assert same >= 9
    assert agree >= 0.99
    assert routed_pairs(c) == (10 * 2 * (8 + 64)) * N_LAYER * TOP_K
    assert snap["swaps"] > 0, "adapt_every=1 swaps experts in"
    assert snap["fill_bytes"] > 0 and info["tier_async"] == tier_async
    assert info["resident"] <= info["n_slots"] == QUARTER
    assert info["pcie_frac"] == 0.0 and info["pcie"] == "off"
    # every step was a window of the one stage, and each ended at a gap (docs/PROTOCOL.md):
    # greedy_vs_pure runs two passes per prompt (its own greedy path, then the reference's),
    # each one prefill chunk (8 tokens) and 64 decode steps
    steps = 2 * 10 * (1 + 64)
    keys = ("device", "layers", "windows", "gaps", "busy", "windows_in_flight")
    assert [{k: s[k] for k in keys} for s in info["stages"]] == [
        {
            "device": 0,
            "layers": (0, N_LAYER),
            "windows": steps,
            "gaps": steps,
            "busy": False,
            "windows_in_flight": 0,
        }
    ]
    assert info["stages"][0]["swaps"] > 0 and info["stages"][0]["copying_s"] == 0


@pytest.mark.parametrize("frac", [0.5, 1.0])
def test_pcie_misses_run_on_the_gpu_from_the_registered_mapping(
    files: dict[str, Path], frac: float
) -> None:
    """`pcie_frac` of the missed experts of chunks of ≤ 8 tokens (at most top-k per layer, the
    staging area's capacity) are copied by the copy engine from the GGUF mapping registered
    with the driver and run through the resident experts' kernels (a second launch over the
    staged experts' pointer tables); the pool computes the rest. With every decode miss over
    PCIe each pair runs the pure path's kernels on the same bytes (only the sum is split in
    two), so the logits stay within float rounding of the pure path's; with half, the
    protocol of the CPU misses holds."""
    pure = open_gpu(files["Q4_K_M"])
    hy = open_gpu(files["Q4_K_M"], vram_slots=QUARTER, adapt_every=1, pcie_frac=frac)
    info = hy.hybrid_info()
    assert info is not None and info["pcie"].startswith("registered"), info["pcie"]
    assert info["pcie_frac"] == frac
    same, cuts, agree = greedy_vs_pure(pure, hy, 6, 32)
    print(f"pcie_frac {frac}: {same}/6 identical up to {cuts}; top-1 {agree:.4f}")
    assert same >= 5 and agree >= 0.99
    c = hy.hybrid_counters()
    assert c is not None
    h, mc, mp = c.totals()
    assert h + mc + mp == 6 * 2 * (8 + 32) * N_LAYER * TOP_K
    assert mp > 0 and mc > 0 and h > 0 and c.snapshot()["pcie_bytes"] > 0
    # decode steps: every miss over PCIe at 1.0 (top-k fit the staging area)
    toks = prompts(1, 8, seed=18, vocab=pure.n_vocab)[0]
    pure.free(0)
    hy.free(0)
    a, b = pure.forward(0, toks), hy.forward(0, toks)
    _, mc0, mp0 = c.totals()
    for _ in range(8):
        if frac == 1.0:
            assert np.abs(a - b).max() <= 1e-2 * max(1.0, float(np.abs(a).max()))
        nxt = [int(a.argmax())]
        a, b = pure.forward(0, nxt), hy.forward(0, nxt)
    _, mc1, mp1 = c.totals()
    assert mp1 > mp0 and (mc1 == mc0 if frac == 1.0 else mc1 > mc0)


def test_no_slots_runs_every_expert_on_the_cpu(files: dict[str, Path]) -> None:
    pure = open_gpu(files["Q8_0"], chunk=24)
    hy = open_gpu(files["Q8_0"], chunk=24, vram_slots=0)
    toks = prompts(1, 32, seed=14, vocab=pure.n_vocab)[0]
    ref = pure.forward(0, toks, logits="all")
    ours = hy.forward(0, toks, logits="all")
    s = margin(ref) >= MARGIN
    assert (ours.argmax(1) == ref.argmax(1))[s].mean() >= 0.99
    c = hy.hybrid_counters()
    assert c is not None and c.totals() == (0, 32 * N_LAYER * TOP_K, 0)


def test_budget_below_the_fixed_part_is_a_config_error(files: dict[str, Path]) -> None:
    with pytest.raises(_core.ConfigError, match="budget"):
        open_gpu(files["Q8_0"], vram_budget_mib=1)


def test_llm_hybrid_counters_and_status(files: dict[str, Path]) -> None:
    from strata import LLM

    llm = LLM(files["Q4_K_M"], n_ctx=128, device="cuda", vram_budget_mib=2048, adapt_every=2)
    assert llm.hybrid is not None
    sc = (llm.model.hybrid_info() or {})["stream_chunk"]
    assert llm.prefill_piece == (sc or llm.config.prefill_chunk)
    ids = prompts(1, 16, seed=15, vocab=llm.n_vocab)[0]
    out = list(llm.generate_ids(ids, max_tokens=8, stop_ids=[], temperature=0))
    assert len(out) == 8
    vram = llm.info()["tiers"]["vram"]
    assert vram["enabled"] and vram["hit_rate"] is not None
    assert vram["plan"]["n_slots"] > 0
    names = {name for name, _, _ in llm.labeled_stats()}
    assert "expert_hits_total" in names
    h, mc, mp = llm.tier_counts() or (0, 0, 0)
    assert h + mc + mp == (16 + 7) * N_LAYER * TOP_K
