"""One chat submission run through the assistant parser into another API's output shape: the
Anthropic route's content blocks, the Responses route's output items. Each shape is a
`Shaper` (a parser part → its stream events; `close` ends the open block or item); this
module runs the loop both routes share, streamed and not."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Protocol

from starlette.requests import Request

from strata.engine.client import DeadlineExceeded, EngineError, Unavailable
from strata.server.assistant import AssistantParser, Part
from strata.server.generate import Delta, merge
from strata.server.routes import Submitted, engine_error, outcome_of, until_done_or_gone
from strata.server.state import ServerState

ENGINE_ERRORS = (EngineError, DeadlineExceeded, Unavailable)


class Shaper(Protocol):
    def feed(self, ev: Part) -> list[bytes]: ...

    def close(self, finish: str | None = None) -> list[bytes]:
        """End the open block or item (`finish`: the choice's finish reason when it ends the
        answer, "length" for one cut off)."""
        ...


async def shaped_stream(
    sub: Submitted, parser: AssistantParser, shaper: Shaper
) -> AsyncIterator[bytes | Delta]:
    """The shaper's events as the text comes; after the finishing delta's parts (and the
    open block's close), that delta itself."""
    async for d in merge(sub.runs):
        for ev in parser.push(d.text):
            for chunk in shaper.feed(ev):
                yield chunk
        if d.finish is None:
            continue
        for ev in parser.finish():
            for chunk in shaper.feed(ev):
                yield chunk
        for chunk in shaper.close(d.finish):
            yield chunk
        yield d


async def shaped_whole(
    request: Request,
    st: ServerState,
    sub: Submitted,
    parser: AssistantParser,
    shaper: Shaper,
    endpoint: str,
    t0: float,
) -> Delta | None:
    """Runs the submission to its end into `shaper` (not streamed): the finishing delta, or
    None when the client left first (the sequences cancelled). An engine failure is raised
    as its APIError; the request's metrics are recorded either way."""
    last: list[Delta] = []

    async def collect() -> None:
        async for x in shaped_stream(sub, parser, shaper):
            if isinstance(x, Delta):
                last.append(x)

    work = asyncio.create_task(collect())
    if not await until_done_or_gone(request, work, sub.cancel_all):
        st.metrics.request_done(endpoint, "cancelled", t0)
        return None
    err = work.exception()
    if err is not None:
        sub.cancel_all()
        st.metrics.request_done(endpoint, outcome_of(err), t0)
        if isinstance(err, ENGINE_ERRORS):
            raise engine_error(err)
        raise err
    st.metrics.request_done(endpoint, "ok", t0)
    return last[-1]
