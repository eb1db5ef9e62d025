"""Tool calling: the request's tool definitions, the conversation as the chat template wants it,
and the model's tool-call text parsed back into calls (whole or streamed).

Interfaces (shared by the OpenAI and Anthropic routes):
- `ToolSpec.from_openai(obj)`: one `tools[i]` entry, validated (ValueError naming the field);
- `template_messages(messages, tools, template)`: OpenAI-shaped messages (assistant
  `tool_calls`, `tool` results) → the dicts the Jinja chat template reads, HF's convention
  (`arguments` as an object). A template that does not read `tools` gets them described in the
  system prompt and the calls written in the Hermes form (as llama.cpp's template polyfills do);
- `ToolFormat`: one model family's tool-call text. `format_for(template)` picks it;
  `HERMES` (Qwen2.5/Qwen3/Hermes: `<tool_call>{json}</tool_call>`) and `QWEN3_CODER`
  (Qwen3-Coder/Qwen3.5: `<tool_call><function=NAME><parameter=P>value</parameter>…`);
  each also writes the llguidance grammar that forces calls valid for the tools' schemas;
- `ToolCallParser`: text in (streamed pieces), `("content", text)` and `("call", ToolCall)`
  events out; a call is released once its block is complete and parses, a block that does not
  parse is given back as content.
"""

from __future__ import annotations

import dataclasses
import json
import re
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from strata.constraints import schema_text

# -- tool definitions ---------------------------------------------------------------------------

_NAME = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")


@dataclass(frozen=True, slots=True)
class ToolSpec:
    name: str
    description: str
    parameters: dict[str, Any]  # a JSON schema of an object
    raw: dict[str, Any] | None = None  # the request's own entry, shown to the template as is

    @staticmethod
    def from_openai(obj: Any, where: str = "tools") -> ToolSpec:
        """One OpenAI `tools[i]` entry: {"type": "function", "function": {name, description?,
        parameters?, strict?}}. Raises ValueError whose first word is the bad field's path."""
        if not isinstance(obj, Mapping):
            raise ValueError(f"{where}: must be an object")
        if obj.get("type", "function") != "function":
            raise ValueError(f"{where}.type: only 'function' tools are supported")
        extra = set(obj) - {"type", "function"}
        if extra:
            raise ValueError(f"{where}.{sorted(extra)[0]}: unknown field")
        fn = obj.get("function")
        if not isinstance(fn, Mapping):
            raise ValueError(f"{where}.function: must be an object")
        extra = set(fn) - {"name", "description", "parameters", "strict"}
        if extra:
            raise ValueError(f"{where}.function.{sorted(extra)[0]}: unknown field")
        spec = ToolSpec.make(fn.get("name"), fn.get("description"), fn.get("parameters"), where)
        return dataclasses.replace(spec, raw=dict(obj))

    @staticmethod
    def make(name: Any, description: Any, parameters: Any, where: str) -> ToolSpec:
        if not isinstance(name, str) or not _NAME.match(name):
            raise ValueError(
                f"{where}.function.name: must be 1-128 characters of A-Z a-z 0-9 _ . : - "
                f"(got {name!r})"
            )
        if description is not None and not isinstance(description, str):
            raise ValueError(f"{where}.function.description: must be a string")
        if parameters is None:
            parameters = {"type": "object", "properties": {}}
        if not isinstance(parameters, Mapping):
            raise ValueError(f"{where}.function.parameters: must be a JSON schema object")
        return ToolSpec(name, description or "", dict(parameters))

    def openai(self) -> dict[str, Any]:
        """The form chat templates read (HF's convention: the OpenAI tool object; the
        request's own when the tool came from one, as vLLM passes it)."""
        if self.raw is not None:
            return self.raw
        fn: dict[str, Any] = {"name": self.name}
        if self.description:
            fn["description"] = self.description
        fn["parameters"] = self.parameters
        return {"type": "function", "function": fn}


