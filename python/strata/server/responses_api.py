"""OpenAI Responses API: `POST /v1/responses` (and llama-server's `/responses`).

A request is translated into an OpenAI chat request (`responses_types.to_chat_body`) and run
through the chat route's preparation (`routes.chat_prompt`) and submission (`routes.submit`),
as the Anthropic route is, so the APIs cannot drift apart. Only the output is shaped here: the
choice's text, split by the chat path's `AssistantParser`, becomes output items — `reasoning`
(its text as `reasoning_text` content), `message` (one `output_text` part) and
`function_call` — in the order they were generated. Streamed, the events are the Responses
sequence, each with its `sequence_number`:

    response.created, response.in_progress,
    per item: response.output_item.added, (for a message: response.content_part.added,
      response.output_text.delta*, response.output_text.done, response.content_part.done;
      for reasoning: response.reasoning_text.delta*, response.reasoning_text.done;
      for a call: response.function_call_arguments.delta*, .done), response.output_item.done,
    response.completed (or response.incomplete: max_output_tokens reached)

An error before the stream is an HTTP error in OpenAI's shape; after its head, an `error`
event. Nothing is stored (`store: false` in every response).
"""

from __future__ import annotations

import secrets
import time
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from strata.server import sse
from strata.server.assistant import AssistantParser, Part
from strata.server.generate import Delta
from strata.server.openai_types import convert
from strata.server.responses_types import ResponsesRequest, responses_names, to_chat_body
from strata.server.routes import (
    Submitted,
    engine_error,
    outcome_of,
    read_json,
    submit,
)
from strata.server.shaped import ENGINE_ERRORS, shaped_stream, shaped_whole, translated_chat
from strata.server.state import ServerState
from strata.server.tokenizing import ServerTokenizer

ENDPOINT = "responses"  # the metrics label


def _id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


class Items:
    """Parser parts → output items, and the stream events that build them. A part of the
    same kind as the open item continues it."""

    def __init__(self) -> None:
        self.output: list[dict[str, Any]] = []
        self.open: str | None = None  # kind of the last item while it is open
        self.called = False
        self.seq = 0  # the next event's sequence_number

    def event(self, kind: str, **fields: Any) -> bytes:
        data = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return sse.named_event(kind, data)

    def _where(self) -> dict[str, Any]:
        return {"item_id": self.output[-1]["id"], "output_index": len(self.output) - 1}

    def _start(self, item: dict[str, Any]) -> list[bytes]:
        self.output.append(item)
        self.open = item["type"]
        out = [self.event("response.output_item.added", output_index=len(self.output) - 1,
                          item=_snapshot(item, "in_progress"))]  # fmt: skip
        if item["type"] == "message":
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            out.append(self.event("response.content_part.added", **self._where(),
                                  content_index=0, part=part))  # fmt: skip
        return out

    def close(self, finish: str | None = None) -> list[bytes]:
        """Ends the open item: "completed", or "incomplete" when `finish` is "length"."""
        if self.open is None:
            return []
        item, where, out = self.output[-1], self._where(), []
        if item["type"] == "message":
            part = item["content"][0]
            out.append(self.event("response.output_text.done", **where, content_index=0,
                                  text=part["text"], logprobs=[]))  # fmt: skip
            out.append(self.event("response.content_part.done", **where, content_index=0,
                                  part=part))  # fmt: skip
        elif item["type"] == "reasoning":
            out.append(self.event("response.reasoning_text.done", **where, content_index=0,
                                  text=item["content"][0]["text"]))  # fmt: skip
        else:
            out.append(self.event("response.function_call_arguments.done", **where,
                                  name=item["name"], arguments=item["arguments"]))  # fmt: skip
        if "status" in item or item["type"] != "reasoning":
            item["status"] = "incomplete" if finish == "length" else "completed"
        self.open = None
        out.append(self.event("response.output_item.done", output_index=where["output_index"],
                              item=item))  # fmt: skip
        return out

    def feed(self, ev: Part) -> list[bytes]:
        """One parser part → the stream events it makes (tool calls whole, or as
        "call_start", "call_args" pieces and a closing "call")."""
        kind, value = ev
        out: list[bytes] = []
        if kind in ("call_start", "call"):
            started = self.open == "function_call"
            if not started:
                out += self.close()
                self.called = True
                out += self._start({"type": "function_call", "id": _id("fc"),
                                    "call_id": value.id, "name": value.name, "arguments": "",
                                    "status": "in_progress"})  # fmt: skip
            if kind == "call_start":
                return out
            if not started and value.arguments:
                out += self.feed(("call_args", value.arguments))
            return out + self.close()
        if kind == "call_args":
            self.output[-1]["arguments"] += value
            return [self.event("response.function_call_arguments.delta", **self._where(),
                               delta=value)]  # fmt: skip
        if not value:
            return out
        want = "reasoning" if kind == "reasoning" else "message"
        if self.open != want:
            out += self.close()
            if want == "reasoning":
                item = {"type": "reasoning", "id": _id("rs"), "summary": [],
                        "content": [{"type": "reasoning_text", "text": ""}]}  # fmt: skip
            else:
                item = {"type": "message", "id": _id("msg"), "role": "assistant",
                        "status": "in_progress",
                        "content": [{"type": "output_text", "text": "", "annotations": [],
                                     "logprobs": []}]}  # fmt: skip
            out += self._start(item)
        self.output[-1]["content"][0]["text"] += value
        delta = (
            "response.reasoning_text.delta" if want == "reasoning" else "response.output_text.delta"
        )
        extra: dict[str, Any] = {} if want == "reasoning" else {"logprobs": []}
        out.append(self.event(delta, **self._where(), content_index=0, delta=value, **extra))
        return out


