"""`strata.config.Config` is the one table of settings and defaults (issue #24): the keyword
defaults of `_core.Model.open` come from it, the engine's field lists derive from it, unknown
`STRATA_*` variables warn with the closest setting, the TEST-ONLY switches stay out of
`--help` and `/v1/status`, and `threads` counts every compute thread as llama.cpp's `-t`."""

from __future__ import annotations

import argparse
import inspect
import os
import warnings
from dataclasses import fields
from pathlib import Path

import pytest
from models import TestModels
from strata import _core
from strata.config import Config, UnknownSettingWarning
from strata.errors import ConfigError


def test_model_open_takes_its_defaults_from_config() -> None:
    params = inspect.signature(_core.Model.open).parameters
    names = {f.name for f in fields(Config)}
    core = set(Config.names("core"))
    for name in core:
        assert name in params, f"Config.{name} is marked core but Model.open lacks it"
        assert params[name].default is None, f"Model.open({name}=...) names its own default"
    # a Model.open keyword named like a setting is a core setting ("profile" there is the
    # loaded Profile object, Config.profile its path)
    assert (set(params) & names) - core == {"profile"}


def test_model_open_left_out_keywords_are_configs_defaults(test_models: TestModels) -> None:
    micro: Path = TestModels(test_models.root, test_models.spec.micro()).f32()
    hp = _core.Model.open(micro).hparams
    d = Config()
    assert (hp["n_ctx"], hp["kv_type"], hp["prefill_chunk"], hp["device"]) == (
        d.n_ctx,
        d.kv_type,
        d.prefill_chunk,
        d.device,
    )


def test_field_groups_cover_every_field_once() -> None:
    names = [f.name for f in fields(Config)]
    groups = [Config.names(g) for g in ("model", "server", "test")]
    assert sorted(n for g in groups for n in g) == sorted(names)
    assert set(Config.names("core")) <= set(Config.names("model"))
    with pytest.raises(ValueError):
        Config.names("nope")


def test_unknown_strata_variable_warns_with_the_closest_setting() -> None:
    with pytest.warns(UnknownSettingWarning, match="STRATA_THREAD .*did you mean STRATA_THREADS"):
        c = Config.load(env={"STRATA_THREAD": "2", "STRATA_N_CTX": "64"})
    assert c.n_ctx == 64 and c.threads == Config().threads
    with pytest.warns(UnknownSettingWarning, match="STRATA_ZZZ names no Strata setting$"):
        Config.load(env={"STRATA_ZZZ": "1"})
    # settings and the build's / harness's own variables do not warn
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Config.load(env={"STRATA_THREADS": "2", "STRATA_REQUIRE_KERNELS": "1", "PATH": "/x"})
        Config.load(env={"STRATA_ISA": "scalar", "STRATA_CONFIG": ""})


def test_isa_is_a_setting() -> None:
    assert Config.load(env={"STRATA_ISA": "avx2"}).isa == "avx2"
    with pytest.raises(Exception, match="isa"):
        Config.load(env={"STRATA_ISA": "sse9"})


def test_test_only_fields_are_not_advertised() -> None:
    test_only = Config.names("test")
    assert test_only == ("fake_step_ms", "fake_load_s", "test_faults", "test_pipeline_miss")
    p = argparse.ArgumentParser()
    Config.add_arguments(p)
    text = p.format_help()
    assert "TEST-ONLY" not in text
    for name in test_only:
        assert "--" + name.replace("_", "-") not in text
    # still settable (the tests' fake engine reads them)
    ns = p.parse_args(["--fake-step-ms", "5", "--test-faults"])
    c = Config.from_args(ns)
    assert c.fake_step_ms == 5.0 and c.test_faults
    shown = c.public_dict()
    assert not set(test_only) & set(shown)
    assert shown["n_ctx"] == c.n_ctx


