"""The one sampler of the project: parameters, their validation, and the per-sequence sampler
(numpy only). The server's engine and `LLM.generate` both use it, so equal settings and seed
give equal tokens.

Order and defaults are llama.cpp's (`common_sampler`'s default chain, llama-server's defaults):
  0. an optional per-request logits processor masks the row (structured output: a grammar sets
     the logits of forbidden tokens to -inf), then the request's logit bias is added (OpenAI's
     `logit_bias`, llama.cpp's first sampler; -inf: the token is never picked);
  1. penalties over the last `repeat_last_n` tokens of the sequence (prompt and output; -1: all
     of it, 0: none): repetition (positive logits divided by `repetition_penalty`, negative ones
     multiplied), then frequency (× count) and presence (once) subtracted; then DRY (off by
     default; `strata.dry`);
  2. temperature 0 → greedy (argmax of the penalized row, lowest id on ties);
  3. otherwise top-n-sigma (llama.cpp's; off by default), top-k, locally typical sampling
     (off by default), top-p (the smallest set of the best tokens whose probability at
     temperature 1 reaches p), min-p (drop tokens below min_p × the best one's probability),
     XTC (off by default), temperature, then (for infill requests that name it) llama.cpp's
     infill sampler (`strata.infill`), then a draw with the sequence's own generator.
Defaults: temperature 0.8, top_k 40, top_p 0.95, min_p 0.05, repetition_penalty 1.0,
repeat_last_n 64 (llama.cpp's). Reported log-probabilities are those of the model's raw
distribution (log-softmax of the logits before the processor, penalties and temperature), as
the OpenAI API reports them.
"""

from __future__ import annotations

import math
import secrets
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import msgspec
import numpy as np
import numpy.typing as npt

from strata import mirostat
from strata.adaptive_p import AdaptiveP

__all__ = [
    "GrammarTrigger",
    "InfillStage",
    "LogitsProcessor",
    "ReasoningBudget",
    "SampleResult",
    "Sampler",
    "SamplingParams",
    "candidates",
    "distribution",
    "draw",
    "log_softmax",
    "request_defaults",
]

F32 = npt.NDArray[np.float32]

MAX_SEED = (1 << 64) - 1
MAX_BREAKERS = 16  # DRY's sequence breakers of one request (each a scan of the vocabulary)


# GGUF metadata keys of a model's recommended sampling (llama.cpp's `general.sampling.*`, read
# where the user set nothing) → SamplingParams' names
GGUF_SAMPLING = {
    "general.sampling.temp": "temperature",
    "general.sampling.top_k": "top_k",
    "general.sampling.top_p": "top_p",
    "general.sampling.min_p": "min_p",
    "general.sampling.penalty_repeat": "repetition_penalty",
    "general.sampling.penalty_last_n": "repeat_last_n",
    "general.sampling.xtc_probability": "xtc_probability",
    "general.sampling.xtc_threshold": "xtc_threshold",
    "general.sampling.mirostat": "mirostat",
    "general.sampling.mirostat_tau": "mirostat_tau",
    "general.sampling.mirostat_eta": "mirostat_eta",
}


class ReasoningBudget(msgspec.Struct, frozen=True):
    """A cap on a thinking block's tokens (`strata.reasoning_budget`: the engine's processor;
    the server fills the tags from the model's template and tokenizer)."""

    budget: int  # reasoning tokens before the close is forced (0: at once)
    start: list[int]  # the open tag's tokens
    end: list[int]  # the close tag's tokens
    forced: list[int]  # forced when the budget is spent: a message's tokens, then the close
    opened: bool = False  # the prompt opened the block: counting from the first token


class GrammarTrigger(msgspec.Struct, frozen=True):
    """A lazy grammar (llama.cpp's `grammar_lazy`): the sequence is free until it samples one
    of `tokens` outside a thinking block; from that token on (the grammar starts with its
    text) the grammar constrains the rest. `think` / `unthink`: the tokens that open and close
    a thinking block; `opened`: the prompt opened one."""

    tokens: list[int]
    think: list[int] = []
    unthink: list[int] = []
    opened: bool = False
    # A header trigger instead (`tokens` empty; the harmony format's recipient): `pattern`, a
    # regex, searched in the text of a message header, from an `anchors` token (or the answer's
    # start, when `armed`) to an `ends` token; the grammar is fed the header's tokens from the
    # anchor on (`strata.constraints.HeaderGrammar`).
    pattern: str = ""
    anchors: list[int] = []
    ends: list[int] = []
    armed: bool = False


