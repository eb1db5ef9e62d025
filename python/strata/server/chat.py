"""A chat request's prompt, constraint and answer parsing: tools and `tool_choice`,
`response_format`, `chat_template_kwargs`, `reasoning_format`.

`prepare_chat(...)` takes the API-neutral pieces (messages as dicts, `ToolSpec`s, a tool
choice, a response grammar) so the OpenAI and Anthropic routes share it; `openai_chat(req)`
maps an OpenAI request onto it. Every problem is an `APIError(400)` naming the field.

Choices (vLLM's and llama-server's where they differ from nothing):
- `tool_choice` defaults to "auto" with tools, "none" without; "none" still shows the tools
  to the template (as vLLM does) but nothing is parsed as a call.
- "required" and a named function constrain the whole answer (llguidance) to calls valid for
  the tools' parameter schemas (objects without `additionalProperties` get none); with
  `parallel_tool_calls: false` "required" makes exactly one call.
- `response_format` `json_object` / `json_schema` constrain the answer to JSON (the schema),
  as do llama-server's `json_schema` / `grammar` and vLLM's `structured_outputs`
  (`strata.server.structured`); not together with a forced tool call.
- A thinking block may precede a constrained answer when the prompt opened it, or when
  `chat_template_kwargs.enable_thinking` is true; it is not constrained.
- The harmony format (gpt-oss): the analysis (and before a call, commentary) messages stay
  free; the final message's text or the call's header and arguments are constrained
  (`strata.server.harmony.answer_grammar` / `call_grammar`, as llama.cpp's gpt-oss grammar).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from strata import constraints
from strata.config import Config
from strata.reasoning import CLOSE, OPEN, prompt_opens_reasoning
from strata.reasoning import FORMATS as REASONING_FORMATS
from strata.sampling import GrammarTrigger, ReasoningBudget
from strata.server import harmony
from strata.server.assistant import AssistantParser
from strata.server.openai_types import APIError, ChatRequest, chat_messages
from strata.server.structured import MAX_GRAMMAR_BYTES, answer_grammar, checked
from strata.server.tokenizing import ServerTokenizer
from strata.server.tools import ToolFormat, ToolSpec, call_grammar, format_for, template_messages

log = logging.getLogger("strata.server")

# Template variables a request's chat_template_kwargs may not replace.
RESERVED_TEMPLATE_KWARGS = frozenset(
    {"messages", "tools", "add_generation_prompt", "bos_token", "eos_token"}
)


@dataclass(slots=True)
class ChatSetup:
    prompt: str  # the rendered conversation, ending with the assistant's turn opening
    grammar: str | None  # a Lark grammar for llguidance, or None
    tools: list[ToolSpec] = field(default_factory=list)
    fmt: ToolFormat | None = None  # None: no tool calls are parsed
    parallel: bool = True
    forced: bool = False  # tool_choice required or a name: the answer is calls only
    parse_reasoning: bool = True
    reasoning_opened: bool = False
    # the template writes harmony messages (gpt-oss), and the channel the prompt left open
    harmony: tuple[bool, str | None] = (False, None)
    # `grammar` is lazy: it applies from this trigger on (tool_choice auto's calls)
    trigger: GrammarTrigger | None = None

    def parser(self, incremental: bool = False) -> AssistantParser:
        """A fresh parser for one choice's answer (`incremental`: for a stream)."""
        return AssistantParser.make(
            self.parse_reasoning,
            self.reasoning_opened,
            self.fmt,
            self.tools,
            self.parallel,
            incremental,
            self.harmony,
            self.forced,
        )


def _bad(param: str, why: str) -> APIError:
    return APIError(400, f"{param}: {why}", param=param)