def test_the_server_takes_llama_servers_flags_where_they_mean_the_same() -> None:
    """A llama-server command line runs as it reads there: `-c` is the context of all `-np`
    slots together, `-t` the compute threads, `-b` the tokens of one step, the draft flags
    speculation's."""
    from strata.server.__main__ import parser

    argv = "-m m.gguf -c 8192 -np 4 -t 2 -b 256 -a served --spec draft -md d.gguf"
    argv += " --draft-max 6 --draft-min 2 --draft-p-min 0.5"
    c = Config.from_args(parser().parse_args(argv.split()))
    assert (c.model, c.n_ctx, c.n_ctx_seq, c.parallel, c.threads) == ("m.gguf", 8192, 2048, 4, 2)
    assert (c.max_batch_tokens, c.served_model_name, c.spec_draft_model) == (
        256,
        "served",
        "d.gguf",
    )
    assert (c.spec_max, c.spec_min, c.spec_p_min) == (6, 2, 0.5)
    long = "--ctx-size 4096 --alias x --model-draft d.gguf --draft 5 --spec draft --batch-size 64"
    # flags that ask for what Strata always does pass; -ctk/-ctv agreeing are the KV type;
    # the placement flags are refused, saying what Strata does instead
    from strata.server.llama_flags import apply_llama_flags

    argv = ["-m", "m.gguf", "--jinja", "-cb", "--metrics", "-fa", "on", "-ub", "1024"]
    ns = parser().parse_args([*argv, "-dt", "0.1", "-ctk", "q8_0", "-ctv", "q8_0"])
    apply_llama_flags(ns)
    assert Config.from_args(ns).kv_type == "q8_0"
    assert parser().parse_args(["-fa", "-ub", "512"]).llama_ubatch_size == "512"  # -fa alone
    for bad, why in (
        ("-ngl 99", "n-gpu-layers: not a Strata setting; Strata places the model itself"),
        ("--n-cpu-moe 20", "vram-budget-mib"),
        ("-ot exps=CPU", "override-tensor"),
        ("--no-mmap", "ram-mode resident"),
        ("-ctk q8_0 -ctv f16", "one type for K and V"),
        ("-ctk q8_0", "one type for K and V"),
        ("-ctk q4_0 -ctv q4_0 --kv-type f16", "disagree"),
    ):
        ns = parser().parse_args(["-m", "m.gguf", *bad.split()])
        with pytest.raises(ConfigError, match=why):
            apply_llama_flags(ns)
    # --cache-reuse is llama-server's KV shifting: its minimum chunk
    assert Config.from_args(parser().parse_args(["--cache-reuse", "256"])).cache_reuse == 256
    with pytest.raises(ConfigError, match="cache_reuse"):
        Config.load({"cache_reuse": -1}, env={})
    # -md alone speculates with the draft, as it does there
    c = Config.from_args(parser().parse_args(["-m", "m.gguf", "-md", "d.gguf"]))
    assert (c.spec, c.spec_draft_model) == ("draft", "d.gguf")
    assert Config.load({"spec_draft_model": "d.gguf"}, env={}).spec == "draft"
    assert Config.load({}, env={"STRATA_SPEC_DRAFT_MODEL": "d.gguf"}).spec == "draft"
    c = Config.from_args(parser().parse_args(long.split()))
    assert (c.n_ctx, c.served_model_name, c.spec_max, c.max_batch_tokens) == (4096, "x", 5, 64)
    opts = [a.option_strings for a in parser()._actions if a.dest == "n_ctx"]
    assert opts == [["--n-ctx", "-c", "--ctx-size"]]  # one setting, --help lists the names
    budget = [a.option_strings for a in parser()._actions if a.dest == "reasoning_budget"]
    assert budget == [["--reasoning-budget"]]  # a llama name equal to the flag: listed once


def test_the_server_refuses_a_model_path_that_is_no_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """As llama-server exits on a model it cannot open: before binding, status 2."""
    from strata.server.__main__ import main

    assert main(["-m", str(tmp_path / "none.gguf"), "--port", "1"]) == 2
    assert "no such file" in capsys.readouterr().err


def _threads_now() -> int:
    return len(os.listdir("/proc/self/task"))


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux /proc")
def test_threads_counts_the_caller_as_llama_cpp_t(test_models: TestModels) -> None:
    """`threads=N` starts N − 1 pool workers: the calling thread is the N-th (it takes work);
    without host participation the pool has N workers."""
    micro: Path = TestModels(test_models.root, test_models.spec.micro()).f32()
    for threads, host, workers in ((2, True, 1), (3, True, 2), (1, True, 0), (2, False, 2)):
        before = _threads_now()
        m = _core.Model.open(micro, n_ctx=32, threads=threads, host_participates=host)
        started = _threads_now() - before
        assert started == workers, (threads, host, started)
        out = m.forward(0, [1, 2, 3])
        assert out.shape == (m.n_vocab,)
        del m


