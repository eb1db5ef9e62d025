"""Sampling parameters, their validation, and the sampler (numpy only).

Order of operations on one row of logits (V = vocabulary size):
  1. penalties: repetition (prompt + output tokens, divide positive logits / multiply negative
     ones), presence and frequency (output tokens only, subtracted), as vLLM and OpenAI do;
  2. temperature 0 → greedy (argmax, lowest id on ties); otherwise divide by temperature;
  3. top-k, then top-p (smallest set whose mass reaches p), then min-p (drop tokens whose
     probability is below min_p × the largest);
  4. draw from the remaining distribution with the request's own generator (seeded).
A per-request logits processor (`LogitsProcessor`, e.g. a grammar's token mask) masks the row
in place after the penalties; `accept` advances it past each sampled token.
Reported log-probabilities are those of the model's raw distribution (log-softmax of the logits
before penalties and temperature), as the OpenAI API reports them.
"""

from __future__ import annotations

import math
import secrets
from typing import Protocol

import msgspec
import numpy as np
import numpy.typing as npt

__all__ = ["LogitsProcessor", "SampleResult", "Sampler", "SamplingParams", "log_softmax"]

F32 = npt.NDArray[np.float32]

MAX_SEED = (1 << 64) - 1


class SamplingParams(msgspec.Struct, frozen=True, kw_only=True):
    """How to pick each next token. `validate()` raises ValueError naming the field."""

    temperature: float = 1.0  # 0: greedy
    top_k: int = -1  # -1 or 0: off
    top_p: float = 1.0  # (0, 1]
    min_p: float = 0.0  # [0, 1]
    repetition_penalty: float = 1.0  # (0, 10]; 1: off
    presence_penalty: float = 0.0  # [-2, 2]
    frequency_penalty: float = 0.0  # [-2, 2]
    seed: int | None = None  # None: a fresh random seed
    top_logprobs: int = -1  # -1: no log-probabilities; k >= 0: chosen token's plus top k
    # A constraint on the output (strata.constraints: a Lark grammar for llguidance); the
    # engine turns it into a LogitsProcessor. None: free text.
    grammar: str | None = None

    def validate(self) -> SamplingParams:
        def bad(name: str, why: str) -> ValueError:
            err = ValueError(f"{name}: {why} (got {getattr(self, name)!r})")
            err.param = name  # type: ignore[attr-defined]
            return err

        def finite(name: str) -> float:
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise bad(name, "must be a finite number")
            return float(v)

        if finite("temperature") < 0:
            raise bad("temperature", "must be >= 0")
        if not (0.0 < finite("top_p") <= 1.0):
            raise bad("top_p", "must be in (0, 1]")
        if not (0.0 <= finite("min_p") <= 1.0):
            raise bad("min_p", "must be in [0, 1]")
        if not (0.0 < finite("repetition_penalty") <= 10.0):
            raise bad("repetition_penalty", "must be in (0, 10]")
        for name in ("presence_penalty", "frequency_penalty"):
            if not (-2.0 <= finite(name) <= 2.0):
                raise bad(name, "must be in [-2, 2]")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < -1:
            raise bad("top_k", "must be an integer >= -1 (-1 or 0: off)")
        if self.seed is not None and (
            isinstance(self.seed, bool)
            or not isinstance(self.seed, int)
            or not (-(1 << 63) <= self.seed <= MAX_SEED)
        ):
            raise bad("seed", "must be a 64-bit integer")
        if (
            isinstance(self.top_logprobs, bool)
            or not isinstance(self.top_logprobs, int)
            or self.top_logprobs < -1
        ):
            raise bad("top_logprobs", "must be an integer >= -1")
        return self


class SampleResult(msgspec.Struct, frozen=True):
    token: int
    logprob: float | None  # raw log-probability of `token`; None when not asked for
    top: list[tuple[int, float]] | None  # [(id, logprob)] best first; None when not asked for


