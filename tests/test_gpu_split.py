"""The layer split on the device (issue #21, docs/PROTOCOL.md): one GPU as two stages
(`gpus="0,0"`), each with its own layers' weights, KV cache, buffers, stream and (hybrid)
expert slots, the activations hopping between them, every step a window of the stage
protocol. On the test models of test_gpu_model.py (3 layers of 8 experts, top-2).

The reference is the one-stage model, which runs today's single-GPU step:
- pure GPU (every weight in VRAM): each stage runs the same kernels on the same bytes and
  the hop is an exact copy of the residual stream, so the logits are bitwise the one-stage
  model's — prefill chunks (grouped kernels), decode steps (captured graphs per stage) and
  batched steps of two slots, for every way of cutting 3 layers in two;
- hybrid with the residency fixed (`adapt_every=0`, 25% of the experts in slots: most pairs
  are CPU misses): the stages' slot shares (2 + 4 of 6 for layers 0 | 1-2) fill the same
  experts per layer as one stage's 6, so each pair runs on the same side with the same
  bytes: bitwise again, sync and async tier;
- hybrid with a choice after every step (`adapt_every=1`: swaps on most steps, each under
  the fence protocol, per stage): the residency now depends on each stage's own choice, so
  the reference is test_gpu_hybrid.py's protocol against the pure path (greedy 64-token
  continuations identical up to the reference's first near-tie on ≥ 9 of 10 prompts; top-1
  ≥ 99% along the reference's path at its sure steps), sync and async, with swaps on both
  stages and every step a window through both stages ending at a gap on each.
The hop two devices take (through page-locked host memory) runs on one device too
(`split_hop="host"`), and KV blobs, `strata.LLM` and three stages are checked against one
stage.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from strata import _core
from strata._core import Model
from test_gpu_hybrid import N_EXPERT, N_LAYER, QUARTER, TOP_K, greedy_vs_pure, routed_pairs
from test_gpu_model import N_CTX, TWO_GPUS, model_files, prompts

pytestmark = pytest.mark.gpu

SPLITS = ["auto", "1", "2"]  # auto cuts 3 equal layers at 2 (the nearest half)


@pytest.fixture(scope="module")
def files() -> dict[str, Path]:
    return model_files(("Q4_K_M", "Q8_0"))


def open_gpu(path: Path, chunk: int = 64, **kw: Any) -> Model:
    kw.setdefault("pcie_frac", 0.0)
    return Model.open(path, n_ctx=N_CTX, prefill_chunk=chunk, device="cuda", threads=3, **kw)


def bounds(split: str) -> int:
    return 2 if split == "auto" else int(split)


def check_stages(m: Model, split: str, steps: int) -> list[dict[str, Any]]:
    """Two stages on device 0 covering the layers at the split; every step entered both and
    ended at a gap on each; the hop into stage 1 took device time."""
    st = m.stages()
    b = bounds(split)
    assert [s["device"] for s in st] == [0, 0]
    assert [tuple(s["layers"]) for s in st] == [(0, b), (b, N_LAYER)]
    for s in st:
        assert s["windows"] == s["gaps"] == steps, st
        assert not s["busy"] and s["windows_in_flight"] == 0
        assert s["max_windows_in_flight"] == 1 and s["compute_s"] > 0
    assert st[0]["copying_s"] == 0 and st[1]["copying_s"] > 0
    return st


@pytest.mark.parametrize("split", SPLITS)
@pytest.mark.parametrize("ty", ["Q4_K_M", "Q8_0"])
def test_two_stages_are_bitwise_one_stage_pure_gpu(
    files: dict[str, Path], ty: str, split: str
) -> None:
    one = open_gpu(files[ty], chunk=24)
    two = open_gpu(files[ty], chunk=24, gpus=TWO_GPUS, layer_split=split)
    assert one.stages()[0]["layers"] == (0, N_LAYER) and len(two.stages()) == 2
    steps = 0
    for toks in prompts(3, 32, seed=21, vocab=one.n_vocab):
        one.free(0)
        two.free(0)
        a = one.forward(0, toks, logits="all")  # chunks of 24 (grouped kernels) and 8
        b = two.forward(0, toks, logits="all")
        steps += 2
        assert np.array_equal(a, b)
        for _ in range(12):  # one-token steps: eager, then the captured graphs per stage
            nxt = [int(a[-1].argmax())]
            a = one.forward(0, nxt)[None]
            b = two.forward(0, nxt)[None]
            steps += 1
            assert np.array_equal(a, b)
    assert two.cuda_graph_state == one.cuda_graph_state == "captured"
    check_stages(two, split, steps)


@pytest.mark.parametrize("split", ["1", "2"])
def test_two_stages_batched_steps_are_bitwise_one_stage(files: dict[str, Path], split: str) -> None:
    """Two slots per step (each piece's KV in each stage's own cache), greedy on both."""
    one = Model.open(files["Q4_K_M"], n_ctx=N_CTX, n_slots=2, device="cuda")
    two = Model.open(
        files["Q4_K_M"], n_ctx=N_CTX, n_slots=2, device="cuda", gpus=TWO_GPUS, layer_split=split
    )
    p = prompts(2, 12, seed=22, vocab=one.n_vocab)
    entries = [(0, p[0], "last"), (1, p[1], "last")]
    ra, rb = one.forward_batch(entries), two.forward_batch(entries)
    for _ in range(16):
        for x, y in zip(ra, rb, strict=True):
            assert np.array_equal(x, y)
        nxt = [(i, [int(x.argmax())], "last") for i, x in enumerate(ra)]
        ra, rb = one.forward_batch(nxt), two.forward_batch(nxt)


@pytest.mark.parametrize("tier_async", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("ty", ["Q4_K_M", "Q8_0"])
def test_two_stages_hybrid_forced_misses_bitwise_one_stage(
    files: dict[str, Path], ty: str, tier_async: bool
) -> None:
    kw = dict(vram_slots=QUARTER, adapt_every=0, tier_async=tier_async)
    one = open_gpu(files[ty], **kw)
    two = open_gpu(files[ty], gpus=TWO_GPUS, layer_split="1", **kw)
    i1, i2 = one.hybrid_info(), two.hybrid_info()
    assert i1 is not None and i2 is not None
    assert i2["n_slots"] == i1["n_slots"] == QUARTER and i2["resident"] == QUARTER
    assert [(s["n_slots"], s["resident"]) for s in i2["stages"]] == [(2, 2), (4, 4)]
    for toks in prompts(4, 8, seed=23, vocab=one.n_vocab):
        one.free(0)
        two.free(0)
        a, b = one.forward(0, toks), two.forward(0, toks)
        for _ in range(24):
            assert np.array_equal(a, b)
            nxt = [int(a.argmax())]
            a, b = one.forward(0, nxt), two.forward(0, nxt)
    c1, c2 = one.hybrid_counters(), two.hybrid_counters()
    assert c1 is not None and c2 is not None
    assert c1.totals() == c2.totals()  # the same pairs hit and missed
    h, mc, _ = c2.totals()
    assert h > 0 and mc > 0  # both sides ran
    assert routed_pairs(c2) == 4 * (8 + 24) * N_LAYER * TOP_K


@pytest.mark.parametrize("tier_async", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("ty", ["Q4_K_M", "Q8_0"])
def test_two_stages_hybrid_swaps_every_step(
    files: dict[str, Path], ty: str, tier_async: bool
) -> None:
    pure = open_gpu(files[ty])
    hy = open_gpu(
        files[ty],
        gpus=TWO_GPUS,
        layer_split="1",
        vram_slots=QUARTER,
        adapt_every=1,
        adapt_swaps=4,
        tier_async=tier_async,
    )
    same, cuts, agree = greedy_vs_pure(pure, hy, 10, 64)
    c, info = hy.hybrid_counters(), hy.hybrid_info()
    assert c is not None and info is not None
    snap = c.snapshot()
    st = info["stages"]
    print(
        f"{ty} {'async' if tier_async else 'sync'} two stages: {same}/10 identical up to the "
        f"first near-tie {cuts}; top-1 along the pure path {agree:.4f}; swaps {snap['swaps']}; "
        f"stages {st}"
    )
    assert same >= 9
    assert agree >= 0.99
    assert routed_pairs(c) == (10 * 2 * (8 + 64)) * N_LAYER * TOP_K
    assert snap["swaps"] > 0 and info["tier_async"] == tier_async
    # each stage's tier swapped its own layers' experts (layer 0's slots are stage 0's,
    # layers 1-2's stage 1's) and its slots stay full
    assert [(s["n_slots"], s["resident"]) for s in st] == [(2, 2), (4, 4)]
    assert all(s["swaps"] > 0 for s in st), st
    check_stages(hy, "1", 2 * 10 * (1 + 64))


@pytest.mark.parametrize("hybrid", [False, True], ids=["pure", "hybrid"])
def test_hop_through_host_memory_is_bitwise_one_stage(files: dict[str, Path], hybrid: bool) -> None:
    """`split_hop="host"`: the hop two devices take (device → page-locked host memory on the
    first stage's stream, host → device on the next's), run on one device."""
    kw: dict[str, Any] = dict(vram_slots=QUARTER, adapt_every=0) if hybrid else {}
    one = open_gpu(files["Q4_K_M"], **kw)
    two = open_gpu(files["Q4_K_M"], gpus=TWO_GPUS, layer_split="1", split_hop="host", **kw)
    steps = 0
    for toks in prompts(2, 8, seed=27, vocab=one.n_vocab):
        one.free(0)
        two.free(0)
        a, b = one.forward(0, toks), two.forward(0, toks)
        steps += 1
        for _ in range(16):
            assert np.array_equal(a, b)
            nxt = [int(a.argmax())]
            a, b = one.forward(0, nxt), two.forward(0, nxt)
            steps += 1
    check_stages(two, "1", steps)
    with pytest.raises(_core.ConfigError, match="split_hop"):
        open_gpu(files["Q4_K_M"], gpus="0,0", split_hop="peer")


def test_layer_split_that_does_not_fit_is_a_config_error(files: dict[str, Path]) -> None:
    for split, gpus in (("3", "0,0"), ("1", "0,0,0"), ("2,1", "0,0,0")):
        with pytest.raises(_core.ConfigError, match="layer_split"):
            open_gpu(files["Q4_K_M"], gpus=gpus, layer_split=split)
    with pytest.raises(_core.ConfigError, match="gpus"):
        open_gpu(files["Q4_K_M"], gpus="zero")
    with pytest.raises(_core.ConfigError, match="pipeline_windows"):
        open_gpu(files["Q4_K_M"], pipeline_windows=2)  # one stage


def test_three_stages_on_one_gpu(files: dict[str, Path]) -> None:
    one = open_gpu(files["Q4_K_M"])
    three = open_gpu(files["Q4_K_M"], gpus="0,0,0")
    assert [tuple(s["layers"]) for s in three.stages()] == [(0, 1), (1, 2), (2, 3)]
    toks = prompts(1, 8, seed=24, vocab=one.n_vocab)[0]
    a, b = one.forward(0, toks), three.forward(0, toks)
    for _ in range(16):
        assert np.array_equal(a, b)
        nxt = [int(a.argmax())]
        a, b = one.forward(0, nxt), three.forward(0, nxt)


@pytest.mark.parametrize("split", ["1", "2"])
def test_kv_blobs_move_between_one_and_two_stages(files: dict[str, Path], split: str) -> None:
    """A slot's KV exported from two stages (each its own layers' cache) is the one-stage
    model's blob byte for byte, and a blob imported into either continues bitwise alike."""
    one = open_gpu(files["Q4_K_M"])
    two = open_gpu(files["Q4_K_M"], gpus=TWO_GPUS, layer_split=split)
    toks = prompts(1, 20, seed=25, vocab=one.n_vocab)[0]
    one.forward(0, toks)
    two.forward(0, toks)
    blob = one.kv_export(0, 20)
    assert two.kv_export(0, 20) == blob
    a = one.forward(0, [7])
    for m in (one, two):
        m.free(0)
        assert m.kv_import(0, blob) == 20
        assert np.array_equal(m.forward(0, [7]), a)


