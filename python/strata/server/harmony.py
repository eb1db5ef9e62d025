"""The harmony format of gpt-oss: an answer is a run of messages
`[<|start|>ROLE]<|channel|>CHANNEL[ to=RECIPIENT][ <|constrain|>…]<|message|>TEXT<|end|>` (the
recipient may also follow ROLE), the last one ended by `<|return|>` or `<|call|>`
(end-of-generation tokens, so not in the text).

`HarmonyParser` splits such an answer, whole or streamed, as `reasoning.ReasoningParser` splits
a `<think>` block: the `analysis` channel's text is reasoning, the other channels' (`final`,
`commentary`) content, the structure tokens are dropped. A message addressed to
`functions.NAME` of a tool the request offers is a tool call whose arguments are its text (a
JSON object); given tools, such a message is held until it ends. An answer that does not start
like a harmony message is content as is. The tokenizer renders the structure tokens as text,
as llama.cpp does (`tokenizer._RENDERED_TEXTS`), so that they reach the parser.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from strata.constraints import ANSWER, renamed_start, schema_text
from strata.reasoning import _partial
from strata.server.tools import ToolCall, ToolSpec, strict_object

START, CHANNEL, CONSTRAIN, MESSAGE, END = (
    "<|start|>",
    "<|channel|>",
    "<|constrain|>",
    "<|message|>",
    "<|end|>",
)
_RECIPIENT = re.compile(r"\bto=functions\.([^\s<]+)")

Part = tuple[str, Any]


def is_harmony(template: str | None) -> bool:
    """Whether a chat template writes harmony messages."""
    return template is not None and CHANNEL in template and MESSAGE in template


def _channel(header: str) -> str:
    """The channel named by a header `CHANNEL[ to=…][<|constrain|>…]`."""
    words = header.split(CONSTRAIN)[0].split()
    return words[0] if words else ""


def open_channel(prompt: str) -> str | None:
    """The channel a rendered prompt leaves open (it ends with `<|channel|>X<|message|>`)."""
    if not prompt.endswith(MESSAGE):
        return None
    i = prompt.rfind(CHANNEL)
    return None if i < 0 else _channel(prompt[i + len(CHANNEL) : -len(MESSAGE)])


def _kind(channel: str) -> str:
    return "reasoning" if channel == "analysis" else "content"


class HarmonyParser:
    """`tools`: the offered tools by name (None: calls are not parsed, their text is
    content); `incremental`: a call also comes as "call_start" and "call_args" parts before
    its "call" (as `tools.ToolCallParser` streams)."""

    def __init__(
        self,
        opened: str | None = None,
        tools: Mapping[str, ToolSpec] | None = None,
        incremental: bool = False,
    ) -> None:
        # "head": before a message's text (its header is buffered); "body": inside a
        # message of `kind` ("call": a tool call's, held whole); "plain": not harmony,
        # everything is content
        self.state = "body" if opened is not None else "head"
        self.kind = _kind(opened or "")
        self.call = ""  # the called tool's name while kind is "call"
        self.tools, self.incremental = tools, incremental
        self.buf = ""

    def _head(self, head: str) -> None:
        j = head.find(CHANNEL)
        self.kind = _kind(_channel(head[j + len(CHANNEL) :]) if j >= 0 else "")
        m = _RECIPIENT.search(head)
        if m and self.tools is not None and m.group(1) in self.tools:
            self.kind, self.call = "call", m.group(1)

    def _body(self, text: str) -> list[Part]:
        """A finished message's text (a call's whole arguments)."""
        if self.kind != "call":
            return [(self.kind, text)] if text else []
        try:
            args = json.loads(text)
        except json.JSONDecodeError:
            args = None
        if not isinstance(args, dict):
            return [("content", text)] if text else []
        call = ToolCall(self.call, json.dumps(args, ensure_ascii=False))
        if not self.incremental:
            return [("call", call)]
        return [("call_start", call), ("call_args", call.arguments), ("call", call)]

    def push(self, text: str) -> list[Part]:
        self.buf += text
        out: list[Part] = []
        while self.buf:
            if self.state == "plain":
                out.append(("content", self.buf))
                self.buf = ""
            elif self.state == "head":
                i = self.buf.find(MESSAGE)
                if i < 0:
                    # a header opens with <|start|>, <|channel|>, or right after the prompt's
                    # `<|start|>assistant` with the recipient (` to=functions.X`)
                    b = self.buf
                    lead = (START, CHANNEL, " to=")
                    if not any(b.startswith(t) or t.startswith(b) for t in lead):
                        self.state = "plain"
                        continue
                    return out  # the header goes on
                self._head(self.buf[:i])
                self.buf = self.buf[i + len(MESSAGE) :]
                self.state = "body"
            else:
                i = self.buf.find(END)
                if i >= 0:
                    out += self._body(self.buf[:i])
                    self.buf = self.buf[i + len(END) :]
                    self.state = "head"
                    continue
                if self.kind == "call":
                    return out  # held until the message ends
                keep = _partial(self.buf, END)
                if len(self.buf) > keep:
                    out.append((self.kind, self.buf[: len(self.buf) - keep]))
                self.buf = self.buf[len(self.buf) - keep :]
                return out
        return out

    def finish(self) -> list[Part]:
        """The end of the answer (`<|return|>` or `<|call|>`): a message's held text is
        released; an unfinished header is dropped."""
        buf, self.buf = self.buf, ""
        if self.state == "head":
            return []
        if self.state == "plain":
            return [("content", buf)] if buf else []
        return self._body(buf)


# -- constraints (llguidance Lark) ----------------------------------------------------------------
# A constrained harmony answer is constrained only where the constraint applies: in the final
# message (`response_format`) or in the call's header and arguments (a forced `tool_choice`);
# the analysis (and, before a call, commentary) messages that precede it stay free, as
# llama.cpp's gpt-oss grammar leaves them. The structure tokens are control tokens, which the
# grammar names (`<|end|>`) and no text matches (`Tokenizer.is_control`): a free message ends
# at the model's `<|end|>`, and a constrained JSON string cannot hold one.

# (names ending in "__": no clash with a request's own rules)
_GRAMMAR_TAIL = r"""
TEXT__: /(?s:.*)/
marks__: (/[ \t\n]+/ <|constrain|>? | <|constrain|>) TYPE__
TYPE__: /[A-Za-z0-9_\-]{1,32}/
"""


def _lead(opened: str | None, channels: str) -> str:
    """The messages before the constrained one: the prompt's open message's rest (when the
    prompt left one open), then any number of messages on `channels` (a Lark alternative)."""
    nxt = '<|end|> <|start|> "assistant"'
    rest = f"TEXT__ {nxt} " if opened is not None else ""
    return f"{rest}(<|channel|> ({channels}) <|message|> TEXT__ {nxt})*"


def answer_grammar(grammar: str, opened: str | None) -> str:
    """`grammar` (a Lark grammar whose `start` is the answer) as the final message's text,
    after any analysis messages: `<|channel|>final[ <|constrain|>TYPE]<|message|>ANSWER`.
    `opened`: the channel the prompt left open (`open_channel`): "final" constrains from the
    first token."""
    if opened == "final":
        return grammar
    body = renamed_start(grammar)
    head = f'start: {_lead(opened, chr(34) + "analysis" + chr(34))} <|channel|> "final" marks__?'
    return f"{body.rstrip()}\n{head} <|message|> {ANSWER}\n{_GRAMMAR_TAIL}"


# A call's header, found in the text after a header's anchor token (`<|start|>`,
# `<|channel|>`, or the answer's start after the prompt's `<|start|>assistant`): the lazy
# grammar's trigger for tool_choice auto (`strata.constraints.HeaderGrammar`).
HEADER_TRIGGER = r"^(assistant|commentary|analysis)?\s*to=functions"


def call_grammar(
    tools: Sequence[ToolSpec], choice: str, lazy: bool = False, opened: str | None = None
) -> str:
    """A forced call (`choice` "required": one call of any offered tool; a tool's name: that
    tool's), after any analysis or commentary messages: the recipient in the role's header
    (` to=functions.NAME<|channel|>commentary`) or in the channel's, then `<|message|>` and the
    arguments as a JSON object valid for the tool's parameters. Harmony makes one call per
    turn (`<|call|>` ends it), so `parallel_tool_calls` changes nothing here. `lazy`: the
    grammar starts at the call's header (its anchor token on; tool_choice auto's).
    `opened`: the channel the prompt left open (its text and end come first)."""
    chosen = [t for t in tools if choice == "required" or t.name == choice]
    if not chosen:
        raise ValueError(f"tool_choice: no tool named {choice!r}")
    lines, names = [], []
    role = '(<|start|> "assistant")? ' if lazy else ""  # lazy: the header from its anchor on
    for i, t in enumerate(chosen):
        to = json.dumps(f" to=functions.{t.name}", ensure_ascii=False)
        args = schema_text(strict_object(t.parameters))
        names.append(f"call_{i}")
        header = f"{role}{to} channel | channel {to}"
        lines.append(f"call_{i}: ({header}) marks__? <|message|> %json {args}")
    chans = '"commentary" | "analysis"'
    head = [
        f"start: {_lead(opened, chans) + ' ' if not lazy else ''}call",
        "call: " + " | ".join(names),
        f"channel: <|channel|> ({chans})",
    ]
    return "\n".join(head + lines) + f"\n{_GRAMMAR_TAIL}"