def _snapshot(item: dict[str, Any], status: str) -> dict[str, Any]:
    """An item as it is announced: empty content, the given status."""
    out = {**item, "status": status}
    if item["type"] == "message":
        out["content"] = []
    elif item["type"] == "reasoning":
        out["content"] = [{"type": "reasoning_text", "text": ""}]
        out.pop("status")
    return out


def _response(rid: str, req: ResponsesRequest, model: str, status: str) -> dict[str, Any]:
    fmt = req.text.format if req.text is not None and req.text.format else {"type": "text"}
    return {
        "id": rid,
        "object": "response",
        "created_at": int(time.time()),
        "status": status,
        "error": None,
        "incomplete_details": None,
        "instructions": req.instructions,
        "max_output_tokens": req.max_output_tokens,
        "model": model,
        "output": [],
        "parallel_tool_calls": req.parallel_tool_calls is not False,
        "previous_response_id": None,
        "reasoning": {"effort": req.reasoning.effort if req.reasoning else None, "summary": None},
        "store": False,
        "temperature": req.temperature,
        "text": {"format": fmt},
        "tool_choice": req.tool_choice if req.tool_choice is not None else "auto",
        "tools": req.tools or [],
        "top_p": req.top_p,
        "truncation": "disabled",
        "usage": None,
        "metadata": req.metadata or {},
    }


def _finished(
    head: dict[str, Any], items: Items, d: Delta, n_prompt: int, tok: ServerTokenizer
) -> dict[str, Any]:
    out = dict(head, output=items.output)
    if d.finish == "length":
        out["status"] = "incomplete"
        out["incomplete_details"] = {"reason": "max_output_tokens"}
    else:
        out["status"] = "completed"
    # the reasoning's tokens: its text tokenized again (the parser splits text, not tokens)
    thought = "".join(i["content"][0]["text"] for i in items.output if i["type"] == "reasoning")
    out["usage"] = {
        "input_tokens": n_prompt,
        "input_tokens_details": {"cached_tokens": d.cached_tokens},
        "output_tokens": d.output_tokens,
        "output_tokens_details": {
            "reasoning_tokens": min(d.output_tokens, len(tok.encode(thought, False)))
        },
        "total_tokens": n_prompt + d.output_tokens,
    }
    return out


def _state(request: Request) -> ServerState:
    st: ServerState = request.app.state.strata
    return st


async def responses(request: Request) -> Response | sse.SSEResponse:
    t0 = time.monotonic()
    st = _state(request)
    req: ResponsesRequest = convert(await read_json(request), ResponsesRequest, frozenset(), {})
    st.check_model(req.model)
    client, tok = st.ready()
    origins: list[str] = []
    body = to_chat_body(req, origins)
    ids, plan, setup = await translated_chat(st, tok, body, lambda e: responses_names(e, origins))
    rid = _id("resp")
    sub = submit(st, client, tok, ENDPOINT, [ids], plan, t0, rid, "input")
    if req.stream:
        head = _response(rid, req, st.model_id, "in_progress")
        stream = _stream(st, sub, setup.parser(incremental=True), head, (len(ids), tok), t0)
        return sse.SSEResponse(stream, sub.cancel_all)
    head = _response(rid, req, st.model_id, "completed")
    return await _complete(request, st, sub, setup.parser(), head, (len(ids), tok), t0)


async def _stream(
    st: ServerState,
    sub: Submitted,
    parser: AssistantParser,
    head: dict[str, Any],
    prompt: tuple[int, ServerTokenizer],
    t0: float,
) -> AsyncIterator[bytes]:
    outcome = "cancelled"
    items = Items()
    try:
        yield items.event("response.created", response=head)
        yield items.event("response.in_progress", response=head)
        async for x in shaped_stream(sub, parser, items):
            if not isinstance(x, Delta):
                yield x
                continue
            done = _finished(head, items, x, *prompt)
            kind = "response.completed" if done["status"] == "completed" else "response.incomplete"
            yield items.event(kind, response=done)
        outcome = "ok"
    except ENGINE_ERRORS as e:
        outcome = outcome_of(e)
        err = engine_error(e)
        yield items.event("error", code=err.code, message=err.message, param=err.param)
    finally:
        st.metrics.request_done(ENDPOINT, outcome, t0)


async def _complete(
    request: Request,
    st: ServerState,
    sub: Submitted,
    parser: AssistantParser,
    head: dict[str, Any],
    prompt: tuple[int, ServerTokenizer],
    t0: float,
) -> Response:
    items = Items()
    d = await shaped_whole(request, st, sub, parser, items, ENDPOINT, t0)
    if d is None:
        return Response(status_code=499)
    return JSONResponse(_finished(head, items, d, *prompt))


routes = [
    Route("/v1/responses", responses, methods=["POST"]),
    Route("/responses", responses, methods=["POST"]),
]