def tool_choice_of(choice: Any, tools: Sequence[ToolSpec]) -> str:
    """OpenAI's `tool_choice` → "auto" | "none" | "required" | a tool's name."""
    if choice is None:
        return "auto" if tools else "none"
    if isinstance(choice, str):
        if choice not in ("auto", "none", "required"):
            raise _bad("tool_choice", "must be auto, none, required or a named function")
        name = choice
    else:
        fn = choice.get("function") if choice.get("type") == "function" else None
        named = fn.get("name") if isinstance(fn, Mapping) else None
        extra = sorted(set(choice) - {"type", "function"}) or sorted(
            set(fn) - {"name"} if isinstance(fn, Mapping) else set()
        )
        if extra:
            where = "tool_choice" if extra[0] in choice else "tool_choice.function"
            raise _bad(f"{where}.{extra[0]}", "unknown field")
        if not isinstance(named, str):
            raise _bad(
                "tool_choice",
                'a named choice is {"type": "function", "function": {"name": …}}',
            )
        if named not in {t.name for t in tools}:
            raise _bad("tool_choice", f"no tool named {named!r} in tools")
        name = named
    if name in ("auto", "required") and not tools:
        raise _bad("tool_choice", f"{name!r} needs tools")
    return name


def prepare_chat(
    tok: ServerTokenizer,
    messages: list[dict[str, Any]],
    tools: list[ToolSpec],
    tool_choice: str,
    parallel: bool,
    answer_grammar: str | None,
    template_kwargs: Mapping[str, Any] | None,
    reasoning_format: str,
    tool_call_format: str = "auto",
    answer_param: str = "response_format",
    lazy_tools: bool = True,
) -> ChatSetup:
    """Render the prompt and decide the constraint and the answer parsing (`answer_grammar`:
    the answer's own constraint, asked by the request's field `answer_param`; `lazy_tools`:
    with tool_choice auto, a call the model starts is constrained from its opening on)."""
    kwargs = dict(template_kwargs or {})
    bad = RESERVED_TEMPLATE_KWARGS & set(kwargs)
    if bad:
        raise _bad(f"chat_template_kwargs.{sorted(bad)[0]}", "set by the server")
    if reasoning_format not in REASONING_FORMATS:
        raise _bad("reasoning_format", f"must be one of {', '.join(REASONING_FORMATS)}")
    template = tok.chat_template
    fmt = format_for(template, tool_call_format)
    try:
        msgs = template_messages(messages, tools, template, fmt)
    except ValueError as e:
        param = str(e).split(":")[0]
        raise APIError(400, str(e), param=param) from None
    if tools and "tools" in (template or ""):
        kwargs["tools"] = [t.openai() for t in tools]
    try:
        prompt = tok.apply_chat_template(msgs, **kwargs)
    except ValueError as e:  # the model's template refused the conversation
        raise APIError(400, f"messages: {e}", param="messages") from None
    grammar = answer_grammar
    is_harmony, opened_channel = harmony.is_harmony(template), harmony.open_channel(prompt)
    if tool_choice not in ("auto", "none"):
        if grammar is not None:
            raise _bad(answer_param, "not together with a required or named tool_choice")
        try:
            if is_harmony:
                grammar = harmony.call_grammar(tools, tool_choice, opened=opened_channel)
            else:
                grammar = call_grammar(fmt, tools, tool_choice, parallel)
        except ValueError as e:  # a parameter schema the call grammar cannot follow
            raise _bad("tools", f"a parameter schema cannot be used as a constraint: {e}") from None
    elif grammar is not None and is_harmony:
        grammar = _wrapped(harmony.answer_grammar, grammar, opened_channel, answer_param)
    opened = prompt_opens_reasoning(prompt)
    trigger = None
    if grammar is None and lazy_tools and tool_choice == "auto" and tools:
        if is_harmony:
            grammar, trigger = lazy_harmony_calls(tok, tools, opened_channel)
        else:
            parsed = reasoning_format == "parsed"
            grammar, trigger = lazy_calls(tok, fmt, tools, parallel, opened and parsed, parsed)
    param = answer_param if answer_grammar is not None else "tools"
    if grammar is not None and is_harmony and trigger is None:  # messages before it are free
        grammar = checked(grammar, param)
    elif grammar is not None and trigger is None:
        mode = "open" if opened else "optional" if kwargs.get("enable_thinking") is True else "none"
        grammar = checked(_wrapped(constraints.with_reasoning, grammar, mode, param), param)
    return ChatSetup(
        prompt=prompt,
        grammar=grammar,
        tools=tools,
        fmt=fmt if tools and tool_choice != "none" else None,
        parallel=parallel,
        forced=bool(tools) and tool_choice not in ("auto", "none"),
        parse_reasoning=reasoning_format == "parsed",
        reasoning_opened=opened,
        harmony=(is_harmony, opened_channel),
        trigger=trigger,
    )


