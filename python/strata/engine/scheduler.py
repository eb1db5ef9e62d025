"""The engine's scheduler: slots, FIFO admission, chunked prefill, batched decode, sampling.

One `step()`:
  1. admit waiting sequences (FIFO) into free slots;
  2. each sequence still reading its prompt runs one chunk (`prefill_chunk` tokens, or the
     backend's `prefill_piece`: the hybrid mode's `stream_chunk`); a sequence whose prompt
     is done samples its first token from the last chunk's logits;
  3. every sequence that has a token to feed runs in one batched decode and samples its next.
Sequences end with finish "stop" (an end-of-generation id, not reported as output), "length"
(max_tokens or the context end), "abort" (asked by the server) or "error" (the backend refused).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from strata.engine.backend import Backend
from strata.engine.protocol import Finish, Progress, Submit, Tokens
from strata.sampling import LogitsProcessor, Sampler, SampleResult

Event = Progress | Tokens

# Makes the per-request logits processor (a structured-output constraint) of a request; None
# when the request has none.
ProcessorFactory = Callable[[Submit], LogitsProcessor | None]


@dataclass(slots=True)
class Seq:
    req: Submit
    sampler: Sampler
    stop_ids: frozenset[int]
    slot: int = -1
    done: int = 0  # prompt tokens prefilled
    generated: int = 0  # output tokens sampled (stop ids included)
    pending: int | None = None  # sampled, reported, not yet fed to the model
    t_admit: float = field(default_factory=time.monotonic)
    prompt_s: float = 0.0
    # The backend's VRAM tier counters (hits, CPU misses, PCIe misses) when the sequence got
    # its slot; None without a VRAM tier.
    tier_at_start: tuple[int, int, int] | None = None


class Scheduler:
    def __init__(
        self,
        backend: Backend,
        prefill_chunk: int,
        max_slots: int,
        processors: ProcessorFactory | None = None,
    ) -> None:
        self.backend = backend
        self.chunk = prefill_chunk
        self.waiting: deque[Seq] = deque()
        self.running: dict[int, Seq] = {}  # slot → sequence
        self.free_slots = list(range(min(max_slots, backend.max_slots)))[::-1]
        self.processors = processors

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def _known(self, rid: int) -> bool:
        return any(s.req.rid == rid for s in self.waiting) or any(
            s.req.rid == rid for s in self.running.values()
        )

    def add(self, req: Submit) -> list[Event]:
        """Queue a request; an invalid one ends at once with finish "error"."""
        try:
            if self._known(req.rid):
                raise ValueError(f"request id {req.rid} is already running")
            if not req.prompt:
                raise ValueError("empty prompt")
            if any(not (0 <= t < self.backend.n_vocab) for t in req.prompt):
                raise ValueError(f"prompt token id outside 0..{self.backend.n_vocab - 1}")
            if len(req.prompt) >= self.backend.n_ctx:
                raise ValueError(
                    f"prompt of {len(req.prompt)} tokens leaves no room in the context of "
                    f"{self.backend.n_ctx}"
                )
            if req.max_tokens < 1:
                raise ValueError("max_tokens must be >= 1")
            proc = self.processors(req) if self.processors is not None else None
            sampler = Sampler(req.params, req.prompt, self.backend.n_vocab, proc)
        except ValueError as e:
            return [Tokens(req.rid, [], finish="error", message=str(e))]
        self.waiting.append(Seq(req, sampler, frozenset(req.stop_ids)))
        return []

    def abort(self, rid: int) -> list[Event]:
        for s in self.waiting:
            if s.req.rid == rid:
                self.waiting.remove(s)
                return [Tokens(rid, [], finish="abort")]
        for slot, s in self.running.items():
            if s.req.rid == rid:
                return [self._end(slot, "abort")]
        return []  # already finished: its finish message is on its way

    def _end(
        self,
        slot: int,
        finish: Finish,
        message: str = "",
        ids: list[int] | None = None,
        res: SampleResult | None = None,
    ) -> Tokens:
        s = self.running.pop(slot)
        self.backend.free(slot)
        self.free_slots.append(slot)
        return self._tokens(s, ids or [], res, finish, message)

    def _tier_counts(self) -> tuple[int, int, int] | None:
        """(hits, CPU misses, PCIe misses) of the backend's VRAM tier so far; None without one
        (the CPU-only path, the fake engine)."""
        fn = getattr(self.backend, "tier_counts", None)
        return fn() if fn is not None else None

    def _tokens(
        self,
        s: Seq,
        ids: list[int],
        res: SampleResult | None,
        finish: Finish | None,
        message: str = "",
    ) -> Tokens:
        lp = [res.logprob] if res is not None and res.logprob is not None and ids else None
        top = [res.top] if res is not None and res.top is not None and ids else None
        t = Tokens(
            s.req.rid,
            ids,
            lp,
            top,
            finish,
            message,
            prompt_s=s.prompt_s if finish else 0.0,
        )
        now = self._tier_counts() if finish and s.tier_at_start is not None else None
        if now is not None and s.tier_at_start is not None:
            # The steps this sequence ran in (shared with the other slots' sequences when
            # parallel > 1: a step's experts serve the whole batch).
            t.expert_hits, t.expert_miss_cpu, t.expert_miss_pcie = (
                max(0, a - b) for a, b in zip(now, s.tier_at_start, strict=True)
            )
        return t

    def _emit(self, s: Seq, res: SampleResult) -> Tokens:
        """Report a sampled token; end the sequence when it is a stop id or the last one."""
        s.generated += 1
        tok = res.token
        if tok in s.stop_ids:
            return self._end(s.slot, "stop")
        if s.generated >= s.req.max_tokens or len(s.req.prompt) + s.generated >= self.backend.n_ctx:
            return self._end(s.slot, "length", ids=[tok], res=res)
        s.pending = tok
        return self._tokens(s, [tok], res, None)

    def step(self) -> list[Event]:
        events: list[Event] = []
        while self.waiting and self.free_slots:
            s = self.waiting.popleft()
            s.slot = self.free_slots.pop()
            s.tier_at_start = self._tier_counts()
            self.running[s.slot] = s
        # prompt chunks (FIFO order of admission)
        for slot, s in list(self.running.items()):
            if s.done >= len(s.req.prompt):
                continue
            chunk = s.req.prompt[s.done : s.done + self.chunk]
            try:
                logits = self.backend.prefill(slot, chunk, s.done)
            except Exception as e:  # the backend refused: this request fails, the engine goes on
                events.append(self._end(slot, "error", f"prefill failed: {e}"))
                continue
            s.done += len(chunk)
            if s.done < len(s.req.prompt):
                events.append(Progress(s.req.rid, s.done, len(s.req.prompt)))
                continue
            s.prompt_s = time.monotonic() - s.t_admit
            events.append(self._emit(s, s.sampler.sample(logits)))
        # one batched decode for every sequence with a token to feed
        batch = [
            (slot, s)
            for slot, s in self.running.items()
            if s.pending is not None and s.done >= len(s.req.prompt)
        ]
        if batch:
            slots = [slot for slot, _ in batch]
            feed = [s.pending for _, s in batch]
            for _, s in batch:
                s.pending = None
            try:
                logits = self.backend.decode(slots, feed)  # type: ignore[arg-type]  # [B, V]
            except Exception as e:  # the backend refused: this request fails, the engine goes on
                for slot in slots:
                    events.append(self._end(slot, "error", f"decode failed: {e}"))
                return events
            for b, (_, s) in enumerate(batch):
                events.append(self._emit(s, s.sampler.sample(logits[b])))
        return events