class SamplingParams(msgspec.Struct, frozen=True, kw_only=True):
    """How to pick each next token. `validate()` raises ValueError naming the field."""

    temperature: float = 0.8  # 0: greedy
    top_k: int = 40  # -1 or 0: off
    top_p: float = 0.95  # (0, 1]; 1: off
    min_p: float = 0.05  # [0, 1]; 0: off
    repetition_penalty: float = 1.0  # (0, 100]; 1: off (llama.cpp's repeat_penalty)
    repeat_last_n: int = 64  # tokens the penalties look back over; -1: all, 0: off
    presence_penalty: float = 0.0  # [-2, 2]
    frequency_penalty: float = 0.0  # [-2, 2]
    seed: int | None = None  # None: a fresh random seed
    top_logprobs: int = -1  # -1: no log-probabilities; k >= 0: chosen token's plus top k
    # A constraint on the output (strata.constraints: a Lark grammar for llguidance); the
    # engine turns it into a LogitsProcessor. None: free text.
    grammar: str | None = None
    # token id → added to its logit before the penalties (-inf: never picked); ids past the
    # vocabulary are the caller's to refuse (the server does, with the vocabulary's size)
    logit_bias: dict[int, float] | None = None
    # `grammar` applies only from one of these tokens on (None: from the first token)
    grammar_trigger: GrammarTrigger | None = None
    # a cap on the thinking block's tokens (None: none)
    reasoning_budget: ReasoningBudget | None = None
    # False: the engine never drafts for this sequence (when its `spec` setting is on)
    speculative: bool = True
    # False: this prompt reuses no cached prefix (llama-server's per-request cache_prompt;
    # the server's `cache_prompt` setting off turns reuse off for every request)
    cache_prompt: bool = True
    # llama.cpp's samplers beside those (their "off" values by default): top-n-sigma (> 0:
    # logits below the best less n standard deviations go), locally typical sampling (< 1),
    # XTC (with this probability, of the tokens at least `xtc_threshold` likely only the
    # least likely one stays)
    top_n_sigma: float = -1.0
    typical_p: float = 1.0
    # DRY (`strata.dry`, after the penalties; 0: off): a token extending a repetition of the
    # last `dry_penalty_last_n` tokens past `dry_allowed_length` loses multiplier ·
    # base^(length − allowed) of its logit; the breakers (None: llama.cpp's) end repetitions
    dry_multiplier: float = 0.0
    dry_base: float = 1.75
    dry_allowed_length: int = 2
    dry_penalty_last_n: int = 64
    dry_sequence_breakers: list[str] | None = None
    xtc_probability: float = 0.0
    xtc_threshold: float = 0.1
    # dynamic temperature (> 0: llama.cpp's temp_ext): the temperature goes from temperature −
    # range to temperature + range with the candidates' normalized entropy ^ exponent
    dynatemp_range: float = 0.0
    dynatemp_exponent: float = 1.0
    # mirostat (`strata.mirostat`, 1 or 2; 0: off): the draw after the logit bias and
    # temperature alone, as llama.cpp's chain has it (no penalties, DRY or truncations)
    mirostat: int = 0
    mirostat_tau: float = 5.0
    mirostat_eta: float = 0.1
    # adaptive-p (`strata.adaptive_p`; llama-server's `samplers` naming "adaptive_p"): the
    # draw prefers tokens near a probability that adapts toward `adaptive_target` (< 0: a
    # plain draw), averaging over ~1 / (1 − `adaptive_decay`) tokens; not under mirostat
    adaptive_p: bool = False
    adaptive_target: float = -1.0
    adaptive_decay: float = 0.9
    # llama.cpp's infill sampler after temperature (llama-server's `samplers` naming
    # "infill"): `strata.infill.InfillFilter` over the candidates the chain leaves
    infill: bool = False

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

        def integer(name: str, lo: int, hi: int = (1 << 31) - 1) -> int:
            # an upper bound too: a count past 32 bits is no count here, and it would not
            # fit the engine's frame (nor a deque's maxlen)
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
                raise bad(name, f"must be an integer in {lo}..{hi}")
            return v

        if not (0.0 <= finite("temperature") <= 100.0):
            raise bad("temperature", "must be in [0, 100]")
        if not (0.0 < finite("top_p") <= 1.0):
            raise bad("top_p", "must be in (0, 1]")
        if not (0.0 <= finite("min_p") <= 1.0):
            raise bad("min_p", "must be in [0, 1]")
        finite("typical_p")  # >= 1: off; <= 0: the most typical token alone
        integer("mirostat", 0, 2)
        finite("mirostat_tau")
        finite("mirostat_eta")
        finite("adaptive_target")
        finite("adaptive_decay")
        if finite("dynatemp_range") < 0.0:
            raise bad("dynatemp_range", "must be >= 0")
        finite("dynatemp_exponent")
        for name in ("xtc_probability", "xtc_threshold"):
            if not (0.0 <= finite(name) <= 1.0):
                raise bad(name, "must be in [0, 1]")
        finite("top_n_sigma")
        if finite("dry_multiplier") < 0.0:
            raise bad("dry_multiplier", "must be >= 0")
        finite("dry_base")  # < 1: DRY off (llama.cpp's sampler; its server takes 1.75 then)
        integer("dry_allowed_length", 0, 1 << 20)
        integer("dry_penalty_last_n", -1)  # -1: all of the sequence (llama.cpp's old default)
        br = self.dry_sequence_breakers
        if br is not None and (
            len(br) > MAX_BREAKERS or any(not isinstance(b, str) or len(b) > 256 for b in br)
        ):
            raise bad(
                "dry_sequence_breakers",
                f"at most {MAX_BREAKERS} strings of at most 256 characters (40 bytes count)",
            )
        if not (0.0 < finite("repetition_penalty") <= 100.0):
            raise bad("repetition_penalty", "must be in (0, 100]")
        for name in ("presence_penalty", "frequency_penalty"):
            if not (-2.0 <= finite(name) <= 2.0):
                raise bad(name, "must be in [-2, 2]")
        for name in ("speculative", "cache_prompt", "infill"):
            if not isinstance(getattr(self, name), bool):
                raise bad(name, "must be true or false")
        if self.logit_bias is not None:
            for tok, b in self.logit_bias.items():
                if isinstance(tok, bool) or not isinstance(tok, int) or tok < 0:
                    raise bad("logit_bias", "token ids must be integers >= 0")
                if isinstance(b, bool) or not isinstance(b, (int, float)):
                    raise bad("logit_bias", "biases must be numbers")
                if not (math.isfinite(b) or b == -math.inf):
                    raise bad("logit_bias", "biases must be finite (or -inf: never picked)")
        gt = self.grammar_trigger
        if gt is not None and (self.grammar is None or not (gt.tokens or gt.pattern)):
            raise bad("grammar_trigger", "needs a grammar and at least one token or a pattern")
        rb = self.reasoning_budget
        if rb is not None and (rb.budget < 0 or not rb.start or not rb.end or not rb.forced):
            raise bad("reasoning_budget", "needs a budget >= 0, open and close tags, forced tokens")
        integer("top_k", -1)
        integer("repeat_last_n", -1)
        integer("top_logprobs", -1)
        if self.seed is not None and (
            isinstance(self.seed, bool)
            or not isinstance(self.seed, int)
            or not (-(1 << 63) <= self.seed <= MAX_SEED)
        ):
            raise bad("seed", "must be a 64-bit integer")
        return self

    @property
    def greedy(self) -> bool:
        """The argmax is the pick (temperature 0; a dynamic temperature may still sample
        there, as llama.cpp's temp_ext does)."""
        return self.temperature == 0.0 and self.dynatemp_range <= 0.0

    @property
    def adaptive(self) -> bool:
        """adaptive-p draws (named in the chain, a target set, no mirostat)."""
        return self.adaptive_p and self.adaptive_target >= 0.0 and not self.mirostat

    @property
    def stateful_draw(self) -> bool:
        """The draw moves the sequence's own state (mirostat's mu, adaptive-p's average):
        such a sequence is not drafted for (a verified window draws differently)."""
        return bool(self.mirostat) or self.adaptive

    @property
    def xtc(self) -> bool:
        """XTC is on (llama.cpp's conditions)."""
        return self.xtc_probability > 0.0 and self.xtc_threshold <= 0.5

    @property
    def chain_picks(self) -> bool:
        """A sampler that may drop the best token is on (typical, XTC; not under mirostat,
        which replaces them): a greedy pick is then the best token the chain leaves, as
        llama.cpp's temperature 0 keeps it."""
        return (self.typical_p < 1.0 or self.xtc) and not self.mirostat

    @property
    def dry(self) -> bool:
        """DRY is on (llama.cpp's conditions)."""
        return self.dry_multiplier != 0.0 and self.dry_base >= 1.0 and self.dry_penalty_last_n != 0

    @property
    def penalized(self) -> bool:
        return self.repeat_last_n != 0 and (
            self.repetition_penalty != 1.0
            or self.presence_penalty != 0.0
            or self.frequency_penalty != 0.0
        )


