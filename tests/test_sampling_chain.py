"""The sampler chain against llama.cpp's own samplers (llama-cpp-python's low-level API):
top-n-sigma → top-k → typical → top-p → min-p → XTC → temperature over the same random rows,
in llama.cpp's default order; the tokens left and their probabilities must be llama.cpp's."""

from __future__ import annotations

import ctypes
import itertools
from collections.abc import Iterator

import llama_cpp
import numpy as np
import numpy.typing as npt
import pytest
from llama_sampler import apply_chain, run_chain, survivors
from models import TestModels
from strata.dry import dry_table
from strata.gguf import GGUFFile
from strata.sampling import SamplingParams, distribution
from strata.tokenizer import Tokenizer


def llama_survivors(
    x: npt.NDArray[np.float32], p: SamplingParams
) -> tuple[list[int], npt.NDArray[np.float64]]:
    """The tokens llama.cpp's chain leaves (sorted ids) and their probabilities (the softmax
    its `dist` sampler draws from), min_keep 0 as llama-server's default."""
    stages = [
        llama_cpp.llama_sampler_init_top_n_sigma(p.top_n_sigma),
        llama_cpp.llama_sampler_init_top_k(p.top_k),
        llama_cpp.llama_sampler_init_typical(p.typical_p, 0),
        llama_cpp.llama_sampler_init_top_p(p.top_p, 0),
        llama_cpp.llama_sampler_init_min_p(p.min_p, 0),
        llama_cpp.llama_sampler_init_xtc(p.xtc_probability, p.xtc_threshold, 0, 1),
        llama_cpp.llama_sampler_init_temp(p.temperature),
    ]
    return survivors(run_chain(stages, x))


def test_chain_leaves_llama_cpps_tokens_and_probabilities() -> None:
    rng = np.random.default_rng(3)
    grid = itertools.product(
        (-1.0, 1.0, 2.5),  # top_n_sigma
        (0, 40, 400),  # top_k
        (1.0, 0.9, 0.4),  # typical_p
        (1.0, 0.9),  # top_p
        (0.0, 0.05),  # min_p
        ((0.0, 0.1), (1.0, 0.1), (1.0, 0.02)),  # XTC probability, threshold
        (1.0, 0.6),  # temperature
    )
    differ, exercised = [], {"sigma": 0, "typical": 0, "xtc": 0}
    # not top-n-sigma with typical after it: llama.cpp leaves the tokens top-n-sigma masked
    # in the candidates with probability 0, and its typical sampler's entropy of them is NaN
    # (0 · log 0); Strata's drops them first
    cases = [c for c in grid if not (c[0] > 0 and c[2] < 1)]
    for case in cases:
        sigma, k, typ, top_p, min_p, (xp, xt), temp = case
        x = (rng.standard_normal(3000) * rng.uniform(1.0, 4.0)).astype(np.float32)
        p = SamplingParams(
            temperature=temp, top_k=k, top_p=top_p, min_p=min_p, typical_p=typ,
            xtc_probability=xp, xtc_threshold=xt, top_n_sigma=sigma,
        )  # fmt: skip
        cand, prob = distribution(x, p, rng=np.random.default_rng(0))
        order = np.argsort(cand)
        ours = cand[order].tolist()
        ref_ids, ref_p = llama_survivors(x, p)
        if ours != ref_ids or not np.allclose(prob[order], ref_p, rtol=1e-4, atol=1e-7):
            differ.append((case, len(ours), len(ref_ids)))
        off = SamplingParams(temperature=temp, top_k=k, top_p=top_p, min_p=min_p)
        plain = distribution(x, off)[0]
        if len(plain) != len(ours):
            exercised["sigma" if sigma > 0 else "typical" if typ < 1 else "xtc"] += 1
    # a token on a threshold can land either side in float32 there and float64 here
    assert len(differ) <= len(cases) // 200, differ[:5]
    assert min(exercised.values()) >= 20, exercised


def llama_dry(
    vocab: object,
    x: npt.NDArray[np.float32],
    history: list[int],
    p: SamplingParams,
    breakers: list[str],
) -> npt.NDArray[np.float32]:
    """The row after llama.cpp's DRY sampler, fed `history` (its accept)."""
    texts = (ctypes.c_char_p * len(breakers))(*[b.encode() for b in breakers])
    dry = llama_cpp.llama_sampler_init_dry(
        vocab,
        p.dry_multiplier,
        p.dry_base,
        p.dry_allowed_length,
        p.dry_penalty_last_n,
        texts,
        len(breakers),
    )
    got = run_chain([dry], x, history)
    out = np.empty(x.shape[0], dtype=np.float32)
    for i, v in got.items():
        out[i] = v
    return out