@dataclass(slots=True)
class ToolCall:
    name: str
    arguments: str  # the arguments object as JSON text
    id: str = field(default_factory=lambda: "call_" + secrets.token_hex(12))

    def openai(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


ToolChoice = Literal["auto", "none", "required"] | str  # a str other than those: a tool name


# -- formats ------------------------------------------------------------------------------------


class ToolFormat(Protocol):
    name: str
    # (opening, closing) text of a call block; the first pair is what the model is taught
    blocks: tuple[tuple[str, str], ...]

    def parse(self, block: str, tools: Mapping[str, ToolSpec]) -> list[ToolCall] | None:
        """The calls in one whole block (markers included); None when it does not parse."""
        ...

    def scan(self, block: str, tools: Mapping[str, ToolSpec]) -> tuple[str, str] | None:
        """For streaming: (name, arguments text so far) of the one call an unfinished block
        (opening marker included) has begun, once its name is known; the text is a prefix of
        the `arguments` that `parse` gives for the finished block. None before that."""
        ...

    def render(self, name: str, arguments: Mapping[str, Any]) -> str:
        """A call as the model writes it (for earlier turns when the template cannot)."""
        ...

    def block_end(self, buf: str, opening: str, closing: str) -> int:
        """Where the block `buf` (which starts with `opening`) ends: the index of its
        `closing` marker, -1 while it has none yet."""
        ...

    def grammar_call(self, tool: ToolSpec, rule: str) -> list[str]:
        """Lark lines (llguidance syntax) defining `rule` as one whole call block of `tool`
        (plus any terminals it needs, named after `rule`)."""
        ...


def _json_args(v: Any) -> str:
    return json.dumps(v, ensure_ascii=False)


# `{"name": "…", "arguments": ` at the start of a Hermes call body
_HERMES_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"arguments"\s*:\s*')


def _object_end(text: str) -> int | None:
    """The end of the JSON object `text` starts with (braces counted outside strings), or None
    while it is not complete."""
    depth, in_str, esc = 0, False, False
    for i, ch in enumerate(text):
        if in_str:
            if esc:
                esc = False
            elif ch == "\\":
                esc = True
            elif ch == '"':
                in_str = False
        elif ch == '"':
            in_str = True
        elif ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return i + 1
    return None


def _raw_arguments(body: str) -> str | None:
    """The arguments object's own text in a Hermes body that starts with the name, else None."""
    m = _HERMES_HEAD.match(body)
    if m is None or body[m.end() : m.end() + 1] != "{":
        return None
    try:
        args, end = json.JSONDecoder().raw_decode(body, m.end())
    except (json.JSONDecodeError, RecursionError):
        return None
    return body[m.end() : end] if isinstance(args, dict) else None


def strict_object(schema: Mapping[str, Any]) -> dict[str, Any]:
    """A forced call's arguments: no properties beyond the declared ones unless the schema says
    otherwise (a function takes no unknown arguments; a weak model would invent them forever)."""
    s = dict(schema)
    if s.get("type", "object") == "object" and "additionalProperties" not in s:
        s["additionalProperties"] = False
    return s


def _lark_str(s: str) -> str:
    return json.dumps(s)  # a Lark string literal is a JSON string literal


class HermesFormat:
    """`<tool_call>\\n{"name": …, "arguments": {…}}\\n</tool_call>` (Qwen2.5, Qwen3, Hermes)."""

    name = "hermes"
    blocks: tuple[tuple[str, str], ...] = (("<tool_call>", "</tool_call>"),)

    def parse(self, block: str, tools: Mapping[str, ToolSpec]) -> list[ToolCall] | None:
        body = block[len("<tool_call>") : -len("</tool_call>")].strip()
        try:
            obj = json.loads(body)
        except (json.JSONDecodeError, RecursionError):
            return None
        raw = _raw_arguments(body)
        if raw is not None and isinstance(obj, dict):
            return [ToolCall(obj["name"], raw)]  # the model's own text (what was streamed)
        items = obj if isinstance(obj, list) else [obj]
        calls = []
        for it in items:
            if not isinstance(it, dict) or not isinstance(it.get("name"), str):
                return None
            args = it.get("arguments", it.get("parameters", {}))
            if isinstance(args, str):  # some models write the arguments as a JSON string
                try:
                    args = json.loads(args)
                except json.JSONDecodeError:
                    return None
            if not isinstance(args, dict):
                return None
            calls.append(ToolCall(it["name"], _json_args(args)))
        return calls

    def scan(self, block: str, tools: Mapping[str, ToolSpec]) -> tuple[str, str] | None:
        body = block[len("<tool_call>") :]
        m = _HERMES_HEAD.match(body)
        if m is None:
            return None
        try:
            name = json.loads(f'"{m.group(1)}"')
        except json.JSONDecodeError:
            return None
        args = body[m.end() :]
        if not args.startswith("{"):
            # arguments written as a JSON string (or not yet begun): they come whole when the
            # block closes (streamed text must be a prefix of the final arguments)
            return name, ""
        end = _object_end(args)
        if end is not None:  # the object is complete: what follows is not arguments
            return name, args[:end]
        # hold back a last "}": it may close the arguments' object
        cut = args.rfind("}")
        if cut >= 0 and not args[cut + 1 :].strip():
            args = args[:cut]
        return name, args.rstrip()

    def render(self, name: str, arguments: Mapping[str, Any]) -> str:
        body = json.dumps({"name": name, "arguments": dict(arguments)}, ensure_ascii=False)
        return f"<tool_call>\n{body}\n</tool_call>"

    def block_end(self, buf: str, opening: str, closing: str) -> int:
        """The first `closing` after a whole JSON body: one inside a JSON string (a value
        quoting the tag) does not end the block; a body that is no JSON ends at the first."""
        end = buf.find(closing, len(opening))
        while end >= 0:
            body = buf[len(opening) : end].strip()
            if not body.startswith(("{", "[")):
                return end
            try:
                json.loads(body)
                return end
            except (json.JSONDecodeError, RecursionError):
                end = buf.find(closing, end + 1)
        return -1

    def grammar_call(self, tool: ToolSpec, rule: str) -> list[str]:
        schema = {
            "type": "object",
            "properties": {
                "name": {"const": tool.name},
                "arguments": strict_object(tool.parameters),
            },
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        return [f'{rule}: "<tool_call>\\n" %json {schema_text(schema)} "\\n</tool_call>"']


_FUNC = re.compile(r"<function=([^>\n]+)>(.*?)</function>", re.S)
_PARAM = re.compile(r"<parameter=([^>\n]+)>\n?(.*?)\n?</parameter>", re.S)


class Qwen3CoderFormat:
    """`<tool_call>\\n<function=NAME>\\n<parameter=P>\\nvalue\\n</parameter>\\n</function>\\n
    </tool_call>` (Qwen3-Coder, Qwen3.5). A value is raw text for a string parameter, JSON
    otherwise (text that does not parse as JSON stays a string, as vLLM's parser does)."""

    name = "qwen3_coder"
    blocks: tuple[tuple[str, str], ...] = (
        ("<tool_call>", "</tool_call>"),
        ("<function=", "</function>"),
    )

    def parse(self, block: str, tools: Mapping[str, ToolSpec]) -> list[ToolCall] | None:
        calls = []
        bare = block.startswith("<function=")  # no <tool_call> around it: maybe prose
        for m in _FUNC.finditer(block):
            name = m.group(1).strip()
            spec = tools.get(name)
            if spec is None and bare:
                return None  # a bare tag names an offered tool or is text (as llama.cpp)
            props = (spec.parameters.get("properties") or {}) if spec else {}
            calls.append(ToolCall(name, _xml_args(m.group(2), props) + "}"))
        return calls or None

    def scan(self, block: str, tools: Mapping[str, ToolSpec]) -> tuple[str, str] | None:
        m = _FUNC_HEAD.search(block)
        if m is None:
            return None
        name = m.group(1).strip()
        spec = tools.get(name)
        if spec is None and block.startswith("<function="):
            return None
        props = (spec.parameters.get("properties") or {}) if spec else {}
        body = block[m.end() :]
        # the first function's parameters only: a next one is another call
        ends = [i for i in (body.find("</function>"), body.find("<function=")) if i >= 0]
        return name, _xml_args(body[: min(ends)] if ends else body, props)

    def render(self, name: str, arguments: Mapping[str, Any]) -> str:
        parts = [f"<tool_call>\n<function={name}>\n"]
        for k, v in arguments.items():
            text = v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)
            parts.append(f"<parameter={k}>\n{text}\n</parameter>\n")
        parts.append("</function>\n</tool_call>")
        return "".join(parts)

    def block_end(self, buf: str, opening: str, closing: str) -> int:
        return buf.find(closing, len(opening))

    def grammar_call(self, tool: ToolSpec, rule: str) -> list[str]:
        items, terminals = _param_items(tool, rule, "<parameter={}>\n", _PARAM_CLOSE)
        head, tail = f"<tool_call>\n<function={tool.name}>\n", "</function>\n</tool_call>"
        return [f"{rule}: {_lark_str(head)} {items} {_lark_str(tail)}", *terminals]


_PARAM_CLOSE = "\n</parameter>\n"


def _param_items(tool: ToolSpec, rule: str, head_of: str, close: str) -> tuple[str, list[str]]:
    """A tagged-parameters call's arguments as Lark: each property in order, `head_of`
    (formatted with its key) then its value and `close` (optional where not required); and
    the extra terminal lines its text values need."""
    props = tool.parameters.get("properties") or {}
    required = set(tool.parameters.get("required") or [])
    parts, terminals = [], []
    for j, (key, sub) in enumerate(props.items()):
        value, term = _xml_value_rule(sub, f"{rule.upper()}_TEXT_{j}", close)
        if term:
            terminals.append(term)
        item = f"({_lark_str(head_of.format(key))} {value})"
        parts.append(item if key in required else item + "?")
    return " ".join(parts), terminals


def _xml_value_rule(schema: Any, terminal: str, close: str = _PARAM_CLOSE) -> tuple[str, str]:
    """(rule body, extra rule line or "") of one parameter's value and its closing tag
    `close`: a string parameter is raw text (its enum: one of the texts; min/maxLength: a
    bounded length) ending at the first close tag, any other parameter JSON for its schema."""
    closing = _lark_str(close)
    if not isinstance(schema, dict):
        return f"%json {schema_text({})} {closing}", ""
    if _is_text(schema):
        if isinstance(schema.get("enum"), list) and all(isinstance(v, str) for v in schema["enum"]):
            alts = " | ".join(_lark_str(v) for v in schema["enum"])
            return f"({alts}) {closing}", ""
        lo, hi = schema.get("minLength", 0), schema.get("maxLength")
        for name, v in (("minLength", lo), ("maxLength", hi)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
                raise ValueError(f"{name}: must be a non-negative integer (got {v!r})")
        span = f"{{{lo},{hi}}}" if hi is not None else f"{{{lo},}}"
        rule = terminal.lower()
        # lazy: the value ends at the first close tag
        tail = close.replace("\n", "\\n").replace("/", "\\/")
        return rule, f"{rule}[lazy]: /(?s:.{span}){tail}/"
    return f"%json {schema_text(schema)} {closing}", ""


_FUNC_HEAD = re.compile(r"<function=([^>\n]+)>")


def _xml_args(body: str, props: Any) -> str:
    """`{"k": v, …` (without the closing brace) for the complete parameters in `body`."""
    parts = []
    for p in _PARAM.finditer(body):
        key, raw = p.group(1).strip(), p.group(2)
        value = _xml_value(raw, props.get(key) if isinstance(props, dict) else None)
        parts.append(f"{_json_args(key)}: {_json_args(value)}")
    return "{" + ", ".join(parts)


def _is_text(schema: Any) -> bool:
    """A parameter the model writes as raw text: type string, or a union with a string in it
    (`["string", "null"]`, Pydantic's `anyOf: [{type: string}, {type: null}]`)."""
    if not isinstance(schema, dict):
        return False
    kind = schema.get("type")
    if kind == "string" or (isinstance(kind, list) and "string" in kind):
        return True
    alts = schema.get("anyOf") or schema.get("oneOf") or []
    return isinstance(alts, list) and any(
        isinstance(a, dict) and a.get("type") == "string" for a in alts
    )


def _xml_value(raw: str, schema: Any) -> Any:
    if _is_text(schema):
        return raw
    if isinstance(schema, dict) and schema.get("type") == "boolean" and raw in ("True", "False"):
        return raw == "True"  # the template writes earlier booleans so (`args_value | string`)
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, RecursionError):
        return raw


_GLM_ARG = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.S)
_GLM_VALUE_CLOSE = "</arg_value>\n"