class LogitsProcessor(Protocol):
    """A per-request constraint on the next token (e.g. a grammar's token mask).

    `__call__` edits one row of logits [V] in place before the penalties (forbidden tokens
    to -inf); `accept` is told every token the sequence samples, so the constraint advances."""

    def __call__(self, logits: F32) -> None: ...

    def accept(self, token: int) -> None: ...


def request_defaults(
    metadata: Mapping[str, Any], settings: Mapping[str, Any]
) -> tuple[SamplingParams, list[str]]:
    """The sampling a request starts from: `settings` (the server's, SamplingParams' names),
    else the model's `general.sampling.*` metadata (each value checked on its own; a bad one
    is left out, and named in the returned notes), else SamplingParams' (llama.cpp's)
    defaults."""
    notes: list[str] = []
    model: dict[str, Any] = {}
    for key, name in GGUF_SAMPLING.items():
        v = metadata.get(key)
        if v is None or name in settings:
            continue
        ints = name in ("top_k", "repeat_last_n", "mirostat")
        if (
            isinstance(v, bool)
            or not isinstance(v, (int, float))
            or (ints and not float(v).is_integer())
        ):
            notes.append(f"{key}: not a number ({v!r}); left out")
            continue
        one: dict[str, Any] = {name: int(v) if ints else float(v)}
        try:
            SamplingParams(**one).validate()
        except ValueError as e:
            notes.append(f"{key}: {e}; left out")
            continue
        model[name] = int(v) if ints else float(v)
    return SamplingParams(**{**model, **settings}).validate(), notes


