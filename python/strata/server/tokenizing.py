"""The tokenizer seam of the server, plus UTF-8-safe incremental detokenization and stop strings.

The server needs only `ServerTokenizer` (below). Two implementations:
- `ToyTokenizer`: bytes + a few specials (`strata.toytok`), paired with the fake engine;
- `RealTokenizer`: an adapter over `strata.tokenizer.Tokenizer.from_metadata(gguf metadata)`
  (imported lazily; it lands with the tokenizer work). Only this adapter knows its API.
`IncrementalDetokenizer` and `StopMatcher` work on any `ServerTokenizer`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from strata import toytok
from strata.config import Config


class ServerTokenizer(Protocol):
    n_vocab: int
    eos_id: int
    eog_ids: frozenset[int]  # ids that end generation (finish "stop", never shown)
    chat_template: str | None  # the Jinja source (None: a built-in rendering)

    def encode(self, text: str, special: bool) -> list[int]:
        """Text to ids; `special`: text like `<|user|>` becomes the special token (templates)."""
        ...

    def decode(self, ids: Sequence[int]) -> str:
        """Ids to text, specials skipped; invalid UTF-8 becomes U+FFFD."""
        ...

    def token_bytes(self, token: int) -> bytes:
        """The raw bytes of one token (for logprobs' `bytes`)."""
        ...

    def apply_chat_template(self, messages: list[dict[str, Any]], **kwargs: Any) -> str:
        """The prompt text for a conversation, ending with the assistant's turn opening;
        `kwargs` are template variables (tools, enable_thinking, …)."""
        ...


class ToyTokenizer:
    def __init__(self) -> None:
        self.n_vocab = toytok.N_VOCAB
        self.eos_id = toytok.EOS
        self.eog_ids = toytok.EOG_IDS
        self.chat_template: str | None = None
        self._by_text = {text: tid for tid, text in toytok.SPECIALS.items()}

    def encode(self, text: str, special: bool) -> list[int]:
        out: list[int] = []
        i = 0
        while i < len(text):
            if special and text.startswith("<|", i):
                j = text.find("|>", i)
                tid = self._by_text.get(text[i : j + 2]) if j >= 0 else None
                if tid is not None:
                    out.append(tid)
                    i = j + 2
                    continue
            j = text.find("<|", i + 1) if special else -1
            end = len(text) if j < 0 else j
            out += text[i:end].encode()
            i = end
        return out

    def decode(self, ids: Sequence[int]) -> str:
        return bytes(t for t in ids if toytok.is_byte(t)).decode("utf-8", errors="replace")

    def token_bytes(self, token: int) -> bytes:
        return toytok.token_bytes(token)

    def apply_chat_template(self, messages: list[dict[str, Any]], **kwargs: Any) -> str:
        parts = []
        for m in messages:
            marker = toytok.SPECIALS[toytok.ROLE_TOKEN.get(m["role"], toytok.USER)]
            parts.append(f"{marker}{m['content']}{toytok.SPECIALS[toytok.END]}")
        return "".join(parts) + toytok.SPECIALS[toytok.ASSISTANT]


class RealTokenizer:
    """Adapter over `strata.tokenizer.Tokenizer` (the GGUF tokenizer and chat template)."""

    def __init__(self, metadata: dict[str, Any]) -> None:
        from strata.tokenizer import Tokenizer  # type: ignore[import-not-found, unused-ignore]

        self.tok: Any = Tokenizer.from_metadata(metadata)
        self.n_vocab = int(self.tok.n_vocab)
        self.eog_ids = frozenset(int(t) for t in self.tok.eog_ids)
        eos = self.tok.eos_id
        self.eos_id = int(eos) if eos is not None else min(self.eog_ids, default=-1)
        self.chat_template: str | None = self.tok.chat_template

    def encode(self, text: str, special: bool) -> list[int]:
        return list(self.tok.encode(text, parse_special=special))

    def decode(self, ids: Sequence[int]) -> str:
        return str(self.tok.decode(list(ids), skip_special=True))

    def token_bytes(self, token: int) -> bytes:
        return bytes(self.tok.token_bytes(token))

    def apply_chat_template(self, messages: list[dict[str, Any]], **kwargs: Any) -> str:
        """Raises ValueError (the tokenizer's ChatTemplateError) when the template fails."""
        return str(self.tok.apply_chat_template(messages, add_generation_prompt=True, **kwargs))


def load_tokenizer(config: Config) -> ServerTokenizer:
    """The tokenizer for `config` (config.model is the resolved path for the llm engine)."""
    if config.engine == "fake":
        return ToyTokenizer()
    from strata.gguf import GGUFFile

    with GGUFFile(config.model) as f:
        metadata = dict(f.metadata)
    return RealTokenizer(metadata)


class IncrementalDetokenizer:
    """Text for a growing list of ids, never splitting a UTF-8 character: text is released only
    once the window decodes without a trailing U+FFFD (a partial character)."""

    def __init__(self, tok: ServerTokenizer) -> None:
        self.tok = tok
        self.ids: list[int] = []
        self.prefix = 0  # ids[prefix:read] is the context whose text was already released
        self.read = 0

    def push(self, ids: Sequence[int]) -> str:
        self.ids.extend(ids)
        before = self.tok.decode(self.ids[self.prefix : self.read])
        now = self.tok.decode(self.ids[self.prefix :])
        if now.endswith("\ufffd"):
            return ""  # a partial character: its next bytes are still to come
        if len(now) > len(before):
            self.prefix, self.read = self.read, len(self.ids)
            return now[len(before) :]
        if now == before:
            # tokens without text here (skipped specials, pads): out of the window, so a run
            # of them costs O(1) per token rather than O(run); the context stays the text's
            del self.ids[self.read :]
        return ""

    def flush(self) -> str:
        """What is left at the end (a broken trailing character shows as U+FFFD)."""
        before = self.tok.decode(self.ids[self.prefix : self.read])
        now = self.tok.decode(self.ids[self.prefix :])
        self.prefix = self.read = len(self.ids)
        return now[len(before) :]


class StopMatcher:
    """Stop strings on streamed text: holds back any tail that may still become a stop."""

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = [s for s in stops if s]
        self.held = ""
        self.stopped = False
        self.matched: str | None = None  # the stop string found (the earliest in the text)

    def push(self, text: str) -> str:
        """Text safe to release; sets `stopped` (and drops the stop and all after it)."""
        if self.stopped:
            return ""
        buf = self.held + text
        hits = [(i, s) for i, s in ((buf.find(s), s) for s in self.stops) if i >= 0]
        if hits:
            at, self.matched = min(hits, key=lambda h: h[0])
            self.stopped = True
            self.held = ""
            return buf[:at]
        keep = 0
        for s in self.stops:
            for k in range(min(len(s) - 1, len(buf)), 0, -1):
                if buf.endswith(s[:k]):
                    keep = max(keep, k)
                    break
        self.held = buf[len(buf) - keep :] if keep else ""
        return buf[: len(buf) - keep]

    def flush(self) -> str:
        out, self.held = ("" if self.stopped else self.held), ""
        return out
