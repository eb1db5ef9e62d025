"""Anthropic Messages API request shapes (msgspec) and their translation into an OpenAI chat
request body, so that `/v1/messages` runs the very path `/v1/chat/completions` runs (template,
tools, constraints, reasoning split, sampling, slots, metrics) instead of a second copy of it.

Every field Anthropic documents for `POST /v1/messages` is either translated or refused with a
400 naming it; an unknown field is a 400 too. Accepted and ignored (they change nothing a local
server does): `metadata`, `service_tier`, `cache_control` (on the request, blocks and tools),
`citations` on text blocks, `signature` on thinking blocks.

Translation (Anthropic → OpenAI):
- `system` (text or text blocks) → a leading system message;
- a user message's `tool_result` blocks → `tool` messages (in order, before the user's text);
- an assistant message's `tool_use` blocks → `tool_calls` (arguments as JSON text), its
  `thinking` blocks → `reasoning_content`;
- `tools[i]` {name, description, input_schema} → function tools; `tool_choice` auto / any /
  tool / none → "auto" / "required" / the named function / "none";
  `disable_parallel_tool_use` → `parallel_tool_calls: false`;
- `thinking` enabled / adaptive / disabled → `chat_template_kwargs.enable_thinking` true /
  true / false (absent: the template's default). `budget_tokens` (>= 1, below `max_tokens`)
  → `reasoning_budget_tokens`: the thinking block's close is forced when it is spent
  (`strata.reasoning_budget`, llama.cpp's reasoning budget). `display: "omitted"` gives the thinking
  blocks with an empty `thinking` text (the route's `Blocks`).
- `output_config.format` (a JSON schema) → `response_format` `json_schema` (the answer is
  constrained to it); `output_config.effort` → `reasoning_effort` (xhigh and max → high);
- `max_tokens`, `stop_sequences`, `temperature`, `top_p`, `top_k`, `stream` carry over.
Image and document blocks, server tools (`type` other than "custom") and a final assistant
message (prefill: the template cannot continue a turn) are 400s. `temperature` takes the
server's range 0..100, as the OpenAI routes do (Anthropic's is 0..1).
"""

from __future__ import annotations

import json
import re
from typing import Any, Literal

import msgspec

from strata.server.openai_types import APIError, check_stops


