"""The assistant's generated text → reasoning, content and tool calls (whole or streamed):
`strata.reasoning.ReasoningParser` first, then `strata.server.tools.ToolCallParser` on the
content. Shared by the OpenAI and Anthropic routes."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from strata.reasoning import ReasoningParser
from strata.server.harmony import HarmonyParser
from strata.server.tools import ToolCall, ToolCallParser, ToolFormat, ToolSpec

# (kind, value): ("reasoning", text), ("content", text), ("call", ToolCall); incremental
# parsers also give ("call_start", ToolCall) and ("call_args", text)
Part = tuple[str, Any]


class AssistantParser:
    def __init__(
        self,
        reasoning: ReasoningParser | HarmonyParser | None = None,
        tools: ToolCallParser | None = None,
        reasoning_as_content: bool = False,
    ) -> None:
        self.reasoning = reasoning
        self.tools = tools
        self.n_calls = 0
        # harmony with reasoning_format none: its calls are parsed still, its analysis text
        # goes to the content (llama.cpp's gpt-oss parser does the same)
        self.reasoning_as_content = reasoning_as_content

    @staticmethod
    def make(
        parse_reasoning: bool,
        reasoning_opened: bool,
        fmt: ToolFormat | None,
        tools: Sequence[ToolSpec],
        parallel: bool = True,
        incremental: bool = False,
        harmony: tuple[bool, str | None] = (False, None),
        forced: bool = False,
    ) -> AssistantParser:
        """`fmt` None: tool calls are not parsed (no tools, or tool_choice "none").
        `incremental`: calls also stream as "call_start" / "call_args" parts
        (`ToolCallParser`). `harmony`: (the template writes harmony messages, the channel
        the prompt left open): channels and calls are parsed by `HarmonyParser` instead (with
        `parse_reasoning`). `forced`: the answer is calls only (`ToolCallParser`)."""
        on, opened = harmony
        # with reasoning_format none the text stays as written, unless calls are to be parsed
        # (llama.cpp's gpt-oss parser still takes them then; the analysis goes to content)
        if on and (parse_reasoning or fmt is not None):
            offered = {t.name: t for t in tools} if fmt is not None else None
            return AssistantParser(
                HarmonyParser(opened, offered, incremental),
                reasoning_as_content=not parse_reasoning,
            )
        reasoning = ReasoningParser(reasoning_opened) if parse_reasoning else None
        return AssistantParser(
            reasoning,
            ToolCallParser(fmt, tools, parallel, incremental, forced) if fmt is not None else None,
        )

    def _content(self, parts: list[Part], final: bool) -> list[Part]:
        out: list[Part] = []
        for kind, v in parts:
            if kind == "reasoning" and self.reasoning_as_content:
                kind = "content"
            if kind == "content" and self.tools is not None:
                out += self.tools.push(v)
            else:
                out.append((kind, v))
        if final and self.tools is not None:
            out += self.tools.finish()
        self.n_calls += sum(1 for p in out if p[0] == "call")
        return out

    def push(self, text: str) -> list[Part]:
        parts: list[Part] = (
            list(self.reasoning.push(text)) if self.reasoning else [("content", text)]
        )
        return self._content(parts, final=False)

    def finish(self) -> list[Part]:
        parts: list[Part] = list(self.reasoning.finish()) if self.reasoning else []
        return self._content(parts, final=True)


@dataclass(slots=True)
class Message:
    """A whole answer, split."""

    reasoning: str = ""
    content: str = ""
    calls: list[ToolCall] = field(default_factory=list)


def split(parser: AssistantParser, text: str) -> Message:
    m = Message()
    for kind, v in parser.push(text) + parser.finish():
        if kind == "reasoning":
            m.reasoning += v
        elif kind == "content":
            m.content += v
        elif kind == "call":
            m.calls.append(v)
    return m
