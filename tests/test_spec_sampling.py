"""Speculative sampling keeps the output distribution: a chi-square test on a small-vocabulary
toy model. The oracle is the exact joint distribution of the first output tokens without
speculation (the product of the target's per-step distributions after top-k/top-p/min-p/
temperature, enumerated); the samples come from the scheduler with speculation, one request per
seed, windows drafted by a toy draft model (its own q under the same top-k/top-p/temperature)
and by the n-gram drafter (q one-hot)."""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
from strata.engine.backend import Entry
from strata.engine.protocol import Stat, Submit, Tokens
from strata.engine.scheduler import Scheduler
from strata.sampling import SamplingParams, distribution, draw
from strata.spec.drafters import Draft, DraftRequest, NgramDrafter
from strata.spec.speculator import Speculator

V = 4  # vocabulary
N_CTX = 16
OUT = 4  # output tokens compared (the first from the prompt's logits, the rest from a window)
MAX_TOKENS = 6  # the first window drafts up to 3 tokens
N = 3000  # requests (seeds)
PARAMS = dict(temperature=0.8, top_k=3, top_p=0.95, min_p=0.02)
PROMPT = [0, 1, 2, 3, 0, 1, 2, 3, 0]  # repeats: the n-gram drafter finds matches


def table(seed: int, scale: float) -> np.ndarray:
    """Logits [position, previous token, V]."""
    return (np.random.default_rng(seed).standard_normal((N_CTX + 1, V, V)) * scale).astype(
        np.float32
    )


TARGET = table(1, 1.5)
TARGET[:, np.arange(V), (np.arange(V) + 1) % V] += 1.5  # likes to go on counting (n-gram's case)
DRAFT = table(2, 1.5) * 0.5 + TARGET * 0.5  # a draft that agrees in part


class Toy:
    """A model whose next-token logits depend on the position and the previous token."""

    n_vocab = V
    n_ctx_seq = N_CTX
    max_slots = 64

    def __init__(self) -> None:
        self.seqs: dict[int, list[int]] = {}

    def forward_batch(self, entries: Sequence[Entry]) -> list[np.ndarray | None]:
        out: list[np.ndarray | None] = []
        for slot, ids, want in entries:
            s = self.seqs.setdefault(slot, [])
            s.extend(ids)
            rows = np.stack([TARGET[i + 1, s[i]] for i in range(len(s) - len(ids), len(s))])
            out.append(None if want == "none" else rows[-1] if want == "last" else rows)  # window
        return out

    def truncate(self, slot: int, n: int) -> None:
        del self.seqs.setdefault(slot, [])[n:]

    def free(self, slot: int) -> None:
        self.seqs.pop(slot, None)

    def vocabulary(self) -> Any:
        return None

    def stats(self) -> list[Stat]:
        return []

    def info(self) -> dict[str, Any]:
        return {}

    def settling(self) -> bool:
        return False


class ToyDrafter:
    """Draws k tokens from the DRAFT table under the request's sampling settings."""

    name = "toy"

    def propose_many(self, reqs: Sequence[DraftRequest]) -> list[Draft]:
        out = []
        for r in reqs:
            h = list(r.history)
            d = Draft(q=[])
            for _ in range(r.k):
                ids, prob = distribution(DRAFT[len(h), h[-1]], r.params)
                tok = draw(ids, prob, r.rng)
                d.tokens.append(tok)
                assert d.q is not None
                d.q.append((ids, prob))
                h.append(tok)
            out.append(d)
        return out

    def rollback(self, slot: int, n: int) -> None:
        pass

    def pause(self, paused: bool) -> None:
        pass

    def release(self, slot: int) -> None:
        pass


def exact() -> dict[tuple[int, ...], float]:
    """The joint distribution of the first OUT tokens without speculation."""
    params = SamplingParams(**PARAMS)  # type: ignore[arg-type]
    probs: dict[tuple[int, ...], float] = {}
    for seq in itertools.product(range(V), repeat=OUT):
        p, h = 1.0, list(PROMPT)
        for t in seq:
            ids, prob = distribution(TARGET[len(h), h[-1]], params)
            p *= float(prob[ids == t].sum())
            h.append(t)
        if p > 0:
            probs[seq] = p
    return probs


