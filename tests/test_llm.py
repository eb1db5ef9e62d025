"""strata.LLM and strata._core.Model on a small random qwen3moe: logits, KV slots and prefix
reuse, refusals, sampling arguments, the generation loop."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import qwen3moe_file as qf
from strata import LLM
from strata._core import Model
from strata.errors import ModelError
from strata.gguf import GGUFFile

SHAPE = qf.Shape(n_layer=2, n_embd=128, n_head=2, n_head_kv=1, n_expert=8, n_expert_used=2)
SHAPE.n_ff_exp = 128


@pytest.fixture(scope="module")
def path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return qf.write(tmp_path_factory.mktemp("llm") / "m.gguf", SHAPE, qf.random_tensors(SHAPE, 7))


def toks(n: int, seed: int = 0) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(0, 509, n)]


def test_chunked_prefill_decode_and_slots_agree(path: Path) -> None:
    ids = toks(40)
    whole = Model.open(path, n_ctx=64, n_slots=3, prefill_chunk=64).forward(0, ids, "all")
    m = Model.open(path, n_ctx=64, n_slots=3, prefill_chunk=7)
    chunked = m.forward(0, ids, logits="all")
    assert chunked.shape == (40, SHAPE.n_vocab) and chunked.dtype == np.float32
    np.testing.assert_allclose(chunked, whole, rtol=0, atol=1e-5)
    # decode token by token in another slot: one-row matmuls and attention take ggml's
    # one-row float order (llama.cpp's vec_dot) instead of its multi-row one (tinyBLAS), as
    # llama.cpp does, so the logits differ at the rounding level (≈ 5e-4 on this model)
    step = np.stack([m.forward(1, [t]) for t in ids])
    np.testing.assert_allclose(step, whole, rtol=0, atol=2e-3)
    assert m.slot_len(0) == m.slot_len(1) == 40 and m.slot_len(2) == 0
    # truncate to a prefix and continue: same as the fresh run
    m.truncate(1, 25)
    again = m.forward(1, ids[25:], logits="all")
    # the kept prefix was written by one-row steps (their float order, see above)
    np.testing.assert_allclose(again, whole[25:], rtol=0, atol=2e-3)
    assert m.forward(2, ids[:5], logits="none").shape == (0, SHAPE.n_vocab)
    m.free(0)
    assert m.slot_len(0) == 0


def test_model_refuses_bad_calls(path: Path) -> None:
    m = Model.open(path, n_ctx=16, n_slots=1)
    with pytest.raises(ValueError, match="slot 3"):
        m.forward(3, [1])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        m.forward(0, [SHAPE.n_vocab])
    with pytest.raises(ValueError, match="n_ctx = 16"):
        m.forward(0, toks(17))
    assert m.slot_len(0) == 0
    with pytest.raises(ValueError, match="holds 0"):
        m.truncate(0, 1)
    with pytest.raises(ValueError, match="logits"):
        m.forward(0, [1], logits="first")


def test_refusals_name_what_is_wrong(tmp_path: Path) -> None:
    t = qf.random_tensors(SHAPE, 1)
    p = qf.write(tmp_path / "gpt2.gguf", SHAPE, t, arch="gpt2")
    with pytest.raises(
        ModelError,
        match=r"architecture \"gpt2\" is not supported.*qwen3moe, qwen3, qwen2moe, llama",
    ):
        Model.open(p)
    p = qf.write(tmp_path / "nokey.gguf", SHAPE, t, drop=("qwen3moe.expert_count",))
    with pytest.raises(ModelError, match=r"qwen3moe\.expert_count is missing"):
        Model.open(p)
    bad = dict(t)
    bad["blk.1.attn_q.weight"] = np.zeros(t["blk.1.attn_q.weight"].shape, np.int8)
    p = qf.write(tmp_path / "i8.gguf", SHAPE, bad)
    with pytest.raises(ModelError, match=r"blk.1.attn_q.weight has type I8.*Strata runs: .*F32"):
        Model.open(p)
    short = dict(t)
    short["blk.0.ffn_up_exps.weight"] = t["blk.0.ffn_up_exps.weight"][:, :64]
    p = qf.write(tmp_path / "shape.gguf", SHAPE, short)
    with pytest.raises(ModelError, match=r"ffn_up_exps\.weight has shape"):
        Model.open(p)
    missing = {k: v for k, v in t.items() if k != "blk.0.ffn_norm.weight"}
    p = qf.write(tmp_path / "missing.gguf", SHAPE, missing)
    with pytest.raises(ModelError, match=r"blk\.0\.ffn_norm\.weight is missing"):
        Model.open(p)


def test_logits_and_validation(path: Path) -> None:
    llm = LLM(path, n_ctx=32, prefill_chunk=8)
    assert llm.prefill_piece == 8  # the CPU path: the scheduler feeds prefill_chunk pieces
    ids = toks(20)
    out = llm.logits(ids)
    assert out.shape == (20, SHAPE.n_vocab) and out.dtype == np.float32
    ref = Model.open(path, n_ctx=32).forward(0, ids, logits="all")
    np.testing.assert_allclose(out, ref, rtol=0, atol=1e-5)
    with pytest.raises(ValueError, match="context of 32"):
        llm.logits(toks(33))
    with pytest.raises(ValueError, match="context of 32"):
        llm.generate_ids(toks(33), stop_ids=())
    for kw, field in [
        ({"temperature": -1.0}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_k": -2}, "top_k"),
        ({"repeat_last_n": -2}, "repeat_last_n"),
        ({"temprature": 0.5}, "temprature"),
        ({"min_p": 2.0}, "min_p"),
        ({"repeat_penalty": 0.0}, "repeat_penalty"),
        ({"presence_penalty": 3.0}, "presence_penalty"),
        ({"frequency_penalty": float("nan")}, "frequency_penalty"),
        ({"seed": "x"}, "seed"),
    ]:
        with pytest.raises(ValueError, match=field):
            llm.generate_ids(ids, stop_ids=(), **kw)
    with pytest.raises(ValueError, match="max_tokens"):
        llm.generate_ids(ids, max_tokens=0, stop_ids=())


def greedy_reference(path: Path, prompt: list[int], n: int) -> list[int]:
    m = Model.open(path, n_ctx=64)
    out: list[int] = []
    logits = m.forward(0, prompt)
    for _ in range(n):
        out.append(int(logits.argmax()))
        logits = m.forward(0, out[-1:])
    return out


def test_greedy_loop_reuses_prefix_and_stops(path: Path) -> None:
    llm = LLM(path, n_ctx=64)
    prompt = toks(12, seed=3)
    want = greedy_reference(path, prompt, 20)
    got = list(llm.generate_ids(prompt, max_tokens=20, stop_ids=(), temperature=0))
    assert [t for t, _ in got] == want
    assert [r for _, r in got] == [None] * 19 + ["length"]
    # a prompt sharing a prefix with the cached sequence gives the fresh result
    p2 = prompt[:6] + toks(4, seed=4)
    got2 = [t for t, _ in llm.generate_ids(p2, max_tokens=10, stop_ids=(), temperature=0)]
    assert got2 == greedy_reference(path, p2, 10)
    # a stop id ends generation with "stop"
    got3 = list(llm.generate_ids(prompt, max_tokens=20, stop_ids={want[4]}, temperature=0))
    assert got3[-1] == (want[4], "stop") and len(got3) == 5
    # the context bounds the generation
    long = toks(60, seed=5)
    got4 = list(llm.generate_ids(long, max_tokens=50, stop_ids=(), temperature=0))
    assert len(got4) == 4 and got4[-1][1] == "length"
    # one private slot: a paused generator whose slot another generation (or logits())
    # moved stops with an error instead of decoding on the other's KV; the newer one is right
    for other in ("generate", "logits"):
        g1 = llm.generate_ids(prompt, max_tokens=20, stop_ids=(), temperature=0)
        assert next(g1)[0] == want[0]
        if other == "logits":
            llm.logits(p2)
        else:
            g2 = llm.generate_ids(p2, max_tokens=10, stop_ids=(), temperature=0)
            assert [t for t, _ in g2] == greedy_reference(path, p2, 10)
        with pytest.raises(RuntimeError, match="private slot"):
            next(g1)


def test_sampling_is_seeded_and_top_k_1_is_greedy(path: Path) -> None:
    llm = LLM(path, n_ctx=64)
    prompt = toks(8, seed=6)

    def run(**kw: object) -> list[int]:
        return [t for t, _ in llm.generate_ids(prompt, max_tokens=12, stop_ids=(), **kw)]

    a = run(temperature=1.0, seed=11, top_k=0, top_p=1.0, min_p=0.0)
    assert a == run(temperature=1.0, seed=11, top_k=0, top_p=1.0, min_p=0.0)
    assert run(temperature=0.7, top_k=1, seed=1) == run(temperature=0)
    # a huge repeat penalty forbids repeating any of the last 64 tokens
    rp = run(temperature=0, repeat_penalty=100.0, presence_penalty=2.0)
    seen = set(prompt)
    for t in rp:
        assert t not in seen
        seen.add(t)


def test_generate_streams_text(path: Path) -> None:
    llm = LLM(path, n_ctx=64)
    evs = list(llm.generate("hello there", max_tokens=8, temperature=0))
    assert evs[-1].finish_reason in ("stop", "length")
    ids = [e.id for e in evs if e.finish_reason != "stop"]
    assert "".join(e.text for e in evs) == llm.tokenizer.decode(ids)
    chat = list(llm.generate([{"role": "user", "content": "hi"}], max_tokens=4, temperature=0))
    assert chat[-1].finish_reason is not None


def test_cli_without_a_model_runs_the_default_and_refuses_bad_settings(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """No --model: the embedded default model, as the server (its help says so); a bad
    setting: exit 2 with the ConfigError's message (it was a traceback)."""
    from strata.__main__ import main

    monkeypatch.delenv("STRATA_MODEL", raising=False)
    monkeypatch.delenv("STRATA_CONFIG", raising=False)
    assert main(["generate", "def f():", "--max-tokens", "2"]) == 0
    assert "[finish: " in capsys.readouterr().err
    assert main(["generate", "--n-ctx", "8", "hello"]) == 2
    assert "n_ctx: must be at least 16" in capsys.readouterr().err


