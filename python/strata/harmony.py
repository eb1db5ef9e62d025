"""The harmony format of gpt-oss: an answer is a run of messages
`[<|start|>ROLE]<|channel|>CHANNEL[ to=…][<|constrain|>…]<|message|>TEXT<|end|>`, the last one
ended by `<|return|>` or `<|call|>` (end-of-generation tokens, so not in the text).

`HarmonyParser` splits such an answer, whole or streamed, as `reasoning.ReasoningParser` splits
a `<think>` block: the `analysis` channel's text is reasoning, every other channel's (`final`,
`commentary`) content, the structure tokens are dropped. An answer that does not start like a
harmony message is content as is. The tokenizer renders the structure tokens as text, as
llama.cpp does (`tokenizer._RENDERED_TEXTS`), so that they reach the parser.
"""

from __future__ import annotations

from typing import Literal

from strata.reasoning import Part, _partial

Kind = Literal["reasoning", "content"]

START, CHANNEL, CONSTRAIN, MESSAGE, END = (
    "<|start|>",
    "<|channel|>",
    "<|constrain|>",
    "<|message|>",
    "<|end|>",
)


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


def _kind(channel: str) -> Kind:
    return "reasoning" if channel == "analysis" else "content"


class HarmonyParser:
    def __init__(self, opened: str | None = None) -> None:
        # "head": before a message's text (its header is buffered); "body": inside a
        # message of `kind`; "plain": not harmony, everything is content
        self.state = "body" if opened is not None else "head"
        self.kind: Kind = _kind(opened or "")
        self.buf = ""

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
                    b = self.buf
                    if not any(b.startswith(t) or t.startswith(b) for t in (START, CHANNEL)):
                        self.state = "plain"
                        continue
                    return out  # the header goes on
                j = self.buf.find(CHANNEL, 0, i)
                self.kind = _kind(_channel(self.buf[j + len(CHANNEL) : i]) if j >= 0 else "")
                self.buf = self.buf[i + len(MESSAGE) :]
                self.state = "body"
            else:
                i = self.buf.find(END)
                if i >= 0:
                    if i:
                        out.append((self.kind, self.buf[:i]))
                    self.buf = self.buf[i + len(END) :]
                    self.state = "head"
                    continue
                keep = _partial(self.buf, END)
                if len(self.buf) > keep:
                    out.append((self.kind, self.buf[: len(self.buf) - keep]))
                self.buf = self.buf[len(self.buf) - keep :]
                return out
        return out

    def finish(self) -> list[Part]:
        """The end of the answer: a message's held text is released; an unfinished header
        is dropped."""
        buf, self.buf = self.buf, ""
        if not buf or self.state == "head":
            return []
        kind: Kind = "content" if self.state == "plain" else self.kind
        return [(kind, buf)]