def _wrapped(wrap: Callable[[str, Any], str], grammar: str, how: Any, param: str) -> str:
    """A request's grammar inside the answer's frame (`wrap`: harmony's final message, a
    thinking block before it); a grammar without a start rule is a 400 naming `param`."""
    try:
        return wrap(grammar, how)
    except ValueError as e:
        raise _bad(param, str(e)) from None


def lazy_calls(
    tok: ServerTokenizer,
    fmt: ToolFormat,
    tools: Sequence[ToolSpec],
    parallel: bool,
    opened: bool,
    thinking: bool = True,
) -> tuple[str | None, GrammarTrigger | None]:
    """llama.cpp's lazy grammar for tool_choice auto: the answer is free until the model
    writes the call format's opening token outside thinking (`thinking`: the answer's
    parser takes a thinking block apart: reasoning_format parsed; `opened`: the prompt opened
    one); from there on it is calls of the offered tools with arguments of their schemas, as
    a forced call's, a line break after them allowed. (None, None) where the opening is no
    single token of the vocabulary, or a schema cannot be a constraint, or the grammar is
    past MAX_GRAMMAR_BYTES: the calls are then the model's own text. Not covered: a
    Qwen3-Coder call the model opens with `<function=` alone (no single token to wait for)."""
    ids = tok.encode(fmt.blocks[0][0], True)
    if len(ids) != 1:
        return None, None
    grammar = _lazy_grammar(
        lambda: call_grammar(fmt, tools, "required", parallel, trailing_break=True)
    )
    if grammar is None:
        return None, None
    think, unthink = tok.encode(OPEN, True), tok.encode(CLOSE, True)
    single = thinking and len(think) == 1 and len(unthink) == 1
    trigger = GrammarTrigger(ids, think if single else [], unthink if single else [], opened)
    return grammar, trigger


def _lazy_grammar(make: Callable[[], str]) -> str | None:
    """A lazy call grammar that compiles and is at most MAX_GRAMMAR_BYTES, else None (the
    calls stay the model's own text)."""
    try:
        grammar = make()
        if len(grammar) > MAX_GRAMMAR_BYTES:
            raise ValueError(f"the grammar is past {MAX_GRAMMAR_BYTES >> 10} KiB")
        constraints.check_grammar(grammar)
    except ValueError as e:
        log.info("tool calls left unconstrained: %s", e)
        return None
    return grammar


def lazy_harmony_calls(
    tok: ServerTokenizer, tools: Sequence[ToolSpec], opened: str | None
) -> tuple[str | None, GrammarTrigger | None]:
    """`lazy_calls` for the harmony format (llama.cpp's gpt-oss triggers): free until a
    message header names a recipient `functions.…` (`harmony.HEADER_TRIGGER`); from the
    header's anchor token on, a call of an offered tool with arguments of its schema.
    (None, None) where a structure token is no single token or a schema cannot be a
    constraint. `opened`: the channel the prompt left open (its text comes first)."""
    ids = [tok.encode(t, True) for t in (harmony.START, harmony.CHANNEL)]
    ends = [tok.encode(t, True) for t in (harmony.MESSAGE, harmony.END)]
    if any(len(i) != 1 for i in ids + ends):
        return None, None
    grammar = _lazy_grammar(lambda: harmony.call_grammar(tools, "required", lazy=True))
    if grammar is None:
        return None, None
    trigger = GrammarTrigger(
        [],
        pattern=harmony.HEADER_TRIGGER,
        anchors=[i[0] for i in ids],
        ends=[i[0] for i in ends],
        armed=opened is None,
    )
    return grammar, trigger


