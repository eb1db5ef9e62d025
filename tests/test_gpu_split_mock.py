"""The layer split's host-side control flow on a machine without a GPU (the mock driver with
no-op kernels, as tests/test_gpu_hybrid_mock.py): one device as two or three stages for each
GPU family, pure and hybrid (sync and async tier, a choice after every step). Values are not
checked (no kernel runs; tests/test_gpu_split.py does that on the device): every step is a
window through every stage that ends at a gap on each (either hop: device to device, or
through host memory), the stages cover the layers in order, their slot shares add up to the
slots asked for (also with streamed prefill chunks), and the decode graphs are captured per
stage.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from test_gpu_hybrid_mock import family_model, mock_env, run_child

# A prefill of 39 tokens (a chunk of 24, then 15) and five decode steps (the first eager, then
# the captured graphs), per split, pure and hybrid; prints one line per model.
CHILD = """
import sys
from strata._core import Model
from strata.tiering import stage_stats
n_layer = int(sys.argv[2])
steps = 2 + 5
for kw in ({}, dict(vram_slots=6, pcie_frac=0.0, adapt_every=1, threads=2),
           dict(vram_slots=6, pcie_frac=0.0, adapt_every=1, threads=2, tier_async=True),
           dict(vram_slots=6, pcie_frac=0.0, adapt_every=1, threads=2, stream_min_tokens=16,
                stream_chunk=24)):
    for gpus, split, hop in (("0,0", "auto", "auto"), ("0,0", "1", "host"),
                             ("0,0,0", "auto", "auto")):
        m = Model.open(sys.argv[1], n_ctx=128, prefill_chunk=24, device="cuda", gpus=gpus,
                       layer_split=split, split_hop=hop, **kw)
        assert m.forward(0, list(range(1, 40)), logits="all").shape == (39, m.n_vocab)
        for t in range(5):
            m.forward(0, [t + 1])
        st = m.stages()
        assert len(st) == len(gpus.split(",")), st
        assert st[0]["layers"][0] == 0 and st[-1]["layers"][1] == n_layer, st
        assert all(a["layers"][1] == b["layers"][0] for a, b in zip(st, st[1:])), st
        if split != "auto":
            assert st[0]["layers"] == (0, int(split)), st
        for s in st:
            assert s["device"] == 0 and s["windows"] == s["gaps"] == steps, st
            assert not s["busy"] and s["windows_in_flight"] == 0, st
        assert st[0]["copying_s"] == 0 and all(s["copying_s"] > 0 for s in st[1:]), st
        # x f32 [T, H] hops into each later stage: 39 prefill rows and five decode rows
        hop = 4 * (39 + 5) * m.hparams["n_embd"]
        assert st[0]["hop_bytes"] == 0 and all(s["hop_bytes"] == hop for s in st[1:]), st
        info = m.hybrid_info()
        if kw:
            assert info is not None and info["n_slots"] == sum(s["n_slots"] for s in st)
            assert info["n_slots"] == 6 and info["stages"] == st
            assert all(s["swap_bytes"] == s["swaps"] * info["slot_bytes"] for s in st), st
        else:
            assert info is None
        assert m.cuda_graph_state.startswith("captured"), m.cuda_graph_state
        stats = stage_stats(st)
        hops = [v for n, lab, v in stats if n == "stage_hop_bytes_total"]
        assert hops == [s["hop_bytes"] for s in st] and hops[1] == hop, stats
        assert [(lab, v) for n, lab, v in stats if n == "pipeline_windows_in_flight"] == [({}, 0)]
        assert [v for n, _, v in stats if n == "stage_busy"] == [0.0] * len(st), stats
        m.free(0)
        print("ok", gpus, split, bool(kw), [s["layers"] for s in st])
# one stage: nothing passes between stages, so no waiting, copying or hop series
one = Model.open(sys.argv[1], n_ctx=64, device="cuda", vram_slots=6, pcie_frac=0.0, threads=2)
one.forward(0, [1, 2, 3])
names = {n for n, _, _ in stage_stats(one.stages())}
assert names == {"pipeline_windows_in_flight", "stage_compute_seconds_total",
                 "stage_windows_total", "stage_gaps_total", "stage_swaps_total",
                 "stage_swap_bytes_total", "stage_busy"}, names