class Glm45Format:
    """`<tool_call>NAME\n<arg_key>K</arg_key>\n<arg_value>V</arg_value>\n…</tool_call>`
    (GLM-4.5, GLM-4.6: their templates write calls so). A value is raw text for a string
    parameter, JSON otherwise (as the template's `tojson` unless a string)."""

    name = "glm45"
    blocks: tuple[tuple[str, str], ...] = (("<tool_call>", "</tool_call>"),)

    @staticmethod
    def _head(body: str) -> tuple[str, str] | None:
        """(name, the rest) once the name is ended by a newline or the first argument."""
        ends = [i for i in (body.find("\n"), body.find("<arg_key>")) if i >= 0]
        if not ends:
            return None
        name = body[: min(ends)].strip()
        return (name, body[min(ends) :]) if name and not re.search(r"[\s<>]", name) else None

    def _args(self, rest: str, tools: Mapping[str, ToolSpec], name: str) -> str:
        spec = tools.get(name)
        props = (spec.parameters.get("properties") or {}) if spec else {}
        parts = [
            f"{_json_args(k.strip())}: {_json_args(_xml_value(v, props.get(k.strip())))}"
            for k, v in _GLM_ARG.findall(rest)
        ]
        return "{" + ", ".join(parts)

    def parse(self, block: str, tools: Mapping[str, ToolSpec]) -> list[ToolCall] | None:
        head = self._head(block[len("<tool_call>") : -len("</tool_call>")] + "\n")
        if head is None:
            return None
        name, rest = head
        return [ToolCall(name, self._args(rest, tools, name) + "}")]

    def scan(self, block: str, tools: Mapping[str, ToolSpec]) -> tuple[str, str] | None:
        head = self._head(block[len("<tool_call>") :])
        return None if head is None else (head[0], self._args(head[1], tools, head[0]))

    def render(self, name: str, arguments: Mapping[str, Any]) -> str:
        parts = [f"<tool_call>{name}\n"]
        for k, v in arguments.items():
            text = v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)
            parts.append(f"<arg_key>{k}</arg_key>\n<arg_value>{text}</arg_value>\n")
        return "".join(parts) + "</tool_call>"

    def block_end(self, buf: str, opening: str, closing: str) -> int:
        return buf.find(closing, len(opening))

    def grammar_call(self, tool: ToolSpec, rule: str) -> list[str]:
        head_of = "<arg_key>{}</arg_key>\n<arg_value>"
        items, terminals = _param_items(tool, rule, head_of, _GLM_VALUE_CLOSE)
        head = f"<tool_call>{tool.name}\n"
        return [f"{rule}: {_lark_str(head)} {items} {_lark_str('</tool_call>')}", *terminals]


