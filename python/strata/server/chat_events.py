"""One chat choice's text as events: reasoning, content, tool calls.

`ChatEvents.for_request(req, tok)` picks the splitters the request needs; `push(text)` takes
the streamed text and returns the events it completes, `finish()` the rest. The Anthropic route
builds its content blocks from these events.
"""

from __future__ import annotations

from typing import Any, Literal

from strata.server.openai_types import ChatRequest
from strata.server.tokenizing import ServerTokenizer

Event = tuple[Literal["reasoning", "content"], str] | tuple[Literal["call"], Any]


class ChatEvents:
    """Text passes through as content."""

    @staticmethod
    def for_request(req: ChatRequest, tok: ServerTokenizer) -> ChatEvents:
        return ChatEvents()

    def push(self, text: str) -> list[Event]:
        return [("content", text)] if text else []

    def finish(self) -> list[Event]:
        return []