def test_parity_console_script_says_it_is_a_check(capsys: pytest.CaptureFixture[str]) -> None:
    from strata.tools import parity

    with pytest.raises(SystemExit):
        parity.main(["--help"])
    assert "A parity check" in capsys.readouterr().out


def test_profile_refuses_where_routing_is_not_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`strata-fill profile` on a model that does not count its routing (the GPU path with
    every expert in VRAM: `counts_routing` false) refuses with the reason before any prompt
    runs, instead of writing a profile of zeros."""
    import types

    from strata.cli import fill
    from strata.engine import backend
    from strata.errors import ConfigError

    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    ran: list[str] = []

    class NotCounting:
        def __init__(self, cfg: Config) -> None:
            self.llm = types.SimpleNamespace(counts_routing=False)
            self.n_ctx = 64

        def prefill(self, *a: object) -> None:
            ran.append("prefill")

    monkeypatch.setattr(backend, "LLMBackend", NotCounting)
    out = tmp_path / "p.json"
    ns = argparse.Namespace(prompts=None, output=str(out))
    with pytest.raises(ConfigError, match="does not count the routing"):
        fill.cmd_profile(Config(model=str(model)), ns)
    assert not ran and not out.exists()


def test_layer_split_settings_are_checked() -> None:
    """`gpus`, `layer_split` and `pipeline_windows` (docs/PROTOCOL.md): their form is checked
    here; whether the boundaries fit the model's layers is checked at load."""
    c = Config.load({"device": "cuda", "gpus": "0,0", "layer_split": "12"}, env={})
    assert c.stage_devices() == [0, 0] and c.split_bounds() == [12]
    assert Config.load(
        env={"STRATA_DEVICE": "cuda", "STRATA_GPUS": "0,1,1", "STRATA_LAYER_SPLIT": "8, 20"}
    ).split_bounds() == [
        8,
        20,
    ]
    two = {"device": "cuda", "gpus": "0,0", "pipeline_windows": 2}
    assert Config.load(two, env={}).pipeline_windows == 2
    bad = [
        ({"gpus": ""}, "gpus"),
        ({"gpus": "0,x"}, "gpus"),
        ({"gpus": "-1"}, "gpus"),
        ({"layer_split": "half"}, "layer_split"),
        ({"gpus": "0,0", "layer_split": "4,8"}, "layer_split"),  # 2 boundaries, 2 stages
        ({"gpus": "0,0,0", "layer_split": "8,8"}, "layer_split"),  # not increasing
        ({"gpus": "0,0", "layer_split": "0"}, "layer_split"),  # an empty first stage
        ({"pipeline_windows": 3}, "pipeline_windows"),
        ({"pipeline_windows": 2}, "pipeline_windows"),  # one stage
    ]
    for over, name in bad:
        with pytest.raises(_core.ConfigError, match=name):
            Config.load(over, env={})