HERMES: ToolFormat = HermesFormat()
QWEN3_CODER: ToolFormat = Qwen3CoderFormat()
GLM45: ToolFormat = Glm45Format()
FORMATS: dict[str, ToolFormat] = {f.name: f for f in (HERMES, QWEN3_CODER, GLM45)}


def format_for(template: str | None, name: str = "auto") -> ToolFormat:
    """The tool-call format: `name` when not "auto", else the one the chat template teaches
    (`<arg_key>` in the template → GLM-4.5; XML `<function=` → Qwen3-Coder; else Hermes)."""
    if name != "auto":
        return FORMATS[name]
    if template and "<arg_key>" in template:
        return GLM45
    if template and "<function=" in template:
        return QWEN3_CODER
    return HERMES


# -- constraint grammars -----------------------------------------------------------------------


def call_grammar(
    fmt: ToolFormat,
    tools: Sequence[ToolSpec],
    choice: str,
    parallel: bool,
    trailing_break: bool = False,
) -> str:
    """A Lark grammar (llguidance) for the whole answer when calls are forced: `choice`
    "required" (one call of any tool, or more when `parallel`) or a tool's name (one call);
    `trailing_break`: a line break may follow the last call (the end may follow it)."""
    chosen = list(tools) if choice == "required" else [t for t in tools if t.name == choice]
    if not chosen:
        raise ValueError(f"tool_choice: no tool named {choice!r}")
    lines = []
    names = []
    for i, t in enumerate(chosen):
        names.append(f"call_{i}")
        lines += fmt.grammar_call(t, f"call_{i}")
    many = parallel and choice == "required"
    tail = ' "\\n"?' if trailing_break else ""
    lines.insert(0, ('start: call ("\\n" call)*' if many else "start: call") + tail)
    lines.insert(1, "call: " + " | ".join(names))
    return "\n".join(lines) + "\n"