class _Strict(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    pass


class _Block(_Strict, tag_field="type"):
    pass


class TextBlock(_Block, tag="text"):
    text: str
    cache_control: dict[str, Any] | None = None
    citations: list[Any] | None = None


class ImageBlock(_Block, tag="image"):
    source: Any
    cache_control: dict[str, Any] | None = None


class DocumentBlock(_Block, tag="document"):
    source: Any
    title: str | None = None
    context: str | None = None
    citations: Any = None
    cache_control: dict[str, Any] | None = None


class ToolUseBlock(_Block, tag="tool_use"):
    id: str
    name: str
    input: dict[str, Any]
    cache_control: dict[str, Any] | None = None


class ToolResultBlock(_Block, tag="tool_result"):
    tool_use_id: str
    content: str | list[TextBlock | ImageBlock | DocumentBlock] | None = None
    is_error: bool = False
    cache_control: dict[str, Any] | None = None


class ThinkingBlock(_Block, tag="thinking"):
    thinking: str
    signature: str = ""


class RedactedThinkingBlock(_Block, tag="redacted_thinking"):
    data: str


Block = (
    TextBlock
    | ImageBlock
    | DocumentBlock
    | ToolUseBlock
    | ToolResultBlock
    | ThinkingBlock
    | RedactedThinkingBlock
)


class Message(_Strict):
    role: Literal["user", "assistant"]
    content: str | list[Block]


class Tool(_Strict):
    name: str
    input_schema: dict[str, Any] | None = None
    description: str | None = None
    type: str | None = None  # "custom" (or absent); anything else is a server tool
    cache_control: dict[str, Any] | None = None
    strict: bool | None = None


class ToolChoice(_Strict):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class Thinking(_Strict):
    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: int | None = None
    display: Literal["summarized", "omitted"] | None = None


class OutputFormat(_Strict):
    type: Literal["json_schema"]
    schema: dict[str, Any]


class OutputConfig(_Strict):
    format: OutputFormat | None = None
    effort: Literal["low", "medium", "high", "xhigh", "max"] | None = None


# Anthropic's effort levels → OpenAI's `reasoning_effort` (the template reads it)
EFFORT = {"low": "low", "medium": "medium", "high": "high", "xhigh": "high", "max": "high"}


class Metadata(_Strict):
    user_id: str | None = None


class CountTokensRequest(_Strict, kw_only=True):
    model: str | None = None  # may be omitted: the served model
    messages: list[Message]
    system: str | list[Block] | None = None  # text blocks only (checked: _texts)
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None
    output_config: OutputConfig | None = None


class MessagesRequest(CountTokensRequest, kw_only=True):
    max_tokens: int
    stop_sequences: list[str] | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    stream: bool = False
    metadata: Metadata | None = None
    service_tier: str | None = None
    cache_control: dict[str, Any] | None = None


def _bad(param: str, why: str) -> APIError:
    return APIError(400, f"{param}: {why}", param=param)


def _texts(blocks: list[Any], where: str) -> str:
    out = []
    for j, b in enumerate(blocks):
        if not isinstance(b, TextBlock):
            raise _bad(f"{where}[{j}]", f"{_kind(b)} blocks are not supported here")
        out.append(b.text)
    return "".join(out)


def _kind(b: Any) -> str:
    return str(type(b).__struct_config__.tag)


def _user(m: Message, i: int) -> list[dict[str, Any]]:
    if isinstance(m.content, str):
        return [{"role": "user", "content": m.content}]
    out: list[dict[str, Any]] = []
    text: list[str] = []
    for j, b in enumerate(m.content):
        where = f"messages[{i}].content[{j}]"
        if isinstance(b, ToolResultBlock):
            c = b.content
            body = c if isinstance(c, str) else _texts(c or [], f"{where}.content")
            if b.is_error:
                body = "Error: " + body
            out.append({"role": "tool", "tool_call_id": b.tool_use_id, "content": body})
        elif isinstance(b, TextBlock):
            text.append(b.text)
        else:
            raise _bad(where, f"{_kind(b)} blocks are not supported in user messages")
    if text:
        out.append({"role": "user", "content": "".join(text)})
    if not out:
        raise _bad(f"messages[{i}].content", "must not be empty")
    return out


def _assistant(m: Message, i: int) -> dict[str, Any]:
    if isinstance(m.content, str):
        return {"role": "assistant", "content": m.content}
    text, thinking, calls = [], [], []
    for j, b in enumerate(m.content):
        where = f"messages[{i}].content[{j}]"
        if isinstance(b, TextBlock):
            text.append(b.text)
        elif isinstance(b, ThinkingBlock):
            thinking.append(b.thinking)
        elif isinstance(b, RedactedThinkingBlock):
            continue  # opaque to any model but the one that wrote it: nothing to render
        elif isinstance(b, ToolUseBlock):
            args = json.dumps(b.input, ensure_ascii=False)
            calls.append(
                {"id": b.id, "type": "function", "function": {"name": b.name, "arguments": args}}
            )
        else:
            raise _bad(where, f"{_kind(b)} blocks are not supported in assistant messages")
    d: dict[str, Any] = {"role": "assistant", "content": "".join(text)}
    if thinking:
        d["reasoning_content"] = "".join(thinking)
    if calls:
        d["tool_calls"] = calls
    return d


def _tools(req: CountTokensRequest) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if req.tools:
        fns = []
        for i, t in enumerate(req.tools):
            if t.type not in (None, "custom"):
                raise _bad(f"tools[{i}].type", f"server tools ({t.type!r}) are not supported")
            if t.input_schema is None:
                raise _bad(f"tools[{i}].input_schema", "required")
            fn: dict[str, Any] = {"name": t.name, "parameters": t.input_schema}
            if t.description:
                fn["description"] = t.description
            fns.append({"type": "function", "function": fn})
        out["tools"] = fns
    tc = req.tool_choice
    if tc is not None:
        if tc.type == "tool":
            if not tc.name:
                raise _bad("tool_choice.name", "required when type is 'tool'")
            out["tool_choice"] = {"type": "function", "function": {"name": tc.name}}
        elif tc.name is not None:
            raise _bad("tool_choice.name", "only with type 'tool'")
        else:
            out["tool_choice"] = {"auto": "auto", "any": "required", "none": "none"}[tc.type]
        if tc.type != "none" and not req.tools:
            raise _bad("tool_choice", "requires tools")
        if tc.disable_parallel_tool_use:
            out["parallel_tool_calls"] = False
    return out


def to_chat_body(req: CountTokensRequest, origins: list[str] | None = None) -> dict[str, Any]:
    """The OpenAI chat request body that asks for what `req` asks for (see the module doc);
    a 400 naming the Anthropic field for what cannot be translated. `origins` (when given)
    gets, for each message of the body, the Anthropic field it came from ("system",
    "messages[i]"): what `anthropic_names` renames a later error's field by."""
    if not req.messages:
        raise _bad("messages", "must be a non-empty array")
    msgs: list[dict[str, Any]] = []
    where: list[str] = [] if origins is None else origins
    where.clear()
    if req.system:
        sys_text = req.system if isinstance(req.system, str) else _texts(req.system, "system")
        if sys_text:
            msgs.append({"role": "system", "content": sys_text})
            where.append("system")
    for i, m in enumerate(req.messages):
        part = _user(m, i) if m.role == "user" else [_assistant(m, i)]
        msgs += part
        where += [f"messages[{i}]"] * len(part)
    if req.messages[-1].role == "assistant":  # Anthropic's "prefill": continue that turn
        raise _bad(
            f"messages[{len(req.messages) - 1}]",
            "a final assistant message (prefill) is not supported; end with a user message",
        )
    body: dict[str, Any] = {"messages": msgs, **_tools(req)}
    th = req.thinking
    if th is not None:
        if th.type == "enabled" and (th.budget_tokens is None or th.budget_tokens < 1):
            raise _bad("thinking.budget_tokens", "required, at least 1, when thinking is enabled")
        if th.type != "enabled" and th.budget_tokens is not None:
            raise _bad("thinking.budget_tokens", "only with type 'enabled'")
        body["chat_template_kwargs"] = {"enable_thinking": th.type != "disabled"}
        if th.type == "enabled":  # the cap is kept (llama.cpp's reasoning budget)
            body["reasoning_budget_tokens"] = th.budget_tokens
    oc = req.output_config
    if oc is not None:
        if oc.format is not None:
            js = {"name": "output", "schema": oc.format.schema, "strict": True}
            body["response_format"] = {"type": "json_schema", "json_schema": js}
        if oc.effort is not None:
            body["reasoning_effort"] = EFFORT[oc.effort]
    if isinstance(req, MessagesRequest):
        if req.max_tokens < 1:
            raise _bad("max_tokens", f"must be at least 1 (got {req.max_tokens})")
        if th is not None and th.budget_tokens is not None and th.budget_tokens >= req.max_tokens:
            raise _bad("thinking.budget_tokens", "must be less than max_tokens")
        stops = req.stop_sequences or []
        check_stops(stops, "stop_sequences")
        body["max_tokens"] = req.max_tokens
        if stops:
            body["stop"] = stops
        for k in ("temperature", "top_p", "top_k"):
            v = getattr(req, k)
            if v is not None:
                body[k] = v
        body["stream"] = req.stream
    return body


_MSG = re.compile(r"\bmessages\[(\d+)\](\.content)?")
_TOOL = re.compile(r"\btools\[(\d+)\]\.function\.")


def anthropic_names(e: APIError, origins: list[str]) -> APIError:
    """`e`, raised on the translated request, with the Anthropic request's field names: a
    message's index as in the request (a system message and expanded tool results shift it;
    a system message's content is `system`), `tools[i].name` for `tools[i].function.name`,
    `output_config.format` for `response_format`."""

    def msg(m: re.Match[str]) -> str:
        i = int(m.group(1))
        if i >= len(origins):
            return m.group(0)
        where = origins[i]
        return where if where == "system" else where + (m.group(2) or "")

    def rename(text: str) -> str:
        text = _MSG.sub(msg, text)
        text = _TOOL.sub(lambda m: f"tools[{m.group(1)}].", text)
        return text.replace("response_format", "output_config.format")

    param = rename(e.param) if e.param else e.param
    return APIError(e.status, rename(e.message), param, e.code, e.type, e.headers)