print("split mock: all passed")
"""


@pytest.mark.parametrize("fam", ["qwen2moe", "llama", "glm4moe", "qwen3next"])
def test_stages_on_the_mock_driver(tmp_path: Path, fam: str) -> None:
    env = mock_env(tmp_path)
    n_layer = 4 if fam == "qwen3next" else 3
    out = run_child(["-c", CHILD, str(family_model(fam, tmp_path)), str(n_layer)], env)
    assert "split mock: all passed" in out, out


# Pipelined windows (`pipeline_windows` 2): window K+1 is launched onto stage 0 while K is on
# a later stage (two stages, and three: K+1 goes on as far as the stages ahead are free); a
# verdict settled as rejected discards K+1 and puts its slot back; calls that need settled
# slots are refused while a window is in flight; then a random run of launches, verdicts and
# settlements (pure, hybrid with the tier choosing after every step, sync and async) ends
# with every stage at a gap and the slot at the length the settled windows add up to. In the
# hybrid mode on two stages a window's stage 1 runs beside the next window's stage 0 (or at
# its verdict), counted per stage.
PIPE_CHILD = """
import random, sys
from strata._core import ConfigError, Model
rng = random.Random(0)
hy = dict(vram_slots=6, pcie_frac=0.0, adapt_every=1, threads=2)
for gpus, kw in (("0,0", {}), ("0,0", hy), ("0,0", dict(hy, tier_async=True)),
                 ("0,0,0", {}), ("0,0,0", dict(hy, tier_async=True))):
    m = Model.open(sys.argv[1], n_ctx=512, n_slots=2, prefill_chunk=24, device="cuda",
                   gpus=gpus, pipeline_windows=2, **kw)
    assert m.pipeline_windows == 2
    # hybrid on two stages: a window's stage 1 waits for the next launch, beside its stage 0
    beside = bool(kw) and gpus == "0,0"
    m.forward_batch([(0, list(range(1, 20)), "last"), (1, [7, 8, 9], "last")])
    m.launch_batch([(0, [1], "last"), (1, [2, 3], "window")])          # K
    assert m.stages()[-1]["busy"] != beside, m.stages()
    m.launch_batch([(0, [4, 5, 6], "window"), (1, [7], "last")])       # K+1 on stage 0
    st = m.stages()
    assert st[0]["windows_in_flight"] == 2 and st[-1]["busy"] and not st[0]["busy"], st
    assert [s["beside"] for s in st] == [int(beside)] * 2 + [0] * (len(st) - 2), st
    for bad in (lambda: m.forward_batch([(0, [1], "last")]), lambda: m.truncate(0, 3),
                lambda: m.launch_batch([(0, [1], "last")]), lambda: m.settle(True)):
        try:
            bad()
            raise SystemExit("not refused")
        except (ConfigError, ValueError) as e:
            assert "flight" in str(e) or "launched" in str(e) or "verdict" in str(e), e
    out = m.finish_batch()
    assert out[0].shape == (m.n_vocab,) and out[1].shape == (2, m.n_vocab)
    assert (m.slot_len(0), m.slot_len(1)) == (23, 6)
    m.settle(False)  # K+1 discarded: the slots as K left them
    assert (m.slot_len(0), m.slot_len(1)) == (20, 5)
    assert m.stages()[0]["windows_in_flight"] == 0
    m.launch_batch([(0, [1], "last")])
    m.launch_batch([(0, [2, 3], "window")])
    m.finish_batch()
    m.settle(True)  # K+1 goes on to stage 1
    assert [o.shape for o in m.finish_batch()] == [(2, m.n_vocab)]
    m.settle(True)
    assert m.slot_len(0) == 23
    try:
        m.launch_batch([(0, list(range(30)), "all")])
        raise SystemExit("a window larger than one step was not refused")
    except ValueError as e:
        assert "one step" in str(e), e
    want = m.slot_len(0)
    inflight = []  # lengths of the windows in flight
    for i in range(60):
        if len(inflight) < 2 and rng.random() < 0.6:
            n = rng.randint(1, 5)
            m.launch_batch([(0, [rng.randrange(1, 100) for _ in range(n)], "window")])
            inflight.append(n)
        elif inflight:
            m.finish_batch()
            ok = rng.random() < 0.7
            m.settle(ok)
            want += inflight.pop(0)
            if not ok:
                inflight.clear()
            assert m.slot_len(0) == want + sum(inflight), (i, m.slot_len(0), want, inflight)
    while inflight:
        m.finish_batch()
        m.settle(True)
        want += inflight.pop(0)
    assert m.slot_len(0) == want
    st = m.stages()
    assert all(not s["busy"] and s["windows_in_flight"] == 0 for s in st), st
    assert st[0]["max_windows_in_flight"] == 2, st
    assert (st[0]["beside"] > 1) == beside and st[0]["beside"] == st[1]["beside"], st
    assert all(s["windows"] == s["gaps"] for s in st) and st[-1]["windows"] < st[0]["windows"]
    m.forward_batch([(0, [1], "last")])  # the serial step again
    # windows of one piece of 2-5 rows came often enough to be captured, per size
    assert {("window", t) for t in range(2, 6)} <= set(m.cuda_graph_shapes), m.cuda_graph_shapes
    print("ok", gpus, bool(kw), [s["windows"] for s in st])
try:
    Model.open(sys.argv[2], n_ctx=64, device="cuda", gpus="0,0", pipeline_windows=2)
    raise SystemExit("a recurrent family was not refused")
except ConfigError as e:
    assert "recurrent state" in str(e), e
print("pipe mock: all passed")
"""


def test_pipelined_windows_on_the_mock_driver(tmp_path: Path) -> None:
    env = mock_env(tmp_path)
    files = [str(family_model(f, tmp_path)) for f in ("qwen3moe", "qwen3next")]
    out = run_child(["-c", PIPE_CHILD, *files], env)
    assert "pipe mock: all passed" in out, out