def chi2_critical(df: int, z: float = 3.09) -> float:
    """Upper quantile of chi-square (Wilson–Hilferty; z = 3.09: p = 0.001)."""
    a = 2.0 / (9.0 * df)
    return df * (1.0 - a + z * math.sqrt(a)) ** 3


def chi2(
    counts: Counter[tuple[int, ...]], probs: dict[tuple[int, ...], float]
) -> tuple[float, int]:
    """(statistic, degrees of freedom), cells with expected count < 5 pooled."""
    stat, df, pool_o, pool_e = 0.0, -1, 0, 0.0
    for cell, p in probs.items():
        e = p * N
        if e < 5:
            pool_o, pool_e = pool_o + counts[cell], pool_e + e
            continue
        stat += (counts[cell] - e) ** 2 / e
        df += 1
    if pool_e > 0:
        stat += (pool_o - pool_e) ** 2 / pool_e
        df += 1
    return stat, df


class FixedCost(Speculator):
    """Step times are not measured (the toy runs in microseconds): a fixed cost curve, each
    token 10% of a one-token step."""

    def __init__(self, drafter: Any, k_min: int, k_max: int) -> None:
        super().__init__(drafter, k_min, k_max)
        for n in range(1, 64 * (k_max + 1) + 1):
            self.cost.observe(n, 1e-3 * (1 + 0.1 * (n - 1)))

    def observe_step(self, n_tokens: int, seconds: float, pipelined: bool = False) -> None:
        pass


@pytest.mark.parametrize("drafter", ["toy", "ngram"])
def test_speculative_sampling_keeps_the_distribution(drafter: str) -> None:
    spec = FixedCost(ToyDrafter() if drafter == "toy" else NgramDrafter(), 1, 3)
    sched = Scheduler(Toy(), 16, max_slots=64, max_batch_tokens=4096, speculator=spec, reuse=False)
    for seed in range(N):
        params = SamplingParams(**PARAMS, seed=seed)  # type: ignore[arg-type]
        sched.add(Submit(seed, PROMPT, params, MAX_TOKENS, []))
    out: dict[int, list[int]] = {}
    while sched.has_work():
        for e in sched.step():
            if isinstance(e, Tokens):
                out.setdefault(e.rid, []).extend(e.ids)
    counts = Counter(tuple(v[:OUT]) for v in out.values())
    assert all(len(v) == MAX_TOKENS for v in out.values()) and len(out) == N
    probs = exact()
    assert set(counts) <= set(probs)  # nothing top-k/top-p excludes
    stat, df = chi2(counts, probs)
    assert stat < chi2_critical(df), (stat, df)
    # windows ran, with acceptances and rejections both
    assert 0 < spec.accepted < spec.offered, (spec.accepted, spec.offered)
    assert spec.offered > N and spec.hist[2] + spec.hist[3] > 0
    # the test has power: keeping every draft (no correction) would be caught
    if drafter == "toy":
        wrong: dict[tuple[int, ...], float] = {}
        params = SamplingParams(**PARAMS)  # type: ignore[arg-type]
        for seq in probs:
            p, h = 1.0, list(PROMPT)
            for i, t in enumerate(seq):
                tab = TARGET if i == 0 else DRAFT
                ids, prob = distribution(tab[len(h), h[-1]], params)
                p *= float(prob[ids == t].sum())
                h.append(t)
            wrong[seq] = p
        total = sum(wrong.values())
        wrong = {k: v / total for k, v in wrong.items() if v > 0}
        w_stat, w_df = chi2(counts, wrong)
        assert w_stat > chi2_critical(w_df), (w_stat, w_df)


def test_draft_floor_does_not_depend_on_the_drawn_token() -> None:
    """`spec_p_min` is held against the draft's top probability, fixed before the draw (as
    llama.cpp's draft loop does): a floor tested on the drawn token's own probability would
    keep likely draws and drop unlikely ones, and the drafted tokens would no longer follow
    the q verification divides by."""
    from strata.spec.drafters import _pick

    row = np.log(np.array([0.9, 0.1, 1e-12, 1e-12])).astype(np.float32)
    p = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)
    req = DraftRequest(0, [0], 4, p, np.random.default_rng(0))
    picks = [_pick(row, req, 4) for _ in range(400)]
    assert {t for t, _, _ in picks} == {0, 1}  # both drawn
    assert {round(c, 6) for _, _, c in picks} == {0.9}  # one certainty for either draw
