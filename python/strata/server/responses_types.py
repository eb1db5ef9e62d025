"""OpenAI Responses API request shape (msgspec) and its translation into an OpenAI chat request
body, so that `POST /v1/responses` runs the very path `/v1/chat/completions` runs (template,
tools, constraints, reasoning split, sampling, slots, metrics), as the Anthropic route does.

Translation (Responses → chat):
- `instructions` → a leading system message; `input` text → one user message;
- `input` items: messages (`role` user / assistant / system / developer; content text or
  `input_text` / `output_text` parts) → messages; `function_call` items → the assistant's
  `tool_calls` (consecutive ones, and a message just before them, make one assistant turn);
  `function_call_output` → `tool` messages; a `reasoning` item's text (its `content`, else its
  `summary`) → the next assistant turn's `reasoning_content`;
- `tools[i]` {type function, name, description, parameters, strict} → function tools;
  `tool_choice` auto / none / required / {type function, name} carry over;
- `text.format` text / json_object / json_schema {name, schema, strict} → `response_format`;
- `reasoning.effort` → `reasoning_effort`; `max_output_tokens` → `max_tokens`;
  `temperature`, `top_p`, `parallel_tool_calls`, `stream` carry over.
Accepted and ignored (nothing a local server does differs): `metadata`, `user`, `store`
(nothing is stored: the response says `store: false`), `service_tier`, `prompt_cache_key`,
`safety_identifier`, `stream_options`, `reasoning.summary` (the reasoning comes whole, as
`content`), `include` of `reasoning.encrypted_content` (nothing is encrypted: the reasoning
item carries its text). Refused with a 400 naming the field: `previous_response_id` and
`conversation` (no response is kept: send the whole conversation), `background`, images,
files and audio, tools other than functions, `include` of anything else, `truncation` auto,
`top_logprobs`, `max_tool_calls`, `text.verbosity`.
"""

from __future__ import annotations

import re
from typing import Any

import msgspec

from strata.server.openai_types import APIError


