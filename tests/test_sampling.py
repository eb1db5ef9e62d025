"""Sampler and SamplingParams. Oracles: numpy softmax / argmax computed here, independently of
the sampler's own code path, and the documented order of operations (llama.cpp's chain:
penalties → top-k → top-p → min-p → temperature → draw)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from strata.sampling import Sampler, SamplingParams

V = 6
LOGITS = np.log(np.array([0.4, 0.25, 0.15, 0.1, 0.06, 0.04], dtype=np.float64)).astype(np.float32)
PROBS = np.array([0.4, 0.25, 0.15, 0.1, 0.06, 0.04])
OFF = {"top_k": 0, "top_p": 1.0, "min_p": 0.0}  # every cut off: the plain softmax


def draws(params: SamplingParams, n: int = 1500, logits: np.ndarray = LOGITS) -> np.ndarray:
    s = Sampler(params, [], V)
    counts = np.zeros(V)
    for _ in range(n):
        tok = s.sample(logits).token
        counts[tok] += 1
        s._window.clear()  # keep every draw independent (no penalties are set anyway)
    return counts / n


def close(freq: np.ndarray, expect: np.ndarray, n: int = 1500) -> None:
    sigma = np.sqrt(np.maximum(expect * (1 - expect), 1e-12) / n)
    assert np.all(np.abs(freq - expect) <= 5 * sigma + 1e-9), (freq, expect)


def test_greedy_is_argmax() -> None:
    rng = np.random.default_rng(0)
    for _ in range(20):
        x = rng.standard_normal(V).astype(np.float32)
        assert Sampler(SamplingParams(temperature=0), [], V).sample(x).token == int(np.argmax(x))


def test_temperature_matches_softmax() -> None:
    close(draws(SamplingParams(temperature=1.0, seed=1, **OFF)), PROBS)
    t = 0.5
    p = PROBS ** (1 / t) / np.sum(PROBS ** (1 / t))
    close(draws(SamplingParams(temperature=t, seed=2, **OFF)), p)


def test_defaults_are_llama_cpps() -> None:
    p = SamplingParams()
    assert (p.temperature, p.top_k, p.top_p, p.min_p) == (0.8, 40, 0.95, 0.05)
    assert (p.repetition_penalty, p.repeat_last_n) == (1.0, 64)
    # top_p 0.95 keeps the 5 best (0.96 reached), min_p 0.05 keeps all of those; then 1/0.8
    keep = PROBS[:5] ** (1 / 0.8)
    close(draws(SamplingParams(seed=8)), np.append(keep / keep.sum(), 0.0))


def test_top_k_top_p_min_p() -> None:
    def only(**kw: float) -> SamplingParams:
        return SamplingParams(temperature=1.0, **{**OFF, **kw})  # type: ignore[arg-type]

    k2 = np.array([0.4, 0.25, 0, 0, 0, 0]) / 0.65
    close(draws(only(top_k=2, seed=3)), k2)
    close(draws(only(top_p=0.64, seed=4)), k2)  # 0.4 + 0.25 reaches 0.64
    k3 = np.array([0.4, 0.25, 0.15, 0, 0, 0]) / 0.8
    close(draws(only(top_p=0.66, seed=5)), k3)
    close(draws(only(min_p=0.2, seed=6)), np.array([0.4, 0.25, 0.15, 0.1, 0, 0]) / 0.9)
    assert set(np.nonzero(draws(only(top_k=1, seed=7), 200))[0]) == {0}


def test_cuts_come_before_temperature() -> None:
    # top-p at temperature 1 keeps 0.4 + 0.25; temperature 2 then flattens those two only
    # (temperature first would flatten all six and top-p 0.64 would keep three)
    w = np.sqrt(np.array([0.4, 0.25]))
    want = np.append(w / w.sum(), [0.0] * 4)
    close(draws(SamplingParams(temperature=2.0, seed=9, **{**OFF, "top_p": 0.64})), want)


def test_seed_reproducible() -> None:
    def seq(seed: int) -> list[int]:
        s = Sampler(SamplingParams(seed=seed, **OFF), [], V)
        return [s.sample(LOGITS).token for _ in range(50)]

    assert seq(11) == seq(11)
    assert seq(11) != seq(12)


def test_penalties() -> None:
    x = np.array([2.0, 1.9, 0.0, -1.0, -1.0, -1.0], dtype=np.float32)
    # repetition: token 0 is in the prompt, its positive logit is divided by 1.5 → 1.33 < 1.9
    assert (
        Sampler(SamplingParams(temperature=0, repetition_penalty=1.5), [0], V).sample(x).token == 1
    )
    # frequency counts the window (prompt and output, as llama.cpp): 1 → 1.94, 2 → 1.88 < 1.9
    s = Sampler(SamplingParams(temperature=0, frequency_penalty=0.06), [0], V)
    assert [s.sample(x).token for _ in range(2)] == [0, 1]
    s = Sampler(SamplingParams(temperature=0, presence_penalty=0.2), [], V)
    assert [s.sample(x).token for _ in range(2)] == [0, 1]
    # the window: only the last repeat_last_n tokens count
    s = Sampler(SamplingParams(temperature=0, presence_penalty=0.2, repeat_last_n=1), [0, 2], V)
    assert s.sample(x).token == 0  # token 0 fell out of the window
    s = Sampler(SamplingParams(temperature=0, presence_penalty=0.2, repeat_last_n=0), [0], V)
    assert s.sample(x).token == 0  # 0: no penalties
    s = Sampler(
        SamplingParams(temperature=0, presence_penalty=0.2, repeat_last_n=-1), [0] + [2] * 99, V
    )
    assert s.sample(x).token == 1  # -1: the whole sequence


class Forbid:
    """A logits processor that forbids one token and records what was accepted."""

    def __init__(self, token: int) -> None:
        self.token = token
        self.accepted: list[int] = []

    def __call__(self, logits: np.ndarray) -> None:
        logits[self.token] = -np.inf

    def accept(self, token: int) -> None:
        self.accepted.append(token)


def test_logits_processor_masks_before_sampling() -> None:
    x = np.array([1.0, 3.0, 0.5, -2.0, 0.0, 2.0], dtype=np.float32)
    f = Forbid(1)
    s = Sampler(SamplingParams(temperature=0, top_logprobs=1), [], V, processor=f)
    assert not s.fast_greedy
    r = s.sample(x)
    assert r.token == 5 and f.accepted == [5]
    # log-probabilities stay those of the raw row
    assert r.logprob == pytest.approx(2.0 - math.log(np.exp(x.astype(np.float64)).sum()), abs=1e-5)
    f = Forbid(0)
    s = Sampler(SamplingParams(temperature=1.0, seed=3, **OFF), [], V, processor=f)
    assert 0 not in {s.sample(LOGITS).token for _ in range(300)}
    assert Sampler(SamplingParams(temperature=0), [], V).fast_greedy


def test_logprobs_are_raw_log_softmax() -> None:
    x = np.array([1.0, 3.0, 0.5, -2.0, 0.0, 2.0], dtype=np.float32)
    ref = x.astype(np.float64) - math.log(np.exp(x.astype(np.float64)).sum())
    r = Sampler(SamplingParams(temperature=0.7, top_logprobs=3, seed=0), [], V).sample(x)
    assert r.logprob == pytest.approx(ref[r.token], abs=1e-5)
    assert [t for t, _ in r.top] == [1, 5, 0]  # type: ignore[union-attr]
    assert [lp for _, lp in r.top] == pytest.approx([ref[1], ref[5], ref[0]], abs=1e-5)  # type: ignore[union-attr]
    none = Sampler(SamplingParams(temperature=0), [], V).sample(x)
    assert none.logprob is None and none.top is None


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("temperature", -0.5),
        ("temperature", float("nan")),
        ("temperature", float("inf")),
        ("top_p", 0.0),
        ("top_p", 1.01),
        ("min_p", -0.01),
        ("min_p", 1.5),
        ("top_k", -2),
        ("repeat_last_n", -2),
        ("temperature", 101.0),
        ("repetition_penalty", 0.0),
        ("presence_penalty", 2.5),
        ("frequency_penalty", -3.0),
        ("seed", 1 << 64),
        ("top_logprobs", -2),
    ],
)
def test_validation_names_the_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=f"^{field}:") as e:
        SamplingParams(**{field: value}).validate()  # type: ignore[arg-type]
    assert e.value.param == field  # type: ignore[attr-defined]


def test_logit_bias_comes_before_the_penalties() -> None:
    """llama.cpp's chain (common/sampling.cpp): the logit bias sampler first, then penalties.
    Token 0 (1.0, in the prompt) gets +1 and a repetition penalty of 2: bias first gives
    (1 + 1) / 2 = 1.0 < 1.2 (token 1 wins); the penalty first would give 0.5 + 1 = 1.5."""
    x = np.array([1.0, 1.2, 0.0, -1.0, -1.0, -1.0], dtype=np.float32)
    p = SamplingParams(temperature=0, repetition_penalty=2.0, logit_bias={0: 1.0})
    assert Sampler(p, [0], V).sample(x).token == 1
    s = Sampler(SamplingParams(temperature=0, logit_bias={0: 1.0}), [0], V)
    assert not s.fast_greedy and s.sample(x).token == 0  # no penalty: 2.0 wins
    # log-probabilities stay those of the raw row
    r = Sampler(SamplingParams(temperature=0, top_logprobs=0, logit_bias={2: 50}), [], V).sample(x)
    assert r.token == 2
    assert r.logprob == pytest.approx(0.0 - math.log(np.exp(x.astype(np.float64)).sum()), abs=1e-5)


def test_logit_bias_shifts_the_draw_and_minus_inf_bans() -> None:
    bias = {0: -math.inf, 3: 1.5}
    x = LOGITS.astype(np.float64).copy()
    x[0], x[3] = -np.inf, x[3] + 1.5
    want = np.exp(x - x[np.isfinite(x)].max())
    close(
        draws(SamplingParams(temperature=1.0, seed=21, logit_bias=bias, **OFF)), want / want.sum()
    )
    # ids past the vocabulary change nothing (the server refuses them)
    s = Sampler(SamplingParams(temperature=0, logit_bias={V + 3: 100.0}), [], V)
    assert s.sample(LOGITS).token == 0


@pytest.mark.parametrize("bias", [{-1: 1.0}, {1: float("nan")}, {1: float("inf")}, {1: "x"}])
def test_logit_bias_validation(bias: object) -> None:
    with pytest.raises(ValueError, match=r"^logit_bias:"):
        SamplingParams(logit_bias=bias).validate()  # type: ignore[arg-type]
