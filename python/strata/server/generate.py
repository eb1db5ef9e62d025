"""Turn one engine sequence into text deltas: UTF-8-safe detokenization, stop strings,
log-probabilities, timing metrics; and merge the deltas of a request's sequences (n, batches).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import msgspec

from strata.engine.client import (
    DeadlineExceeded,
    EngineClient,
    EngineError,
    SeqStream,
    Unavailable,
)
from strata.engine.protocol import Finish, Progress, Tokens
from strata.metrics import Metrics, RequestRecord
from strata.server.line_limit import LineLimit
from strata.server.tokenizing import ServerTokenizer
from strata.tokenizer import IncrementalDetokenizer, StopMatcher


@dataclass(slots=True)
class TokenInfo:
    id: int
    text: str
    bytes: list[int]
    logprob: float
    top: list[tuple[str, list[int], float]]  # (token text, bytes, logprob)
    top_ids: list[int] = field(default_factory=list)  # the ids of `top`


@dataclass(slots=True)
class Delta:
    index: int  # choice index
    text: str
    tokens: list[TokenInfo] = field(default_factory=list)
    finish: str | None = None
    output_tokens: int = 0  # set on the finishing delta
    # On the finishing delta, with a VRAM expert tier: (hits, CPU misses, PCIe misses).
    tier: tuple[int, int, int] | None = None
    stop: str | None = None  # on the finishing delta: the stop string that ended the choice
    cached_tokens: int = 0  # on the finishing delta: prompt tokens reused from a KV cache
    # on the finishing delta when the engine speculates: (drafts offered, drafts accepted)
    drafts: tuple[int, int] | None = None
    # on the finishing delta: the prompt's seconds (admission to first token) and the
    # decode's (first token to the end)
    prompt_s: float = 0.0
    decode_s: float = 0.0
    ids: list[int] = field(default_factory=list)  # the tokens this delta's text came from
    slot: int = -1  # on the finishing delta: the engine slot the choice ran in


@dataclass(slots=True)
class FirstToken:
    """Whether a request's first token (of any of its choices) has come."""

    seen: bool = False


