"""Run by tests/test_gpu_hybrid_mock.py in a child process whose libcuda.so.1 is the mock
driver with no-op kernels (STRATA_MOCK_NOOP_KERNELS=1): the hybrid step's host-side control
flow on a real test model. Kernels do nothing and memory starts zeroed, so the router routes
both of every token's picks to expert 0; the profile ranks experts 5-7 hottest, so expert 0
starts outside VRAM and the adaptive tier (a choice after every step) must bring it in.
With `pcie_frac=1.0` (`run_pcie`), decode misses are staged over PCIe. Streamed prefill:
chunks of `stream_chunk` tokens (24: two chunks of the 48-token prompt; 4096: one, capped at
n_ctx), two staging areas (the plan has room), the bounce copy threads; the bytes moved are
one copy of each missing expert per chunk.

    python tests/hybrid_mock_child.py MODEL.gguf
"""

from __future__ import annotations

import sys
import time

import numpy as np
from strata._core import Model, Profile, set_hybrid_chain_timing
from strata.errors import ConfigError

N_LAYER, N_EXPERT, K = 3, 8, 2


def run(
    path: str, tier_async: bool, stream: bool, stream_chunk: int = 0, timed: bool = False
) -> np.ndarray:
    counts = np.zeros((N_LAYER, N_EXPERT), np.float32)
    counts[:, 5:] = 10.0
    prof = Profile.from_counts(path, counts, 100)
    m = Model.open(
        path,
        n_ctx=256,
        prefill_chunk=24,
        device="cuda",
        threads=2,
        vram_slots=6,
        profile=prof,
        pcie_frac=0.0,
        adapt_every=1,
        tier_async=tier_async,
        stream_min_tokens=16 if stream else 0,
        stream_chunk=stream_chunk,
        stream_threads=2,
    )
    info = m.hybrid_info()
    c = m.hybrid_counters()
    assert info is not None and c is not None
    assert info["n_slots"] == info["resident"] == 6 and info["n_experts"] == 24
    assert info["stream_min_tokens"] == (16 if stream else 0)
    n_chunks = 2  # the 48-token prompt in chunks of prefill_chunk = 24
    if stream:
        sc = min(stream_chunk or 24, 256)
        n_chunks = -(-48 // sc)
        assert info["stream_chunk"] == sc, info
        assert info["stream_areas"] == 2 and info["stream_threads"] == 2, info
    else:
        assert info["stream_chunk"] == info["stream_areas"] == info["stream_threads"] == 0
    assert info["tier_async"] == tier_async and m.cuda_graph_state == "not yet"
    eb = info["expert_bytes_total"] // 24
    assert c.snapshot()["fill_bytes"] == 6 * eb
    logits = m.forward(0, list(range(1, 49)), logits="all")
    _, mc0, mp0 = c.totals()  # the prompt's misses: on the CPU, or streamed over PCIe
    steps = []

    def step() -> None:
        before = c.totals()
        m.forward(0, [5])
        steps.append(tuple(a - b for a, b in zip(c.totals(), before, strict=True)))

    for _ in range(50):
        step()
    # the async tier moves expert 0 in on its own thread: on a loaded machine it may not have
    # by now, so decode on (each step's misses on the CPU) until it has, within a bound
    while tier_async and c.snapshot()["swaps"] < 3 and len(steps) < 50 + 2000:
        step()
        time.sleep(0.002)
    for _ in range(10):
        step()
    nd = len(steps)
    h, mc, mp = c.totals()
    s = c.snapshot()
    # the first one-token step ran eagerly, the others replayed the per-layer graphs
    assert m.cuda_graph_state == "captured (per layer)", m.cuda_graph_state
    # phase times of the layers whose misses ran on the CPU path: every decode layer, and
    # the prefill chunks' layers when they do not stream
    lt = c.layer_times()
    assert lt["layers"] == nd * N_LAYER + (0 if stream else n_chunks * N_LAYER), lt
    assert sum(v for k, v in lt.items() if k != "layers") > 0, lt
    label = f"async={tier_async} stream={stream} chunks={n_chunks}"
    print(f"{label}: totals {(h, mc, mp)}, swaps {s['swaps']}, pcie bytes {s['pcie_bytes']}")
    assert h + mc + mp == (48 + nd) * N_LAYER * K, label
    # every pair was slot 0's (the per-request counts), split as the totals are
    assert c.slot_totals(0) == (h, mc, mp), (label, c.slot_totals(0))
    assert s["swaps"] == 3, label  # expert 0 of each layer, once
    assert s["fill_bytes"] == 9 * eb, label
    assert steps[-10:] == [(N_LAYER * K, 0, 0)] * 10, (label, steps[-10:])
    assert (m.hybrid_info() or {}).get("resident") == 6
    assert (m.routing_counts()[:, 0] == (48 + nd) * K).all()
    # with set_hybrid_chain_timing on at open, the GPU part of every decode layer after a
    # hand-off add of its step is timed (not a step's first layer: no add before it)
    ct = c.chain_times()
    assert (ct["layers"] > 0) == timed and ct["add"] >= 0 and ct["attention"] >= 0, ct
    assert m.routing_counts()[:, 1:].sum() == 0
    # the first chunk misses everywhere (no slot holds expert 0)
    first = 48 // n_chunks * N_LAYER * K
    if stream:
        # every miss of the streamed chunks went over PCIe: the 18 experts without a slot,
        # each copied once per chunk
        assert mc0 == 0 and mp0 == mp and mp >= first, label
        assert s["pcie_bytes"] == n_chunks * 18 * eb, (label, s["pcie_bytes"] / eb)
        if not tier_async:
            assert mp == first and mc == 0, label  # the sync tier swapped expert 0 after chunk 1
    else:
        assert mp == 0 and s["pcie_bytes"] == 0 and mc0 >= first, label
        if not tier_async:
            assert mc == mc0 == first, label
    return np.asarray(logits)


def run_defer(path: str) -> None:
    """`defer_experts` = top-k: with expert 0 (every pick) outside VRAM and no adaptation,
    every layer's misses go to the helper thread and land one layer later (the last layer's before
    the step ends): prefill chunks and per-layer-graph decode steps run, the counters see
    every pair as a CPU miss, and a model is dropped with its helper idle. gpt-oss's biased
    experts refuse deferral with a typed error (tests/test_gpu_gptoss.py's file is not
    needed: the check is the placement's, before any step)."""
    counts = np.zeros((N_LAYER, N_EXPERT), np.float32)
    counts[:, 5:] = 10.0
    prof = Profile.from_counts(path, counts, 100)
    m = Model.open(
        path, n_ctx=128, prefill_chunk=24, device="cuda", threads=2, vram_slots=6,
        profile=prof, pcie_frac=0.0, adapt_every=0, stream_min_tokens=0, defer_experts=K,
    )  # fmt: skip
    info = m.hybrid_info()
    c = m.hybrid_counters()
    assert info is not None and c is not None and info["defer_experts"] == K, info
    assert m.forward(0, list(range(1, 49)), logits="all").shape == (48, m.n_vocab)
    for t in range(12):
        m.forward(0, [t + 1])
    assert m.cuda_graph_state == "captured (per layer)", m.cuda_graph_state
    h, mc, mp = c.totals()
    assert (h, mc, mp) == (0, (48 + 12) * N_LAYER * K, 0), (h, mc, mp)
    m.truncate(0, 10)  # a rollback between steps, then more steps
    for t in range(3):
        m.forward(0, [t + 1])
    assert m.slot_len(0) == 13
    del m
    off = Model.open(path, n_ctx=64, device="cuda", threads=2, vram_slots=6, pcie_frac=0.0)
    assert (off.hybrid_info() or {}).get("defer_experts") == 0
    print("defer: ok")


def run_pcie(path: str) -> None:
    """`pcie_frac=1.0` without adaptation: expert 0 (every pick) stays outside VRAM, so every
    decode step stages it over PCIe once per layer (the token's two picks name it twice) and
    runs it on the GPU, while prefill chunks (24 tokens: more than 8) compute their misses on
    the CPU; the staging copies move real bytes from the registered mapping."""
    counts = np.zeros((N_LAYER, N_EXPERT), np.float32)
    counts[:, 5:] = 10.0
    m = Model.open(
        path,
        n_ctx=256,
        prefill_chunk=24,
        device="cuda",
        threads=2,
        vram_slots=6,
        profile=Profile.from_counts(path, counts, 100),
        adapt_every=0,
        stream_min_tokens=0,
        pcie_frac=1.0,
    )
    assert m.counts_routing  # the hybrid mode sees the routed ids on the host
    info = m.hybrid_info()
    c = m.hybrid_counters()
    assert info is not None and c is not None
    assert info["pcie"].startswith("registered") and info["pcie"].endswith("(read-only)"), info
    assert info["pcie_frac"] == 1.0
    eb = info["expert_bytes_total"] // 24
    m.forward(0, list(range(1, 49)), logits="all")
    assert c.totals() == (0, 48 * N_LAYER * K, 0), c.totals()
    for _ in range(10):
        m.forward(0, [5])
    assert c.totals() == (0, 48 * N_LAYER * K, 10 * N_LAYER * K), c.totals()
    assert c.snapshot()["pcie_bytes"] == 10 * N_LAYER * eb, c.snapshot()["pcie_bytes"] / eb
    print(f"pcie: totals {c.totals()}, pcie bytes {c.snapshot()['pcie_bytes']}")


def run_vram(path: str) -> None:
    """Every expert in VRAM (the tiny model fits, no hybrid setting): the whole one-token step
    is captured as one graph after an eager first step, and the routing is not counted there,
    so asking for it is refused with the reason (issue #24)."""
    m = Model.open(path, n_ctx=64, device="cuda", threads=2)
    assert m.hybrid_info() is None and m.hybrid_counters() is None
    m.forward(0, list(range(1, 13)))
    for t in range(3):
        m.forward(0, [t + 1])
    assert m.cuda_graph_state == "captured", m.cuda_graph_state
    assert m.slot_len(0) == 15
    assert not m.counts_routing
    for call in (m.routing_counts, m.routing_counters):
        try:
            call()
        except ConfigError as e:
            assert "does not count the routing" in str(e), e
        else:
            raise AssertionError(f"{call.__name__} on the all-in-VRAM GPU path did not refuse")
    print("vram: ok")


def run_batch(path: str, hybrid: bool) -> None:
    """The batched step's host side: entries cut into pieces of at most `prefill_chunk` rows
    and packed into steps (a 30-token prompt beside one-token decodes), each slot's length
    advanced by its tokens, logits of the rows asked for in entry order, the hybrid routed
    pairs counted once per row of the step (K per row and layer), and a decode step of S
    one-token entries replayed from the graph(s) captured for S after one eager step."""
    kw: dict = {"vram_slots": 6, "adapt_every": 0, "pcie_frac": 0.0} if hybrid else {}
    m = Model.open(path, n_ctx=128, n_slots=4, prefill_chunk=24, device="cuda", threads=2, **kw)
    c = m.hybrid_counters()
    v = m.n_vocab
    out = m.forward_batch([(2, list(range(1, 31)), "all"), (0, [3], "last"), (1, [4, 5], "none")])
    assert [None if o is None else o.shape for o in out] == [(30, v), (v,), None], out
    assert [m.slot_len(s) for s in range(4)] == [1, 2, 30, 0]
    if c is not None:
        assert sum(c.totals()) == 33 * N_LAYER * K, c.totals()
        # each slot counts the pairs of its own rows (a request's share, issue 15 item 6)
        got = [sum(c.slot_totals(s)) for s in range(4)]
        assert got == [n * N_LAYER * K for n in (1, 2, 30, 0)], got
    for i in range(4):
        out = m.forward_batch([(0, [7], "last"), (2, [8], "none"), (1, [9], "all")])
        assert [None if o is None else o.shape for o in out] == [(v,), None, (1, v)], out
        assert [m.slot_len(s) for s in range(3)] == [2 + i, 3 + i, 31 + i]
    if c is not None:
        assert sum(c.totals()) == (33 + 12) * N_LAYER * K, c.totals()
        got = [sum(c.slot_totals(s)) for s in range(4)]
        assert got == [n * N_LAYER * K for n in (5, 6, 34, 0)], got
        per_slot = [c.slot_totals(s) for s in range(4)]
        assert tuple(map(sum, zip(*per_slot, strict=True))) == c.totals()
    want = "captured (per layer)" if hybrid else "captured"
    # the one-sequence graph is captured too once a one-entry decode step ran twice
    m.forward(3, [1])
    m.forward(3, [2])
    assert m.cuda_graph_state == want, m.cuda_graph_state
    # a refused batch (slot 0 twice) changes nothing
    try:
        m.forward_batch([(0, [1], "last"), (0, [2], "last")])
    except ValueError:
        pass
    else:
        raise AssertionError("a slot twice in one batch was not refused")
    assert [m.slot_len(s) for s in range(4)] == [5, 6, 34, 2]
    print(f"batch hybrid={hybrid}: ok")


def main() -> None:
    path = sys.argv[1]
    run_batch(path, False)
    run_batch(path, True)
    run_vram(path)
    run_pcie(path)
    run_defer(path)
    for tier_async in (False, True):
        # the sync tier's run with the GPU part timed (off again for the runs after it)
        prev = set_hybrid_chain_timing(not tier_async)
        ref = run(path, tier_async, False, timed=not tier_async)
        assert set_hybrid_chain_timing(prev) == (not tier_async) and prev is False
        for sc in (24, 0 if tier_async else 4096):
            out = run(path, tier_async, True, sc)
            # no kernel runs in the mock: this checks shapes and that the streamed path's
            # chunking returns every row (values: tests/test_gpu_hybrid.py on the device)
            assert out.shape == ref.shape and np.array_equal(out, ref)
    print("hybrid mock: all passed")


if __name__ == "__main__":
    main()
