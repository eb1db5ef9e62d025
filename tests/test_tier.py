"""The RAM tier and `strata-fill`: routing counters, profiles and fingerprints, residency
modes, fill cancellation, read-ahead, and the CLI's flags. Expert bytes are checked against
gguf-py's reader (an independent oracle), never against our own reader."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from models import TestModels
from strata import _core
from strata.cli import fill as cli
from strata.config import Config
from strata.errors import ConfigError, ProfileError, ProfileMismatchError

GIB = float(1 << 30)


@pytest.fixture(scope="module")
def tiny(test_models: TestModels) -> Path:
    """Tiny qwen3moe, F32: 4 layers × 16 experts, 768 KiB per expert (48 MiB of experts)."""
    return test_models.f32()


@pytest.fixture(scope="module")
def other(test_models: TestModels) -> Path:
    """The same shapes with other weights (seed 1): only the routers tell them apart."""
    return TestModels(test_models.root, seed=1).f32()


@pytest.fixture(scope="module")
def oracle(tiny: Path) -> dict[tuple[int, int], tuple[bytes, bytes, bytes]]:
    """Every expert's (gate, up, down) bytes as gguf-py reads them."""
    import gguf

    r = gguf.GGUFReader(str(tiny))
    t = {x.name: x for x in r.tensors}
    out = {}
    for layer in range(4):
        parts = [
            np.asarray(t[f"blk.{layer}.ffn_{p}_exps.weight"].data) for p in ("gate", "up", "down")
        ]
        for e in range(16):
            g, u, d = (np.ascontiguousarray(p[e]).tobytes() for p in parts)
            out[(layer, e)] = (g, u, d)
    return out


def skewed_counts(seed: int = 0) -> np.ndarray[Any, Any]:
    rng = np.random.default_rng(seed)
    return (rng.pareto(1.5, size=(4, 16)) * 100).astype(np.float32)


# ---- counters ----------------------------------------------------------------------------


def test_counters_match_bincount() -> None:
    rng = np.random.default_rng(3)
    c = _core.RoutingCounters(3, 16)
    want = np.zeros((3, 16))
    for _ in range(50):
        for layer in range(3):
            ids = rng.integers(0, 16, size=8)
            c.observe(layer, ids.tolist())
            want[layer] += np.bincount(ids, minlength=16)
        c.end_step()
    np.testing.assert_array_equal(c.snapshot(), want.astype(np.float32))
    assert c.hits(1) == 400
    assert c.steps == 50
    top = c.top_k(2, 3)
    assert [e for e, _ in top] == list(np.argsort(-want[2], kind="stable")[:3])
    # Decay: a half-life of 64 steps halves the counts after 64 more steps.
    d = _core.RoutingCounters(1, 2, half_life_steps=64.0)
    d.observe(0, [1] * 1000)
    for _ in range(64):
        d.end_step()
    assert abs(d.snapshot()[0, 1] - 500.0) < 1.0


# ---- profiles ----------------------------------------------------------------------------


