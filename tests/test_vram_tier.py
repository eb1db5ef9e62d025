"""The VRAM expert tier's host-side plumbing: the `_core` counters and slot plan, the
`/metrics` and `/v1/status` views, per-request hit rate and PCIe share (scheduler → usage),
and the settings. The tier's own logic (fences, choice, CPU misses) is tested in Rust
(`cargo test tier::vram`); the GPU wiring is tested on the device."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
from strata import toytok
from strata._core import HybridCounters, vram_plan
from strata.config import Config
from strata.engine.backend import FakeBackend, LLMBackend
from strata.engine.protocol import Submit, Tokens
from strata.engine.scheduler import Scheduler
from strata.errors import ConfigError
from strata.sampling import SamplingParams
from strata.server.generate import hit_rate, pcie_share, tier_counts, usage_extras
from strata.tiering import vram_info, vram_stats

MIB = 1 << 20


def test_counters_record_and_snapshot() -> None:
    c = HybridCounters(3)
    assert c.n_layer == 3
    assert c.totals() == (0, 0, 0)
    c.record_layer(0, 6, 2, 0)
    c.record_layer(2, 1, 1, 2)
    c.record_layer(9, 50, 50, 50)  # out of range: ignored
    c.record_swaps(2, 4096)
    c.record_fill(100)
    c.record_pcie(77)
    c.record_handoff(5)
    assert c.totals() == (7, 3, 2)
    s = c.snapshot()
    assert s["hits"] == [6, 0, 1] and s["miss_cpu"] == [2, 0, 1] and s["miss_pcie"] == [0, 0, 2]
    assert (s["swaps"], s["fill_bytes"], s["pcie_bytes"], s["handoff_bytes"]) == (2, 4196, 77, 5)
    with pytest.raises(ValueError):
        HybridCounters(0)


def test_vram_plan_slots_and_errors() -> None:
    layers: list[tuple[int, int, int] | None] = [(1000, 1000, 1500), None, (1000, 1000, 1000)]
    p = vram_plan(1000 * MIB, 700, -1, 100 * MIB, 50 * MIB, 10 * MIB, 8, layers)
    # Slot: parts 256-aligned (1024 + 1024 + 1536); 16 experts fit easily.
    assert p["budget_bytes"] == 300 * MIB and p["slot_bytes"] == 3584
    assert p["n_slots"] == 16 and p["resident_share"] == 1.0
    # 10 bytes short of three slots beside the fixed part.
    tight = vram_plan(1000 * MIB, 700, -1, 160 * MIB, 0, 140 * MIB - 3 * 3584 + 10, 8, layers)
    assert tight["n_slots"] == 2
    with pytest.raises(ConfigError, match="exceeds the free VRAM"):
        vram_plan(1000 * MIB, 700, 301, 0, 0, 0, 8, layers)
    with pytest.raises(ConfigError, match="need 160 MiB"):
        vram_plan(800 * MIB, 700, -1, 100 * MIB, 50 * MIB, 10 * MIB, 8, layers)


def test_metrics_and_status_views() -> None:
    assert vram_stats(None) == []
    assert vram_info(None) == {"enabled": False}
    c = HybridCounters(2)
    c.record_layer(0, 3, 1, 0)
    c.record_layer(1, 1, 1, 2)
    c.record_swaps(1, 10)
    stats = {(n, tuple(sorted(lab.items()))): v for n, lab, v in vram_stats(c)}
    assert stats[("expert_hits_total", (("tier", "vram"),))] == 4
    assert stats[("expert_misses_total", (("by", "cpu"),))] == 2
    assert stats[("expert_misses_total", (("by", "pcie"),))] == 2
    assert stats[("vram_swaps_total", ())] == 1
    assert stats[("vram_layer_hits_total", (("layer", "1"),))] == 1
    assert stats[("vram_layer_misses_total", (("by", "pcie"), ("layer", "1")))] == 2
    info = vram_info(c, {"n_slots": 5})
    assert info["enabled"] and info["hit_rate"] == 0.5 and info["pcie_share"] == 0.5
    assert info["layer_hit_rate"] == [0.75, 0.25]
    assert info["plan"] == {"n_slots": 5}


class _LLMStub:
    """What LLMBackend forwards to: plain stats plus the labeled VRAM ones."""

    n_vocab, n_ctx_seq = 16, 64

    def __init__(self, c: HybridCounters | None) -> None:
        self.hybrid = c

    def stats(self) -> dict[str, float]:
        return {"tier_mapped_hits_total": 3.0}

    def labeled_stats(self) -> list[tuple[str, dict[str, str], float]]:
        return vram_stats(self.hybrid)

    def tier_counts(self, slot: int | None = None) -> tuple[int, int, int] | None:
        if self.hybrid is None:
            return None
        return self.hybrid.totals() if slot is None else self.hybrid.slot_totals(slot)


def test_backend_forwards_labeled_stats_and_counts() -> None:
    c = HybridCounters(1, n_slots=1)
    c.record_layer(0, 2, 1, 1)
    c.record_slot(0, 2, 1, 1)
    b = LLMBackend(Config(), factory=lambda path, **kw: _LLMStub(c))
    names = {(s.name, tuple(sorted(s.labels.items())), s.kind) for s in b.stats()}
    assert ("tier_mapped_hits_total", (), "counter") in names
    assert ("expert_misses_total", (("by", "pcie"),), "counter") in names
    assert b.tier_counts(0) == (2, 1, 1)
    cpu = LLMBackend(Config(), factory=lambda path, **kw: _LLMStub(None))
    assert cpu.tier_counts(0) is None
    assert not any(s.name.startswith(("vram_", "expert_")) for s in cpu.stats())


class _HybridFake(FakeBackend):
    """The fake engine with a VRAM tier: every prefill token routes 2 hits, 1 CPU miss and
    1 PCIe miss; every decoded token 3 hits and 1 CPU miss, counted per layer and per slot as
    the hybrid step does. Counts its own calls per slot as the oracle."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.hybrid = HybridCounters(1, n_slots=kw["max_slots"])
        self.prefilled = [0] * kw["max_slots"]
        self.decoded = [0] * kw["max_slots"]

    def forward_batch(self, entries: Sequence[Any]) -> Any:
        for slot, ids, _ in entries:
            n = len(ids)
            if slot in self._n_prompt:  # generating: a decoded token
                self.hybrid.record_layer(0, 3 * n, n, 0)
                self.hybrid.record_slot(slot, 3 * n, n, 0)
                self.decoded[slot] += n
            else:
                self.hybrid.record_layer(0, 2 * n, n, n)
                self.hybrid.record_slot(slot, 2 * n, n, n)
                self.prefilled[slot] += n
        return super().forward_batch(entries)

    def tier_counts(self, slot: int) -> tuple[int, int, int]:
        return self.hybrid.slot_totals(slot)