@dataclass(slots=True)
class SeqRun:
    client: EngineClient
    tok: ServerTokenizer
    metrics: Metrics
    stream: SeqStream
    index: int
    stops: list[str]
    logprobs: bool
    t_arrival: float
    request_id: str
    endpoint: str
    # shared by a request's choices: its time to first token is observed once, at the first
    # token of any of them (as `strata_request_duration_seconds` is once per request)
    first_token: FirstToken = field(default_factory=FirstToken)
    # llama-server's n_indent / t_max_predict_ms (None: neither asked for)
    limit: LineLimit | None = None

    def _info(self, ev: Tokens) -> list[TokenInfo]:
        if not self.logprobs or ev.logprobs is None:
            return []
        out = []
        for i, tid in enumerate(ev.ids):
            top = [
                (self.tok.decode([t]), list(self.tok.token_bytes(t)), lp)
                for t, lp in (ev.top[i] if ev.top else [])
            ]
            raw = self.tok.token_bytes(tid)
            ids = [t for t, _ in (ev.top[i] if ev.top else [])]
            out.append(TokenInfo(tid, self.tok.decode([tid]), list(raw), ev.logprobs[i], top, ids))
        return out

    async def _finished_after_stop(self, ev: Tokens) -> Tokens:
        """The sequence's finishing event after the server ended it at a stop string: the
        engine's acknowledgement of the abort (or its own finish, had it ended meanwhile),
        whose tokens are past the stop and dropped. `ev` (figures unset) if the engine fails
        or the deadline passes first: the choice's text is whole either way."""
        self.client.stop_early(self.stream)
        try:
            while True:
                nxt = await self.stream.next()
                if isinstance(nxt, Tokens) and nxt.finish is not None:
                    # its figures; not its tokens, logprobs included (past the stop)
                    return msgspec.structs.replace(nxt, ids=[], logprobs=None, top=None)
        except (EngineError, DeadlineExceeded, Unavailable):
            return ev

    async def run(self) -> AsyncIterator[Delta]:
        detok = IncrementalDetokenizer(self.tok, skip_special=True)
        stopm = StopMatcher(self.stops)
        n_out = 0
        first: float | None = None
        last = 0.0
        held: list[int] = []  # ids of text not yet released
        while True:
            ev = await self.stream.next()
            if isinstance(ev, Progress):
                continue
            now = time.monotonic()
            if ev.ids:
                # the token counters move as tokens come, so that sequences that never finish
                # (cancelled, failed, past their deadline) are counted too
                self.metrics.generation_tokens.inc(len(ev.ids))
                if first is None:  # a multi-token first event: the rest came with it
                    first = now
                    if not self.first_token.seen:
                        self.first_token.seen = True
                        self.metrics.ttft.observe(now - self.t_arrival)
                    self.metrics.prompt_tokens.inc(len(self.stream.submit.prompt))
                    extra, gap = len(ev.ids) - 1, 0.0
                else:
                    extra, gap = len(ev.ids), (now - last) / len(ev.ids)
                for _ in range(extra):
                    self.metrics.itl.observe(gap)
                last = now
                n_out += len(ev.ids)
            text = self._release(detok, stopm, ev.ids, first, now)
            finish = ev.finish
            limited = self.limit is not None and self.limit.stopped
            if (stopm.stopped or limited) and finish is None:
                # a stop string or a line limit: the text ends here; the sequence's own
                # figures (cached prompt tokens, expert tier, drafts) come with the engine's
                # finishing event
                if stopm.stopped and self.limit is not None:
                    text += self.limit.flush()  # the text before the stop string is whole
                if text or ev.logprobs:
                    yield Delta(self.index, text, self._info(ev), ids=held + ev.ids)
                    held = []
                else:  # the tokens that completed the stop come with the finishing delta
                    held += ev.ids
                ended: Finish = "stop" if stopm.stopped else "length"
                text, ev, finish = "", await self._finished_after_stop(ev), ended
            if finish is None:
                if text or ev.logprobs:
                    yield Delta(self.index, text, self._info(ev), ids=held + ev.ids)
                    held = []
                else:  # text held back (a partial character or stop string): ids come later
                    held += ev.ids
                continue
            if finish == "error":
                raise EngineError(ev.message or "engine error")
            if finish == "abort" or (finish == "length" and stopm.stopped):
                finish = "stop"  # (a stop string met by the last token allowed ends it too)
            if not stopm.stopped and not limited:
                tail = stopm.feed(detok.flush())[0] + stopm.flush()
                if self.limit is not None:
                    tail = self.limit.feed(tail, _since(first, now))[0] + self.limit.flush()
                text += tail
            if ev.stop_id and not stopm.stopped and not limited:
                n_out += 1  # the end-of-generation token: sampled, counted, never shown
                self.metrics.generation_tokens.inc()
            if first is None:  # finished without a token: its prompt was read all the same
                self.metrics.prompt_tokens.inc(len(self.stream.submit.prompt))
            decode_s = (now - first) if first is not None else 0.0
            self.metrics.record(
                RequestRecord(
                    id=f"{self.request_id}/{self.index}",
                    endpoint=self.endpoint,
                    finish_reason=finish,
                    prompt_tokens=len(self.stream.submit.prompt),
                    cached_tokens=ev.cached_tokens,
                    output_tokens=n_out,
                    ttft_ms=round((first - self.t_arrival) * 1000, 3) if first else None,
                    prompt_ms=round(ev.prompt_s * 1000, 3),
                    decode_ms=round(decode_s * 1000, 3),
                    tokens_per_s=round((n_out - 1) / decode_s, 3) if decode_s > 0 else None,
                    drafts_offered=ev.drafts_offered,
                    drafts_accepted=ev.drafts_accepted,
                    hit_rate=hit_rate(ev),
                    pcie_share=pcie_share(ev),
                )
            )
            yield Delta(
                self.index,
                text,
                self._info(ev),
                finish,
                n_out,
                tier_counts(ev),
                stopm.matched,
                ev.cached_tokens,
                drafts(ev),
                ev.prompt_s,
                decode_s,
                ids=held + ev.ids,
                slot=ev.slot,
            )
            return

    def _release(
        self,
        detok: IncrementalDetokenizer,
        stopm: StopMatcher,
        ids: list[int],
        first: float | None,
        now: float,
    ) -> str:
        """The text of `ids` that may be sent: through the stop strings, and through the line
        limit token by token where there is one (it ends the text at the token it stops)."""
        if self.limit is None:
            return stopm.feed(detok.feed_all(ids))[0]
        out = ""
        for t in ids:
            out += self.limit.feed(stopm.feed(detok.feed(t))[0], _since(first, now))[0]
            if self.limit.stopped or stopm.stopped:
                break
        return out


