"""DRY ("don't repeat yourself", llama.cpp's `llama_sampler_init_dry`, from koboldcpp): a token
that would extend a sequence already seen in the last `dry_penalty_last_n` tokens by more than
`dry_allowed_length` loses multiplier · base^(length − allowed) of its logit. Sequence
breakers (text such as "\\n" or ":") end the sequences a repetition may run through.

`breaker_table` finds, as llama.cpp does, every token whose text holds a breaker (a breaker
of its own) or ends with the start of one (then the breaker's rest, as tokens, must follow);
`DryTable.apply` is llama.cpp's apply: the restart limit, the Z-algorithm over the reversed
history and the longest repetition each next token would extend (`strata._core.dry_longest`:
linear in the history, ~20 ms a token over 16K tokens in Python), the penalties.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np
import numpy.typing as npt

from strata._core import dry_longest

__all__ = ["DEFAULT_BREAKERS", "DryTable", "LazyDry", "breaker_table", "dry_table"]

DEFAULT_BREAKERS = ("\n", ":", '"', "*")  # llama.cpp's
MAX_CHAR_LEN = 40  # a breaker's bytes kept (llama.cpp's)
MAX_SEQ_LEN = 20  # a breaker tail's tokens kept (llama.cpp's)
FLOAT_MAX_LOG = 88.7228391  # log of float32's largest value: the exponent's cap

Breakers = dict[int, list[tuple[int, ...]]]  # head token → the tails that complete a breaker


def breaker_table(
    pieces: Sequence[bytes], encode: Callable[[bytes], list[int]], breakers: Sequence[str]
) -> Breakers:
    """llama.cpp's `get_overlapping_token_sequences` for each breaker: `pieces[t]` is token
    t's text (special tokens as their text), `encode` tokenizes the rest of a breaker."""
    out: Breakers = {}
    for b in breakers:
        s = b.encode("utf-8")[:MAX_CHAR_LEN]
        if not s:
            continue
        for tok, word in enumerate(pieces):
            if s in word:
                tails = out.setdefault(tok, [])
                if () not in tails:
                    tails.append(())
                continue
            pos = word.find(s[:1])
            while pos >= 0:
                n = min(len(s), len(word) - pos)  # the word's tail from pos is s's start
                if word[pos : pos + n] == s[:n]:
                    tail = tuple(encode(s[n:])[:MAX_SEQ_LEN])
                    tails = out.setdefault(tok, [])
                    if tail not in tails:
                        tails.append(tail)
                pos = word.find(s[:1], pos + 1)
    return out


class DryTable:
    """The breakers of one vocabulary, and the penalty over a history (`apply`)."""

    def __init__(self, breakers: Breakers) -> None:
        self._breakers = breakers
        self._heads: npt.NDArray[np.bool_] | None = None

    @property
    def breakers(self) -> Breakers:
        return self._breakers

    @property
    def heads(self) -> npt.NDArray[np.bool_]:
        """bool [max head + 2]: whether a token starts a breaker (the last entry False: any
        token past the heads is clipped to it)."""
        if self._heads is None:
            top = max(self.breakers, default=-1)
            heads = np.zeros(top + 2, dtype=np.bool_)
            heads[list(self.breakers)] = True
            self._heads = heads
        return self._heads

    def apply(
        self,
        x: npt.NDArray[np.float32],
        history: Sequence[int],
        multiplier: float,
        base: float,
        allowed: int,
        last_n: int,
    ) -> None:
        """Lower the logits [V] of `x` in place for the tokens that would extend a
        repetition of the history's last `last_n` tokens (-1: all of it; llama.cpp's
        apply)."""
        if multiplier == 0.0 or base < 1.0 or last_n == 0:
            return
        n = len(history) if last_n < 0 else min(len(history), last_n)
        if n <= allowed:
            return
        window = itertools.islice(history, len(history) - n, None)
        # rat[i]: i tokens from the end
        rat = np.ascontiguousarray(np.fromiter(window, dtype=np.int32, count=n)[::-1])
        limit = self._restart_limit(rat)
        if limit < allowed:
            return
        toks, lengths = dry_longest(rat, limit, allowed)
        cap = int(FLOAT_MAX_LOG / math.log(base)) if base > 1.000001 else 0
        v = x.shape[0]
        for tok, r in zip(toks, lengths, strict=True):
            if not 0 <= tok < v or () in self.breakers.get(tok, []):
                continue  # a breaker of its own is never penalized
            e = r - allowed
            if cap > 0 and e > cap:
                e = cap
            x[tok] = np.float32(x[tok] - np.float32(multiplier * base**e))

    def _restart_limit(self, rat: npt.NDArray[np.int32]) -> int:
        """How far back a repetition may reach: up to the nearest breaker in the history."""
        heads = self.heads
        past = len(heads) - 1  # False: tokens past the heads, and negative ones
        at = np.where((rat >= 0) & (rat < past), rat, past)
        for i in np.flatnonzero(heads[at]).tolist():
            tails = self.breakers[int(rat[i])]
            longest = -1
            for tail in tails:
                m = len(tail)
                if m > longest and m <= i and all(tail[o] == rat[i - o - 1] for o in range(m)):
                    longest = m
            if longest >= 0:
                return int(i) - longest
        return len(rat)


def _text(b: bytes) -> str:
    """Bytes as text with each invalid byte its own U+FFFD (as llama.cpp's tokenizer takes a
    breaker cut inside a character)."""
    return "".join(
        "\ufffd" if 0xDC80 <= ord(c) <= 0xDCFF else c
        for c in b.decode("utf-8", errors="surrogateescape")
    )


@functools.lru_cache(maxsize=8)
def _cached(vocab: Any, breakers: tuple[str, ...]) -> DryTable:
    n = vocab.n_vocab
    pieces = [bytes(vocab.token_bytes(i)) for i in range(n)]

    @functools.lru_cache(maxsize=4096)
    def tail(b: bytes) -> tuple[int, ...]:
        # special-token text stays text, as llama.cpp tokenizes a breaker's rest
        try:
            return tuple(vocab.encode(_text(b), parse_special=False))
        except TypeError:  # a vocabulary without the keyword (the fake engine's)
            return tuple(vocab.encode(_text(b)))

    return DryTable(breaker_table(pieces, lambda b: list(tail(b)) if b else [], breakers))


_builder = ThreadPoolExecutor(1, thread_name_prefix="strata-dry")


def dry_table(vocab: Any, breakers: Sequence[str] | None) -> DryTable:
    """The table of a `strata.constraints.Vocabulary` for these breakers (None: llama.cpp's
    defaults), built once per vocabulary and breakers (0.3 s for llama.cpp's on a 152K
    vocabulary)."""
    return _cached(vocab, tuple(DEFAULT_BREAKERS if breakers is None else breakers))


class LazyDry(DryTable):
    """A DRY table built beside the engine's steps (`dry_table` on a worker): the first
    token's sampling waits for it only if the prompt took less time than the build."""

    def __init__(self, vocab: Any, breakers: Sequence[str] | None) -> None:
        self._table: Future[DryTable] = _builder.submit(dry_table, vocab, breakers)
        self._heads = None

    @property
    def breakers(self) -> Breakers:
        return self._table.result().breakers