def _finish(sched: Scheduler, rid: int) -> Tokens:
    for _ in range(1000):
        for e in sched.step():
            if isinstance(e, Tokens) and e.rid == rid and e.finish:
                return e
    raise AssertionError("no finish")


def test_per_request_hit_rate_and_pcie_share() -> None:
    fb = _HybridFake(n_ctx_seq=64, max_slots=1)
    sched = Scheduler(fb, prefill_chunk=4, max_slots=1)
    eog = sorted(toytok.EOG_IDS)
    sched.add(Submit(1, list(b"hello"), SamplingParams(temperature=0), 6, eog))
    first = _finish(sched, 1)
    p, d = fb.prefilled[0], fb.decoded[0]
    assert (first.expert_hits, first.expert_miss_cpu, first.expert_miss_pcie) == (
        2 * p + 3 * d,
        p + d,
        p,
    )
    # The second request counts only its own steps.
    sched.add(Submit(2, list(b"abc"), SamplingParams(temperature=0), 3, eog))
    second = _finish(sched, 2)
    p2, d2 = fb.prefilled[0] - p, fb.decoded[0] - d
    assert second.expert_hits == 2 * p2 + 3 * d2 and second.expert_miss_pcie == p2
    h, c, q = 2 * p2 + 3 * d2, p2 + d2, p2
    assert hit_rate(second) == round(h / (h + c + q), 6)
    assert pcie_share(second) == round(q / (c + q), 6)
    counts = tier_counts(second)
    assert counts == (h, c, q)
    extras = usage_extras([counts])
    assert extras == {"expert_hit_rate": hit_rate(second), "pcie_share": pcie_share(second)}


