"""Another API on the chat path: its request, translated into a chat body, prepared as the
chat route prepares one (`translated_chat`), and the submission's text run through the
assistant parser into that API's output shape — the Anthropic route's content blocks, the
Responses route's output items. Each shape is a `Shaper` (a parser part → its stream events;
`close` ends the open block or item); this module runs the loop both routes share, streamed
and not."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

from starlette.requests import Request

from strata.engine.client import DeadlineExceeded, EngineError, Unavailable
from strata.server.assistant import AssistantParser, Part
from strata.server.chat import ChatSetup
from strata.server.generate import Delta, merge
from strata.server.openai_types import APIError, ChatRequest, Plan, convert
from strata.server.routes import (
    Submitted,
    chat_prompt,
    engine_error,
    outcome_of,
    until_done_or_gone,
)
from strata.server.state import ServerState
from strata.server.tokenizing import ServerTokenizer

ENGINE_ERRORS = (EngineError, DeadlineExceeded, Unavailable)


async def translated_chat(
    st: ServerState,
    tok: ServerTokenizer,
    body: dict[str, Any],
    rename: Callable[[APIError], APIError],
) -> tuple[list[int], Plan, ChatSetup]:
    """The prompt ids, plan and setup of `body` (another API's request as a chat request
    body), as the chat route makes them; a 400 raised there is renamed by `rename` to the
    fields the original request named."""
    try:
        creq: ChatRequest = convert({"model": st.model_id, **body}, ChatRequest)
        return await chat_prompt(st, tok, creq)
    except APIError as e:
        raise rename(e) from None


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