@pytest.fixture(scope="module")
def qwen3(test_models: TestModels) -> Iterator[tuple[Tokenizer, object]]:
    """The Qwen3 vocabulary as Strata's tokenizer and as llama.cpp's vocab (its model kept
    alive while the tests use it)."""
    path = test_models.vocab_only("qwen3")
    with GGUFFile(path) as f:
        tok = Tokenizer.from_metadata(f.metadata)
    ll = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    yield tok, llama_cpp.llama_model_get_vocab(ll._model.model)
    del ll


def test_dry_is_llama_cpps(qwen3: tuple[Tokenizer, object]) -> None:
    """DRY over histories with planted repetitions, breakers inside and around them (one- and
    several-token breakers, and tokens holding a breaker's start), on the Qwen3 vocabulary:
    every logit as llama.cpp's DRY sampler leaves it."""
    tok, vocab = qwen3
    words = ["def", " f", "(", "x", "):", "\n", " return", " x", ":", " *", '"', "##", "User"]
    words += ["<|im_start|>", "x" * 8]
    pool = sorted({t for w in words for t in tok.encode(w, parse_special=False)})
    rng = np.random.default_rng(5)
    penalized = 0
    for case in range(120):
        unit = [int(t) for t in rng.choice(pool, size=int(rng.integers(2, 9)))]
        hist: list[int] = []
        while len(hist) < int(rng.integers(10, 160)):
            hist += unit if rng.random() < 0.6 else [int(rng.choice(pool))]
        breakers = [
            ["\n", ":", '"', "*"],
            ["\n\n", "###", "User:"],
            [],
            # special-token text in a breaker's rest stays text; a breaker cut at 40 bytes
            # inside a character leaves one U+FFFD per byte, as llama.cpp's tokenizer takes it
            ["\n<|im_start|>", "x" * 39 + "é"],
        ][case % 4]
        p = SamplingParams(
            dry_multiplier=float(rng.choice([0.8, 2.0])),
            dry_base=float(rng.choice([1.1, 1.75, 3.0])),
            dry_allowed_length=int(rng.integers(0, 4)),
            dry_penalty_last_n=int(rng.choice([16, 64, 1000])),
            dry_sequence_breakers=breakers,
        )
        x = rng.standard_normal(tok.n_vocab).astype(np.float32)
        ours = x.copy()
        dry_table(tok, breakers).apply(
            ours, hist, p.dry_multiplier, p.dry_base, p.dry_allowed_length, p.dry_penalty_last_n
        )
        ref = llama_dry(vocab, x, hist, p, breakers)
        assert np.allclose(ours, ref, rtol=1e-6, atol=1e-5), case
        penalized += int(np.any(ours != x))
    assert penalized >= 60  # most cases do penalize something


def test_dry_over_long_histories_is_llama_cpps(qwen3: tuple[Tokenizer, object]) -> None:
    """DRY's scan over histories of thousands of tokens (the repetition scan in Rust,
    `strata._core.dry_longest`): long planted repetitions, windows shorter and longer than
    the history; every logit as llama.cpp's DRY sampler leaves it."""
    tok, vocab = qwen3
    pool = sorted(
        {t for w in ["def", " f", "(", "x", "):", " return", " y"] for t in tok.encode(w)}
    )
    rng = np.random.default_rng(11)
    penalized = 0
    for case in range(12):
        unit = [int(t) for t in rng.choice(pool, size=int(rng.integers(20, 200)))]
        hist: list[int] = []
        while len(hist) < int(rng.integers(1500, 5000)):
            hist += unit[: int(rng.integers(5, len(unit) + 1))]
            hist += [int(t) for t in rng.choice(pool, size=int(rng.integers(0, 30)))]
        p = SamplingParams(
            dry_multiplier=0.8,
            dry_base=1.75,
            dry_allowed_length=int(rng.integers(1, 4)),
            dry_penalty_last_n=int(rng.choice([300, 1000, 8192])),
            dry_sequence_breakers=["\n"],
        )
        x = rng.standard_normal(tok.n_vocab).astype(np.float32)
        ours = x.copy()
        dry_table(tok, ["\n"]).apply(
            ours, hist, p.dry_multiplier, p.dry_base, p.dry_allowed_length, p.dry_penalty_last_n
        )
        ref = llama_dry(vocab, x, hist, p, ["\n"])
        assert np.allclose(ours, ref, rtol=1e-6, atol=1e-5), case
        penalized += int(np.any(ours != x))
    assert penalized >= 10


