"""strata.infill against llama.cpp: the FIM tokens and end-of-turn token of a vocabulary
(llama-cpp-python's `llama_vocab_fim_*`), the infill prompt's layout (llama-server's own
`/infill` prompts, tests/golden/infill_prompts.json by scripts/make_infill_goldens.py), and
the infill sampler (llama-cpp-python's `llama_sampler_init_infill` over the same candidates)."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import llama_cpp
import numpy as np
import pytest
from llama_sampler import run_chain
from models import TestModels
from strata.gguf import GGUFFile
from strata.infill import InfillFilter, infill_filter, infill_prompt
from strata.sampling import Sampler, SamplingParams
from strata.tokenizer import Tokenizer

GOLDEN = Path(__file__).parent / "golden" / "infill_prompts.json"


@functools.cache
def tokenizer(path: Path) -> Tokenizer:
    with GGUFFile(path) as f:
        return Tokenizer.from_metadata(f.metadata)


@functools.cache
def llama_vocab(path: Path) -> Any:
    m = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    return m, llama_cpp.llama_model_get_vocab(m._model.model)


@pytest.fixture(scope="module")
def qwen3_path(test_models: TestModels) -> Path:
    return test_models.vocab_only("qwen3")


def test_fim_and_eot_tokens_as_llama_cpp(qwen3_path: Path, test_models: TestModels) -> None:
    tok = tokenizer(qwen3_path)
    _, v = llama_vocab(qwen3_path)
    assert tok.fim is not None
    ours = (tok.fim.pre, tok.fim.suf, tok.fim.mid, tok.fim.rep, tok.fim.sep)
    ref = tuple(
        int(f(v))
        for f in (
            llama_cpp.llama_vocab_fim_pre,
            llama_cpp.llama_vocab_fim_suf,
            llama_cpp.llama_vocab_fim_mid,
            llama_cpp.llama_vocab_fim_rep,
            llama_cpp.llama_vocab_fim_sep,
        )
    )
    assert ours == ref
    assert [tok.token_text(i) for i in ours[:3]] == [
        "<|fim_prefix|>",
        "<|fim_suffix|>",
        "<|fim_middle|>",
    ]
    assert tok.eot_id == int(llama_cpp.llama_vocab_eot(v))
    # the small test vocabulary has none: llama.cpp says so too (-1)
    small = test_models.vocab_only("small")
    assert tokenizer(small).fim is None
    assert int(llama_cpp.llama_vocab_fim_pre(llama_vocab(small)[1])) == -1


def test_infill_prompt_is_llama_servers(qwen3_path: Path) -> None:
    """Each golden case's prompt built here, detokenized with its special tokens, is the text
    llama-server reported for it, and has as many tokens as it evaluated."""
    tok = tokenizer(qwen3_path)
    assert tok.fim is not None
    cases = json.loads(GOLDEN.read_text())
    assert len(cases) >= 9 and any(c["spm"] for c in cases)
    assert any(c["n_predict"] > 0 for c in cases)
    for c in cases:
        r = c["request"]
        ids = infill_prompt(
            tok.fim,
            lambda s: tok.encode(s, parse_special=False),
            tok.encode(r["input_prefix"], parse_special=False),
            tok.encode(r["input_suffix"], parse_special=False),
            [(e.get("filename", "tmp"), e["text"]) for e in r.get("input_extra", [])],
            tok.encode(r.get("prompt", ""), parse_special=True),
            n_ctx=c["n_ctx"],
            n_predict=c["n_predict"],
            spm=c["spm"],
        )
        assert len(ids) == c["tokens_evaluated"], r
        assert tok.decode(ids, skip_special=False) == c["prompt"], r


def llama_infill_survivors(
    v: Any, logits: np.ndarray, top_k: int, top_p: float, temp: float
) -> list[int]:
    """The candidates llama.cpp's chain top-k → top-p → temperature → infill leaves (the set
    its `dist` sampler draws from), over one row of logits."""
    stages = (
        llama_cpp.llama_sampler_init_top_k(top_k),
        llama_cpp.llama_sampler_init_top_p(top_p, 1),
        llama_cpp.llama_sampler_init_temp(temp),
        llama_cpp.llama_sampler_init_infill(v),
    )
    return sorted(run_chain(stages, logits.astype(np.float32)))


def test_infill_sampler_keeps_llama_cpps_candidates(qwen3_path: Path) -> None:
    """Random rows over families of tokens that are prefixes of one another (" re", " ret",
    " return", ...) and end-of-generation tokens: the candidates left after top-k, top-p,
    temperature and the infill stage are llama.cpp's, in each of its three outcomes (only
    end of generation, the end-of-turn token alone, merged text tokens)."""
    tok = tokenizer(qwen3_path)
    _, v = llama_vocab(qwen3_path)
    flt = infill_filter(tok)
    words = ["return", "def", "print", "self", "import", "value", "for", "in", "x", "("]
    pool: set[int] = set()
    for w in words:
        for text in (w, " " + w):
            for j in range(1, len(text) + 1):
                ids = tok.encode(text[:j], parse_special=False)
                if len(ids) == 1:
                    pool.add(ids[0])
    pool |= set(tok.eog_ids)
    pool_ids = np.array(sorted(pool))
    rng = np.random.default_rng(11)
    outcomes = {"eog": 0, "eot": 0, "text": 0}
    n_vocab = tok.n_vocab
    for case in range(300):
        x = np.full(n_vocab, -30.0, dtype=np.float32)
        pick = rng.choice(pool_ids, size=min(len(pool_ids), 24), replace=False)
        x[pick] = rng.normal(0.0, 1.0 + 3.0 * rng.random(), size=pick.size).astype(np.float32)
        top_k, top_p, temp = [40, 8, 3][case % 3], [0.99, 0.9, 1.0][case % 3], [1.0, 0.7][case % 2]
        params = SamplingParams(temperature=temp, top_k=top_k, top_p=top_p, min_p=0.0, infill=True)
        s = Sampler(params, [], n_vocab, infill=flt)
        cand, prob = s.distribution(x)
        ours = sorted(int(t) for t in cand)
        ref = llama_infill_survivors(v, x, top_k, top_p, temp)
        assert ours == ref, (case, ours, ref)
        assert abs(float(prob.sum()) - 1.0) < 1e-9
        if all(t in tok.eog_ids for t in ours):
            outcomes["eot" if ours == [tok.eot_id] and len(ours) == 1 else "eog"] += 1
        else:
            outcomes["text"] += 1
    assert min(outcomes.values()) >= 5, outcomes


def test_infill_filter_draws_over_survivors_logits() -> None:
    """The draw after the stage is over the survivors' own logits (llama.cpp's `dist`
    recomputes its softmax), not the merged probabilities."""
    pieces = [b"re", b"ret", b"x", b""]
    flt = InfillFilter(pieces, frozenset({3}), 3)
    cand = np.array([1, 2, 0, 3], dtype=np.int64)  # best first: "ret", "x", "re", end
    logits = np.array([2.0, 1.9, 1.0, -9.0])  # p = 0.44, 0.40, 0.16, 0.00
    ids, prob = flt(cand, logits)
    # "re" is a prefix of "ret": merged into it (0.60); "x" keeps p ≥ 0.2 and ≥ 1/3; the end
    # token stays (end-of-generation tokens always do)
    assert ids.tolist() == [1, 2, 3]
    e = np.exp(np.array([2.0, 1.9, -9.0]) - 2.0)
    assert np.allclose(prob, e / e.sum())
    with pytest.raises(ValueError, match="infill"):
        Sampler(SamplingParams(infill=True), [], 4)
