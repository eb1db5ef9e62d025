"""`strata setup`: the recommendation rules on made-up machines (a 64 GiB PC, a 16 GiB one, 24
and 8 GB cards), the calibration's rule for keeping an alternative, and the command on a real
file: the config it writes loads as Strata's settings and opens the model."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from models import TestModels
from strata.cli import setup as S
from strata.config import Config
from strata.errors import ConfigError
from strata.gguf import GGUFFile

GIB = 1 << 30
# Qwen3-30B-A3B at Q4_K_M: 48 layers × 4 KV heads × 128 × (K, V) × f16 = 98,304 B a position
A3B = S.ModelFacts("q.gguf", "qwen3moe", 16_900 << 20, 1_500 << 20, 98_304, 40_960)


def pc(ram_gib: float, gpu_gib: float = 0.0) -> S.Machine:
    return S.Machine(
        cores=8,
        isa="avx2",
        ram_available=int(ram_gib * GIB),
        disk_free=500 * GIB,
        gpu="RTX" if gpu_gib else None,
        vram_free=int(gpu_gib * GIB),
        link_gbps=25.0 if gpu_gib else 0.0,
    )


def kv_bytes(plan: S.Plan, f: S.ModelFacts) -> float:
    c = Config.load(plan.settings, env={})
    return f.kv_bytes_per_pos * S.KV_SCALE[c.kv_type] * c.n_ctx_seq * c.parallel


def test_a_64_gib_pc_keeps_the_model_resident_with_four_long_contexts() -> None:
    p = S.recommend(pc(60), A3B)
    c = Config.load(p.settings, env={})
    assert (c.device, c.ram_mode, c.parallel, c.kv_type) == ("cpu", "resident", 4, "f16")
    # the KV share of what the model leaves: (60 - 17.97 - 2) GiB / 4, on the 256 grid
    room = (60 * GIB - A3B.expert_bytes - A3B.dense_bytes - S.RAM_HEADROOM) * S.KV_SHARE_CPU
    assert c.n_ctx_seq == min(32768, int(room / (98_304 * 4)) // 256 * 256)
    assert c.n_ctx == 4 * c.n_ctx_seq and kv_bytes(p, A3B) <= room
    assert "llama.cpp's -c" in p.reasons["n_ctx"] and not p.notes


def test_a_16_gib_pc_keeps_a_budget_of_hot_experts() -> None:
    p = S.recommend(pc(16), A3B)
    c = Config.load(p.settings, env={})
    assert c.ram_mode == "budget"
    assert c.ram_budget_gib == round((16 * GIB - A3B.dense_bytes - S.RAM_HEADROOM) * 0.8 / GIB, 1)
    assert "strata-fill profile" in p.reasons["ram_mode"]
    assert c.n_ctx_seq >= 4096  # the floor, with fewer slots or q8_0 if need be
    tiny = Config.load(S.recommend(pc(3), A3B).settings, env={})
    assert tiny.ram_mode == "mmap"
    # little RAM beside a resident model: q4_0 (a CPU-path type) before fewer slots
    tight = Config.load(S.recommend(pc(22.5), A3B).settings, env={})
    room = (22.5 * GIB - A3B.expert_bytes - A3B.dense_bytes - S.RAM_HEADROOM) * S.KV_SHARE_CPU
    assert room / (98_304 * 4 * 34 / 64) < 4096 <= room / (98_304 * 4 * 18 / 64)
    assert (tight.ram_mode, tight.kv_type, tight.parallel) == ("resident", "q4_0", 4)


def test_a_24_gb_card_runs_the_hybrid_mode_with_f16_kv() -> None:
    p = S.recommend(pc(60, gpu_gib=23), A3B)
    c = Config.load(p.settings, env={})
    assert (c.device, c.kv_type, c.parallel) == ("cuda", "f16", 4)
    # the CPU pool reads missed experts where they lie in the mapping: the RAM tier's modes
    # are the CPU path's (Config refuses them with device cuda)
    assert "hybrid mode" in p.reasons["device"] and p.hybrid and c.ram_mode == "mmap"
    with pytest.raises(ConfigError, match="ram_mode"):
        Config.load({**p.settings, "ram_mode": "resident"}, env={})
    assert ("pcie_frac", 0.0) in S.alternatives(pc(60, gpu_gib=23), p)
    # a model that fits the card: every expert in VRAM, the RAM tier not read
    small = S.ModelFacts("s.gguf", "qwen3moe", 3 * GIB, GIB // 2, 49_152, 40_960)
    whole = S.recommend(pc(60, gpu_gib=23), small)
    assert not whole.hybrid and whole.settings["ram_mode"] == "mmap"
    assert "whole model fits" in whole.reasons["device"]
    assert all(name != "pcie_frac" for name, _ in S.alternatives(pc(60, gpu_gib=23), whole))
    room = (23 * GIB - Config().vram_reserve_mib * (1 << 20)) * S.KV_SHARE_GPU
    assert kv_bytes(p, A3B) <= room and c.n_ctx_seq >= 4096


def test_an_8_gb_card_takes_q8_0_before_giving_up_slots() -> None:
    c = Config.load(S.recommend(pc(60, gpu_gib=8), A3B).settings, env={})
    room = (8 * GIB - Config().vram_reserve_mib * (1 << 20)) * S.KV_SHARE_GPU
    assert room / (98_304 * 4) < 4096  # f16 would leave four sequences under the floor
    assert (c.kv_type, c.parallel) == ("q8_0", 4) and c.n_ctx_seq >= 4096


def test_asked_slots_and_context_are_kept_and_an_overflow_is_noted() -> None:
    p = S.recommend(pc(60), A3B, parallel=8, n_ctx=65536)
    c = Config.load(p.settings, env={})
    assert (c.parallel, c.n_ctx, c.n_ctx_seq) == (8, 65536, 8192) and not p.notes
    big = S.recommend(pc(24, gpu_gib=8), A3B, parallel=2, n_ctx=262144)
    assert Config.load(big.settings, env={}).kv_type == "q8_0"
    assert any("needs" in n for n in big.notes)
    # n_ctx alone: the most slots that keep the floor context each
    assert Config.load(S.recommend(pc(60), A3B, n_ctx=8192).settings, env={}).parallel == 2


def test_every_plan_is_valid_settings_on_random_machines() -> None:
    rng = random.Random(7)
    for _ in range(300):
        f = S.ModelFacts(
            "m.gguf",
            "qwen3moe",
            rng.randint(1, 200) << 30,
            rng.randint(1, 8) << 30,
            rng.choice([4_096, 49_152, 98_304, 196_608]),
            rng.choice([0, 4_096, 40_960, 262_144]),
        )
        m = pc(rng.uniform(2, 256), rng.choice([0, 0, 6, 12, 24, 80]))
        p = S.recommend(m, f, rng.choice([0, 0, 1, 3]), rng.choice([0, 0, 2048, 50_000]))
        c = Config.load(p.settings, env={})  # never an invalid combination
        assert c.n_ctx_seq >= 16 and set(p.reasons) >= set(p.settings)


def test_speculation_is_a_draft_model_else_the_mtp_layer_on_the_cpu_else_ngrams() -> None:
    mtp = S.ModelFacts(**{**{k: getattr(A3B, k) for k in A3B.__slots__}, "has_mtp": True})
    for m, f, draft, want in [
        (pc(64), A3B, "d.gguf", "draft"),
        (pc(64), mtp, "", "mtp"),
        (pc(64, 24), mtp, "", "ngram"),  # the MTP layer runs on the CPU path only
        (pc(64), A3B, "", "ngram"),
    ]:
        p = S.recommend(m, f, draft=draft)
        c = Config.load(p.settings, env={})
        assert c.spec == want and c.spec_adaptive and "spec" in p.reasons
        assert c.spec_draft_model == draft
    alts = S.alternatives(pc(64), S.recommend(pc(64), A3B, draft="d.gguf"))
    assert ("spec", "off") in alts and {("spec_p_min", p) for p in S.P_MIN} <= set(alts)
    assert not any(n == "spec_p_min" for n, _ in S.alternatives(pc(64), S.recommend(pc(64), A3B)))


def test_calibrated_speculation_off_drops_the_drafters_settings() -> None:
    plan = S.recommend(pc(64), A3B, draft="d.gguf")

    def off_wins(settings: dict[str, object]) -> list[float]:
        if settings.get("spec") == "off":
            assert "spec_draft_model" not in settings  # a valid config: the draft goes too
            return [12.0, 12.1, 12.2]
        return [11.0, 11.0, 11.0] if settings.get("spec_p_min") else [10.0, 10.0, 10.0]

    S.calibrate(plan, S.alternatives(pc(64), plan), off_wins)
    assert plan.settings["spec"] == "off" and "calibrated" in plan.reasons["spec"]
    assert "spec_draft_model" not in plan.settings and "spec_p_min" not in plan.settings
    Config.load(plan.settings, env={})
    # where a draft floor beats speculation off too, drafting stays with that floor
    rates = {"off": [11.0] * 3, 0.5: [10.0] * 3, 0.8: [12.0] * 3, 0.0: [10.0] * 3}

    def timer(st: dict[str, object]) -> list[float]:
        return rates["off" if st["spec"] == "off" else st.get("spec_p_min", 0.0)]

    plan = S.recommend(pc(64), A3B, draft="d.gguf")
    S.calibrate(plan, S.alternatives(pc(64), plan), timer)
    assert (plan.settings["spec"], plan.settings["spec_p_min"]) == ("draft", 0.8)
    assert "calibrated" not in plan.reasons["spec"]


def test_calibration_keeps_an_alternative_only_where_measurably_faster() -> None:
    base = S.Plan({"model": "m", "threads": 0, "pcie_frac": -1.0}, {})
    rates = {
        "base": [10.0, 10.1, 9.9],
        ("threads", 7): [10.5, 10.4, 10.6],  # 5% faster, every run above the median
        ("pcie_frac", 0.0): [10.2, 10.3, 10.2],  # 2%: within the noise
        ("pcie_frac", 0.5): [11.5, 9.0, 11.0],  # faster median, a run below the base's
    }

    def timer(settings: dict[str, object]) -> list[float]:
        for key in (("threads", 7), ("pcie_frac", 0.0), ("pcie_frac", 0.5)):
            if settings[key[0]] == key[1]:
                return rates[key]
        return rates["base"]

    lines = S.calibrate(base, [("threads", 7), ("pcie_frac", 0.0), ("pcie_frac", 0.5)], timer)
    assert base.settings["threads"] == 7 and base.settings["pcie_frac"] == -1.0
    assert "calibrated" in base.reasons["threads"] and "pcie_frac" not in base.reasons
    assert lines[0].startswith("recommended: 10.0 tok/s")
    assert sum("— faster" in line for line in lines) == 1


def setup(model: Path, out: Path, *args: str) -> Config:
    """`strata setup MODEL -o OUT ARGS…` (exit 0) and the config it wrote."""
    from strata.__main__ import main

    assert main(["setup", str(model), "-o", str(out), *args]) == 0
    return Config.load(config_file=str(out), env={})


def test_setup_writes_a_config_that_loads_and_runs(
    test_models: TestModels,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from strata.__main__ import main
    from strata.llm import LLM

    model = test_models.quantized("Q8_0")
    out = tmp_path / "strata.toml"
    c = setup(model, out, "--parallel", "2")
    text = out.read_text()
    assert "# run: STRATA_CONFIG=" in text and "parallel = 2" in text
    assert (c.model, c.parallel, c.device) == (str(model), 2, "cpu")
    llm = LLM.from_config(c, private_slot=False)
    assert llm.n_ctx_seq == c.n_ctx_seq and llm.max_slots == 2
    # the model's path as an absolute one (the server may start anywhere); --n-ctx 0 is
    # llama.cpp's -c 0, the training context for all slots together
    with GGUFFile(model) as g:
        train = int(g.metadata[f"{g.architecture}.context_length"])
    with monkeypatch.context() as mp:
        mp.chdir(model.parent)
        c0 = setup(Path(model.name), tmp_path / "c0.toml", "--n-ctx", "0", "--parallel", "2")
    assert c0.model == str(model.absolute()) and (c0.n_ctx, c0.n_ctx_seq) == (train, train // 2)
    # an --out folder that is not there: said before anything is inspected
    assert main(["setup", str(model), "-o", str(tmp_path / "none" / "x.toml")]) == 2
    assert "no such folder" in capsys.readouterr().err
    # an existing file is kept; a missing model is a clear error
    assert main(["setup", str(model), "-o", str(out)]) == 2
    assert "exists" in capsys.readouterr().err
    assert main(["setup", str(tmp_path / "none.gguf"), "-o", str(tmp_path / "x.toml")]) == 2
    assert "no such file" in capsys.readouterr().err
    # the calibration's timer runs the model through the scheduler, speculation included
    rates = S.decode_rates({"model": str(model), "threads": 1, "spec": "ngram"}, tokens=4, reps=2)
    assert len(rates) == 2 and all(r > 0 for r in rates)


def test_setup_of_the_default_model_drafts_with_its_shipped_draft(
    test_models: TestModels, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from strata import modelgen
    from strata.__main__ import main

    default = modelgen.shipped_model_path("default")
    c = setup(default, tmp_path / "d.toml", "--parallel", "1")
    assert c.spec == "draft" and Path(c.spec_draft_model) == modelgen.shipped_model_path("draft")
    # the calibration's timer drafts with it: tokens/s of windows the draft proposed
    rates = S.decode_rates(
        {
            "model": str(default),
            "threads": 1,
            "spec": "draft",
            "spec_draft_model": c.spec_draft_model,
        },
        tokens=16,
        reps=1,
    )
    assert len(rates) == 1 and rates[0] > 0
    # a draft of another vocabulary is refused before anything is written
    other = test_models.quantized("Q8_0")
    bad = tmp_path / "bad.toml"
    assert main(["setup", str(default), "-o", str(bad), "--draft", str(other)]) == 2
    assert "vocabulary differs" in capsys.readouterr().err and not bad.exists()
