"""The engine's scheduler: slots, FIFO admission, continuous batching, sampling.

One `step()`:
  1. admit waiting sequences (FIFO) into free slots, each into the slot that holds the longest
     prefix of its prompt (or restored from the prompt cache; `strata.engine.prefix`);
  2. pack one forward batch: every running sequence's next token, then prompt chunks of the
     admitted ones in admission order (each up to the backend's `prefill_piece`) while the
     batch has fewer than `max_batch_tokens` tokens;
  3. run it (`Backend.forward_batch`: one pass over all of them) and sample: a sequence whose
     prompt is done samples its first token from its last chunk's logits, a decoding one its
     next token.
With a `Speculator` (the `spec` setting), a decoding sequence may run a window instead of its
one token: its last token and k drafted ones in one entry, the verified prefix committed and
the slot's KV cut back to it (`strata.spec`).
A request that arrives joins at the next step; one that finishes or is cancelled leaves at once
(its slot keeps its KV for a later prompt that shares its prefix). Sequences end with finish
"stop" (an end-of-generation id, not reported as output), "length" (max_tokens or the context
end), "abort" (asked by the server) or "error" (the backend refused).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from strata.dry import LazyDry
from strata.engine.backend import Backend, Entry
from strata.engine.prefix import PromptCache, SlotCache
from strata.engine.protocol import Finish, Progress, SlotAction, SlotDone, Stat, Submit, Tokens
from strata.engine.slot_actions import SlotActions
from strata.infill import infill_filter
from strata.sampling import LogitsProcessor, Sampler, SampleResult
from strata.spec.control import SeqSpec
from strata.spec.drafters import Draft
from strata.spec.speculator import Candidate, Speculator

Event = Progress | Tokens
log = logging.getLogger("strata.engine")

# Makes the per-request logits processor (a structured-output constraint) of a request; None
# when the request has none.
ProcessorFactory = Callable[[Submit], LogitsProcessor | None]


@dataclass(slots=True)
class Seq:
    req: Submit
    sampler: Sampler
    stop_ids: frozenset[int]
    slot: int = -1
    done: int = 0  # prompt tokens in the slot's KV (reused or run)
    reused: int = 0  # of them, taken from a slot's or the prompt cache's KV
    generated: int = 0  # output tokens sampled (stop ids included)
    pending: int | None = None  # sampled, reported, not yet fed to the model
    out: list[int] = field(default_factory=list)  # output tokens sampled
    spec: SeqSpec | None = None  # speculation state; None: this sequence never drafts
    draft_rng: np.random.Generator | None = None  # the drafter's draws (sampled requests)
    t_admit: float = field(default_factory=time.monotonic)
    prompt_s: float = 0.0
    # The backend's VRAM tier counters when the sequence got its slot; None without a tier.
    tier_at_start: tuple[int, int, int] | None = None

    def candidate(self, room: int, out: list[int] | None = None) -> Candidate:
        """The sequence as the speculator sees it: `room` drafts at most, `out` its output
        (a pipelined window's guess of it; its own by default)."""
        assert self.spec is not None and self.draft_rng is not None
        return Candidate(
            self.slot,
            self.req.prompt,
            self.out if out is None else out,
            room,
            self.sampler,
            self.spec,
            self.draft_rng,
            self.stop_ids,
        )


@dataclass(frozen=True, slots=True)
class SamplingFailed:
    """A request's sampling raised this step (a bug, or its processor's error): it ends with
    the error, its KV dropped; the engine and the other requests go on."""

    message: str

    @staticmethod
    def of(s: Seq, e: Exception) -> SamplingFailed:
        log.exception("request %d: sampling failed", s.req.rid)
        return SamplingFailed(f"sampling failed: {type(e).__name__}: {e}")


# a step's outcome for one entry: the tokens it emits, None (a prompt chunk), or a failure
Verdict = list[SampleResult] | SamplingFailed | None


# Rows of a pipelined window at most (the GPU path's logit rows of one head block).
WINDOW_ROWS = 64
# Whether to guess is measured: blocks of GUESS_BLOCK steps run serial (the incumbent arm
# until guessing wins) or pipelined with guesses, costed in seconds per emitted token. A
# block's cost follows the text (how many drafts hold there) as much as the arm, so the other
# arm is judged on one block bracketed by the incumbent's blocks just before and after it
# (the same stretch of text), and wins the bracket when cheaper than their mean by more than
# GUESS_MARGIN; two won brackets in a row (the second at once) make it the incumbent. Lost
# brackets space the next out: after GUESS_EXPLORE blocks, the gap doubling to
# GUESS_EXPLORE_MAX. (Comparing against the arms' running averages instead let the stale
# average of a stretch of easy text flip the choice: ~11% of the edit prompt's steps ran
# pipelined where serial steps were cheaper overall, BENCHMARKS 12-07 15:07.)
GUESS_BLOCK = 32
GUESS_EXPLORE = 8
GUESS_EXPLORE_MAX = 512
GUESS_MARGIN = 0.05


@dataclass(slots=True)
class _Window:
    """A step launched as a pipelined window: its entries, their sequences and drafts, and
    (a window drafted on a guess) the token each sequence's previous window must emit."""

    entries: list[Entry]
    seqs: list[Seq]
    drafts: list[Draft]
    guesses: list[int]
    t0: float  # when it was launched


class Scheduler:
    def __init__(
        self,
        backend: Backend,
        prefill_chunk: int,
        max_slots: int,
        max_batch_tokens: int = 512,
        prompt_cache_bytes: int = 0,
        processors: ProcessorFactory | None = None,
        reuse: bool = True,
        cache_reuse: int = 0,
        speculator: Speculator | None = None,
        force_miss: int = 0,
        clock: Callable[[], float] = time.perf_counter,
        model: Callable[[], str] = lambda: "",
    ) -> None:
        self.backend = backend
        # what the guess policy and the drafter's step costs are timed by (tests: a virtual one)
        self._clock = clock
        self.spec = speculator
        self.chunk = prefill_chunk
        # prompt chunks are cut to fit (the caller keeps a hybrid streamed chunk whole by
        # passing at least its length: engine/core.py)
        self.max_batch_tokens = max_batch_tokens
        self.processors = processors
        self.waiting: deque[Seq] = deque()
        self.running: dict[int, Seq] = {}  # slot → sequence, in admission order
        n_slots = min(max_slots, backend.max_slots)
        self.free_slots = list(range(n_slots))
        can_move = all(hasattr(backend, m) for m in ("kv_export", "kv_import"))
        cache = PromptCache(prompt_cache_bytes) if prompt_cache_bytes > 0 and can_move else None
        self.slots = SlotCache(backend, n_slots, cache, reuse, cache_reuse)
        # llama-server's slot save / restore / erase (`model`: the fingerprint of its files)
        self.slot_actions = SlotActions(self.slots, model)
        self.steps = 0
        # pipelined windows: a backend with two in flight, and speculation to draft them
        self.pipelined = speculator is not None and getattr(backend, "pipeline_windows", 1) > 1
        # rows one step takes (the backend's prompt chunk; a hybrid's streamed chunk is longer)
        self.window_rows = min(getattr(backend, "step_rows", prefill_chunk), WINDOW_ROWS)
        self._inflight: _Window | None = None  # launched, its verdict not yet taken
        self._last = 0.0  # when the last pipelined verdict was taken
        self._arm = True  # this block of steps guesses (else: serial steps)
        self._block = [0, 0.0, 0]  # its steps, seconds, emitted tokens
        self._best = False  # the incumbent arm (serial steps until guessing beats them)
        self._probe: float | None = None  # the other arm's block, its bracket not yet closed
        self._prev: float | None = None  # the incumbent's last block (seconds per token)
        self._wins = 0  # brackets in a row that the other arm won
        self._wait = GUESS_EXPLORE  # blocks until the other arm is measured again
        self._gap = GUESS_EXPLORE
        self._t_step = 0.0  # when this step() began
        self.force_miss = force_miss  # TEST-ONLY: every n-th guess made wrong (0: none)
        self.guesses = 0
        self.pipe_windows = 0  # pipelined windows settled
        self.pipe_held = 0  # of them, those whose successor's guess held

    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self._inflight)

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
            if len(req.prompt) >= self.backend.n_ctx_seq:
                raise ValueError(
                    f"prompt of {len(req.prompt)} tokens leaves no room in the context of "
                    f"{self.backend.n_ctx_seq}"
                )
            if req.max_tokens < 1:
                raise ValueError("max_tokens must be >= 1")
            proc = self.processors(req) if self.processors is not None else None
            # llama.cpp's infill sampler where the request names it (llama-server's samplers)
            p = req.params
            stage = infill_filter(self.backend.vocabulary()) if p.infill else None
            # built beside the steps (a new breaker list costs up to seconds)
            dry = LazyDry(self.backend.vocabulary(), p.dry_sequence_breakers) if p.dry else None
            sampler = Sampler(p, req.prompt, self.backend.n_vocab, proc, stage, dry)
        except ValueError as e:
            return [Tokens(req.rid, [], finish="error", message=str(e))]
        s = Seq(req, sampler, frozenset(req.stop_ids))
        # (a mirostat or adaptive-p draw moves its own state: not through a verified window)
        if self.spec is not None and req.params.speculative and not req.params.stateful_draw:
            s.spec = self.spec.new_sequence()
            s.draft_rng = np.random.default_rng([sampler.seed, 0x5EC])
        self.waiting.append(s)
        return []

    def slot_action(self, msg: SlotAction) -> list[SlotDone]:
        """Run a slot action now, or once no request holds its slot (`run_slot_actions`)."""
        self.slot_actions.add(msg)
        return self.run_slot_actions()

    def run_slot_actions(self) -> list[SlotDone]:
        """The waiting slot actions whose slot is free (before the next step admits)."""
        if not self.slot_actions.waiting:
            return []
        busy = set(self.running)
        if self._inflight is not None:  # a window still on the device (an aborted one's too)
            busy.update(s.slot for s in self._inflight.seqs)
        return self.slot_actions.run(busy)

    def abort(self, rid: int) -> list[Event]:
        for s in self.waiting:
            if s.req.rid == rid:
                self.waiting.remove(s)
                return [Tokens(rid, [], finish="abort")]
        for slot, s in self.running.items():
            if s.req.rid == rid:
                return [self._end(slot, "abort")]
        return []  # already finished: its finish message is on its way

    def stats(self) -> list[Stat]:
        """The scheduler's counters for /metrics."""
        out = [
            Stat("engine_steps_total", "counter", {}, float(self.steps)),
        ]
        if self.pipelined:
            out += [
                Stat("pipeline_windows_total", "counter", {}, float(self.pipe_windows)),
                Stat("pipeline_guesses_held_total", "counter", {}, float(self.pipe_held)),
            ]
        if self.spec is not None:
            out += self.spec.stats()
        if self.slots.chunk_reuse > 0:  # --cache-reuse: positions moved instead of run again
            shifted = float(self.slots.shifted_tokens)
            out.append(Stat("kv_shifted_tokens_total", "counter", {}, shifted))
        c = self.slots.cache
        if c is not None:
            out += [
                Stat("prompt_cache_bytes", "gauge", {}, float(c.used)),
                Stat("prompt_cache_capacity_bytes", "gauge", {}, float(c.capacity)),
                Stat("prompt_cache_entries", "gauge", {}, float(len(c))),
                Stat("prompt_cache_saves_total", "counter", {}, float(c.saves)),
                Stat("prompt_cache_restores_total", "counter", {}, float(c.restores)),
                Stat("prompt_cache_evictions_total", "counter", {}, float(c.evictions)),
            ]
        return out

    def info(self) -> dict[str, Any]:
        """For /v1/status: the speculation state and the pipelined windows' counts (None when
        off); for `GET /slots`: each slot's request (its id, or -1) and the positions its KV
        holds."""
        pipe = {"windows": self.pipe_windows, "guesses_held": self.pipe_held}
        return {
            "spec": self.spec.info() if self.spec is not None else None,
            "pipeline": pipe if self.pipelined else None,
            "slots": [
                {
                    "id": i,
                    "id_task": s.req.rid if (s := self.running.get(i)) is not None else -1,
                    "n_past": len(toks),
                }
                for i, toks in enumerate(self.slots.tokens)
            ],
        }

    # -- ending and reporting ------------------------------------------------------------------

    def _end(
        self,
        slot: int,
        finish: Finish,
        message: str = "",
        ids: list[int] | None = None,
        res: list[SampleResult] | None = None,
    ) -> Tokens:
        s = self.running.pop(slot)
        if finish == "error":
            self.slots.lost(slot)
        if self.spec is not None:
            self.spec.release(slot)
        self.free_slots.append(slot)  # its KV stays for the next prompt that shares it
        return self._tokens(s, ids or [], res, finish, message)

    def _tier_counts(self, slot: int) -> tuple[int, int, int] | None:
        """(hits, CPU misses, PCIe misses) of the backend's VRAM tier so far; None without one
        (the CPU-only path, the fake engine)."""
        fn = getattr(self.backend, "tier_counts", None)
        return fn(slot) if fn is not None else None

    def _tokens(
        self,
        s: Seq,
        ids: list[int],
        res: list[SampleResult] | None,
        finish: Finish | None,
        message: str = "",
    ) -> Tokens:
        res = (res or [])[: len(ids)]
        lp = [r.logprob for r in res if r.logprob is not None] if ids else None
        top = [r.top for r in res if r.top is not None] if ids else None
        t = Tokens(s.req.rid, ids, lp or None, top or None, finish, message)
        if not finish:
            return t
        t.prompt_s = s.prompt_s
        t.cached_tokens = s.reused
        t.slot = s.slot
        if s.spec is not None:
            t.drafts_offered, t.drafts_accepted = s.spec.offered, s.spec.accepted
        now = self._tier_counts(s.slot) if s.tier_at_start is not None else None
        if now is not None and s.tier_at_start is not None:
            # this sequence's own routed pairs (its slot's counters over its life)
            t.expert_hits, t.expert_miss_cpu, t.expert_miss_pcie = (
                max(0, a - b) for a, b in zip(now, s.tier_at_start, strict=True)
            )
        return t

    def _emit(self, s: Seq, results: list[SampleResult]) -> Tokens:
        """Report sampled tokens (one, or a verified window's); end the sequence at a stop id
        or the last token it may have."""
        ids: list[int] = []
        for res in results:
            s.generated += 1
            tok = res.token
            if tok in s.stop_ids:
                t = self._end(s.slot, "stop", ids=ids, res=results)
                t.stop_id = True
                return t
            ids.append(tok)
            s.out.append(tok)
            if (
                s.generated >= s.req.max_tokens
                or len(s.req.prompt) + s.generated >= self.backend.n_ctx_seq
            ):
                return self._end(s.slot, "length", ids=ids, res=results)
        s.pending = ids[-1]
        return self._tokens(s, ids, results, None)

    # -- the step ----------------------------------------------------------------------------

    def _admit(self) -> list[Event]:
        events: list[Event] = []
        while self.waiting and self.free_slots:
            s = self.waiting.popleft()
            try:
                slot, reused = self.slots.place(
                    s.req.prompt, self.free_slots, s.req.params.cache_prompt
                )
            except Exception as e:  # the backend refused the KV move: this request fails
                events.append(Tokens(s.req.rid, [], finish="error", message=f"slot: {e}"))
                continue
            self.free_slots.remove(slot)
            s.slot, s.done, s.reused = slot, reused, reused
            s.tier_at_start = self._tier_counts(slot)
            self.running[slot] = s
        return events

    def _drafts(self, decoding: list[Seq]) -> list[Draft]:
        """Each decoding sequence's draft (empty without speculation)."""
        cands: list[Candidate] = []
        where: list[int] = []
        n_ctx = self.backend.n_ctx_seq
        for i, s in enumerate(decoding):
            if self.spec is None or s.spec is None or s.draft_rng is None:
                continue
            assert s.pending is not None
            n = len(s.req.prompt) + s.generated  # positions after the window's first token
            room = min(s.req.max_tokens - s.generated, n_ctx - n) - 1
            cands.append(s.candidate(room))
            where.append(i)
        out = [Draft() for _ in decoding]
        if self.spec is not None and cands:
            # a step the guess policy runs pipelined is priced on the pipelined curve
            pipe = self.pipelined and self._guess_pays()
            plans = self.spec.plan(cands, len(decoding), pipelined=pipe)
            for i, d in zip(where, plans, strict=True):
                out[i] = d
        return out

    def _pack(self) -> tuple[list[Entry], list[Seq], list[Draft]]:
        """The step's batch: decodes (or windows) first, then prompt chunks under
        max_batch_tokens."""
        entries: list[Entry] = []
        decoding = [s for s in self.running.values() if s.pending is not None]
        drafts = self._drafts(decoding)
        for s, d in zip(decoding, drafts, strict=True):
            assert s.pending is not None
            entries.append((s.slot, [s.pending, *d.tokens], "window" if d.tokens else "last"))
        seqs: list[Seq] = list(decoding)
        room = self.max_batch_tokens - sum(len(ids) for _, ids, _ in entries)
        head = True  # the oldest prompt always moves, however many sequences decode
        for s in self.running.values():
            left = len(s.req.prompt) - s.done
            if left <= 0:
                continue
            n = min(left, self.chunk, max(room, 1) if head else room)
            if n <= 0:
                break
            head = False
            want = "last" if n == left else "none"
            entries.append((s.slot, s.req.prompt[s.done : s.done + n], want))
            seqs.append(s)
            room -= n
        return entries, seqs, drafts

    def step(self) -> list[Event]:
        self._t_step = self._clock()
        if self._inflight is not None:
            return self._pipelined([])
        events = self._admit()
        entries, seqs, drafts = self._pack()
        if not entries:
            return events
        t0 = self._clock()
        pipe = self._can_pipeline(entries, seqs, drafts)
        if pipe and self._guess_pays():
            try:
                self.backend.launch_batch(entries)  # type: ignore[attr-defined]
                launched = True
            except Exception as e:  # refused (nothing in flight then): the serial step runs it
                log.warning("pipelined window refused, run as a step: %s", e)
                launched = False
            if launched:
                self._inflight = _Window(entries, seqs, drafts, [], t0)
                return self._pipelined(events)
        try:
            out = self.backend.forward_batch(entries)
        except Exception as e:  # the backend refused: these requests fail, the engine goes on
            return events + self._fail(seqs, e)
        self.steps += 1
        if self.spec is not None and len(entries) == len(drafts):  # no prompt chunk in it
            self.spec.observe_step(sum(len(ids) for _, ids, _ in entries), self._clock() - t0)
        drafts += [Draft() for _ in range(len(entries) - len(drafts))]  # prompt chunks
        results = self._verdicts(entries, seqs, drafts, out)
        if pipe:  # the serial arm of the guess policy: measured like a pipelined window
            self._account(
                self._clock() - self._t_step,
                sum(len(r) for r in results if isinstance(r, list)),
            )
        return events + self._apply(entries, seqs, drafts, out, results)

    def _fail(self, seqs: list[Seq], e: Exception) -> list[Event]:
        return [
            self._end(s.slot, "error", f"forward failed: {e}")
            for s in seqs
            if self.running.get(s.slot) is s
        ]

    def _verdicts(
        self, entries: list[Entry], seqs: list[Seq], drafts: list[Draft], out: list[Any]
    ) -> list[Verdict]:
        """The tokens each decoding sequence's entry emits (a window verified, or one
        sampled); None for a prompt chunk; `SamplingFailed` where sampling raised."""
        res: list[Verdict] = []
        for i, (_, s, logits) in enumerate(zip(entries, seqs, out, strict=True)):
            if s.pending is None:
                res.append(None)
                continue
            assert logits is not None
            try:
                if self.spec is not None and drafts[i].tokens:  # a window
                    res.append(self.spec.settle(s.candidate(0), drafts[i], logits))
                else:
                    res.append([s.sampler.sample(logits)])
            except Exception as e:  # this request ends (`_apply`); the others go on
                res.append(SamplingFailed.of(s, e))
        return res

    def _apply(
        self,
        entries: list[Entry],
        seqs: list[Seq],
        drafts: list[Draft],
        out: list[Any],
        results: list[Verdict],
    ) -> list[Event]:
        """A step's outcome: windows cut back to their accepted prefix, tokens reported,
        prompts advanced."""
        events: list[Event] = []
        for (slot, ids, _), s, logits, d, res in zip(
            entries, seqs, out, drafts, results, strict=True
        ):
            if isinstance(res, SamplingFailed):
                events.append(self._end(slot, "error", res.message))
                continue
            if res is not None:  # a decode, or a window
                keep = len(res) - 1  # the accepted drafts
                if keep < len(d.tokens):  # cut the KV back to the accepted prefix
                    cut = getattr(self.backend, "rollback", self.backend.truncate)
                    cut(slot, len(s.req.prompt) + s.generated + keep)
                self.slots.fed(slot, ids[: 1 + keep])
                s.pending = None
                events.append(self._emit(s, res))
                continue
            self.slots.fed(slot, ids)
            s.done += len(ids)
            if s.done < len(s.req.prompt):
                events.append(Progress(s.req.rid, s.done, len(s.req.prompt)))
                continue
            s.prompt_s = time.monotonic() - s.t_admit
            mark = getattr(self.backend, "checkpoint", None)
            if mark is not None:  # a recurrent slot: the prompt's end, to come back to
                mark(slot)
            log.info(
                "request %d: prompt %d tokens: %d reused + %d read in %.3f s",
                s.req.rid,
                len(s.req.prompt),
                s.reused,
                len(s.req.prompt) - s.reused,
                s.prompt_s,
            )
            assert logits is not None
            try:
                first = s.sampler.sample(logits)
            except Exception as e:
                events.append(self._end(slot, "error", SamplingFailed.of(s, e).message))
                continue
            events.append(self._emit(s, [first]))
        return events

    # -- pipelined windows (`pipeline_windows` 2) ----------------------------------------------

    def _can_pipeline(self, entries: list[Entry], seqs: list[Seq], drafts: list[Draft]) -> bool:
        """Whether this step may run as a pipelined window: the backend has two windows in
        flight, every entry is a speculating sequence's decode or window (no prompt chunk),
        and the step is one small step."""
        return (
            self.pipelined
            and len(entries) == len(drafts)
            and all(s.spec is not None for s in seqs)
            and sum(len(ids) for _, ids, _ in entries) <= self.window_rows
        )

    def _guess_pays(self) -> bool:
        """Whether to run pipelined, launching the next window on a guess: one that holds
        saves its stage 0's time in the next step, one that fails costs it (on the hybrid path
        the CPU pool's share), and the pipeline's books cost the engine's Python time besides;
        the balance depends on the path, the model and how often guesses hold, so it is
        measured against serial steps (`_account`). Always with `force_miss` (the stress
        test's)."""
        return bool(self.force_miss) or self._arm

    def _account(self, seconds: float, tokens: int) -> None:
        """A step that could run pipelined took `seconds` (from step()'s start to its
        verdict) and emitted `tokens`: per block of GUESS_BLOCK steps, the arm's cost per
        token. The incumbent runs; every `_wait` blocks one block of the other arm, which the
        incumbent's next block closes into a bracket (GUESS_BLOCK's comment)."""
        b = self._block
        b[0], b[1], b[2] = b[0] + 1, b[1] + seconds, b[2] + tokens
        if b[0] < GUESS_BLOCK:
            return
        cost = b[1] / max(b[2], 1)
        self._block = [0, 0.0, 0]
        if self._arm != self._best:  # the other arm's block: the incumbent's next closes it
            self._probe, self._arm = cost, self._best
            return
        switched = False
        if self._probe is not None:
            ref = cost if self._prev is None else 0.5 * (self._prev + cost)
            self._wins = self._wins + 1 if self._probe < (1 - GUESS_MARGIN) * ref else 0
            self._probe = None
            if self._wins >= 2:  # the other arm takes over
                self._best, self._wins, switched = not self._best, 0, True
                self._gap = self._wait = GUESS_EXPLORE
            elif self._wins:
                self._wait = 1  # confirm at once
            else:
                self._gap = min(2 * self._gap, GUESS_EXPLORE_MAX)
                self._wait = self._gap
        self._prev = None if switched else cost  # (this block was the old incumbent's)
        self._wait -= 1
        explore = self._wait <= 0 and not switched
        self._arm = (not self._best) if explore else self._best

    def _guess(self, k: _Window) -> _Window | None:
        """Window K+1, drafted before K's verdict on the guess that K is accepted whole: each
        sequence's history runs on through K's drafts, and the drafter's first token stands
        for the token K's verification will emit after them (`guess`). None where a sequence
        cannot go on (it ends in K, or nothing is drafted for it)."""
        assert self.spec is not None
        if self.waiting and self.free_slots:
            return None  # let the pipeline drain: a waiting request is admitted next step
        cands: list[Candidate] = []
        n_ctx = self.backend.n_ctx_seq
        for s, d in zip(k.seqs, k.drafts, strict=True):
            if self.running.get(s.slot) is not s or s.spec is None or s.draft_rng is None:
                return None
            gen = s.generated + len(d.tokens) + 1  # after K, accepted whole
            room = min(s.req.max_tokens - gen, n_ctx - (len(s.req.prompt) + gen))
            if room < 1:
                return None
            out = [*s.out, *d.tokens]  # the guess, then room - 1 drafts at most
            cands.append(s.candidate(room - 1, out))
        plans = self.spec.plan(cands, len(cands), extra=1, pipelined=True)
        entries: list[Entry] = []
        drafts: list[Draft] = []
        guesses: list[int] = []
        self.guesses += 1
        wrong = bool(self.force_miss) and self.guesses % self.force_miss == 0
        for i, (s, p) in enumerate(zip(k.seqs, plans, strict=True)):
            if not p.tokens:
                return None
            g, rest = p.tokens[0], p.tokens[1:]
            if wrong and i == 0:
                g = (g + 1) % self.backend.n_vocab  # TEST-ONLY: this window's guess fails
            entries.append((s.slot, [g, *rest], "window" if rest else "last"))
            drafts.append(Draft(rest, p.q[1:] if p.q is not None else None))
            guesses.append(g)
        if sum(len(ids) for _, ids, _ in entries) > self.window_rows:
            return None
        return _Window(entries, list(k.seqs), drafts, guesses, 0.0)

    def _pipelined(self, events: list[Event]) -> list[Event]:
        """Window K (in flight) to its verdict, with K+1 launched on its guess first; K+1 goes
        on when every sequence's guess held (K accepted whole, the guessed token emitted,
        the sequence not ended), else it is discarded and the next step plans anew."""
        k = self._inflight
        assert k is not None
        nxt = self._guess(k) if self._guess_pays() else None
        launched = False
        if nxt is not None:
            try:
                nxt.t0 = self._clock()
                self.backend.launch_batch(nxt.entries)  # type: ignore[attr-defined]
                launched = True
            except Exception as e:  # refused: K+1 is not run; K still finishes
                log.warning("pipelined window refused: %s", e)
        try:
            out = self.backend.finish_batch()  # type: ignore[attr-defined]
        except Exception as e:  # the backend dropped every window
            self._inflight = None
            return events + self._fail(k.seqs, e)
        self.steps += 1
        # the step's cost as the pipeline runs it: the time since the previous verdict
        now = self._clock()
        assert self.spec is not None
        dt = now - max(k.t0, self._last)
        self.spec.observe_step(sum(len(ids) for _, ids, _ in k.entries), dt, pipelined=True)
        self._last = now
        live = [self.running.get(s.slot) is s for s in k.seqs]  # an aborted one is gone
        keep = [i for i, ok in enumerate(live) if ok]
        ent = [k.entries[i] for i in keep]
        seqs = [k.seqs[i] for i in keep]
        drafts = [k.drafts[i] for i in keep]
        outs = [out[i] for i in keep]
        results = self._verdicts(ent, seqs, drafts, outs)
        held = launched and nxt is not None and all(live)
        held = held and all(isinstance(r, list) for r in results)
        if held:
            assert nxt is not None
            for s, d, res, g in zip(seqs, drafts, results, nxt.guesses, strict=True):
                assert isinstance(res, list)
                toks = [r.token for r in res]
                ends = (
                    any(t in s.stop_ids for t in toks)
                    or s.generated + len(toks) >= s.req.max_tokens
                    or len(s.req.prompt) + s.generated + len(toks) >= self.backend.n_ctx_seq
                )
                held = held and len(toks) == len(d.tokens) + 1 and toks[-1] == g and not ends
        try:
            self.backend.settle(held)  # type: ignore[attr-defined]
        except Exception as e:
            self._inflight = None
            return events + self._fail(k.seqs, e)
        self.pipe_windows += 1
        self.pipe_held += held
        # the step's time to its settlement (a discarded window's books included)
        emitted = sum(len(r) for r in results if isinstance(r, list))
        self._account(self._clock() - self._t_step, emitted)
        self._inflight = nxt if held else None
        return events + self._apply(ent, seqs, drafts, outs, results)
