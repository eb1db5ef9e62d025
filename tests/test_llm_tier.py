"""The tier wired into the model: routing counters fed by the forward pass (checked against a
numpy router for the first layer of a one-token sequence), and tier stats/info in
`LLM.stats()` / `LLM.info()`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from models import TestModels
from strata._core import Model
from strata.llm import LLM


@pytest.fixture(scope="module")
def tiny(test_models: TestModels) -> Path:
    """Tiny qwen3moe, F32: 4 layers × 16 experts, 4 used."""
    return test_models.f32()


def _rms(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x) + eps) * w


def layer0_top4(path: Path, token: int) -> list[int]:
    """Layer 0's routed experts for `token` at position 0, by numpy over gguf-py's tensors:
    with one position, attention returns each head's value vector (softmax over one key)."""
    import gguf

    r = gguf.GGUFReader(str(path))
    t = {x.name: np.asarray(x.data, dtype=np.float64) for x in r.tensors}
    f = {x.name: x for x in r.fields.values()}

    def meta(key: str) -> float:
        fld = f[f"qwen3moe.{key}"]
        return float(fld.parts[fld.data[0]][0])

    eps = meta("attention.layer_norm_rms_epsilon")
    n_head, n_kv = int(meta("attention.head_count")), int(meta("attention.head_count_kv"))
    x = t["token_embd.weight"][token]  # [H]
    h = _rms(x, t["blk.0.attn_norm.weight"], eps)
    v = t["blk.0.attn_v.weight"] @ h  # [Nkv·D]
    d = v.size // n_kv
    att = np.concatenate([v[(i // (n_head // n_kv)) * d :][:d] for i in range(n_head)])
    x = x + t["blk.0.attn_output.weight"] @ att
    logits = t["blk.0.ffn_gate_inp.weight"] @ _rms(x, t["blk.0.ffn_norm.weight"], eps)  # [E]
    return sorted(int(e) for e in np.argsort(-logits, kind="stable")[:4])


def test_forward_feeds_the_routing_counters(tiny: Path) -> None:
    m = Model.open(tiny, n_ctx=64, n_slots=2, threads=1)
    assert m.routing_counts().shape == (4, 16) and m.routing_counts().sum() == 0
    m.forward(0, [7])
    c = m.routing_counts()
    assert sorted(int(e) for e in np.flatnonzero(c[0])) == layer0_top4(tiny, 7)
    np.testing.assert_array_equal(c.sum(1), [4, 4, 4, 4])
    m.forward(1, [3, 9, 11, 2], logits="all")
    m.forward(0, [5], logits="none")
    c = m.routing_counts()
    np.testing.assert_array_equal(c.sum(1), [24, 24, 24, 24])  # 6 tokens × 4
    hot = m.routing_counters(decayed=True)
    assert hot.steps == 3  # one step per forward call
    np.testing.assert_array_equal(hot.snapshot(), c)  # no decay pass yet (every 64 steps)
    assert m.routing_counters(decayed=False).snapshot().sum() == 24 * 4


def test_llm_reports_the_tier(tiny: Path, tmp_path: Path) -> None:
    llm = LLM(tiny, n_ctx=64, parallel=1, threads=1)
    llm.forward_batch([(0, [1, 2, 3], "last")])
    llm.forward_batch([(0, [4], "last")])
    np.testing.assert_array_equal(llm.routing_counts().sum(1), [16] * 4)
    s = llm.stats()
    assert s["tier_resident_experts"] == 0.0 and s["tier_arena_bytes"] == 0.0
    assert s["decode_tokens_total"] == 1.0
    tiers = llm.info()["tiers"]
    assert tiers["ram_mode"] == "mmap" and tiers["experts"] == 64
    top = tiers["top_experts"]
    assert len(top) == 4 and all(len(row) == 4 for row in top)
    c = llm.routing_counts()
    for layer, row in enumerate(top):
        assert row[0][1] == pytest.approx(float(c[layer].max()))


@pytest.mark.parametrize(
    ("mode", "budget"), [("resident", 0.0), ("budget", 0.02)], ids=["resident", "budget"]
)
def test_ram_modes_give_the_logits_of_mmap(tiny: Path, mode: str, budget: float) -> None:
    """Experts read from the arena (all, or the part a budget holds) give bitwise the logits
    of the plain map, so the same greedy tokens."""
    ids = [5, 17, 3, 99, 42, 7, 1, 64]
    ref = LLM(tiny, n_ctx=64, parallel=1, threads=2)
    want = ref.logits(ids)
    llm = LLM(tiny, n_ctx=64, parallel=1, threads=2, ram_mode=mode, ram_budget_gib=budget)
    assert llm.fill is not None and llm.fill.wait(60)
    n_res, _ = llm.tier.resident()
    assert (n_res == 64) if mode == "resident" else (0 < n_res < 64)
    got = llm.logits(ids)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    greedy = list(ref.generate_ids(ids, max_tokens=6, stop_ids=[], temperature=0.0))
    assert list(llm.generate_ids(ids, max_tokens=6, stop_ids=[], temperature=0.0)) == greedy
    s = llm.stats()
    assert s["tier_resident_hits_total"] > 0
    assert (s["tier_mapped_hits_total"] == 0) == (mode == "resident")
    assert ref.stats()["tier_resident_hits_total"] == 0
    assert ref.stats()["tier_mapped_hits_total"] > 0


def test_server_applies_the_profile_and_reports_the_tier(tiny: Path, tmp_path: Path) -> None:
    """STRATA_PROFILE at start: the fill warms the profile's hot set (mmap prefault), and
    /v1/status and /metrics report the tier."""
    from server_harness import Server
    from strata._core import Profile

    counts = np.zeros((4, 16), dtype=np.float32)
    counts[:, :2] = 10.0  # two hot experts per layer
    prof = tmp_path / "hot.prof"
    Profile.from_counts(tiny, counts, 5, "unit").save(prof)
    srv = Server(
        engine="llm", model=tiny, profile=prof, n_ctx=64, parallel=1, threads=1, readahead="on"
    )
    try:

        def filled(r: Any) -> bool:
            fill = r.json().get("tiers", {}).get("fill") or {}
            return r.status_code == 200 and bool(fill.get("finished"))

        tiers = srv.wait(filled, "/v1/status").json()["tiers"]
        assert tiers["ram_mode"] == "mmap" and tiers["profile"] == str(prof)
        assert tiers["experts"] == 64 and len(tiers["top_experts"]) == 4
        assert tiers["fill"]["done_bytes"] == tiers["fill"]["total_bytes"] > 0
        assert tiers["readahead"]["misses"] == 0  # STRATA_READAHEAD=on, nothing run yet
        text = srv.http.get("/metrics").text
        names = ("strata_tier_mapped_hits_total", "strata_tier_fill_done_bytes")
        for name in (*names, "strata_tier_prefetch_hits_total"):
            assert name in text, name
    finally:
        srv.stop()


def test_llm_refuses_a_profile_for_another_model(
    tiny: Path, test_models: TestModels, tmp_path: Path
) -> None:
    from strata._core import Profile
    from strata.errors import ProfileMismatchError

    other = TestModels(test_models.root, seed=1).f32()
    prof = tmp_path / "other.prof"
    Profile.from_counts(other, np.ones((4, 16), dtype=np.float32), 1).save(prof)
    with pytest.raises(ProfileMismatchError, match="another model"):
        LLM(tiny, n_ctx=64, parallel=1, threads=1, profile=str(prof))


def test_readahead_keeps_the_tokens_of_mmap_and_counts_its_hits(tiny: Path) -> None:
    """Budget mode reads ahead by default: the same greedy tokens as mmap, and every mapped
    expert use is counted once as a read-ahead hit, late or miss."""
    ids = [5, 17, 3, 99, 42, 7, 1, 64]
    ref = LLM(tiny, n_ctx=64, parallel=1, threads=2)
    assert ref.model.readahead_stats() is None  # mmap: off by default
    assert ref.info()["tiers"]["readahead"] is None
    greedy = list(ref.generate_ids(ids, max_tokens=8, stop_ids=[], temperature=0.0))
    llm = LLM(tiny, n_ctx=64, parallel=1, threads=2, ram_mode="budget", ram_budget_gib=0.01)
    assert llm.fill is not None and llm.fill.wait(60)
    assert 0 < llm.tier.resident()[0] < 64
    assert list(llm.generate_ids(ids, max_tokens=8, stop_ids=[], temperature=0.0)) == greedy
    s = llm.stats()
    hits, late, misses = (s[f"tier_prefetch_{k}_total"] for k in ("hits", "late", "misses"))
    assert hits + late + misses == s["tier_mapped_hits_total"] > 0
    assert s["tier_prefetch_queued_total"] > 0 and hits + late > 0
    ra = llm.info()["tiers"]["readahead"]
    rate = hits / (hits + late + misses)
    assert ra["hits"] == hits and ra["hit_rate"] == pytest.approx(rate, abs=1e-4)
    # Off on the same model: nothing counted, same tokens.
    llm.model.set_readahead(0)
    assert llm.model.readahead_stats() is None
    assert list(llm.generate_ids(ids, max_tokens=8, stop_ids=[], temperature=0.0)) == greedy


def test_readahead_setting() -> None:
    from strata.config import Config
    from strata.errors import ConfigError
    from strata.tiering import readahead_threads

    def threads(**kw: Any) -> int:
        return readahead_threads(Config.load(kw, env={}))

    assert threads(ram_mode="budget", ram_budget_gib=1.0) == 2
    assert threads(ram_mode="budget", ram_budget_gib=1.0, readahead_threads=3) == 3
    assert threads(ram_mode="budget", ram_budget_gib=1.0, readahead="off") == 0
    assert threads() == 0 and threads(readahead="on") == 2
    assert threads(ram_mode="resident") == 0
    with pytest.raises(ConfigError, match="readahead: on has nothing to read ahead"):
        Config.load({"ram_mode": "resident", "readahead": "on"}, env={})
    with pytest.raises(ConfigError, match="readahead"):
        Config.load({"readahead": "sometimes"}, env={})
    with pytest.raises(ConfigError, match="readahead_threads"):
        Config.load({"readahead_threads": 0}, env={})


def test_readahead_needs_a_tier(tiny: Path) -> None:
    from strata.errors import ConfigError

    m = Model.open(tiny, n_ctx=64, threads=1)
    with pytest.raises(ConfigError, match="set_tier first"):
        m.set_readahead(2)
    m.set_readahead(0)  # off needs nothing
    assert m.readahead_stats() is None
