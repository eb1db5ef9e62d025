"""The shipped trained models (docs/MODELS.md): the default qwen3moe and its dense qwen3 draft,
Q8_0 files made by scripts/train_default_model.py.

- llama.cpp (llama-cpp-python) loads both, and our forward pass agrees with it on held-out
  Python text at the oracle thresholds of tests/test_model_llamacpp.py (top-1 ≥ 99% of the
  positions where llama.cpp is sure, mean KL ≤ 1e-3; greedy continuations identical up to
  llama.cpp's first near-tie on ≥ 9 of 10 prompts). The draft is the dense `qwen3` graph.
- Held-out perplexity (text of held-out stdlib modules, never trained on) is far below the
  random model's, and a greedy completion of a Python prompt parses as Python.
"""

from __future__ import annotations

import ast
import sysconfig
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from strata import modelgen
from strata._core import Model
from strata.tokenizer import Tokenizer
from test_model_llamacpp import (
    EXACT,
    MARGIN,
    NOT_EXACT_WHY,
    llama,
    log_softmax,
    margin,
    ref_logits,
)

KINDS = ("default", "draft")


def heldout_text() -> str:
    """A held-out module (strata.stdlib_corpus.HELDOUT) of this interpreter's stdlib."""
    return (Path(sysconfig.get_paths()["stdlib"]) / "json" / "decoder.py").read_text()


def windows(path: Path, n: int, length: int) -> list[list[int]]:
    ids = Tokenizer.from_gguf(path).encode(heldout_text())
    starts = np.linspace(0, len(ids) - length - 1, n).astype(int)
    return [ids[s : s + length] for s in starts]


@pytest.mark.parametrize("kind", KINDS)
def test_logits_agree_with_llamacpp(kind: str) -> None:
    path = modelgen.shipped_model_path(kind)
    ll = llama(path, "f16")
    m = Model.open(path, n_ctx=256, n_slots=1, kv_type="f16", prefill_chunk=64)
    top1, sure, kls = [], [], []
    for toks in windows(path, 6, 48):
        m.free(0)
        ours = m.forward(0, toks, logits="all")
        ref = ref_logits(ll, toks)
        top1.extend(ours.argmax(1) == ref.argmax(1))
        sure.extend(margin(ref) >= MARGIN)
        lp, lq = log_softmax(ref), log_softmax(ours)
        kls.extend((np.exp(lp) * (lp - lq)).sum(1))
    t, s = np.array(top1), np.array(sure)
    kl = float(np.mean(kls))
    print(f"{kind}: top-1 {t[s].mean():.4f} over {s.sum()} sure ({t.mean():.4f} all), KL {kl:.2e}")
    assert t[s].mean() >= 0.99
    assert kl <= 1e-3


@pytest.mark.parametrize("kind", KINDS)
def test_greedy_continuations_match_llamacpp(kind: str) -> None:
    path = modelgen.shipped_model_path(kind)
    ll = llama(path, "f16")
    m = Model.open(path, n_ctx=256, n_slots=1, kv_type="f16", prefill_chunk=64)
    same = 0
    for toks in windows(path, 10, 16):
        m.free(0)
        ours: list[int] = []
        logits = m.forward(0, toks)
        for _ in range(32):
            ours.append(int(logits.argmax()))
            logits = m.forward(0, ours[-1:])
        ll.reset()
        ll.eval(toks)
        ref: list[int] = []
        cut = 32
        for i in range(32):
            row = ll.scores[ll.n_tokens - 1]
            if cut == 32 and margin(row) < MARGIN:
                cut = i
            ref.append(int(np.argmax(row)))
            ll.eval(ref[-1:])
        same += ours[:cut] == ref[:cut]
    print(f"{kind}: {same}/10 greedy continuations identical up to the first near-tie")
    assert same >= 9


def perplexity(path: Path, toks: list[int]) -> float:
    m = Model.open(path, n_ctx=512, n_slots=1, kv_type="f32", prefill_chunk=128)
    logits = m.forward(0, toks, logits="all")
    lp = log_softmax(logits[:-1])
    return float(np.exp(-lp[np.arange(len(toks) - 1), toks[1:]].mean()))


