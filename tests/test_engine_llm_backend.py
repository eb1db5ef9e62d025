"""LLMBackend's glue over an `LLM`-shaped stand-in (the real strata.llm lands separately).
Oracle: greedy decoding done here directly on the stand-in's full-sequence logits."""

from __future__ import annotations

from typing import Any

import numpy as np
from strata.config import Config
from strata.engine.backend import LLMBackend
from strata.engine.protocol import Submit, Tokens
from strata.engine.scheduler import Scheduler
from strata.sampling import SamplingParams

V = 50
EOS = 0


class StandIn:
    """`LLM(path, **config)` with `logits(ids) -> [T, V]`: a tiny recurrent toy model."""

    def __init__(self, path: str, **config: Any) -> None:
        self.path, self.config = path, config
        rng = np.random.default_rng(5)
        self.emb = rng.standard_normal((V, 8))  # [V, D]
        self.out = rng.standard_normal((8, V))  # [D, V]
        self.n_vocab = V
        self.n_ctx = int(config["n_ctx"])

    def logits(self, ids: list[int]) -> np.ndarray:
        h = np.zeros(8)
        rows = []
        for t in ids:
            h = np.tanh(0.7 * h + self.emb[t])
            rows.append(h @ self.out)
        return np.asarray(rows, dtype=np.float32)  # [T, V]


class StepStandIn(StandIn):
    """The same model with the batched step API."""

    def __init__(self, path: str, **config: Any) -> None:
        super().__init__(path, **config)
        self.seqs: dict[int, list[int]] = {}
        self.batches: list[int] = []
        self.max_slots = 2

    def forward_batch(self, entries: list[tuple[int, list[int], str]]) -> list[Any]:
        self.batches.append(len(entries))
        out: list[Any] = []
        for slot, ids, want in entries:
            seq = self.seqs.setdefault(slot, [])
            seq += ids
            out.append(None if want == "none" else self.logits(seq)[-1])
        return out

    def truncate(self, slot: int, n: int) -> None:
        del self.seqs.setdefault(slot, [])[n:]

    def free(self, slot: int) -> None:
        self.seqs.pop(slot)


def greedy(model: StandIn, prompt: list[int], n: int) -> list[int]:
    seq, out = list(prompt), []
    for _ in range(n):
        tok = int(np.argmax(model.logits(seq)[-1]))
        if tok == EOS:
            break
        out.append(tok)
        seq.append(tok)
    return out


def run(backend: LLMBackend, prompts: list[list[int]], n: int) -> dict[int, list[int]]:
    sched = Scheduler(backend, prefill_chunk=3, max_slots=2)
    for rid, p in enumerate(prompts):
        sched.add(Submit(rid, p, SamplingParams(temperature=0), n, [EOS]))
    out: dict[int, list[int]] = {rid: [] for rid in range(len(prompts))}
    for _ in range(500):
        if not sched.has_work():
            return out
        for e in sched.step():
            if isinstance(e, Tokens):
                out[e.rid] += e.ids
    raise AssertionError("did not finish")


CFG = Config.load({"engine": "llm", "model": "/models/x.gguf", "n_ctx": 64, "parallel": 2}, env={})
PROMPTS = [[3, 4, 5, 6, 7], [9, 1, 2], [11, 12, 13, 14, 15, 16, 17]]


def test_fallback_full_sequence_logits() -> None:
    b = LLMBackend(CFG, factory=StandIn)
    # n_ctx 64 shared by the 2 slots (llama.cpp's meaning): 32 positions each
    assert not b.stepwise and (b.n_vocab, b.n_ctx_seq, b.max_slots) == (V, 32, 2)
    assert b.llm.path == "/models/x.gguf" and b.llm.config["kv_type"] == "f16"
    ref = StandIn("", n_ctx=64)
    assert run(b, PROMPTS, 12) == {i: greedy(ref, p, 12) for i, p in enumerate(PROMPTS)}
    assert b.info()["step_api"] == "full-sequence logits"


def test_every_model_setting_reaches_the_engines_llm() -> None:
    """Each Config field is the model's (handed to `LLM`) or the server's: a flag given to
    `strata serve` (e.g. --device cuda) must reach the engine's model, not only the env."""
    cfg = Config.load(
        {"engine": "llm", "model": "/m.gguf", "device": "cuda", "pcie_frac": 0.25}, env={}
    )
    b = LLMBackend(cfg, factory=StandIn)
    assert b.llm.config["device"] == "cuda" and b.llm.config["pcie_frac"] == 0.25
    assert b.llm.config["stream_chunk"] == cfg.stream_chunk and "port" not in b.llm.config


def test_batched_step_api() -> None:
    b = LLMBackend(CFG, factory=StepStandIn)
    assert b.stepwise
    ref = StandIn("", n_ctx=64)
    assert run(b, PROMPTS, 12) == {i: greedy(ref, p, 12) for i, p in enumerate(PROMPTS)}
    assert max(b.llm.batches) == 2  # two slots ran in one call
    # the slots keep their sequences for prefix reuse
    assert len(b.llm.seqs) == 2 and all(b.llm.seqs.values())
    assert b.info()["step_api"] == "batched"


def test_the_engines_model_takes_the_servers_settings_not_the_environment(
    test_models: Any, monkeypatch: Any
) -> None:
    """The engine builds its model from the Config the server resolved (its flags over its
    environment): a STRATA_* value a flag overrode is not read and checked again (an invalid
    STRATA_PORT under `--port` made the engine refuse to load), and a setting the
    environment would change does not change the engine's model."""
    from strata.config import Config

    path = str(test_models.quantized("Q8_0"))
    monkeypatch.setenv("STRATA_PORT", "0")  # invalid; the server's flag overrode it
    monkeypatch.setenv("STRATA_N_CTX", "48")
    cfg = Config.load({"port": 8123, "model": path, "n_ctx": 96, "threads": 1}, env={})
    b = LLMBackend(cfg)
    assert b.n_ctx_seq == 96 and b.llm.config == cfg