def test_concurrent_requests_count_their_own_pairs() -> None:
    # Two requests in the same steps (issue 15 item 6): each reports the pairs of the rows it
    # fed, not the engine-wide change over its life.
    fb = _HybridFake(n_ctx_seq=64, max_slots=2)
    sched = Scheduler(fb, prefill_chunk=4, max_slots=2)
    eog = sorted(toytok.EOG_IDS)
    sched.add(Submit(1, list(b"hello there"), SamplingParams(temperature=0), 9, eog))
    sched.add(Submit(2, list(b"abc"), SamplingParams(temperature=0), 2, eog))
    done: dict[int, Tokens] = {}
    slot_of: dict[int, int] = {}
    for _ in range(1000):
        slot_of.update({s.req.rid: slot for slot, s in sched.running.items()})
        for e in sched.step():
            if isinstance(e, Tokens) and e.finish:
                done[e.rid] = e
        if len(done) == 2:
            break
    assert sorted(done) == [1, 2]
    assert fb.decoded[0] > 0 and fb.decoded[1] > 0 and fb.prefilled[0] != fb.prefilled[1]
    assert sorted(slot_of.values()) == [0, 1]
    for rid, slot in slot_of.items():
        p, d = fb.prefilled[slot], fb.decoded[slot]
        t = done[rid]
        assert (t.expert_hits, t.expert_miss_cpu, t.expert_miss_pcie) == (2 * p + 3 * d, p + d, p)
    total = fb.hybrid.totals()
    assert total == tuple(
        sum(x) for x in zip(*(tier_counts(done[r]) or (0, 0, 0) for r in (1, 2)), strict=True)
    )


def test_cpu_only_path_reports_nothing() -> None:
    fb = FakeBackend(n_ctx_seq=64, max_slots=1)
    sched = Scheduler(fb, prefill_chunk=4, max_slots=1)
    sched.add(Submit(1, list(b"hi"), SamplingParams(temperature=0), 3, sorted(toytok.EOG_IDS)))
    t = _finish(sched, 1)
    assert (t.expert_hits, t.expert_miss_cpu, t.expert_miss_pcie) == (None, None, None)
    assert hit_rate(t) is None and pcie_share(t) is None and tier_counts(t) is None
    assert usage_extras([]) == {}
    # No misses at all: the PCIe share is undefined, the hit rate is 1.
    assert usage_extras([(5, 0, 0)]) == {"expert_hit_rate": 1.0, "pcie_share": None}


def test_settings() -> None:
    c = Config()
    assert (c.vram_budget_mib, c.vram_reserve_mib, c.adapt_every, c.adapt_swaps) == (
        -1,
        700,
        16,
        4,
    )
    assert c.pcie_frac == -1.0 and c.tier_async is False
    env = {"STRATA_PCIE_FRAC": "0.25", "STRATA_TIER_ASYNC": "1", "STRATA_ADAPT_EVERY": "8"}
    env["STRATA_DEVICE"] = "cuda"  # GPU settings (the CPU refuses them: test_config)
    c = Config.load(env=env)
    assert (c.pcie_frac, c.tier_async, c.adapt_every) == (0.25, True, 8)
    for bad in (
        {"pcie_frac": 1.5},
        {"pcie_frac": float("nan")},
        {"pcie_frac": -0.5},
        {"adapt_every": -1},
        {"adapt_swaps": -1},
        {"vram_budget_mib": 0},
        {"vram_budget_mib": -2},
        {"vram_reserve_mib": -1},
    ):
        with pytest.raises(ConfigError):
            Config.load(bad, env={})
    assert np.isfinite(Config.load({"pcie_frac": 0.0, "device": "cuda"}, env={}).pcie_frac)


def test_default_pcie_frac() -> None:
    from strata._core import default_pcie_frac

    assert default_pcie_frac(20.0, 20.0) == 0.5
    assert default_pcie_frac(0.0, 20.0) == 0.0


@pytest.mark.gpu
def test_pcie_probe_measures_the_link() -> None:
    """Pinned host→device copies timed with events: a plausible PCIe/NVLink-C2C figure."""
    from strata._core import pcie_probe_gbps

    gbps = pcie_probe_gbps(64)
    assert 1.0 < gbps < 1000.0, gbps
    print(f"host→device link: {gbps:.1f} GB/s")