class DryStage(Protocol):
    """DRY's penalty over a history (`strata.dry.DryTable`)."""

    def apply(
        self,
        x: F32,
        history: Sequence[int],
        multiplier: float,
        base: float,
        allowed: int,
        last_n: int,
    ) -> None: ...


class InfillStage(Protocol):
    """A last stage over the candidates (`strata.infill.InfillFilter`): (ids [n] best first,
    their logits [n] after temperature) → (ids [m], probabilities [m])."""

    def __call__(
        self, cand: npt.NDArray[np.int64], logits: npt.NDArray[np.float64]
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]: ...


class SampleResult(msgspec.Struct, frozen=True):
    token: int
    logprob: float | None  # raw log-probability of `token`; None when not asked for
    top: list[tuple[int, float]] | None  # [(id, logprob)] best first; None when not asked for


def log_softmax(x: F32) -> F32:
    m = np.max(x)
    z = x - m
    out: F32 = (z - np.log(np.sum(np.exp(z)))).astype(np.float32)
    return out


class Sampler:
    """The per-sequence sampler: owns its generator, the penalty window and the processor."""

    def __init__(
        self,
        params: SamplingParams,
        prompt: list[int],
        n_vocab: int,
        processor: LogitsProcessor | None = None,
        infill: InfillStage | None = None,
        dry: DryStage | None = None,
    ) -> None:
        self.params = params.validate()
        self.processor = processor
        if params.dry and dry is None:
            raise ValueError("dry_multiplier: this engine has no DRY table for its vocabulary")
        # mirostat draws instead of the chain (and ignores the penalties and DRY, as there)
        self._mu = 2.0 * params.mirostat_tau
        self.dry = dry if params.dry and not params.mirostat else None
        self._adaptive = (
            AdaptiveP(params.adaptive_target, params.adaptive_decay) if params.adaptive else None
        )
        # the tokens DRY looks back over (prompt and output, as llama.cpp's chain accepts them)
        self._dry_hist: deque[int] = (
            deque((t for t in prompt if 0 <= t < n_vocab), _last_n(params.dry_penalty_last_n))
            if self.dry is not None
            else deque(maxlen=0)
        )
        if params.infill and infill is None:
            raise ValueError("infill: this engine has no infill sampler for its vocabulary")
        self.infill = infill if params.infill else None
        seed = params.seed if params.seed is not None else secrets.randbits(64)
        self.seed = seed & MAX_SEED  # a drafter's own generator derives from it
        self.rng = np.random.default_rng(seed & MAX_SEED)
        self.n_vocab = n_vocab
        # the bias as two arrays (ids within the vocabulary [B], their biases [B])
        bias = {t: b for t, b in (params.logit_bias or {}).items() if t < n_vocab}
        self._bias_ids = np.fromiter(bias, dtype=np.int64, count=len(bias))
        self._bias = np.fromiter(bias.values(), dtype=np.float32, count=len(bias))
        n = params.repeat_last_n
        # the last `repeat_last_n` tokens of prompt + output (all of them for -1)
        self._window: deque[int] = deque(
            (t for t in prompt if 0 <= t < n_vocab), maxlen=None if n < 0 else n
        )

    @property
    def fast_greedy(self) -> bool:
        """True when the token is the plain argmax of the row (no penalties, processor or
        log-probabilities): a caller may then pick it without handing the row over."""
        p = self.params
        return (
            p.greedy
            and not p.penalized
            and not p.logit_bias
            and self.processor is None
            and p.top_logprobs < 0
            and not p.chain_picks
            and not p.dry
        )

    def accept(self, token: int) -> None:
        """Record a token of the sequence (the penalty window, the processor's state)."""
        if 0 <= token < self.n_vocab and self._window.maxlen != 0:
            self._window.append(token)
        if self.dry is not None:
            self._dry_hist.append(token)
        if self._adaptive is not None:
            self._adaptive.accept(token)
        if self.processor is not None:
            self.processor.accept(token)

    def _penalize(self, x: F32) -> None:
        p = self.params
        if not p.penalized or not self._window or p.mirostat:
            return
        ids, counts = np.unique(np.fromiter(self._window, dtype=np.int64), return_counts=True)
        v = x[ids]
        if p.repetition_penalty != 1.0:
            v = np.where(v > 0, v / p.repetition_penalty, v * p.repetition_penalty)
        x[ids] = v - counts * np.float32(p.frequency_penalty) - np.float32(p.presence_penalty)

    def processed(self, logits: npt.NDArray[np.floating]) -> tuple[F32, F32]:
        """(raw, x): one row of logits [V] as given, and after the processor, the logit bias
        and the penalties (the row the next token is picked from)."""
        p = self.params
        raw = np.asarray(logits, dtype=np.float32).reshape(-1)[: self.n_vocab]  # [V]
        if self.processor is None and not p.penalized and not self._bias.size and not self.dry:
            return raw, raw
        x = raw.copy()
        if self.processor is not None:
            self.processor(x)
        if self._bias.size:
            x[self._bias_ids] += self._bias
        self._penalize(x)
        if self.dry is not None:
            self.dry.apply(
                x,
                self._dry_hist,
                p.dry_multiplier,
                p.dry_base,
                p.dry_allowed_length,
                p.dry_penalty_last_n,
            )
        return raw, x

    def sample(self, logits: npt.NDArray[np.floating]) -> SampleResult:
        """Pick the next token from one row of logits [V]; also records it."""
        raw, x = self.processed(logits)
        if not self.params.greedy:
            token = self._draw(x)
        elif self.params.chain_picks:
            token = int(candidates(x, self.params, self.rng)[0][0])
        else:
            token = int(np.argmax(x))
        self.accept(token)
        return self.result(raw, token)

    def result(self, raw: F32, token: int) -> SampleResult:
        """What is reported for `token` picked from the raw row [V] (its log-probability and
        the top ones when asked for)."""
        p = self.params
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

    def mirostat(
        self, x: F32, pick: Callable[[npt.NDArray[np.int64]], int] | None = None
    ) -> tuple[int, npt.NDArray[np.int64]]:
        """Mirostat's draw over the processed row [V] (`pick`: choose among the kept ids
        instead, for tests): (the token, the ids it kept); moves this sequence's mu."""
        p = self.params

        def choose(cand: npt.NDArray[np.int64], prob: npt.NDArray[np.float64]) -> int:
            return pick(cand) if pick is not None else draw(cand, prob, self.rng)

        token, self._mu, kept = mirostat.step(
            x, p.mirostat, p.temperature, p.mirostat_tau, p.mirostat_eta, self._mu,
            self.n_vocab, choose,
        )  # fmt: skip
        return token, kept

    def adaptive(
        self, x: F32, pick: Callable[[npt.NDArray[np.int64]], int] | None = None
    ) -> tuple[int, npt.NDArray[np.int64], npt.NDArray[np.float64]]:
        """adaptive-p's draw over the processed row [V] (`pick`: choose among the candidates
        instead, for tests): (the token, the candidates, the probabilities it drew by)."""
        assert self._adaptive is not None
        cand, prob = self.distribution(x)
        moved = self._adaptive.transform(prob)
        token = pick(cand) if pick is not None else draw(cand, moved, self.rng)
        self._adaptive.drew(token, float(prob[int(np.flatnonzero(cand == token)[0])]))
        return token, cand, moved

    def distribution(self, x: F32) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]:
        """The distribution a non-greedy draw picks from over the processed row [V]
        (`distribution`, with this sequence's infill stage and generator)."""
        return distribution(x, self.params, self.infill, self.rng)

    def _draw(self, x: F32) -> int:
        """The chain of `distribution`, then the draw, over the row [V] (mirostat's draw
        where it is on)."""
        if self.params.mirostat:
            return self.mirostat(x)[0]
        if self._adaptive is not None:
            return self.adaptive(x)[0]
        cand, prob = self.distribution(x)
        if cand.size == 1 and not np.isfinite(x[cand[0]]):  # everything masked: no draw
            return int(cand[0])
        return draw(cand, prob, self.rng)