def test_greedy_is_the_best_token_the_chain_leaves() -> None:
    """Temperature 0 with typical or XTC on, which may drop the best token: llama.cpp's
    chain keeps the best of what is left (its temperature 0), and so does Strata's pick."""
    from strata.sampling import Sampler

    rng = np.random.default_rng(11)
    moved = 0
    for case in range(60):
        x = (rng.standard_normal(2000) * 3).astype(np.float32)
        p = SamplingParams(
            temperature=0.0,
            top_k=int(rng.choice([0, 40])),
            top_p=1.0,
            min_p=0.0,
            typical_p=[0.3, 1.0][case % 2],
            xtc_probability=[1.0, 0.0, 1.0][case % 3],
            xtc_threshold=float(rng.choice([0.01, 0.05])),
        )
        ids, _ = llama_survivors(x, p)
        token = Sampler(p, [], x.shape[0]).sample(x).token
        assert [token] == ids, case
        moved += token != int(np.argmax(x))
    assert moved >= 20


def test_dynamic_temperature_is_llama_cpps() -> None:
    """llama.cpp's temp_ext (dynamic temperature from the candidates' entropy), temperature 0
    included (its lowest end is then 0): the tokens left and their probabilities."""
    rng = np.random.default_rng(17)
    for case in itertools.product((0.0, 0.5, 1.0), (0.3, 1.0), (0.5, 1.0, 2.0), (0, 40)):
        temp, delta, exponent, k = case
        x = (rng.standard_normal(3000) * rng.uniform(0.5, 3.0)).astype(np.float32)
        # min_p 0 with top-n-sigma: llama.cpp's candidates keep the masked tokens, whose count
        # is in its entropy's normalization
        sigma, min_p = (1.0, 0.0) if k == 0 and temp == 1.0 else (-1.0, 0.05)
        p = SamplingParams(
            temperature=temp, top_k=k, top_p=1.0, min_p=min_p, top_n_sigma=sigma,
            dynatemp_range=delta, dynatemp_exponent=exponent,
        )  # fmt: skip
        cand, prob = distribution(x, p)
        stages = (
            llama_cpp.llama_sampler_init_top_n_sigma(sigma),
            llama_cpp.llama_sampler_init_top_k(k),
            llama_cpp.llama_sampler_init_min_p(min_p, 0),
            llama_cpp.llama_sampler_init_temp_ext(temp, delta, exponent),
        )
        ids, ref = survivors(run_chain(stages, x))
        order = np.argsort(cand)
        assert cand[order].tolist() == ids, case
        assert np.allclose(prob[order], ref, rtol=1e-4, atol=1e-7), case


def test_dynamic_temperature_of_a_certain_row_with_a_negative_exponent() -> None:
    """Zero entropy to a negative power is infinite (llama.cpp's powf): the temperature is
    infinite and the candidates even, not a ZeroDivisionError ending the request."""
    x = np.full(100, -1000.0, dtype=np.float32)
    x[3] = 0.0
    p = SamplingParams(
        temperature=1.0, top_k=0, top_p=1.0, min_p=0.0,
        dynatemp_range=0.5, dynatemp_exponent=-1.0,
    )  # fmt: skip
    cand, prob = distribution(x, p)
    assert cand.size == 100 and np.allclose(prob, 0.01)


@pytest.mark.parametrize("version", [1, 2])
def test_mirostat_is_llama_cpps(version: int) -> None:
    """Mirostat v1 and v2 step by step against llama.cpp's (temperature, then mirostat): the
    tokens each step keeps are llama.cpp's, given the token llama.cpp drew there (its mu
    moves with them: a wrong update shows in the steps after)."""
    from strata.sampling import Sampler

    rng = np.random.default_rng(23 + version)
    n_vocab = 4000
    for temp, tau, eta in ((1.0, 5.0, 0.1), (0.8, 3.0, 0.3), (1.3, 8.0, 0.05)):
        p = SamplingParams(temperature=temp, mirostat=version, mirostat_tau=tau, mirostat_eta=eta)
        ours = Sampler(p, [], n_vocab)
        miro = (
            llama_cpp.llama_sampler_init_mirostat(n_vocab, 7, tau, eta, 100)
            if version == 1
            else llama_cpp.llama_sampler_init_mirostat_v2(7, tau, eta)
        )
        chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
        llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_temp(temp))
        llama_cpp.llama_sampler_chain_add(chain, miro)
        try:
            for step in range(40):
                x = (rng.standard_normal(n_vocab) * rng.uniform(1.0, 4.0)).astype(np.float32)
                arr = apply_chain(chain, x)
                kept = sorted(int(arr.data[i].id) for i in range(arr.size))
                chosen = int(arr.data[arr.selected].id)
                token, mine = ours.mirostat(x, pick=lambda cand, c=chosen: c)
                assert token == chosen and sorted(mine.tolist()) == kept, (temp, step)
        finally:
            llama_cpp.llama_sampler_free(chain)