def log_softmax(x: F32) -> F32:
    m = np.max(x)
    z = x - m
    out: F32 = (z - np.log(np.sum(np.exp(z)))).astype(np.float32)
    return out


class LogitsProcessor(Protocol):
    """A per-request constraint on the next token (e.g. a grammar's token mask)."""

    def __call__(self, logits: F32) -> None:
        """Mask one row of logits [V] in place (forbidden tokens to -inf)."""
        ...

    def accept(self, token: int) -> None:
        """Advance past the sampled token."""
        ...


class Sampler:
    """The per-sequence sampler: owns its generator and the counts the penalties need."""

    def __init__(
        self,
        params: SamplingParams,
        prompt: list[int],
        n_vocab: int,
        processor: LogitsProcessor | None = None,
    ) -> None:
        self.params = params.validate()
        self.processor = processor
        seed = params.seed if params.seed is not None else secrets.randbits(64)
        self.rng = np.random.default_rng(seed & MAX_SEED)
        self.n_vocab = n_vocab
        self._seen = np.zeros(n_vocab, dtype=bool)  # [V] in prompt or output
        self._counts = np.zeros(n_vocab, dtype=np.int32)  # [V] times in output
        ids = np.asarray([t for t in prompt if 0 <= t < n_vocab], dtype=np.int64)
        self._seen[ids] = True

    def accept(self, token: int) -> None:
        """Record an output token (for the penalties)."""
        if 0 <= token < self.n_vocab:
            self._seen[token] = True
            self._counts[token] += 1
        if self.processor is not None:
            self.processor.accept(token)

    def sample(self, logits: npt.NDArray[np.floating]) -> SampleResult:
        """Pick the next token from one row of logits [V]; also records it."""
        p = self.params
        raw = np.asarray(logits, dtype=np.float32).reshape(-1)[: self.n_vocab]  # [V]
        x = raw.copy()
        if p.repetition_penalty != 1.0:
            s = self._seen
            x[s] = np.where(x[s] > 0, x[s] / p.repetition_penalty, x[s] * p.repetition_penalty)
        if p.presence_penalty or p.frequency_penalty:
            c = self._counts.astype(np.float32)
            x -= p.frequency_penalty * c + p.presence_penalty * (c > 0)
        if self.processor is not None:
            self.processor(x)
        if p.temperature == 0.0:
            token = int(np.argmax(x))
        else:
            token = self._draw(x / np.float32(p.temperature))
        self.accept(token)
        if p.top_logprobs < 0:
            return SampleResult(token, None, None)
        lp = log_softmax(raw)
        top: list[tuple[int, float]] = []
        if p.top_logprobs > 0:
            k = min(p.top_logprobs, lp.shape[0])
            idx = np.argpartition(-lp, k - 1)[:k]
            idx = idx[np.lexsort((idx, -lp[idx]))]
            top = [(int(i), float(lp[i])) for i in idx]
        return SampleResult(token, float(lp[token]), top)

    def _draw(self, x: F32) -> int:
        p = self.params
        keep = np.isfinite(x)
        if p.top_k > 0 and p.top_k < x.shape[0]:
            kth = np.partition(x, -p.top_k)[-p.top_k]
            keep &= x >= kth
        z = np.where(keep, x, -np.inf)
        probs = np.exp(z - np.max(z))
        probs /= probs.sum()
        if p.top_p < 1.0:
            order = np.argsort(-probs, kind="stable")
            cum = np.cumsum(probs[order])
            cut = int(np.searchsorted(cum, p.top_p)) + 1  # tokens needed to reach top_p
            mask = np.zeros_like(keep)
            mask[order[:cut]] = True
            probs = np.where(mask, probs, 0.0)
        if p.min_p > 0.0:
            probs = np.where(probs >= p.min_p * probs.max(), probs, 0.0)
        total = probs.sum()
        if not total > 0:
            return int(np.argmax(x))
        cdf = np.cumsum(probs / total)
        r = self.rng.random()
        return int(min(np.searchsorted(cdf, r, side="right"), x.shape[0] - 1))
