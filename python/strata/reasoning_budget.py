"""The reasoning budget: a cap on the tokens of a thinking block, as llama.cpp's reasoning-budget
sampler (common/reasoning-budget.cpp, llama-server's `--reasoning-budget N` and per-request
`reasoning_budget_tokens`) does it.

A sequence is idle until its output completes the block's open tag (`<think>`), or counting
from its first token when the prompt opened the block. Each reasoning token spends one of
`budget`; when none is left (and the token just sampled completes its UTF-8 character) the
`forced` tokens — an optional message, then the close tag — are the only ones the sampler may
pick, one a step; then the block is done. The model's own close tag ends the count early; a new
open tag after a done block starts a fresh budget (models may think more than once). Budget 0
forces the close at once.

`BudgetProcessor` is a `strata.sampling.LogitsProcessor`: the engine chains it with the
request's grammar (`Chain`), so a constrained answer after a capped block works as before.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import Any

import numpy as np
import numpy.typing as npt

from strata.sampling import LogitsProcessor, ReasoningBudget

IDLE, COUNTING, WAITING_UTF8, FORCING, DONE = range(5)


class _Tail:
    """Whether the tokens seen so far end with `seq`."""

    def __init__(self, seq: Sequence[int]) -> None:
        self.seq = list(seq)
        self.last: deque[int] = deque(maxlen=max(len(self.seq), 1))

    def advance(self, token: int) -> bool:
        self.last.append(token)
        return bool(self.seq) and list(self.last) == self.seq

    def reset(self) -> None:
        self.last.clear()


class BudgetProcessor:
    """One sequence's reasoning budget (see the module doc). `complete(token)`: whether the
    token's bytes end on a whole UTF-8 character (a forced close never splits one)."""

    def __init__(self, rb: ReasoningBudget, complete: Callable[[int], bool]) -> None:
        self.rb = rb
        self.complete = complete
        self.start, self.end = _Tail(rb.start), _Tail(rb.end)
        self.state, self.remaining, self.pos = IDLE, rb.budget, 0
        if rb.opened:
            self._count()

    def _count(self) -> None:
        self.state, self.remaining = COUNTING, self.rb.budget
        self.end.reset()
        if self.remaining <= 0:
            self._force()

    def _force(self) -> None:
        self.state, self.pos = FORCING, 0
        self.end.reset()

    def __call__(self, logits: npt.NDArray[np.float32]) -> None:
        if self.state != FORCING or self.pos >= len(self.rb.forced):
            return
        keep = self.rb.forced[self.pos]
        kept = logits[keep]
        logits[...] = -np.inf
        logits[keep] = kept

    def accept(self, token: int) -> None:
        if self.state in (IDLE, DONE):
            if self.start.advance(token):
                self._count()
        elif self.state in (COUNTING, WAITING_UTF8):
            if self.end.advance(token):
                self.state = DONE  # the model closed the block itself
                self.start.reset()
                return
            whole = self.complete(token)
            if self.state == WAITING_UTF8:
                if whole:
                    self._force()
                return
            self.remaining -= 1
            if self.remaining <= 0:
                if whole:
                    self._force()
                else:  # as llama.cpp: the close tag's matcher starts over while it waits
                    self.state = WAITING_UTF8
                    self.end.reset()
        else:  # FORCING
            self.pos += 1
            if self.pos >= len(self.rb.forced):
                self.state = DONE
                self.start.reset()


class Chain:
    """Logits processors applied in turn (each masks the row; each is told every token)."""

    def __init__(self, procs: Sequence[LogitsProcessor]) -> None:
        self.procs = list(procs)

    def __call__(self, logits: npt.NDArray[np.float32]) -> None:
        for p in self.procs:
            p(logits)

    def accept(self, token: int) -> None:
        for p in self.procs:
            p.accept(token)


def utf8_complete(piece: bytes) -> bool:
    """Whether `piece` ends on a whole UTF-8 character (llama.cpp's common_utf8_is_complete:
    only the last lead byte and the bytes after it are looked at; a piece of continuation
    bytes alone does not count as whole)."""
    if not piece:
        return True
    for back in range(1, min(4, len(piece)) + 1):
        b = piece[-back]
        if b & 0xC0 != 0x80:  # a lead (or ASCII) byte: its sequence's length
            need = 1 if b < 0x80 else 2 if b >> 5 == 0x6 else 3 if b >> 4 == 0xE else 4
            return back >= need
    return False


def utf8_checker(vocabulary: Callable[[], Any]) -> Callable[[int], bool]:
    """Whether a token of `vocabulary()` (a `strata.constraints.Vocabulary`) ends on a whole
    UTF-8 character, memoized by token."""

    @lru_cache(maxsize=1 << 16)
    def complete(token: int) -> bool:
        return utf8_complete(vocabulary().token_bytes(token))

    return complete


def with_budget(
    proc: LogitsProcessor | None, rb: ReasoningBudget | None, complete: Callable[[int], bool]
) -> LogitsProcessor | None:
    """`proc` (a grammar's, or None) with the reasoning budget `rb`'s processor first."""
    if rb is None:
        return proc
    budget = BudgetProcessor(rb, complete)
    return budget if proc is None else Chain([budget, proc])


def processor_factory(
    grammar: Callable[[Any], LogitsProcessor | None], vocabulary: Callable[[], Any]
) -> Callable[[Any], LogitsProcessor | None]:
    """The scheduler's processor factory: a request's (`Submit`) grammar processor (from
    `grammar`, e.g. `Constraints.for_request`) chained with its reasoning budget's."""
    complete = utf8_checker(vocabulary)
    return lambda req: with_budget(grammar(req), req.params.reasoning_budget, complete)