def test_mirostat_rows_where_llama_cpps_arithmetic_breaks() -> None:
    """Where llama.cpp's float32 arithmetic overflows or divides by zero (a mu past float's
    range, equal top probabilities: v1's k is no number) it keeps one token, and so does
    Strata, instead of raising; at temperature 0 mirostat's pick is the argmax even with
    typical or XTC set (mirostat replaces them)."""
    from strata.sampling import Sampler

    v = 4000
    x = np.random.default_rng(0).standard_normal(v).astype(np.float32)
    s = Sampler(SamplingParams(temperature=1.0, mirostat=1), [], v)
    s._mu = 2000.0
    token, kept = s.mirostat(x)
    assert kept.tolist() == [int(np.argmax(x))] and token == kept[0]
    token, kept = Sampler(SamplingParams(mirostat=1), [], v).mirostat(np.zeros(v, np.float32))
    assert kept.size == 1
    for extra in ({"typical_p": 0.2}, {"xtc_probability": 1.0, "xtc_threshold": 0.01}):
        p = SamplingParams(temperature=0.0, mirostat=2, **extra)  # type: ignore[arg-type]
        assert Sampler(p, [], v).sample(x).token == int(np.argmax(x))


@pytest.mark.parametrize("target, decay", [(0.5, 0.9), (0.1, 0.5), (0.9, 0.0), (-1.0, 0.9)])
def test_adaptive_p_is_llama_cpps(target: float, decay: float) -> None:
    """adaptive-p step by step against llama.cpp's (temperature, then adaptive-p): the
    probabilities each step draws by are llama.cpp's, given the token llama.cpp drew there
    (the running average moves with them: a wrong update shows in the steps after); a
    negative target is the plain draw."""
    from strata.sampling import Sampler

    rng = np.random.default_rng(31)
    n_vocab, temp = 400, 0.9
    p = SamplingParams(
        temperature=temp, top_k=0, top_p=1.0, min_p=0.0,
        adaptive_p=True, adaptive_target=target, adaptive_decay=decay,
    )  # fmt: skip
    ours = Sampler(p, [], n_vocab)
    chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
    llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_temp(temp))
    llama_cpp.llama_sampler_chain_add(
        chain, llama_cpp.llama_sampler_init_adaptive_p(target, decay, 7)
    )
    try:
        for step in range(40):
            x = (rng.standard_normal(n_vocab) * rng.uniform(1.0, 4.0)).astype(np.float32)
            arr = apply_chain(chain, x)
            want = {int(arr.data[i].id): float(arr.data[i].p) for i in range(arr.size)}
            chosen = int(arr.data[arr.selected].id)
            if target < 0:
                cand, prob = ours.distribution(x)
                token = chosen
            else:
                token, cand, prob = ours.adaptive(x, pick=lambda c, t=chosen: t)
            got = dict(zip(cand.tolist(), prob.tolist(), strict=True))
            assert set(got) == {i for i, v in want.items() if v > 0.0}, step
            # llama.cpp's float32 arithmetic against float64 here
            assert max(abs(got[i] - want[i]) for i in got) < 1e-4, step
            llama_cpp.llama_sampler_accept(chain, chosen)
            ours.accept(token)
    finally:
        llama_cpp.llama_sampler_free(chain)


def test_adaptive_p_moves_the_draw_toward_the_target() -> None:
    """Over many draws the drawn tokens' probabilities average near the target (what the
    sampler is for; after min-p, as its authors advise), where the plain draw's average is
    far from it."""
    from strata.sampling import Sampler

    rng = np.random.default_rng(5)
    rows = [(rng.standard_normal(200) * 3.0).astype(np.float32) for _ in range(600)]

    def mean_p(**kw: object) -> float:
        p = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.05, seed=3, **kw)  # type: ignore[arg-type]
        s = Sampler(p, [], 200)
        got = []
        for x in rows:
            cand, prob = s.distribution(x)
            t = s.sample(x).token
            got.append(float(prob[int(np.flatnonzero(cand == t)[0])]))
        return float(np.mean(got))

    plain = mean_p()
    adapted = mean_p(adaptive_p=True, adaptive_target=0.1, adaptive_decay=0.9)
    print(f"mean drawn probability: plain {plain:.3f}, adaptive-p at 0.1 {adapted:.3f}")
    assert abs(adapted - 0.1) < 0.03 and abs(plain - 0.1) > 0.2