@pytest.mark.parametrize(
    ("over", "refused"),
    [
        ({"vram_budget_mib": 8192}, "vram_budget_mib: applies to device cuda only"),
        ({"gpus": "0,0"}, "gpus: applies to device cuda only"),
        ({"tier_async": True}, "tier_async: applies to device cuda only"),
        ({"defer_experts": 2}, "defer_experts: applies to device cuda only"),
        ({"readahead": "on", "ram_mode": "resident"}, "readahead: on has nothing"),
        ({"spec": "ngram", "spec_draft_model": "d.gguf"}, "spec_draft_model: is read by"),
        ({"spec": "off", "spec_draft_model": "d.gguf"}, "spec_draft_model: .*spec is off"),
        ({"spec_max": 4}, "spec_max: .*spec is off"),
        ({"spec_adaptive": False}, "spec_adaptive: .*spec is off"),
        ({"device": "cuda", "ram_mode": "resident"}, "ram_mode: is the CPU path's"),
        ({"device": "cuda", "readahead": "on"}, "readahead: is the CPU path's"),
        ({"ram_mode": "resident", "ram_budget_gib": 4.0}, "ram_budget_gib: is read by"),
        ({"device": "cuda", "spec": "mtp"}, "spec: mtp runs"),
    ],
)
def test_settings_that_contradict_each_other_are_refused(
    over: dict[str, object], refused: str
) -> None:
    """A setting another one makes inert (a GPU setting on the CPU, read-ahead with every
    expert resident, a draft model without draft speculation) is a ConfigError, not ignored."""
    with pytest.raises(ConfigError, match=refused):
        Config.load(over, env={})
    # the same values where they apply
    fine = {"vram_budget_mib", "gpus", "tier_async", "defer_experts"} & set(over)
    if fine:
        assert Config.load({**over, "device": "cuda"}, env={}).device == "cuda"
    elif "device" in over:  # the CPU path's settings where they apply
        assert Config.load({**over, "device": "cpu"}, env={}).device == "cpu"
    elif "readahead" in over or "ram_budget_gib" in over:
        assert Config.load({"readahead": "on", "ram_mode": "budget", "ram_budget_gib": 1.0}, env={})
    else:
        assert Config.load({**over, "spec": "draft"}, env={}).spec == "draft"


def test_an_empty_boolean_variable_is_refused_and_draft_min_0_is_llama_cpps() -> None:
    with pytest.raises(ConfigError, match="STRATA_CACHE_PROMPT"):
        Config.load(env={"STRATA_CACHE_PROMPT": ""})
    assert Config.load(env={"STRATA_CACHE_PROMPT": "off"}).cache_prompt is False
    assert Config.load({"spec": "ngram", "spec_min": 0}, env={}).spec_min == 0


@pytest.mark.parametrize(
    ("data", "why"),
    [
        ("n_ctx = 4096.9", "whole number"),
        ("parallel = 2.5", "whole number"),
        ("n_ctx = inf", "overflow"),
        ("pcie_frac = true", "bool for a number"),
        ("host = true", "bool for text"),
        ("served_model_name = [1, 2]", "list for text"),
        ("cache_prompt = 2.0", "float for a bool"),
        ("adapt_every = 5000000000", "u32"),
        ("threads = 100000", "threads"),
        ("parallel = 1000000000", "slots"),
    ],
)
def test_config_values_of_the_wrong_type_or_range_are_refused(
    tmp_path: Path, data: str, why: str
) -> None:
    """A config file's value is refused with a ConfigError naming the setting, not cut
    (4096.9 → 4096), turned into text (true → 'True') or left to overflow later."""
    f = tmp_path / "c.toml"
    f.write_text(data + "\n")
    with pytest.raises(ConfigError, match=data.split(" ")[0]):
        Config.load(config_file=str(f), env={})


def test_config_built_directly_checks_types() -> None:
    for kw in ({"cache_prompt": "no"}, {"n_ctx": 4096.5}, {"n_ctx": "4096"}, {"gpus": 0}):
        with pytest.raises(ConfigError):
            Config(**kw)
    assert Config.load({"gpus": 0, "n_ctx": 4096.0}, env={}).gpus == "0"
    assert Config(device="cuda", pcie_frac=1).pcie_frac == 1
    import numpy as np  # numpy's numbers are numbers

    numpy_kw = {"n_ctx": np.int64(64), "pcie_frac": np.float32(0.5), "device": "cuda"}
    assert Config.load(numpy_kw, env={}).n_ctx == 64
    assert Config(n_ctx=np.int64(64)).n_ctx == 64
    with pytest.raises(ConfigError):
        Config.load({"n_ctx": np.float64(64.5)}, env={})


def test_a_kv_cache_too_large_for_the_machine_is_refused(test_models: TestModels) -> None:
    """Where the allocator cannot give the KV cache's bytes, the model is refused with a
    ConfigError (it aborted the process), and the process goes on."""
    path = test_models.quantized("Q8_0")
    with pytest.raises(ConfigError, match="KV cache"):
        _core.Model.open(path, n_ctx=1 << 40)
    assert _core.Model.open(path, n_ctx=64).n_vocab > 0