class _Strict(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    pass


class TextConfig(_Strict):
    format: dict[str, Any] | None = None
    verbosity: str | None = None


class ReasoningConfig(_Strict):
    effort: str | None = None
    summary: str | None = None
    generate_summary: str | None = None  # the older name of `summary`


class ResponsesRequest(_Strict):
    input: str | list[Any]
    model: str | None = None
    instructions: str | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stream: bool = False
    tools: list[Any] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    reasoning: ReasoningConfig | None = None
    include: list[str] | None = None
    truncation: str | None = None
    top_logprobs: int | None = None
    max_tool_calls: int | None = None
    previous_response_id: str | None = None
    conversation: Any = None
    background: bool | None = None
    # accepted and ignored
    store: bool | None = None
    metadata: dict[str, Any] | None = None
    user: str | None = None
    service_tier: str | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None
    stream_options: dict[str, Any] | None = None


INCLUDE_OK = frozenset({"reasoning.encrypted_content"})
EFFORTS = {"minimal": "minimal", "low": "low", "medium": "medium", "high": "high"}


def _bad(param: str, why: str) -> APIError:
    return APIError(400, f"{param}: {why}", param=param)


def _text(content: Any, where: str, kinds: tuple[str, ...]) -> str:
    """A message's content (text, or text parts of `kinds`) as one text."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _bad(f"{where}.content", "must be text or an array of content parts")
    out = []
    for j, p in enumerate(content):
        kind = p.get("type") if isinstance(p, dict) else None
        if kind not in kinds or not isinstance(p.get("text"), str):
            what = kind if isinstance(kind, str) else "this"
            raise _bad(f"{where}.content[{j}]", f"{what} parts are not supported (text only)")
        out.append(p["text"])
    return "".join(out)


def _reasoning_text(item: dict[str, Any], where: str) -> str:
    for key in ("content", "summary"):
        parts = item.get(key)
        if parts:
            if not isinstance(parts, list):
                raise _bad(f"{where}.{key}", "must be an array")
            return "".join(str(p.get("text", "")) for p in parts if isinstance(p, dict))
    return ""


class _Turns:
    """Chat messages built from the input items, with each one's origin (`input[i]`)."""

    def __init__(self) -> None:
        self.msgs: list[dict[str, Any]] = []
        self.origins: list[str] = []
        self.reasoning = ""  # a reasoning item's text, for the next assistant turn

    def add(self, msg: dict[str, Any], where: str) -> None:
        if msg["role"] == "assistant" and self.reasoning:
            msg["reasoning_content"], self.reasoning = self.reasoning, ""
        self.msgs.append(msg)
        self.origins.append(where)

    def call(self, item: dict[str, Any], where: str) -> None:
        for k in ("call_id", "name", "arguments"):
            if not isinstance(item.get(k), str):
                raise _bad(f"{where}.{k}", "required (a string)")
        call = {
            "id": item["call_id"],
            "type": "function",
            "function": {"name": item["name"], "arguments": item["arguments"]},
        }
        last = self.msgs[-1] if self.msgs else None
        if last is not None and last["role"] == "assistant" and not self.reasoning:
            last.setdefault("tool_calls", []).append(call)  # the same assistant turn
        else:
            self.add({"role": "assistant", "content": None, "tool_calls": [call]}, where)


# the fields each input item kind takes (`id`, `status` and a message's `phase`: as the API
# and its SDK echo them back)
ITEM_FIELDS = {
    "message": {"type", "role", "content", "id", "status", "phase"},
    "function_call": {"type", "call_id", "name", "arguments", "id", "status"},
    "function_call_output": {"type", "call_id", "output", "id", "status"},
    "reasoning": {"type", "id", "summary", "content", "encrypted_content", "status"},
}


def _item(turns: _Turns, item: Any, where: str) -> None:
    if not isinstance(item, dict):
        raise _bad(where, "must be an object (a message or an item)")
    kind = item.get("type", "message")
    if not isinstance(kind, str):
        raise _bad(f"{where}.type", "must be a string")
    extra = set(item) - ITEM_FIELDS.get(kind, set(item))
    if extra:
        raise _bad(f"{where}.{sorted(extra)[0]}", "unknown field")
    if kind == "message":
        role = item.get("role")
        if role not in ("user", "assistant", "system", "developer"):
            raise _bad(f"{where}.role", "must be user, assistant, system or developer")
        kinds = ("output_text", "refusal") if role == "assistant" else ("input_text",)
        parts = item.get("content")
        if role == "assistant" and isinstance(parts, list):
            parts = [
                {"type": "output_text", "text": p.get("refusal", "")}
                if isinstance(p, dict) and p.get("type") == "refusal"
                else p
                for p in parts
            ]
        turns.add({"role": role, "content": _text(parts, where, kinds)}, where)
    elif kind == "function_call":
        turns.call(item, where)
    elif kind == "function_call_output":
        if not isinstance(item.get("call_id"), str):
            raise _bad(f"{where}.call_id", "required (a string)")
        out = item.get("output")
        text = out if isinstance(out, str) else _text(out, where, ("input_text",))
        turns.add({"role": "tool", "tool_call_id": item["call_id"], "content": text}, where)
    elif kind == "reasoning":
        turns.reasoning += _reasoning_text(item, where)
    else:
        raise _bad(f"{where}.type", f"{kind!r} items are not supported")


def _tools(req: ResponsesRequest) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if req.tools is not None:
        fns = []
        for i, t in enumerate(req.tools):
            if not isinstance(t, dict) or t.get("type") != "function":
                kind = t.get("type") if isinstance(t, dict) else None
                raise _bad(f"tools[{i}].type", f"only function tools are supported (got {kind!r})")
            extra = set(t) - {"type", "name", "description", "parameters", "strict"}
            if extra:
                raise _bad(f"tools[{i}].{sorted(extra)[0]}", "unknown field")
            fn = {k: t[k] for k in ("name", "description", "parameters", "strict") if k in t}
            fns.append({"type": "function", "function": fn})
        out["tools"] = fns
    tc = req.tool_choice
    if isinstance(tc, dict):
        if tc.get("type") != "function" or set(tc) - {"type", "name"}:
            raise _bad("tool_choice", 'a named choice is {"type": "function", "name": …}')
        if not isinstance(tc.get("name"), str):
            raise _bad("tool_choice.name", "required (a string)")
        out["tool_choice"] = {"type": "function", "function": {"name": tc.get("name")}}
    elif tc is not None:
        out["tool_choice"] = tc
    if req.parallel_tool_calls is not None:
        out["parallel_tool_calls"] = req.parallel_tool_calls
    return out


def _refused(req: ResponsesRequest) -> None:
    if req.previous_response_id is not None or req.conversation is not None:
        name = "previous_response_id" if req.previous_response_id is not None else "conversation"
        raise _bad(name, "not supported: no response is kept here; send the whole conversation")
    if req.background:
        raise _bad("background", "not supported")
    for name in ("top_logprobs", "max_tool_calls"):
        if getattr(req, name) is not None:
            raise _bad(name, "not supported")
    if req.truncation not in (None, "disabled"):
        raise _bad("truncation", "only disabled (a prompt past the context is a 400)")
    bad = sorted(set(req.include or []) - INCLUDE_OK)
    if bad:
        raise _bad("include", f"{bad[0]!r} is not supported")
    if req.text is not None and req.text.verbosity is not None:
        raise _bad("text.verbosity", "not supported")


def to_chat_body(req: ResponsesRequest, origins: list[str]) -> dict[str, Any]:
    """The chat request body that asks for what `req` asks for (see the module doc); a 400
    naming the Responses field for what cannot be translated. `origins` gets each chat
    message's field ("instructions", "input", "input[i]") for `responses_names`."""
    _refused(req)
    turns = _Turns()
    if req.instructions:
        turns.add({"role": "system", "content": req.instructions}, "instructions")
    if isinstance(req.input, str):
        turns.add({"role": "user", "content": req.input}, "input")
    else:
        if not req.input:
            raise _bad("input", "must be text or a non-empty array of items")
        for i, item in enumerate(req.input):
            _item(turns, item, f"input[{i}]")
    origins[:] = turns.origins
    body: dict[str, Any] = {"messages": turns.msgs, "stream": req.stream, **_tools(req)}
    if req.max_output_tokens is not None:
        body["max_tokens"] = req.max_output_tokens
    for k in ("temperature", "top_p"):
        if getattr(req, k) is not None:
            body[k] = getattr(req, k)
    fmt = req.text.format if req.text is not None else None
    if fmt is not None:
        kind = fmt.get("type")
        if kind in ("text", "json_object"):
            extra = set(fmt) - {"type"}
            if extra:
                raise _bad(f"text.format.{sorted(extra)[0]}", "unknown field")
            body["response_format"] = {"type": kind}
        elif kind == "json_schema":
            js = {k: v for k, v in fmt.items() if k != "type"}
            body["response_format"] = {"type": "json_schema", "json_schema": js}
        else:
            raise _bad("text.format.type", "must be text, json_object or json_schema")
    effort = req.reasoning.effort if req.reasoning is not None else None
    if effort is not None:
        if effort not in EFFORTS:
            raise _bad("reasoning.effort", f"must be one of {', '.join(EFFORTS)}")
        body["reasoning_effort"] = EFFORTS[effort]
    return body


_MSG = re.compile(r"\bmessages\[(\d+)\]")
_TOOL = re.compile(r"\btools\[(\d+)\]\.function\.")
_NAMES = (
    ("response_format.json_schema", "text.format"),
    ("response_format", "text.format"),
    ("max_tokens", "max_output_tokens"),
    ("reasoning_effort", "reasoning.effort"),
)


def responses_names(e: APIError, origins: list[str]) -> APIError:
    """`e`, raised on the translated request, with the Responses request's field names."""

    def rename(text: str) -> str:
        text = _MSG.sub(
            lambda m: origins[int(m.group(1))] if int(m.group(1)) < len(origins) else m[0], text
        )
        text = _TOOL.sub(lambda m: f"tools[{m.group(1)}].", text)
        for old, new in _NAMES:
            text = text.replace(old, new)
        return text

    param = rename(e.param) if e.param else e.param
    return APIError(e.status, rename(e.message), param, e.code, e.type, e.headers)
