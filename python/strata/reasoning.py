"""Reasoning text: a `<think>…</think>` block at the start of an answer (Qwen3, DeepSeek-R1,
GLM) split from the answer, whole or streamed.

`reasoning_format` (llama-server's setting, `Config.reasoning_format` and per request):
"parsed" puts the block's text in `reasoning_content` (stream deltas too) and the rest in
`content`; "none" leaves everything in `content`.

`ReasoningParser(opened)`: `opened` when the prompt itself opened the block (a template that
ends the generation prompt with `<think>`), so the answer starts inside it. Otherwise a block
counts only when the answer begins with it (leading whitespace aside).
"""

from __future__ import annotations

from typing import Literal

FORMATS = ("none", "parsed")
OPEN, CLOSE = "<think>", "</think>"

Part = tuple[Literal["reasoning", "content"], str]


def prompt_opens_reasoning(prompt: str, open_tag: str = OPEN, close_tag: str = CLOSE) -> bool:
    """True when the rendered prompt ends inside an open reasoning block."""
    i = prompt.rfind(open_tag)
    return i >= 0 and prompt.find(close_tag, i) < 0 and not prompt[i + len(open_tag) :].strip()


def _partial(buf: str, tag: str) -> int:
    """Length of the longest tail of `buf` that is a proper prefix of `tag`."""
    for k in range(min(len(tag) - 1, len(buf)), 0, -1):
        if buf.endswith(tag[:k]):
            return k
    return 0


class ReasoningParser:
    def __init__(self, opened: bool = False, open_tag: str = OPEN, close_tag: str = CLOSE):
        self.open_tag, self.close_tag = open_tag, close_tag
        # "start": before the first text; "reasoning"; "after": right after the close
        # (leading whitespace dropped); "content": plain text from here on
        self.state = "reasoning" if opened else "start"
        self.lead = opened  # drop whitespace at the start of the reasoning
        self.buf = ""

    def push(self, text: str) -> list[Part]:
        self.buf += text
        out: list[Part] = []
        while self.buf:
            if self.state == "start":
                s = self.buf.lstrip()
                if not s:
                    return out
                if s.startswith(self.open_tag):
                    self.buf = s[len(self.open_tag) :]
                    self.state, self.lead = "reasoning", True
                    continue
                if self.open_tag.startswith(s):
                    return out  # may still become the open tag
                self.state = "content"
                continue
            if self.state == "reasoning":
                if self.lead:
                    self.buf = self.buf.lstrip()
                    if not self.buf:
                        return out
                    self.lead = False
                i = self.buf.find(self.close_tag)
                if i >= 0:
                    if i:
                        out.append(("reasoning", self.buf[:i]))
                    self.buf = self.buf[i + len(self.close_tag) :]
                    self.state = "after"
                    continue
                keep = _partial(self.buf, self.close_tag)
                if len(self.buf) > keep:
                    out.append(("reasoning", self.buf[: len(self.buf) - keep]))
                self.buf = self.buf[len(self.buf) - keep :]
                return out
            if self.state == "after":
                self.buf = self.buf.lstrip()
                if not self.buf:
                    return out
                self.state = "content"
                continue
            out.append(("content", self.buf))
            self.buf = ""
        return out

    def finish(self) -> list[Part]:
        """The end of the answer: held text is released (an unclosed block stays reasoning)."""
        buf, self.buf = self.buf, ""
        if not buf:
            return []
        if self.state == "reasoning":
            return [("reasoning", buf)]
        if self.state == "after":
            buf = buf.lstrip()
        return [("content", buf)] if buf else []