def distribution(
    x: F32,
    p: SamplingParams,
    infill: InfillStage | None = None,
    rng: np.random.Generator | None = None,
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]:
    """The distribution a non-greedy draw picks from over the row [V]: the `candidates` →
    temperature → `infill` (when given). Returns (ids [n], probabilities [n]), best first
    (lowest id on ties); a row with every logit masked gives its argmax with probability 1."""
    cand, v, masked = _chain(x, p, rng)
    t = p.temperature
    # llama.cpp's candidates there still hold the masked ones no later stage removed
    size = cand.size + (masked if p.top_p >= 1.0 and p.min_p <= 0.0 and p.typical_p >= 1.0 else 0)
    if p.dynatemp_range > 0.0 and size > 1:
        prob = _softmax(v)
        nz = prob[prob > 0]
        norm = float(-np.sum(nz * np.log(nz))) / math.log(size)
        e = p.dynatemp_exponent
        scale = norm**e if norm > 0.0 else (math.inf if e < 0 else 1.0 if e == 0 else 0.0)
        lo, hi = max(0.0, t - p.dynatemp_range), t + p.dynatemp_range
        t = lo + (hi - lo) * scale
    if t <= 0.0:  # the best alone (llama.cpp's temperature 0)
        return cand[:1], np.ones(1)
    if infill is not None:
        return infill(cand, v / t)
    w = np.exp((v - v[0]) / t)
    return cand, w / w.sum()


