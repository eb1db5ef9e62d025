"""Anthropic Messages API: `POST /v1/messages` and `POST /v1/messages/count_tokens`.

A request is translated into an OpenAI chat request (`anthropic_types.to_chat_body`) and run
through the chat route's own preparation (`routes.chat_prompt`: template, tools, constraint,
plan) and submission (`routes.submit`: same slots, queue, metrics), so the two APIs cannot
drift apart. Only the output is shaped here: the choice's text, split by the chat path's
`AssistantParser` into reasoning / content / tool calls, becomes thinking / text / tool_use
content blocks; streamed, the events are Anthropic's sequence

    message_start, ping, (content_block_start, content_block_delta*, content_block_stop)*,
    message_delta (stop_reason, usage.output_tokens), message_stop

with `text_delta`, `thinking_delta` and `input_json_delta` deltas. Errors take Anthropic's
shape (`APIError.anthropic_body`), before the stream as an HTTP error, after its head as an
`error` event. Blocks open when their first piece arrives, so an answer with no text has no
text block (as Anthropic's own API does).
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from strata.server import sse
from strata.server.anthropic_types import (
    CountTokensRequest,
    MessagesRequest,
    anthropic_names,
    to_chat_body,
)
from strata.server.assistant import AssistantParser, Part
from strata.server.chat import ChatSetup
from strata.server.generate import Delta
from strata.server.openai_types import Plan, convert
from strata.server.routes import (
    Submitted,
    engine_error,
    outcome_of,
    read_json,
    submit,
)
from strata.server.shaped import ENGINE_ERRORS, shaped_stream, shaped_whole, translated_chat
from strata.server.state import ServerState

ENDPOINT = "messages"  # the metrics label


def _state(request: Request) -> ServerState:
    st: ServerState = request.app.state.strata
    return st


def _stop(d: Delta, called: bool) -> dict[str, Any]:
    """`stop_reason` and `stop_sequence` of a finished choice."""
    if d.finish == "length":  # cut off, a call among what came before or not
        reason = "max_tokens"
    elif called:
        reason = "tool_use"
    elif d.stop is not None:
        reason = "stop_sequence"
    else:
        reason = "end_turn"
    return {"stop_reason": reason, "stop_sequence": d.stop if reason == "stop_sequence" else None}


def _arguments(text: str) -> Any:
    """A call's arguments as the `input` object. The parser releases only calls that parse,
    except a streamed call whose block broke after it started: its text so far is kept as
    `{"_raw": text}` rather than dropped."""
    try:
        obj = json.loads(text) if text else {}
    except json.JSONDecodeError:
        return {"_raw": text}
    return obj if isinstance(obj, dict) else {"_raw": text}


class Blocks:
    """Events (thinking / text / tool call) → Anthropic content blocks, and the stream events
    that build them. A block of the same kind as the open one continues it. `omit_thinking`
    (`thinking.display: "omitted"`): thinking blocks come with an empty `thinking` text."""

    def __init__(self, omit_thinking: bool = False) -> None:
        self.omit_thinking = omit_thinking
        self.content: list[dict[str, Any]] = []
        self.open: str | None = None  # kind of the last block while it is open
        self.called = False
        self.args = ""  # the open tool_use block's arguments text so far

    def _start(self, block: dict[str, Any]) -> bytes:
        self.content.append(block)
        self.open = block["type"]
        return sse.named_event(
            "content_block_start",
            {
                "type": "content_block_start",
                "index": len(self.content) - 1,
                "content_block": dict(block),
            },
        )

    def _delta(self, delta: dict[str, Any]) -> bytes:
        i = len(self.content) - 1
        return sse.named_event(
            "content_block_delta", {"type": "content_block_delta", "index": i, "delta": delta}
        )

    def close(self, finish: str | None = None) -> list[bytes]:
        if self.open is None:
            return []
        self.open = None
        i = len(self.content) - 1
        return [sse.named_event("content_block_stop", {"type": "content_block_stop", "index": i})]

    def feed(self, ev: Part) -> list[bytes]:
        """One parser part → the stream events it makes. Tool calls come whole ("call"), or,
        from an incremental parser, as "call_start", "call_args" pieces (each an
        `input_json_delta`) and a closing "call"."""
        kind, value = ev
        out: list[bytes] = []
        if kind in ("call_start", "call"):
            call: Any = value  # a ToolCall: name, arguments (JSON text), id
            started = self.open == "tool_use"
            if not started:
                out += self.close()
                self.called = True
                self.args = ""
                block = {"type": "tool_use", "id": "toolu_" + call.id.split("_")[-1]}
                out.append(self._start({**block, "name": call.name, "input": {}}))
            if kind == "call_start":
                return out
            if not started and call.arguments:
                out += self.feed(("call_args", call.arguments))
            self.content[-1]["input"] = _arguments(self.args)
            return out + self.close()
        if kind == "call_args":
            self.args += value
            return [self._delta({"type": "input_json_delta", "partial_json": value})]
        if not value:
            return out
        btype, field, dtype = (
            ("thinking", "thinking", "thinking_delta")
            if kind == "reasoning"
            else ("text", "text", "text_delta")
        )
        if self.open != btype:
            out += self.close()
            init = {"type": btype, field: ""}
            if btype == "thinking":
                init["signature"] = ""  # no signature: nothing here signs its reasoning
            out.append(self._start(init))
        if btype == "thinking" and self.omit_thinking:
            return out
        self.content[-1][field] += value
        out.append(self._delta({"type": dtype, field: value}))
        return out


def _message(
    rid: str, model: str, content: list[dict[str, Any]], input_tokens: int
) -> dict[str, Any]:
    return {
        "id": rid,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": input_tokens, "output_tokens": 0},
    }


async def _prepare(request: Request, cls: type[Any]) -> tuple[Any, list[int], Plan, ChatSetup]:
    st = _state(request)
    # Anthropic's own fields only: OpenAI's ignored and refused ones are unknown here (its
    # `metadata` and `service_tier` are fields of the request shape)
    areq = convert(await read_json(request), cls, frozenset(), {})
    st.check_model(areq.model)
    _, tok = st.ready()
    origins: list[str] = []
    body = to_chat_body(areq, origins)
    ids, plan, setup = await translated_chat(st, tok, body, lambda e: anthropic_names(e, origins))
    return areq, ids, plan, setup


async def count_tokens(request: Request) -> Response:
    _, ids, _, _ = await _prepare(request, CountTokensRequest)
    return JSONResponse({"input_tokens": len(ids)})


async def messages(request: Request) -> Response | sse.SSEResponse:
    t0 = time.monotonic()
    st = _state(request)
    areq, ids, plan, setup = await _prepare(request, MessagesRequest)
    client, tok = st.ready()
    rid = "msg_" + secrets.token_hex(12)
    sub = submit(st, client, tok, ENDPOINT, [ids], plan, t0, rid, "messages")
    head = _message(rid, st.model_id, [], len(ids))
    if areq.stream:
        parser = setup.parser(incremental=True)  # tool_use input streams as it is written
        stream = _stream(st, sub, parser, head, Blocks(_omits(areq)), t0)
        return sse.SSEResponse(stream, sub.cancel_all)
    return await _complete(request, st, sub, setup.parser(), head, Blocks(_omits(areq)), t0)


def _omits(areq: Any) -> bool:
    th = areq.thinking
    return th is not None and th.display == "omitted"


async def _stream(
    st: ServerState,
    sub: Submitted,
    events: AssistantParser,
    head: dict[str, Any],
    blocks: Blocks,
    t0: float,
) -> AsyncIterator[bytes]:
    outcome = "cancelled"
    try:
        yield sse.named_event("message_start", {"type": "message_start", "message": head})
        yield sse.named_event("ping", {"type": "ping"})
        async for x in shaped_stream(sub, events, blocks):
            if not isinstance(x, Delta):
                yield x
                continue
            delta = _stop(x, blocks.called)
            yield sse.named_event(
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": delta,
                    # cumulative, as Anthropic's: the prompt's cache reads are known by now
                    "usage": _usage(head["usage"]["input_tokens"], x),
                },
            )
        yield sse.named_event("message_stop", {"type": "message_stop"})
        outcome = "ok"
    except ENGINE_ERRORS as e:
        outcome = outcome_of(e)
        yield sse.named_event("error", engine_error(e).anthropic_body())
    finally:
        st.metrics.request_done(ENDPOINT, outcome, t0)


async def _complete(
    request: Request,
    st: ServerState,
    sub: Submitted,
    events: AssistantParser,
    head: dict[str, Any],
    blocks: Blocks,
    t0: float,
) -> Response:
    d = await shaped_whole(request, st, sub, events, blocks, ENDPOINT, t0)
    if d is None:
        return Response(status_code=499)
    body = dict(head, content=blocks.content)
    body.update(_stop(d, blocks.called))
    body["usage"] = _usage(head["usage"]["input_tokens"], d)
    return JSONResponse(body)


def _usage(prompt_tokens: int, d: Delta) -> dict[str, int]:
    """Anthropic's usage: the prompt tokens read from the (automatic) prefix cache apart from
    the ones read anew, as llama-server reports them."""
    return {
        "input_tokens": prompt_tokens - d.cached_tokens,
        "cache_read_input_tokens": d.cached_tokens,
        "output_tokens": d.output_tokens,
    }


routes = [
    Route("/v1/messages", messages, methods=["POST"]),
    Route("/v1/messages/count_tokens", count_tokens, methods=["POST"]),
]