# -- the conversation for the template ---------------------------------------------------------


def template_reads_tools(template: str | None) -> bool:
    return bool(template) and "tools" in (template or "")


def tools_system_text(tools: Sequence[ToolSpec], fmt: ToolFormat) -> str:
    """The tool instructions a template without tool support gets in its system prompt (the
    wording of Qwen2.5's template, in the model's own call format)."""
    defs = "\n".join(json.dumps(t.openai(), ensure_ascii=False) for t in tools)
    example = (
        '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
        if fmt is HERMES
        else "<tool_call>\n<function=NAME>\n<parameter=PARAM>\nVALUE\n</parameter>\n"
        "</function>\n</tool_call>"
    )
    return (
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n"
        f"<tools>\n{defs}\n</tools>\n\n"
        "For each function call, return it within <tool_call></tool_call> XML tags:\n"
        f"{example}"
    )


def template_messages(
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[ToolSpec],
    template: str | None,
    fmt: ToolFormat,
) -> list[dict[str, Any]]:
    """Messages (role, content text, and for assistants `tool_calls` with `arguments` as JSON
    text; for tools `tool_call_id`) → what the template renders. Raises ValueError naming the
    message when an assistant's arguments are not a JSON object."""
    native = template_reads_tools(template)
    out: list[dict[str, Any]] = []
    for i, m in enumerate(messages):
        d: dict[str, Any] = {"role": m["role"], "content": m.get("content") or ""}
        if m.get("reasoning_content"):
            d["reasoning_content"] = m["reasoning_content"]
        calls = []
        for j, c in enumerate(m.get("tool_calls") or []):
            try:
                args = json.loads(c["arguments"])
            except (json.JSONDecodeError, TypeError):
                args = None
            if not isinstance(args, dict):
                raise ValueError(
                    f"messages[{i}].tool_calls[{j}].function.arguments: must be a JSON object"
                )
            calls.append({"id": c.get("id"), "name": c["name"], "arguments": args})
        if native:
            if calls:
                d["tool_calls"] = [
                    {
                        "id": c["id"],
                        "type": "function",
                        "function": {k: c[k] for k in ("name", "arguments")},
                    }
                    for c in calls
                ]
            if m.get("tool_call_id") is not None:
                d["tool_call_id"] = m["tool_call_id"]
            if m.get("name"):
                d["name"] = m["name"]
        else:
            if calls:
                text = "\n".join(fmt.render(c["name"], c["arguments"]) for c in calls)
                d["content"] = (d["content"] + "\n" if d["content"] else "") + text
            if m["role"] == "tool":
                d = {
                    "role": "user",
                    "content": f"<tool_response>\n{d['content']}\n</tool_response>",
                }
        out.append(d)
    if tools and not native:
        text = tools_system_text(tools, fmt)
        if out and out[0]["role"] in ("system", "developer"):
            out[0] = {**out[0], "content": out[0]["content"] + "\n\n" + text}
        else:
            out.insert(0, {"role": "system", "content": text})
    return out