@pytest.mark.parametrize("hybrid", [False, True], ids=["pure", "hybrid"])
def test_llm_generates_alike_through_two_stages(files: dict[str, Path], hybrid: bool) -> None:
    """`strata.LLM` with `gpus="0,0"` (the Config fields reach Model.open): greedy text as
    one stage's, and the stages in /metrics' labeled stats."""
    from strata import LLM

    kw: dict[str, Any] = dict(n_ctx=128, device="cuda", pcie_frac=0.0, threads=3)
    if hybrid:  # every expert fits the budget's slots: all resident, on every stage
        kw.update(vram_budget_mib=2048, adapt_every=0)
    one = LLM(files["Q4_K_M"], **kw)
    two = LLM(files["Q4_K_M"], gpus=TWO_GPUS, layer_split="1", **kw)
    ids = prompts(1, 12, seed=26, vocab=one.n_vocab)[0]
    go = dict(max_tokens=24, stop_ids=[], temperature=0)
    assert list(two.generate_ids(ids, **go)) == list(one.generate_ids(ids, **go))
    if hybrid:
        info = two.model.hybrid_info()
        assert info is not None and info["resident"] == N_LAYER * N_EXPERT
        assert [s["resident"] for s in info["stages"]] == [N_EXPERT, 2 * N_EXPERT]
    stats = two.labeled_stats()
    windows = [(lab["stage"], v) for n, lab, v in stats if n == "stage_windows_total"]
    assert [w[0] for w in windows] == ["0", "1"] and windows[0][1] == windows[1][1] > 0
    assert {n for n, _, _ in stats} >= {
        "stage_compute_seconds_total",
        "stage_waiting_seconds_total",
        "stage_copying_seconds_total",
        "stage_gaps_total",
        "stage_busy",
        "pipeline_windows_in_flight",
    }
    assert N_EXPERT == 8  # the test models' shape (test_gpu_hybrid.py)