REASONING_EFFORTS = ("minimal", "low", "medium", "high")
MAX_TOOLS = 128  # OpenAI's limit: a forced call's grammar grows with every tool


def openai_chat(
    req: ChatRequest,
    tok: ServerTokenizer,
    default_reasoning: str,
    tool_call_format: str,
    lazy_tools: bool = True,
) -> ChatSetup:
    """An OpenAI chat request → `ChatSetup`."""
    if len(req.tools or []) > MAX_TOOLS:
        raise _bad("tools", f"at most {MAX_TOOLS} tools (as OpenAI's API)")
    tools = []
    for i, t in enumerate(req.tools or []):
        try:
            tools.append(ToolSpec.from_openai(t, f"tools[{i}]"))
        except ValueError as e:
            raise APIError(400, str(e), param=str(e).split(":")[0]) from None
    if len({t.name for t in tools}) != len(tools):
        raise _bad("tools", "tool names must be unique")
    choice = tool_choice_of(req.tool_choice, tools)
    kwargs = dict(req.chat_template_kwargs or {})
    if req.reasoning_effort is not None:
        if req.reasoning_effort not in REASONING_EFFORTS:
            raise _bad("reasoning_effort", f"must be one of {', '.join(REASONING_EFFORTS)}")
        kwargs.setdefault("reasoning_effort", req.reasoning_effort)
    grammar, param = answer_grammar(req)
    return prepare_chat(
        tok,
        chat_messages(req),
        tools,
        choice,
        req.parallel_tool_calls is not False,
        grammar,
        kwargs,
        req.reasoning_format or default_reasoning,
        tool_call_format,
        param,
        lazy_tools,
    )


def reasoning_budget(
    req: ChatRequest, setup: ChatSetup, tok: ServerTokenizer, config: Config
) -> ReasoningBudget | None:
    """The request's cap on its thinking (`reasoning_budget_tokens` or llama.cpp's
    `thinking_budget_tokens`; absent or -1: the server's `reasoning_budget`), with the tags of
    the template's format: `<think>`…`</think>` where the template writes them, harmony's
    analysis channel (`<|channel|>analysis<|message|>`…`<|end|>`); None without a cap or a
    format that thinks (llama.cpp switches the budget on the same way). As llama.cpp, a prompt
    that opened the block spends the budget on its tokens after the open tag."""
    budget = req.reasoning_budget_tokens
    name = "reasoning_budget_tokens"
    if req.thinking_budget_tokens is not None:
        if budget is not None:
            raise _bad("thinking_budget_tokens", "the same setting as reasoning_budget_tokens")
        budget, name = req.thinking_budget_tokens, "thinking_budget_tokens"
    if budget is not None and not -1 <= budget < 1 << 31:
        raise _bad(name, f"must be -1 (the server's) or in 0..2^31-1 (got {budget})")
    if budget is None or budget == -1:
        budget = config.reasoning_budget
    if budget < 0:
        return None
    template = tok.chat_template or ""
    if setup.harmony[0]:
        open_tag, close_tag = harmony.CHANNEL + "analysis" + harmony.MESSAGE, harmony.END
        opened = setup.harmony[1] == "analysis"
    elif OPEN in template or CLOSE in template:
        open_tag, close_tag, opened = OPEN, CLOSE, setup.reasoning_opened
    else:
        return None  # the model writes no thinking block this cap could close
    message = req.reasoning_budget_message
    if message is None:
        message = config.reasoning_budget_message
    close = tok.encode(close_tag, True)
    spent = 0
    if opened:  # the prompt's tokens after its open tag count, as llama.cpp feeds them
        tail = setup.prompt[setup.prompt.rfind(open_tag) + len(open_tag) :]
        spent = len(tok.encode(tail, True)) if tail else 0
    return ReasoningBudget(
        budget=max(0, budget - spent),
        start=tok.encode(open_tag, True),
        end=close,
        forced=(tok.encode(message, False) if message else []) + close,
        opened=opened,
    )