def candidates(
    x: F32, p: SamplingParams, rng: np.random.Generator | None = None
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]:
    """The tokens the chain before temperature leaves, best first (lowest id on ties), and
    their logits: top-n-sigma → top-k → typical → top-p → min-p → XTC (it draws from `rng`;
    without one it is left out), llama.cpp's default order. A row with every logit masked
    gives its argmax."""
    cand, v, _ = _chain(x, p, rng)
    return cand, v


def _chain(
    x: F32, p: SamplingParams, rng: np.random.Generator | None
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64], int]:
    """`candidates`, and how many masked (-inf) tokens top-k's pool held."""
    if p.top_n_sigma > 0.0:
        x = _top_n_sigma(x, p.top_n_sigma)
    n = x.shape[0]
    # [k] candidates, unordered
    cand = np.argpartition(-x, p.top_k - 1)[: p.top_k] if 0 < p.top_k < n else np.arange(n)
    pool = cand.size
    cand = cand[np.isfinite(x[cand])]
    masked = pool - cand.size
    if cand.size == 0:  # everything masked: the argmax stands
        return np.array([int(np.argmax(x))], dtype=np.int64), np.zeros(1), 0
    v = x[cand].astype(np.float64)
    order = np.lexsort((cand, -v))  # best first, lowest id on ties
    cand, v = cand[order], v[order]
    prob = _softmax(v)
    if p.typical_p < 1.0:
        cand, v = _typical(cand, v, prob, p.typical_p)
        prob = _softmax(v)
    if p.top_p < 1.0:
        keep = int(np.searchsorted(np.cumsum(prob), p.top_p)) + 1  # tokens to reach p
        cand, v, prob = cand[:keep], v[:keep], prob[:keep]
    if p.min_p > 0.0:
        keep_mask = prob >= p.min_p * prob[0]
        cand, v = cand[keep_mask], v[keep_mask]
    # XTC: sometimes, of the tokens at least `threshold` likely, only the least one stays
    if p.xtc and cand.size >= 2 and rng is not None and rng.random() <= p.xtc_probability:
        above = int(np.count_nonzero(_softmax(v) >= p.xtc_threshold))
        if above > 1:
            cand, v = cand[above - 1 :], v[above - 1 :]
    return cand.astype(np.int64), v, masked