def _since(first: float | None, now: float) -> float:
    return now - first if first is not None else 0.0


def tier_counts(ev: Tokens) -> tuple[int, int, int] | None:
    h, c, p = ev.expert_hits, ev.expert_miss_cpu, ev.expert_miss_pcie
    return None if h is None or c is None or p is None else (h, c, p)


def drafts(ev: Tokens) -> tuple[int, int] | None:
    o, a = ev.drafts_offered, ev.drafts_accepted
    return None if o is None or a is None else (o, a)


def draft_usage(counts: list[tuple[int, int]]) -> dict[str, int]:
    """`usage` keys beyond OpenAI's when the engine speculates: the choices' drafted tokens
    the model verified (`drafts_offered`) and kept (`drafts_accepted`)."""
    if not counts:
        return {}
    return {
        "drafts_offered": sum(o for o, _ in counts),
        "drafts_accepted": sum(a for _, a in counts),
    }


def usage_extras(counts: list[tuple[int, int, int]]) -> dict[str, float | None]:
    """`usage` keys beyond OpenAI's, from the choices' tier counts: `expert_hit_rate` and
    `pcie_share` (absent on the CPU-only path, where `counts` is empty)."""
    if not counts:
        return {}
    h, c, p = (sum(x) for x in zip(*counts, strict=True))
    return {
        "expert_hit_rate": round(h / (h + c + p), 6) if h + c + p else None,
        "pcie_share": round(p / (c + p), 6) if c + p else None,
    }


def hit_rate(ev: Tokens) -> float | None:
    """Share of the request's routed experts served from VRAM; None without a VRAM tier or
    before any expert was routed."""
    h, c, p = ev.expert_hits, ev.expert_miss_cpu, ev.expert_miss_pcie
    if h is None or c is None or p is None or h + c + p == 0:
        return None
    return round(h / (h + c + p), 6)


def pcie_share(ev: Tokens) -> float | None:
    """Share of the request's missed experts copied over PCIe (the rest ran on the CPU)."""
    c, p = ev.expert_miss_cpu, ev.expert_miss_pcie
    if c is None or p is None or c + p == 0:
        return None
    return round(p / (c + p), 6)


async def merge(runs: list[SeqRun]) -> AsyncIterator[Delta]:
    """Deltas of several sequences as they come; the first error cancels the others."""
    if len(runs) == 1:
        async for d in runs[0].run():
            yield d
        return
    q: asyncio.Queue[Delta | BaseException | None] = asyncio.Queue()

    async def pump(r: SeqRun) -> None:
        try:
            async for d in r.run():
                await q.put(d)
            await q.put(None)
        except Exception as e:  # handed to the consumer, which re-raises it
            await q.put(e)

    tasks = [asyncio.create_task(pump(r)) for r in runs]
    try:
        left = len(runs)
        while left:
            item = await q.get()
            if item is None:
                left -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield item
    finally:
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