def test_cli_streams(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from strata.__main__ import main

    assert main(["generate", "--model", str(path), "--n-ctx", "64", "hi", "--max-tokens", "4"]) == 0
    assert "[finish: " in capsys.readouterr().err


def test_n_ctx_is_shared_by_the_parallel_slots_as_in_llama_cpp(path: Path) -> None:
    """`n_ctx` is the context of all `parallel` sequences together (llama.cpp's `-c` with
    `-np`); the engine's model has those slots only, so its KV cache holds n_ctx positions."""
    from strata.config import Config
    from strata.errors import ConfigError

    cfg = Config.load({"model": str(path), "n_ctx": 192, "parallel": 3}, env={})
    assert cfg.n_ctx_seq == 64
    engine = LLM.from_config(cfg, private_slot=False)
    assert (engine.model.hparams["n_ctx"], engine.model.hparams["n_slots"]) == (64, 3)
    with pytest.raises(RuntimeError, match="step API only"):
        engine.logits([1, 2])
    with pytest.raises(ValueError, match="context of 64"):
        engine.forward_batch([(2, toks(65), "last")])
    own = LLM.from_config(cfg)  # a private slot of the same size for logits()/generate()
    assert (own.model.hparams["n_ctx"], own.model.hparams["n_slots"]) == (64, 4)
    assert own.logits(toks(64)).shape[0] == 64
    with pytest.raises(ValueError, match="context of 64"):
        own.logits(toks(65))
    with pytest.raises(ConfigError, match="n_ctx: leaves 5 tokens to each of the 3"):
        Config.load({"n_ctx": 16, "parallel": 3}, env={})
    # llama.cpp's -c 0: the model's training context (the file's context_length), shared
    with GGUFFile(path) as g:
        train = int(g.metadata[f"{g.architecture}.context_length"])
    whole = LLM.from_config(Config.load({"model": str(path), "n_ctx": 0, "parallel": 2}, env={}))
    assert (whole.n_ctx, whole.n_ctx_seq, whole.config.n_ctx) == (train, train // 2, train)
    assert whole.model.hparams["n_ctx"] == train // 2


def test_batched_step_api_matches_forward(path: Path) -> None:
    llm = LLM(path, n_ctx=96, parallel=2)  # llama.cpp's n_ctx: 48 positions to each slot
    assert (llm.max_slots, llm.n_ctx, llm.n_ctx_seq) == (2, 96, 48)
    a, b = toks(10, seed=8), toks(6, seed=9)
    ref_a = Model.open(path, n_ctx=48).forward(0, [*a, 5, 6], logits="all")
    ref_b = Model.open(path, n_ctx=48).forward(0, [*b, 7], logits="all")
    la, lb = llm.forward_batch([(0, a, "last"), (1, b, "last")])
    np.testing.assert_allclose(la, ref_a[9], atol=1e-5, rtol=0)  # type: ignore[arg-type]
    np.testing.assert_allclose(lb, ref_b[5], atol=1e-5, rtol=0)  # type: ignore[arg-type]
    out = llm.forward_batch([(0, [5], "last"), (1, [7], "last")])
    np.testing.assert_allclose(np.stack(out), np.stack([ref_a[10], ref_b[6]]), atol=1e-5, rtol=0)  # type: ignore[arg-type]
    # prefix reuse: keep 10 positions of slot 0 and run tokens 5, 6 again
    llm.truncate(0, 10)
    assert llm.slot_len(0) == 10
    again = llm.forward_batch([(0, [5, 6], "all")])[0]
    np.testing.assert_allclose(again, ref_a[10:12], atol=1e-5, rtol=0)  # type: ignore[arg-type]
    assert llm.forward_batch([(0, [1], "none")]) == [None]
    # the private slot of logits()/generate() is separate
    llm.logits(b)
    np.testing.assert_allclose(
        llm.forward_batch([(1, [3], "last")])[0],  # type: ignore[arg-type]
        Model.open(path, n_ctx=48).forward(0, [*b, 7, 3], logits="all")[-1],
        atol=1e-5,
        rtol=0,
    )
    with pytest.raises(ValueError, match="slot"):
        llm.forward_batch([(2, a, "last")])
    with pytest.raises(ValueError, match="more than once"):
        llm.forward_batch([(0, [1], "last"), (0, [2], "last")])
    with pytest.raises(ValueError, match="logits"):
        llm.forward_batch([(0, [1], "first")])
    with pytest.raises(ValueError, match="context of 48"):
        llm.forward_batch([(1, toks(45), "last")])
    with pytest.raises(ValueError, match="outside"):
        llm.forward_batch([(1, [10**6], "last")])
    llm.free(1)
    assert llm.model.slot_len(1) == 0
    assert llm.stats()["decode_tokens_total"] == 3  # the one-token entries that want logits
    assert llm.info()["max_slots"] == 2
