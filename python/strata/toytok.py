"""The toy byte-level vocabulary shared by the fake engine and its tokenizer.

Ids 0..255 are the bytes; then a few specials. The chat template is
`<|system|>…<|end|><|user|>…<|end|><|assistant|>` with each marker one token. Nothing here
depends on numpy or the engine, so the server and the engine can both import it.
"""

from __future__ import annotations

EOS = 256
SYSTEM, USER, ASSISTANT, END = 257, 258, 259, 260
SPECIALS = {
    EOS: "<|endoftext|>",
    SYSTEM: "<|system|>",
    USER: "<|user|>",
    ASSISTANT: "<|assistant|>",
    END: "<|end|>",
}
ROLE_TOKEN = {"system": SYSTEM, "developer": SYSTEM, "user": USER, "assistant": ASSISTANT}
N_VOCAB = 264  # 261 used; padded
EOG_IDS = frozenset({EOS, END})


def is_byte(token: int) -> bool:
    return 0 <= token < 256


def token_bytes(token: int) -> bytes:
    """The bytes a token stands for (specials as their UTF-8 text; unused ids as empty)."""
    if is_byte(token):
        return bytes([token])
    return SPECIALS.get(token, "").encode()


class Vocabulary:
    """The toy vocabulary as `strata.constraints.Vocabulary` (grammar constraints on the fake
    engine): specials are matched by name only; text encodes byte by byte."""

    n_vocab = N_VOCAB
    eog_ids = EOG_IDS

    def token_bytes(self, token: int) -> bytes:
        return token_bytes(token)

    def is_special(self, token: int) -> bool:
        return token in SPECIALS

    is_control = is_special

    def encode(self, text: str) -> list[int]:
        return list(text.encode())

    encode_continuation = encode