def test_heldout_perplexity_far_below_random(tmp_path: Path) -> None:
    path = modelgen.shipped_model_path("default")
    toks = windows(path, 1, 384)[0]
    trained = perplexity(path, toks)
    draft = perplexity(modelgen.shipped_model_path("draft"), toks)
    rnd_path = tmp_path / "random.gguf"
    spec = modelgen.ModelSpec.default(n_vocab=8192)
    modelgen.write_qwen3moe(rnd_path, spec)  # same vocabulary size, random weights
    rnd = perplexity(rnd_path, toks)
    print(f"held-out perplexity: default {trained:.2f}, draft {draft:.2f}, random {rnd:.0f}")
    # measured: default 14.8, draft 37.7, random ~12800 (docs/MODELS.md)
    assert trained < 30 and draft < 80
    assert trained < draft and trained * 50 < rnd


def _parses(src: str) -> bool:
    try:
        ast.parse(src)
    except SyntaxError:
        return False
    return True


def test_greedy_completion_reads_as_python() -> None:
    from strata.llm import LLM

    llm = LLM(modelgen.shipped_model_path("default"), n_ctx=256)
    prompt = "import os\n\n\ndef walk_files(root):\n"
    ids = llm.tokenizer.encode(prompt)
    out = [t for t, _ in llm.generate_ids(ids, max_tokens=64, temperature=0.0)]
    text = prompt + llm.tokenizer.decode(out)
    lines = text.splitlines()
    # the longest prefix of whole lines that parses
    ok = max((k for k in range(2, len(lines) + 1) if _parses("\n".join(lines[:k]))), default=0)
    print(repr(text))
    assert ok >= 3, text


def test_dense_qwen3_random_agrees_with_llamacpp(tmp_path: Path) -> None:
    """The dense qwen3 graph on a random-weight file (strata.modelgen, arch "qwen3"): our
    logits against llama.cpp's at the oracle thresholds."""
    spec = modelgen.ModelSpec.tiny(
        arch="qwen3", n_expert=1, n_expert_used=1, n_ff_exp=512, n_vocab=512, name="dense"
    )
    path = modelgen.write_qwen3moe(tmp_path / "dense.gguf", spec, seed=5)
    ll = llama(path, "f16")
    m = Model.open(path, n_ctx=256, n_slots=1, kv_type="f16", prefill_chunk=64)
    assert m.hparams["architecture"] == "qwen3"
    rng = np.random.default_rng(6)
    top1, sure, kls = [], [], []
    for _ in range(4):
        toks = [int(t) for t in rng.integers(0, 500, 32)]
        m.free(0)
        ours = m.forward(0, toks, logits="all")
        ref = ref_logits(ll, toks)
        top1.extend(ours.argmax(1) == ref.argmax(1))
        sure.extend(margin(ref) >= MARGIN)
        lp, lq = log_softmax(ref), log_softmax(ours)
        kls.extend((np.exp(lp) * (lp - lq)).sum(1))
    t, s = np.array(top1), np.array(sure)
    assert t[s].mean() >= 0.99
    assert float(np.mean(kls)) <= 1e-3
    # over every position, near-ties included: only where llama.cpp runs our float orders
    if "F32" not in EXACT:
        pytest.skip(f"unfiltered top-1 not asserted: {NOT_EXACT_WHY}")
    assert t.mean() >= 0.99


def test_shipped_files_carry_tokenizer_and_chat_template() -> None:
    import gguf

    for kind, arch in (("default", "qwen3moe"), ("draft", "qwen3")):
        path = modelgen.shipped_model_path(kind)
        assert path.stat().st_size <= 24 * 1024 * 1024
        r = gguf.GGUFReader(path)

        def field(k: str, r: gguf.GGUFReader = r) -> Any:
            return r.fields[k].contents()

        assert field("general.architecture") == arch
        assert "Python standard library" in field("general.description")
        assert field("tokenizer.ggml.model") == "gpt2"
        toks = field("tokenizer.ggml.tokens")
        assert len(toks) == 8192
        assert toks[field("tokenizer.ggml.eos_token_id")] == "<|im_end|>"
        assert "<|im_start|>" in toks and "<|endoftext|>" in toks
        assert "<|im_start|>" in field("tokenizer.chat_template")
        types = {t.tensor_type.name for t in r.tensors}
        assert types == {"Q8_0", "F32"}, types