def _last_n(n: int) -> int | None:
    """A look-back window's length (-1: all of the sequence)."""
    return None if n < 0 else n


def _softmax(v: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """Probabilities of logits [n] sorted best first."""
    e = np.exp(v - v[0])
    out: npt.NDArray[np.float64] = e / e.sum()
    return out


def _top_n_sigma(x: F32, n: float) -> F32:
    """llama.cpp's top-n-sigma: logits below the best one less n standard deviations of the
    finite logits are masked."""
    f = x[np.isfinite(x)]
    if f.size <= 1:
        return x
    cut = f.max() - n * f.std()
    out: F32 = np.where(x < cut, np.float32(-np.inf), x).astype(np.float32)
    return out


def _typical(
    cand: npt.NDArray[np.int64],
    v: npt.NDArray[np.float64],
    prob: npt.NDArray[np.float64],
    typical_p: float,
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]:
    """Locally typical sampling (llama.cpp's): the tokens whose surprise is closest to the
    entropy, until their probability passes `typical_p`; kept best first."""
    logp = np.log(np.where(prob > 0, prob, 1.0))
    entropy = -float(np.sum(prob * logp))
    order = np.argsort(np.abs(-logp - entropy), kind="stable")
    over = int(np.searchsorted(np.cumsum(prob[order]), typical_p, side="right"))
    keep = np.sort(order[: min(over + 1, order.size)])
    return cand[keep], v[keep]


def draw(
    cand: npt.NDArray[np.int64], prob: npt.NDArray[np.float64], rng: np.random.Generator
) -> int:
    """One id of `cand` drawn with probabilities `prob` (one uniform from `rng`)."""
    cdf = np.cumsum(prob)
    r = rng.random()
    return int(cand[min(int(np.searchsorted(cdf, r, side="right")), cand.size - 1)])
