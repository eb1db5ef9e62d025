"""The scheduler's side of speculative decoding: drafting windows for the decoding sequences of
a step, settling them after the step, and the counters.

Each decoding sequence that speculates runs its window `[t0, d1 .. dk]` as its own entry of the
step (logits "all"), beside the other sequences' one-token decodes and prompt chunks; k comes
from `strata.spec.control.choose_k`. After the step `strata.spec.verify.verify` picks the
emitted tokens, and the target's KV (by the scheduler) and the drafter's are cut back to the
accepted prefix.
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from strata.engine.protocol import Stat
from strata.sampling import Sampler, SampleResult
from strata.spec.control import ALPHA_PRIOR, MIN_SAMPLES, WINDOW, CostModel, SeqSpec, choose_k
from strata.spec.drafters import Draft, Drafter, DraftRequest
from strata.spec.verify import verify


@dataclass(slots=True)
class Candidate:
    """A decoding sequence as the speculator sees it."""

    slot: int
    prompt: list[int]
    out: list[int]  # the output so far; its last token (t0) not yet run
    room: int  # most drafts its window may hold (max_tokens and context left)
    sampler: Sampler
    state: SeqSpec
    rng: np.random.Generator  # the drafter's draws for this sequence
    stops: frozenset[int] = frozenset()  # end-of-generation ids: the window ends at one

    @property
    def history(self) -> list[int]:
        """Prompt + output (built only for a sequence that drafts)."""
        return [*self.prompt, *self.out]


class Speculator:
    def __init__(
        self,
        drafter: Drafter,
        k_min: int,
        k_max: int,
        adaptive: bool = True,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.drafter = drafter
        self._clock = clock  # what the drafter's calls are timed by (tests: a virtual one)
        self.adaptive = adaptive  # False: every window drafts k_max (what room allows)
        self.k_min, self.k_max = k_min, k_max
        self.cost = CostModel()  # serial steps
        # pipelined windows (`pipeline_windows` 2): T(n) is the interval between two verdicts,
        # which overlaps the next window's launch with this one's books: another curve than a
        # serial step's, kept apart so that neither mode's choices read the other's times
        self.pipe_cost = CostModel()
        self.offered = 0
        self.accepted = 0
        self.hist = [0] * (k_max + 1)  # windows by accepted drafts
        self.draft_s = 0.0  # time spent drafting
        self.draft_tokens = 0
        # recent steady drafting calls' seconds per drafted token: calls in which every
        # sequence drafted at its previous step too. A sequence's first call, or its first
        # after steps without drafting, also catches the drafter up with the history (the
        # n-gram index, the draft model's prefill): a cost of not having drafted, which a
        # sequence that drafts every step does not pay; counted per drafted token it would
        # price drafting out, and the probes that could show otherwise (each one such a
        # catch-up) would keep it out for good.
        self._per_token: deque[float] = deque(maxlen=WINDOW)
        self._called: dict[int, tuple[int, int]] = {}  # slot → (history length, k) last call
        self._per_token_med: float | None = None  # its median (None: to be re-read)
        self.k_by_slot: dict[int, int] = {}  # the window each slot chose last
        self.rejections = 0  # windows that ended on a rejected draft

    def new_sequence(self) -> SeqSpec:
        """A new sequence's state: its acceptance prior is what the windows so far measured
        (with the weight of ALPHA_PRIOR's pseudo-counts), 0.5 before any."""
        self.drafter.pause(False)  # it may draft: the drafter's upkeep runs again
        w = sum(ALPHA_PRIOR)
        seen = self.accepted + self.rejections
        alpha = self.accepted / seen if seen else ALPHA_PRIOR[0] / w
        return SeqSpec(accepted_w=alpha * w, rejected_w=(1.0 - alpha) * w)

    def _draft_cost(self, base: int, cost: CostModel | None = None) -> float:
        """The drafter's time per drafted token, in target steps of `base` tokens (0 until
        MIN_SAMPLES steady drafting calls are measured)."""
        if len(self._per_token) < MIN_SAMPLES:
            return 0.0
        t = (cost or self.cost).time(base)
        if t is None or t <= 0:
            return 0.0
        if self._per_token_med is None:  # re-read only after a new steady call
            self._per_token_med = statistics.median(self._per_token)
        return self._per_token_med / t

    def plan(
        self, cands: Sequence[Candidate], base: int, extra: int = 0, pipelined: bool = False
    ) -> list[Draft]:
        """The draft of each candidate (empty: a plain one-token decode); `base` is the number
        of tokens the step runs without any drafts. `extra` tokens are drafted before each
        window (a pipelined window's guess of the token its predecessor emits), also where
        the window has no drafts. `pipelined`: the step runs as a pipelined window (its costs
        are `pipe_cost`'s)."""
        cost = self.pipe_cost if pipelined else self.cost
        dc = self._draft_cost(base, cost)
        reqs: list[DraftRequest] = []
        where: list[int] = []
        # the adaptive window needs T(base), the step without drafts, measured first
        measured = cost.samples(base) > 0
        for i, c in enumerate(cands):
            k_max = min(self.k_max, c.room) if measured or not self.adaptive else 0
            if self.adaptive:
                k = choose_k(c.state, cost, base, self.k_min, k_max, dc)
            else:
                k = max(k_max, 0)
            self.k_by_slot[c.slot] = k
            if k + extra > 0:
                reqs.append(DraftRequest(c.slot, c.history, k + extra, c.sampler.params, c.rng))
                where.append(i)
        if self.adaptive and cands and all(c.state.hopeless for c in cands):
            self.drafter.pause(True)
        out = [Draft() for _ in cands]
        if reqs:
            steady = True
            for r in reqs:  # each sequence's history grew by at most its last window
                last = self._called.get(r.slot)
                steady = steady and last is not None and len(r.history) - last[0] <= last[1] + 2
                self._called[r.slot] = (len(r.history), r.k)
            t0 = self._clock()
            drafts = self.drafter.propose_many(reqs)
            dt = self._clock() - t0
            n = sum(r.k for r in reqs)
            self.draft_s += dt
            self.draft_tokens += n
            if steady:
                self._per_token.append(dt / n)
                self._per_token_med = None
            for i, d in zip(where, drafts, strict=True):
                out[i] = d
        return out

    def observe_step(self, n_tokens: int, seconds: float, pipelined: bool = False) -> None:
        """A step of decodes and windows only (no prompt chunk) ran `n_tokens` tokens (a
        pipelined window: `seconds` since the previous verdict)."""
        (self.pipe_cost if pipelined else self.cost).observe(n_tokens, seconds)

    def settle(self, c: Candidate, draft: Draft, rows: np.ndarray[Any, Any]) -> list[SampleResult]:
        """The tokens a window emits; the drafter keeps the accepted prefix."""
        res, acc = verify(c.sampler, rows, draft, c.stops)
        k = len(draft.tokens)
        if k:
            c.state.record(k, acc)
            self.offered += k
            self.accepted += acc
            self.rejections += acc < k
            self.hist[min(acc, self.k_max)] += 1
            # the sequence keeps history + the accepted drafts; the last emitted token is new
            self.drafter.rollback(c.slot, len(c.prompt) + len(c.out) + acc)
        return res

    def release(self, slot: int) -> None:
        self._called.pop(slot, None)
        self.drafter.release(slot)

    def stats(self) -> list[Stat]:
        out = [
            Stat("spec_drafts_offered_total", "counter", {}, float(self.offered)),
            Stat("spec_drafts_accepted_total", "counter", {}, float(self.accepted)),
        ]
        out += [
            Stat("spec_windows_total", "counter", {"accepted": str(a)}, float(n))
            for a, n in enumerate(self.hist)
        ]
        out += [
            Stat("spec_verify_cost_ratio", "gauge", {"k": str(k)}, r)
            for k, r in enumerate(self.cost.curve(1, self.k_max))
        ]
        return out

    def info(self) -> dict[str, Any]:
        """For /v1/status: the drafter, the window k each slot chose last (for a running
        sequence: its current one), the counters, the measured cost curve."""
        return {
            "drafter": self.drafter.name,
            "adaptive": self.adaptive,
            "k_min": self.k_min,
            "k_max": self.k_max,
            "k": {str(s): k for s, k in sorted(self.k_by_slot.items())},
            "drafts_offered": self.offered,
            "drafts_accepted": self.accepted,
            "acceptance_histogram": list(self.hist),
            "verify_cost_ratio": self.cost.curve(1, self.k_max),
        }