# -- parsing the model's text ------------------------------------------------------------------

# (kind, value): ("content", text) or ("call", ToolCall)
Event = tuple[str, Any]


class ToolCallParser:
    """Splits streamed model text into content and tool calls.

    Text outside call blocks is content, released as it comes except a tail that may still
    open a block and whitespace that may sit between calls; a block is held until it closes
    and then released as its calls (or, when it does not parse, as content). `finish()` ends
    the text: an unclosed block is parsed as if closed (a cut-off call that still parses, as
    llama-server does), else given back as content. With `parallel` false only the first call
    is kept.

    `incremental` (for streams): a call is also announced as soon as its name is known,
    `("call_start", ToolCall with empty arguments)`, and its arguments follow as
    `("call_args", text)` pieces while the model writes them; the final `("call", ToolCall)`
    then only marks its end (its arguments are the pieces joined). A block that turns out
    malformed after its start ends the call with the text sent so far.

    `forced` (tool_choice required or a name: the grammar made the answer calls only): a
    block cut off where it does not parse is never content; it ends as a call with the
    arguments text written so far once its name is known (as a stream sends it, and as
    OpenAI returns a call cut by max_tokens), and is dropped before that."""

    def __init__(
        self,
        fmt: ToolFormat,
        tools: Sequence[ToolSpec],
        parallel: bool = True,
        incremental: bool = False,
        forced: bool = False,
    ) -> None:
        self.fmt = fmt
        self.forced = forced
        self.tools = {t.name: t for t in tools}
        self.parallel = parallel
        self.incremental = incremental
        self.buf = ""
        self.open: tuple[str, str] | None = None  # the block being read
        self.ws = ""  # whitespace held back (it may sit between two calls)
        self.calls = 0
        self.started: ToolCall | None = None  # incremental: the call being streamed
        self.sent = ""  # its arguments text sent so far

    def push(self, text: str) -> list[Event]:
        self.buf += text
        out: list[Event] = []
        while True:
            if self.open is None:
                hit = self._find_open()
                if hit is None:
                    keep = self._partial_open()
                    self._content(self.buf[: len(self.buf) - keep], out)
                    self.buf = self.buf[len(self.buf) - keep :]
                    return out
                pos, pair = hit
                self._content(self.buf[:pos], out)
                self.buf = self.buf[pos:]
                self.open = pair
            end = self.fmt.block_end(self.buf, *self.open)
            if end < 0:
                self._stream_block(out)
                return out
            end += len(self.open[1])
            self._block(self.buf[:end], out)
            self.buf = self.buf[end:]
            self.open = None

    def finish(self) -> list[Event]:
        out: list[Event] = []
        if self.open is not None:
            closed = self.buf + self.open[1]
            if self.forced and self.started is None and self.fmt.parse(closed, self.tools) is None:
                scanned = self.fmt.scan(self.buf, self.tools)
                if scanned is not None:
                    self.ws = ""
                    self._emit(ToolCall(*scanned), out)
            else:
                self._block(closed, out, raw=self.buf)
        else:
            self._content(self.buf, out)
        self.buf = ""
        self.open = None
        if not self.calls and self.ws:
            out.append(("content", self.ws))
        self.ws = ""
        return out

    def _find_open(self) -> tuple[int, tuple[str, str]] | None:
        best: tuple[int, tuple[str, str]] | None = None
        for pair in self.fmt.blocks:
            i = self.buf.find(pair[0])
            if i >= 0 and (best is None or i < best[0]):
                best = (i, pair)
        return best

    def _partial_open(self) -> int:
        keep = 0
        for opening, _ in self.fmt.blocks:
            for k in range(min(len(opening) - 1, len(self.buf)), 0, -1):
                if self.buf.endswith(opening[:k]):
                    keep = max(keep, k)
                    break
        return keep

    def _content(self, text: str, out: list[Event]) -> None:
        if not text:
            return
        if not text.strip():
            self.ws += text
            return
        text = self.ws + text
        stripped = text.rstrip()
        self.ws = text[len(stripped) :]
        out.append(("content", stripped))

    def _stream_block(self, out: list[Event]) -> None:
        """Incremental: announce the open block's call and send its new arguments text."""
        if not self.incremental or not (self.parallel or self.calls == 0):
            return
        scanned = self.fmt.scan(self.buf, self.tools)
        if scanned is None:
            return
        name, args = scanned
        if self.started is None:
            self.ws = ""
            self.started = ToolCall(name, "")
            out.append(("call_start", ToolCall(name, "", self.started.id)))
        if len(args) > len(self.sent) and args.startswith(self.sent):
            out.append(("call_args", args[len(self.sent) :]))
            self.sent = args

    def _emit(self, c: ToolCall, out: list[Event]) -> None:
        if not (self.parallel or self.calls == 0):
            return
        if self.incremental:
            out.append(("call_start", ToolCall(c.name, "", c.id)))
            if c.arguments:
                out.append(("call_args", c.arguments))
        out.append(("call", c))
        self.calls += 1

    def _block(self, block: str, out: list[Event], raw: str | None = None) -> None:
        calls = self.fmt.parse(block, self.tools)
        started, sent = self.started, self.sent
        self.started, self.sent = None, ""
        if started is not None:  # its start and part of its arguments are out already
            final = calls[0].arguments if calls else sent
            if final.startswith(sent):
                if len(final) > len(sent):
                    out.append(("call_args", final[len(sent) :]))
                started.arguments = final
            else:
                started.arguments = sent
            out.append(("call", started))
            self.calls += 1
            for c in (calls or [])[1:]:
                self._emit(c, out)
            return
        if calls is None:
            self._content(block if raw is None else raw, out)
            return
        self.ws = ""
        for c in calls:
            self._emit(c, out)


def parse_all(
    fmt: ToolFormat, tools: Sequence[ToolSpec], text: str, parallel: bool = True
) -> tuple[str, list[ToolCall]]:
    """Whole text → (content, calls)."""
    p = ToolCallParser(fmt, tools, parallel)
    content, calls = [], []
    for ev in p.push(text) + p.finish():
        if ev[0] == "content":
            content.append(ev[1])
        else:
            calls.append(ev[1])
    return "".join(content), calls
