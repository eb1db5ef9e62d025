"""The tokenizer seam of the server.

The server needs only `ServerTokenizer` (below). Two implementations:
- `ToyTokenizer`: bytes + a few specials (`strata.toytok`), paired with the fake engine;
- `RealTokenizer`: an adapter over `strata.tokenizer.Tokenizer.from_metadata(gguf metadata)`
  (imported lazily; it lands with the tokenizer work). Only this adapter knows its API.
Streamed text comes from `strata.tokenizer`'s `IncrementalDetokenizer` and `StopMatcher` (the
project's one implementation of each), which work on any `ServerTokenizer`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from strata import toytok
from strata.config import Config
from strata.infill import FimTokens


class ServerTokenizer(Protocol):
    n_vocab: int
    eos_id: int
    eog_ids: frozenset[int]  # ids that end generation (finish "stop", never shown)
    fim: FimTokens | None  # fill-in-the-middle tokens (None: /infill is refused)
    sampling_metadata: dict[str, Any]  # the GGUF's general.sampling.* keys (recommendations)
    chat_template: str | None  # the Jinja source (None: a built-in rendering)
    # the BOS a prompt starts with where the GGUF asks for one (tokenizer.ggml.add_bos_token,
    # SentencePiece models), as llama-server's prompts; None: none
    prompt_bos: int | None

    def encode(self, text: str, special: bool) -> list[int]:
        """Text to ids; `special`: text like `<|user|>` becomes the special token (templates)."""
        ...

    def with_bos(self, ids: list[int]) -> list[int]:
        """A prompt's ids led by `prompt_bos`, unless they start with it already (a chat
        template that writes it)."""
        ...

    def decode(self, ids: Sequence[int]) -> str:
        """Ids to text, specials skipped; invalid UTF-8 becomes U+FFFD."""
        ...

    def decode_special(self, ids: Sequence[int]) -> str:
        """Ids to text with special tokens as their text (a prompt shown back)."""
        ...

    def token_bytes(self, token: int) -> bytes:
        """The raw bytes of one token (for logprobs' `bytes`, and the streamed text)."""
        ...

    def is_special(self, token: int) -> bool:
        """Whether the token is one `decode` skips (its bytes are not text)."""
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
        self.fim: FimTokens | None = None
        self.sampling_metadata: dict[str, Any] = {}
        self.prompt_bos: int | None = None
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

    def with_bos(self, ids: list[int]) -> list[int]:
        return ids  # the toy vocabulary has no BOS

    def decode(self, ids: Sequence[int]) -> str:
        return bytes(t for t in ids if toytok.is_byte(t)).decode("utf-8", errors="replace")

    def decode_special(self, ids: Sequence[int]) -> str:
        return b"".join(toytok.token_bytes(t) for t in ids).decode("utf-8", errors="replace")

    def token_bytes(self, token: int) -> bytes:
        return toytok.token_bytes(token)

    def is_special(self, token: int) -> bool:
        return not toytok.is_byte(token)

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
        self.bos_id: int | None = self.tok.bos_id
        self.prompt_bos: int | None = self.bos_id if self.tok.adds_bos else None
        self.chat_template: str | None = self.tok.chat_template
        self.fim: FimTokens | None = self.tok.fim  # fill-in-the-middle tokens (/infill)
        self.sampling_metadata = {
            k: v for k, v in metadata.items() if k.startswith("general.sampling.")
        }

    def encode(self, text: str, special: bool) -> list[int]:
        return list(self.tok.encode(text, parse_special=special))

    def with_bos(self, ids: list[int]) -> list[int]:
        return list(self.tok.with_bos(ids))

    def decode(self, ids: Sequence[int]) -> str:
        return str(self.tok.decode(list(ids), skip_special=True))

    def decode_special(self, ids: Sequence[int]) -> str:
        return str(self.tok.decode(list(ids), skip_special=False))

    def token_bytes(self, token: int) -> bytes:
        return bytes(self.tok.token_bytes(token))

    def is_special(self, token: int) -> bool:
        return bool(self.tok.is_special(token))

    def use_template(self, source: str) -> None:
        """Render chats with `source` instead of the GGUF's template."""
        self.tok.chat_template = source
        self.chat_template = source

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
    tok = RealTokenizer(metadata)
    if config.chat_template_file:
        tok.use_template(template_file(config.chat_template_file))
    return tok


def template_file(path: str) -> str:
    """A chat template file's text, compiled once to refuse a broken one at start."""
    from strata.errors import ConfigError
    from strata.tokenizer import check_template

    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"chat_template_file: {e}") from None
    try:
        check_template(text)
    except ValueError as e:
        raise ConfigError(f"chat_template_file {path}: {e}") from None
    return text
