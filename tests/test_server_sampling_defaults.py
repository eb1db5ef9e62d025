"""The sampling a request starts from: the server's settings (llama-server's `--temp`,
`--top-k`, `--top-p`, `--min-p`, `--repeat-penalty`, `--repeat-last-n`, `-s`, `-n`), else the
model's recommendations in its GGUF (`general.sampling.*`, read as llama.cpp reads them), else
llama.cpp's defaults; a request's own fields over all of them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from gguf_edit import rewrite
from models import TestModels
from server_harness import Server
from strata.config import Config
from strata.errors import ConfigError
from strata.sampling import SamplingParams, request_defaults


def test_layers_of_defaults() -> None:
    meta = {
        "general.sampling.temp": 0.6,
        "general.sampling.top_k": 20,
        "general.sampling.top_p": 0.0,
    }
    d, notes = request_defaults(meta, {"top_k": 5})
    assert (d.temperature, d.top_k, d.top_p, d.min_p) == (pytest.approx(0.6), 5, 0.95, 0.05)
    assert len(notes) == 1 and "general.sampling.top_p" in notes[0]  # (0, 1]: left out
    d, notes = request_defaults({"general.sampling.top_k": 2.5, "x": 1}, {})
    assert d.top_k == 40 and "not a number" in notes[0]
    assert request_defaults({}, {})[0] == SamplingParams()


def test_model_chain_and_mirostat_recommendations() -> None:
    """general.sampling.sequence (llama.cpp's names separated by ';') is the chain of a
    request that names none, unless `--samplers` sets one; one Strata cannot run is left out
    with a note. general.sampling.mirostat / _tau / _eta are read as llama.cpp reads them."""
    from strata.sampling_chain import default_chain

    d = SamplingParams()
    meta = {"general.sampling.sequence": "top_k;min_p;temperature"}
    assert default_chain(meta, "", d) == (["top_k", "min_p", "temperature"], [])
    assert default_chain(meta, "kt", d) == ("kt", [])  # --sampler-seq's letter codes
    assert default_chain(meta, "top_p;temperature", d)[0] == ["top_p", "temperature"]
    chain, notes = default_chain({"general.sampling.sequence": "min_p;top_k"}, "", d)
    assert chain is None and "general.sampling.sequence" in notes[0]  # not Strata's order
    assert default_chain({}, "", d) == (None, [])
    m, notes = request_defaults(
        {"general.sampling.mirostat": 2, "general.sampling.mirostat_tau": 4.0}, {}
    )
    assert (m.mirostat, m.mirostat_tau, notes) == (2, 4.0, [])


def test_settings_are_checked_and_named_as_llama_servers_flags() -> None:
    from strata.server.__main__ import parser

    argv = "--temp 0.6 --top-k 20 --top-p 0.9 --min-p 0 --repeat-penalty 1.1 -s 7 -n 64"
    c = Config.from_args(parser().parse_args(argv.split()))
    assert c.sampling_settings() == {
        "temperature": 0.6,
        "top_k": 20,
        "top_p": 0.9,
        "min_p": 0.0,
        "repetition_penalty": 1.1,
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "typical_p": 1.0,
        "top_n_sigma": -1.0,
        "dry_multiplier": 0.0,
        "dry_base": 1.75,
        "dry_allowed_length": 2,
        "dry_penalty_last_n": 64,
        "dynatemp_range": 0.0,
        "dynatemp_exponent": 1.0,
        "mirostat": 0,
        "mirostat_tau": 5.0,
        "mirostat_eta": 0.1,
        "adaptive_target": -1.0,
        "adaptive_decay": 0.9,
        "seed": 7,
    }
    ns = parser().parse_args(
        ["--typical", "0.9", "--xtc-probability", "0.5", "--top-nsigma", "1.5"]
    )
    # llama-server's chain flags: names (--samplers) or letter codes (--sampler-seq)
    for flag, value in (("--samplers", "top_k;temperature"), ("--sampling-seq", "kt")):
        assert Config.from_args(parser().parse_args([flag, value])).samplers == value
    t = Config.from_args(ns).sampling_settings()
    assert (t["typical_p"], t["xtc_probability"], t["top_n_sigma"]) == (0.9, 0.5, 1.5)
    assert c.n_predict == 64
    assert "temperature" not in Config.load({}, env={}).sampling_settings()
    for over, name in (
        ({"temperature": -1.0}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"repeat_penalty": 0.0}, "repeat_penalty"),
        ({"n_predict": 0}, "n_predict"),
    ):
        with pytest.raises(ConfigError, match=name):
            Config.load(over, env={})


@pytest.fixture(scope="module")
def greedy_model(test_models: TestModels, tmp_path_factory: pytest.TempPathFactory) -> Path:
    micro = TestModels(test_models.root, test_models.spec.micro()).f32()
    out = tmp_path_factory.mktemp("meta") / "greedy.gguf"
    meta = {"general.sampling.temp": 0.0, "general.sampling.top_k": 1}
    return rewrite(micro, out, extra=meta)


@pytest.fixture(scope="module")
def srv(greedy_model: Path) -> Iterator[Server]:
    s = Server(engine="llm", model=greedy_model, n_ctx=512)
    try:
        yield s
    finally:
        s.stop()


def answer(srv: Server, **body: Any) -> str:
    r = srv.http.post("/v1/completions", json={"prompt": "Once upon", "max_tokens": 12, **body})
    assert r.status_code == 200, r.text
    return str(r.json()["choices"][0]["text"])


def test_the_models_recommendation_applies(srv: Server) -> None:
    """The file recommends temperature 0: requests that set none are greedy, whatever their
    seed; a request's own temperature still samples."""
    greedy = answer(srv, temperature=0)
    assert answer(srv, seed=1) == answer(srv, seed=2) == greedy
    sampled = {answer(srv, seed=s, temperature=1.5, top_k=0) for s in range(4)}
    assert len(sampled) > 1
    props = srv.http.get("/props").json()["default_generation_settings"]["params"]
    assert (props["temperature"], props["top_k"]) == (0.0, 1)


def test_the_servers_settings_win_over_the_model(greedy_model: Path) -> None:
    s = Server(engine="llm", model=greedy_model, n_ctx=512, temperature=1.5, top_k=0, n_predict=5)
    try:
        outs = {answer(s, seed=i, max_tokens=None) for i in range(4)}
        assert len(outs) > 1  # sampled: the setting, not the file's temperature 0
        r = s.http.post("/v1/completions", json={"prompt": "Once upon", "temperature": 0})
        assert r.json()["usage"]["completion_tokens"] == 5  # n_predict: no max_tokens given
        assert r.json()["choices"][0]["finish_reason"] == "length"
    finally:
        s.stop()


def test_dry_reaches_the_engine(srv: Server, greedy_model: Path) -> None:
    """A request's DRY settings reach the engine's sampler (its own test checks DRY against
    llama.cpp's): at allowed length 0 with a large multiplier every token seen before (the
    prompt's included) is pushed down, so the greedy answer repeats none, as the engine run
    directly gives it; without DRY the same answer repeats tokens."""
    from strata.llm import LLM

    llm = LLM(greedy_model, n_ctx=512, threads=1)
    ids = llm.tokenizer.encode("Once upon")
    dry = dict(
        dry_multiplier=1000.0,
        dry_allowed_length=0,
        dry_penalty_last_n=-1,
        dry_sequence_breakers=[],
    )
    out = [t for t, _ in llm.generate_ids(ids, max_tokens=60, temperature=0, **dry)]
    plain = [t for t, _ in llm.generate_ids(ids, max_tokens=60, temperature=0)]
    assert len(set(plain)) < len(plain)  # the plain answer repeats itself
    body = [t for t in out if t not in llm.tokenizer.eog_ids]
    assert len(set(body)) == len(body) and not set(body) & set(ids)
    ref = llm.tokenizer.decode(body, skip_special=True)
    assert answer(srv, temperature=0, max_tokens=60, **dry) == ref