def test_profile_round_trip(tiny: Path, tmp_path: Path) -> None:
    counts = skewed_counts()
    p = _core.Profile.from_counts(tiny, counts, 1234, "unit test")
    out = tmp_path / "t.prof"
    p.save(out)
    back = _core.Profile.load(out, tiny)
    np.testing.assert_array_equal(back.counts(), counts)
    assert (back.tokens, back.source, back.n_layer, back.n_expert) == (1234, "unit test", 4, 16)
    assert back.fingerprint == _core.model_fingerprint(tiny)[0]
    assert "qwen3moe, 4 layers × 16 experts" in back.model
    flat = [(int(i) // 16, int(i) % 16) for i in np.argsort(-counts.ravel(), kind="stable")]
    assert back.order() == flat
    with pytest.raises(ValueError, match="shape"):
        _core.Profile.from_counts(tiny, counts[:3], 1)
    with pytest.raises(ProfileError, match="finite"):
        _core.Profile.from_counts(tiny, np.full((4, 16), np.nan, np.float32), 1)


def test_profile_for_another_model_is_refused(tiny: Path, other: Path, tmp_path: Path) -> None:
    assert _core.model_fingerprint(tiny)[0] != _core.model_fingerprint(other)[0]
    out = tmp_path / "t.prof"
    prof = _core.Profile.from_counts(tiny, skewed_counts(), 10)
    prof.save(out)
    with pytest.raises(ProfileMismatchError, match="made for another model"):
        _core.Profile.load(out, other)
    with pytest.raises(ProfileMismatchError):
        prof.check(other)
    with pytest.raises(ProfileMismatchError):
        _core.ExpertTier(other, "budget", 0.01, prof)
    assert issubclass(ProfileMismatchError, ProfileError)


def test_corrupt_profiles_are_refused(tiny: Path, tmp_path: Path) -> None:
    good = tmp_path / "g.prof"
    _core.Profile.from_counts(tiny, skewed_counts(), 10).save(good)
    raw = good.read_bytes()
    for name, data, why in [
        ("trunc", raw[:-3], "bytes, expected"),
        ("magic", b"JUNK" + raw[4:], "not a Strata profile"),
        ("flip", raw[:100] + bytes([raw[100] ^ 1]) + raw[101:], "checksum"),
    ]:
        p = tmp_path / name
        p.write_bytes(data)
        with pytest.raises(ProfileError, match=why):
            _core.Profile.load(p)


# ---- residency and fills -----------------------------------------------------------------


def check_against_oracle(tier: _core.ExpertTier, oracle: dict[Any, Any]) -> None:
    for (layer, e), want in oracle.items():
        assert tier.expert_bytes(layer, e) == want, (layer, e)


def test_modes_read_the_same_bytes(tiny: Path, oracle: dict[Any, Any]) -> None:
    mm = _core.ExpertTier(tiny)
    assert mm.mode == "mmap" and mm.arena_bytes == 0
    assert mm.total_bytes == 64 * 3 * 256 * 256 * 4
    check_against_oracle(mm, oracle)
    res = _core.ExpertTier(tiny, "resident")
    assert res.fill(threads=3).wait(60)
    assert res.resident() == (64, res.total_bytes)
    assert (res.table() == 1).all()
    check_against_oracle(res, oracle)
    assert res.uses()["resident_hits"] == 64
    assert res.locked or any("ulimit -l" in w for w in res.warnings)
    with pytest.raises(IndexError):
        res.expert_bytes(4, 0)
    with pytest.raises(ConfigError):
        _core.ExpertTier(tiny, "budget", 0.0)


def test_budget_keeps_the_hottest(tiny: Path, oracle: dict[Any, Any]) -> None:
    counts = skewed_counts(1)
    prof = _core.Profile.from_counts(tiny, counts, 10)
    per_expert = 3 * 256 * 256 * 4
    tier = _core.ExpertTier(tiny, "budget", 10.5 * per_expert / GIB, prof)
    assert tier.fill(threads=2).wait(60)
    want = set(np.argsort(-counts.ravel(), kind="stable")[:10].tolist())
    got = set(np.flatnonzero(tier.table().ravel() == 1).tolist())
    assert got == want
    check_against_oracle(tier, oracle)
    # Read-ahead queues only mapped experts.
    hot = [e for e in range(16) if tier.place(0, e) is not None]
    cold = [e for e in range(16) if tier.place(0, e) is None]
    tier.prefetch(0, hot + cold)
    s = tier.stop_prefetch()
    assert s["queued"] + s["dropped"] == len(cold)
    assert s["done"] == s["queued"]


def test_cancelled_fill_leaves_a_consistent_table(tiny: Path, oracle: dict[Any, Any]) -> None:
    tier = _core.ExpertTier(tiny, "resident")
    per_expert = 3 * 256 * 256 * 4
    # About 8 experts a second: the cancel lands with most of the 64 still to copy.
    h = tier.fill(threads=2, max_bytes_per_s=8 * per_expert)
    with pytest.raises(ConfigError, match="already running"):
        tier.fill()
    while h.progress()["done_experts"] < 2:
        time.sleep(0.01)
    h.cancel()
    assert h.wait(30)
    p = h.progress()
    assert p["cancelled"] and p["finished"]
    assert 2 <= p["done_experts"] < 64
    n, b = tier.resident()
    assert (n, b) == (p["done_experts"], p["done_bytes"])
    assert int((tier.table() == 1).sum()) == n
    check_against_oracle(tier, oracle)
    # Another fill completes the rest.
    assert tier.fill(threads=2).wait(60)
    assert tier.resident()[0] == 64
    check_against_oracle(tier, oracle)


# ---- the CLI -----------------------------------------------------------------------------


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    try:
        rc = cli.main(list(args))
    except SystemExit as e:
        rc = int(e.code or 0)
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.parametrize(
    ("args", "why"),
    [
        (["warm", "--mode", "ssd"], "invalid choice: 'ssd'"),
        (["warm", "--fill-threads", "-1"], "fill_threads"),
        (["warm", "--fill-threads", "many"], "invalid int value"),
        (["warm", "--mode", "budget"], "ram_budget_gib"),
        (["warm", "--budget-gib", "-2"], "ram_budget_gib"),
        (["warm", "--frobnicate"], "unrecognized arguments"),
        (["profile", "--tokens", "5"], "-o/--output"),
        (["profile", "-o", "x", "--tokens", "-3"], "profile_tokens"),
        (["profile", "-o", "x", "--n-ctx", "16", "--tokens", "64"], "leaves no room"),
        (["show", "p.prof", "--top", "0"], "--top"),
        (["defrag"], "invalid choice"),
        ([], "required"),
    ],
)
def test_bad_flags_exit_2(capsys: pytest.CaptureFixture[str], args: list[str], why: str) -> None:
    rc, _, err = run_cli(capsys, *args)
    assert rc == 2
    assert why in err
    assert "strata-fill" in err


def test_help_documents_every_flag() -> None:
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    fields = {f.name: f for f in Config.__dataclass_fields__.values()}
    for name, wanted in (("warm", cli.WARM_FIELDS), ("profile", cli.PROFILE_FIELDS)):
        text = sub.choices[name].format_help()
        for field in wanted:
            flag = cli.RENAMED.get(field, "--" + field.replace("_", "-"))
            assert flag in text, (name, flag)
            assert Config.env_name(field) in text
            first_words = " ".join(str(fields[field].metadata["help"]).split()[:3])
            assert first_words in " ".join(text.split()), (name, field)
    # The installed console script runs from a fresh process.
    exe = shutil.which("strata-fill") or str(Path(sys.executable).parent / "strata-fill")
    r = subprocess.run([exe, "warm", "--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "--budget-gib" in r.stdout


def test_warm_faults_the_tiny_model_in(
    tiny: Path, other: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A private copy, so no other test's map keeps its pages in.
    model = tmp_path / "m.gguf"
    shutil.copyfile(tiny, model)
    with open(model, "rb+") as f:
        os.fsync(f.fileno())
    # Parsing the header starts readahead (the kernel may read tens of MiB past it): open,
    # let that settle, then evict; only the header pages this map faulted stay.
    probe = _core.ExpertTier(model)
    time.sleep(0.3)
    _core.evict_page_cache(model)
    before = probe.page_cache_fraction()
    assert before < 0.2, f"page cache eviction did not work here ({before})"
    prof = tmp_path / "m.prof"
    _core.Profile.from_counts(model, skewed_counts(), 10).save(prof)
    rc, out, _ = run_cli(
        capsys, "warm", "--model", str(model), "--profile", str(prof), "--fill-threads", "2"
    )
    assert rc == 0, out
    assert "64 experts" in out and "profile order" in out and "100.0%" in out
    assert "dense weights" in out
    assert probe.page_cache_fraction() == 1.0
    rc, out, _ = run_cli(capsys, "warm", "--model", str(model), "--mode", "resident")
    assert rc == 0 and "64 experts, 0.05 GiB resident" in out
    # A profile for another model: a clear error, exit 1.
    other_prof = tmp_path / "other.prof"
    _core.Profile.from_counts(other, skewed_counts(), 10).save(other_prof)
    rc, _, err = run_cli(capsys, "warm", "--model", str(model), "--profile", str(other_prof))
    assert rc == 1 and "made for another model" in err


def test_show(tiny: Path, other: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    counts = skewed_counts(2)
    p = tmp_path / "s.prof"
    _core.Profile.from_counts(tiny, counts, 77, "unit").save(p)
    rc, out, _ = run_cli(capsys, "show", str(p), "--top", "3", "--model", str(tiny))
    assert rc == 0
    assert _core.model_fingerprint(tiny)[0] in out and "4 layers × 16 experts" in out
    rc, out, _ = run_cli(capsys, "show", str(p), "--json", "--top", "2")
    d = json.loads(out)
    assert d["tokens"] == 77
    want = [int(e) for e in np.argsort(-counts[1], kind="stable")[:2]]
    assert [e for e, _ in d["layers"][1]["top"]] == want
    share = np.sort(counts, axis=1)[:, ::-1][:, :4].sum(1) / counts.sum(1)
    assert abs(d["hottest_quarter_share"] - float(share.mean())) < 1e-5
    rc, _, err = run_cli(capsys, "show", str(p), "--model", str(other))
    assert rc == 1 and "another model" in err
    rc, _, err = run_cli(capsys, "show", str(tmp_path / "missing.prof"))
    assert rc == 1 and "missing.prof" in err


def test_profile_command(
    tiny: Path, other: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """profile → show → warm --profile end to end; the profile is refused for another model."""
    out = tmp_path / "p.prof"
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("hello there\n\nwrite a poem\n")
    args = ["profile", "--model", str(tiny), "--prompts", str(prompts), "--tokens", "4"]
    rc, said, err = run_cli(capsys, *args, "-o", str(out))
    assert rc == 0, err
    assert "2 prompts" in said
    assert "profile: 1 / 2 prompts (50%)" in err  # progress off a terminal, in prompts
    prof = _core.Profile.load(out, tiny)
    # Every token routes to n_expert_used (4) experts in every layer.
    assert prof.tokens > 0
    np.testing.assert_allclose(prof.counts().sum(1), prof.tokens * 4)
    assert "prompts.txt (2 prompts)" in prof.source
    rc, said, _ = run_cli(capsys, "show", str(out), "--json", "--model", str(tiny))
    assert rc == 0 and json.loads(said)["tokens"] == prof.tokens
    rc, said, err = run_cli(
        capsys, "warm", "--model", str(tiny), "--profile", str(out), "--fill-threads", "2"
    )
    assert rc == 0, err
    assert "profile order" in said
    rc, _, err = run_cli(capsys, "warm", "--model", str(other), "--profile", str(out))
    assert rc == 1 and "made for another model" in err
    with pytest.raises(ProfileMismatchError):
        _core.Profile.load(out, other)
    rc, _, err = run_cli(capsys, "profile", "--prompts", str(tmp_path / "no"), "-o", str(out))
    assert rc == 1 and "prompts" in err
    # an --output folder that is not there is said before any prompt runs
    rc, said, err = run_cli(capsys, *args, "-o", str(tmp_path / "none" / "p.prof"))
    assert rc == 1 and "no such folder" in err and "prompts" not in said


# ---- the engine-facing helpers -----------------------------------------------------------


def test_open_tier_applies_the_settings(tiny: Path, other: Path, tmp_path: Path) -> None:
    from strata import tiering

    counts = skewed_counts(4)
    prof = tmp_path / "p.prof"
    _core.Profile.from_counts(tiny, counts, 10).save(prof)
    per_expert = 3 * 256 * 256 * 4
    cfg = Config(
        model=str(tiny),
        ram_mode="budget",
        ram_budget_gib=6 * per_expert / GIB,
        profile=str(prof),
        fill_threads=2,
    )
    tier, fill = tiering.open_tier(cfg, tiny)
    assert fill is not None and fill.wait(60)
    want = set(np.argsort(-counts.ravel(), kind="stable")[:6].tolist())
    assert set(np.flatnonzero(tier.table().ravel() == 1).tolist()) == want
    for layer, e in [(0, 0), (1, 5), (3, 15)]:
        tier.expert_bytes(layer, e)
    hits = sum(1 for i in [0, 16 + 5, 48 + 15] if i in want)
    s = tiering.tier_stats(tier, fill)
    assert s["tier_resident_hits_total"] == hits
    assert s["tier_mapped_hits_total"] == 3 - hits
    assert s["tier_mapped_read_bytes_total"] == (3 - hits) * per_expert
    assert s["tier_resident_experts"] == 6 and s["tier_arena_bytes"] == 6 * per_expert
    assert s["tier_fill_done_bytes"] == s["tier_fill_total_bytes"] == 6 * per_expert
    c = _core.RoutingCounters(4, 16)
    c.observe(2, [7, 7, 3])
    info = tiering.tier_info(tier, c, fill, top=2)
    assert info["ram_mode"] == "budget" and info["resident_experts"] == 6
    assert info["top_experts"][2] == [[7, 2.0], [3, 1.0]]
    # heat map: layer 2 scaled to its hottest expert (7: 2 picks → 255, 3: 1 pick → 127.5,
    # rounded half to even), the unrouted layers all 0; residency is the tier's table
    routing = [[0] * 16 for _ in range(4)]
    routing[2][7], routing[2][3] = 255, 128
    assert info["heat"]["routing"] == routing
    resident = [[1 if layer * 16 + e in want else 0 for e in range(16)] for layer in range(4)]
    assert info["heat"]["resident"] == resident
    assert info["fill"]["finished"] is True
    # mmap without a profile starts no fill; a profile for another model is refused.
    tier, fill = tiering.open_tier(Config(model=str(tiny)), tiny)
    assert fill is None and tier.mode == "mmap"
    with pytest.raises(ProfileMismatchError):
        tiering.open_tier(Config(model=str(other), profile=str(prof)), other)
