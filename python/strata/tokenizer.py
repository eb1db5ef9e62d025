"""The GGUF's byte-level BPE tokenizer rebuilt with HF `tokenizers` (docs/FORMATS.md §5), its chat
template, an incremental UTF-8-safe detokenizer and a stop-string matcher.

Used by the server (which owns tokenization, templates, stop strings and detokenization) and
by `strata.LLM`.
"""

from __future__ import annotations

import codecs
import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, Protocol

from strata import tokenizer_spm
from strata.errors import ModelError
from strata.infill import FimTokens, eot_token, fim_tokens
from strata.tokenizer_spm import CONTROL, NORMAL, UNKNOWN, USER_DEFINED

# The qwen2 pre-tokenizer split pattern (docs/FORMATS.md §5), as in Qwen's tokenizer.json.
QWEN2_PRETOKENIZER_RE = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# tokenizer.ggml.pre values whose split pattern is the qwen2 one.
_QWEN2_PRES = frozenset({"qwen2", "qwen35", "deepseek-r1-qwen", "megrez"})
# The o200k split pattern (gpt-oss, `gpt-4o`) as llama.cpp runs it (LLAMA_VOCAB_PRE_TYPE_GPT4O):
# tokenizer.json's letter classes written as "a letter that is not a-z" / "not A-Z", so a
# non-ASCII letter counts on both sides, as in llama.cpp.
GPT4O_PRETOKENIZER_RE = (
    r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+"
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?"
    r"|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*"
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# tokenizer.ggml.pre values and their split patterns (the names llama.cpp maps to each).
PRETOKENIZERS: dict[str, str] = {
    **dict.fromkeys(_QWEN2_PRES, QWEN2_PRETOKENIZER_RE),
    **dict.fromkeys(("gpt-4o", "llama4", "kanana2", "talkie"), GPT4O_PRETOKENIZER_RE),
}

# tokenizer.ggml.model values: byte-level BPE and SentencePiece (`tokenizer_spm`)
VOCAB_MODELS = ("gpt2", "llama")


# Special-token texts llama.cpp treats as end of generation when present (besides eos / eot /
# eom), the FIM pad / repo / file-separator tokens included. llama.cpp also matches a NORMAL
# "</s>" entry by text; Strata does not (a plain-text token).
_EOG_TEXTS = (
    "<|im_end|>",
    "<|endoftext|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|end|>",
    "<|return|>",  # o200k_harmony (gpt-oss)
    "<|call|>",  # o200k_harmony
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
)


# The harmony format's (gpt-oss) structure tokens, which llama.cpp always renders as text (it
# makes them USER_DEFINED) so that channels can be parsed from the output.
_RENDERED_TEXTS = ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>")


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte → printable character table used by byte-level BPE."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    chars = list(printable)
    n = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(printable, chars, strict=True)}


_BYTE_OF_CHAR = {c: b for b, c in _bytes_to_unicode().items()}


def _token_bytes(text: str) -> bytes:
    """The bytes a NORMAL byte-level token stands for (characters outside the table, which a
    well-formed vocabulary does not have, are taken as their UTF-8)."""
    out = bytearray()
    for ch in text:
        b = _BYTE_OF_CHAR.get(ch)
        if b is None:
            out += ch.encode("utf-8")
        else:
            out.append(b)
    return bytes(out)


def _byte_level_piece(text: str, ty: int) -> bytes:
    """The bytes a byte-level BPE token decodes to (control, unknown and user-defined entries
    are their text; unused ones nothing)."""
    if ty == NORMAL:
        return _token_bytes(text)
    if ty in (CONTROL, USER_DEFINED, UNKNOWN):
        return text.encode("utf-8")
    return b""


def _byte_level_model(vocab: dict[str, int], merges: Sequence[str], pre: str) -> Any:
    """The `tokenizers.Tokenizer` of a byte-level BPE vocabulary (added tokens not yet set)."""
    from tokenizers import Regex, decoders, models, normalizers, pre_tokenizers
    from tokenizers import Tokenizer as HFTokenizer

    merge_pairs: list[tuple[str, str]] = []
    for m in merges:
        left, sep, right = m.partition(" ")
        if not sep or not left or not right:
            raise ModelError(f"tokenizer.ggml.merges: malformed entry {m!r}")
        merge_pairs.append((left, right))
    try:
        model = models.BPE(vocab=vocab, merges=merge_pairs, unk_token=None, byte_fallback=False)
    except Exception as e:  # tokenizers raises plain Exception on bad merges
        raise ModelError(f"tokenizer: cannot build the BPE model: {e}") from None
    hf = HFTokenizer(model)
    hf.normalizer = normalizers.NFC()
    hf.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZERS[pre]), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    hf.decoder = decoders.ByteLevel()
    return hf


class ChatTemplateError(ValueError):
    """The chat template could not be rendered (bad template or messages it rejects)."""


class Tokenizer:
    """The tokenizer of a GGUF model: byte-level BPE, or SentencePiece (`tokenizer_spm`). Build
    with `from_metadata` or `from_gguf`."""

    def __init__(
        self,
        tokens: Sequence[str],
        token_types: Sequence[int],
        merges: Sequence[str],
        *,
        bos_id: int | None,
        eos_id: int | None,
        extra_eog: Iterable[int] = (),
        add_bos: bool = False,
        add_eos: bool = False,
        chat_template: str | None = None,
        pre: str = "qwen2",
        model: str = "gpt2",
        scores: Sequence[float] | None = None,
        add_space_prefix: bool = True,
        unk_id: int | None = None,
    ) -> None:
        from tokenizers import AddedToken

        n = len(tokens)
        if len(token_types) != n:
            raise ModelError(
                f"tokenizer: {len(token_types)} token types for {n} tokens (they must match)"
            )
        if model not in VOCAB_MODELS:
            raise ModelError(
                f"tokenizer.ggml.model {model!r} is not supported (Strata runs byte-level BPE, "
                "'gpt2', and SentencePiece, 'llama')"
            )
        if model == "gpt2" and pre not in PRETOKENIZERS:
            raise ModelError(
                f"tokenizer.ggml.pre {pre!r} is not supported (Strata runs the qwen2 and "
                f"gpt-4o pre-tokenizers: {', '.join(sorted(PRETOKENIZERS))})"
            )
        for name, v in (("bos", bos_id), ("eos", eos_id)):
            if v is not None and not (0 <= v < n):
                raise ModelError(f"tokenizer: {name} token id {v} is outside the vocabulary ({n})")
        self._tokens = list(tokens)
        self._types = [int(t) for t in token_types]
        self._bos = bos_id
        self._eos = eos_id
        self._add_bos = add_bos
        self._add_eos = add_eos
        self.chat_template = chat_template

        # Every token keeps its GGUF id in the BPE vocabulary (only NORMAL ones are reachable
        # through merges); the first id of a duplicated text wins.
        vocab: dict[str, int] = {}
        for i, t in enumerate(self._tokens):
            vocab.setdefault(t, i)
        if model == "llama":
            hf = tokenizer_spm.hf_model(
                tokens, self._types, scores, vocab, add_space_prefix, unk_id
            )
            piece_of = tokenizer_spm.piece
        else:
            hf = _byte_level_model(vocab, merges, pre)
            piece_of = _byte_level_piece
        special = [
            AddedToken(self._tokens[i], special=True, normalized=False)
            for i, ty in enumerate(self._types)
            if ty in (CONTROL, UNKNOWN) and vocab[self._tokens[i]] == i
        ]
        user = [
            AddedToken(self._tokens[i], special=False, normalized=False)
            for i, ty in enumerate(self._types)
            if ty == USER_DEFINED and vocab[self._tokens[i]] == i
        ]
        hf.add_special_tokens(special)
        hf.add_tokens(user)
        self._hf = hf
        self._hf_plain: Any = None  # the same with special tokens read as text, made on demand
        # a SentencePiece vocabulary that adds the space prefix: the same without it, made on
        # demand (`encode_continuation`)
        self._prefixed = model == "llama" and add_space_prefix
        self._hf_cont: Any = None

        # decode table: bytes of every id (control tokens are their text; unused ones empty)
        self._piece = [piece_of(t, ty) for t, ty in zip(self._tokens, self._types, strict=True)]
        rendered = {vocab[t] for t in _RENDERED_TEXTS if t in vocab}
        self._control = frozenset(i for i, ty in enumerate(self._types) if ty in (CONTROL, UNKNOWN))
        self._special = self._control - rendered

        eog = set(extra_eog)
        if eos_id is not None:
            eog.add(eos_id)
        for text in _EOG_TEXTS:
            j = vocab.get(text)
            if j is not None and self._types[j] in (CONTROL, USER_DEFINED):
                eog.add(j)
        # llama.cpp's o200k_harmony rule: with <|return|> and <|call|> among the EOG tokens,
        # <|end|> ends a message, not the generation (and is rendered as text).
        texts = {self._tokens[i]: i for i in eog if 0 <= i < n}
        if {"<|return|>", "<|call|>", "<|end|>"} <= texts.keys():
            eog.discard(texts["<|end|>"])
            self._special = self._special - {texts["<|end|>"]}
        self._eog = frozenset(i for i in eog if 0 <= i < n)
        # fill-in-the-middle tokens and the end-of-turn token, found by text (from_metadata
        # reads the GGUF's keys first)
        self.fim: FimTokens | None = fim_tokens({}, self.token_id)
        self.eot_id: int | None = eot_token({}, self.token_id, eos_id)

    # ---- construction --------------------------------------------------------------------

    @classmethod
    def from_metadata(cls, metadata: Mapping[str, Any]) -> Tokenizer:
        """Build from a GGUF's metadata (as `strata.gguf.GGUFFile.metadata` gives it)."""

        def get(key: str, kind: type | tuple[type, ...], required: bool = True) -> Any:
            v = metadata.get(key)
            if v is None:
                if required:
                    raise ModelError(f"tokenizer: the GGUF has no {key}")
                return None
            if not isinstance(v, kind) or (isinstance(v, bool) and kind is int):
                raise ModelError(f"tokenizer: {key} has the wrong type ({type(v).__name__})")
            return v

        model = get("tokenizer.ggml.model", str)
        if model not in VOCAB_MODELS:
            raise ModelError(
                f"tokenizer.ggml.model {model!r} is not supported (Strata runs byte-level BPE, "
                "'gpt2', and SentencePiece, 'llama')"
            )
        spm = model == "llama"
        tokens = get("tokenizer.ggml.tokens", (list, tuple))
        types = get("tokenizer.ggml.token_type", (list, tuple), required=False)
        if types is None:
            types = [NORMAL] * len(tokens)
        merges = () if spm else get("tokenizer.ggml.merges", (list, tuple))
        space = get("tokenizer.ggml.add_space_prefix", bool, required=False)
        extra = []
        for key in ("tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"):
            v = get(key, int, required=False)
            if v is not None:
                extra.append(v)
        add_bos = get("tokenizer.ggml.add_bos_token", bool, required=False)
        add_eos = get("tokenizer.ggml.add_eos_token", bool, required=False)
        bos = get("tokenizer.ggml.bos_token_id", int, required=False)
        eos = get("tokenizer.ggml.eos_token_id", int, required=False)
        unk = get("tokenizer.ggml.unknown_token_id", int, required=False)
        if spm:  # llama.cpp's defaults where a SentencePiece file leaves them out
            n = len(tokens)
            bos = 1 if bos is None and n > 1 else bos
            eos = 2 if eos is None and n > 2 else eos
            unk = 0 if unk is None and n > 0 else unk
            add_bos = True if add_bos is None else add_bos
        tok = cls(
            tokens,
            types,
            merges,
            bos_id=bos,
            eos_id=eos,
            extra_eog=extra,
            add_bos=bool(add_bos),
            add_eos=bool(add_eos),
            chat_template=get("tokenizer.chat_template", str, required=False),
            pre=get("tokenizer.ggml.pre", str, required=False) or "qwen2",
            model=model,
            scores=get("tokenizer.ggml.scores", (list, tuple), required=spm),
            # llama.cpp's default for SentencePiece vocabularies: on
            add_space_prefix=True if space is None else space,
            unk_id=unk,
        )
        ids = [v for k, v in metadata.items() if k.startswith("tokenizer.ggml.fim_")]
        if any(isinstance(v, bool) or not isinstance(v, int) or v >= tok.n_vocab for v in ids):
            raise ModelError("tokenizer: a tokenizer.ggml.fim_*_token_id is no token id")
        tok.fim = fim_tokens(metadata, tok.token_id)
        eot = eot_token(metadata, tok.token_id, tok.eos_id)
        tok.eot_id = eot if eot is not None and 0 <= eot < tok.n_vocab else tok.eos_id
        return tok

    @classmethod
    def from_gguf(cls, path: Any) -> Tokenizer:
        from strata.gguf import GGUFFile

        with GGUFFile(path) as f:
            return cls.from_metadata(f.metadata)

    # ---- properties ----------------------------------------------------------------------

    @property
    def n_vocab(self) -> int:
        return len(self._tokens)

    @property
    def bos_id(self) -> int | None:
        return self._bos

    @property
    def eos_id(self) -> int | None:
        return self._eos

    @property
    def adds_bos(self) -> bool:
        """Whether a prompt starts with BOS (`tokenizer.ggml.add_bos_token` and a BOS id)."""
        return self._add_bos and self._bos is not None

    def with_bos(self, ids: list[int]) -> list[int]:
        """A prompt's ids led by BOS where the GGUF asks for it (as llama.cpp tokenizes a
        prompt), unless they start with it already (a chat template that writes it)."""
        if not self.adds_bos or ids[:1] == [self._bos]:
            return ids
        return [int(self._bos), *ids]  # type: ignore[arg-type]

    @property
    def eog_ids(self) -> frozenset[int]:
        """End-of-generation ids: eos, eot/eom when given, and the special tokens <|im_end|>,
        <|endoftext|> (and the like, as llama.cpp) when the vocabulary has them."""
        return self._eog

    def token_text(self, token_id: int) -> str:
        """The token's entry in the GGUF (byte-level characters for normal tokens)."""
        self._check_id(token_id)
        return self._tokens[token_id]

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes the token decodes to (empty for unused entries)."""
        self._check_id(token_id)
        return self._piece[token_id]

    def is_special(self, token_id: int) -> bool:
        return token_id in self._special

    def is_control(self, token_id: int) -> bool:
        """A control token, rendered as text or not (the harmony format's structure tokens are
        rendered, but a grammar matches them only by name: a constrained JSON string cannot
        end a harmony message by holding `<|end|>`)."""
        return token_id in self._control

    def token_id(self, text: str) -> int | None:
        """The id of a token given by its GGUF entry text, or None."""
        i = self._hf.token_to_id(text)
        return None if i is None else int(i)

    def _check_id(self, token_id: int) -> None:
        if not (0 <= token_id < len(self._tokens)):
            raise ValueError(f"token id {token_id} is outside the vocabulary (0..{self.n_vocab})")

    # ---- encode / decode -----------------------------------------------------------------

    def encode(self, text: str, add_special: bool = False, parse_special: bool = True) -> list[int]:
        """Token ids of `text`. `add_special` adds BOS/EOS where the GGUF asks for them (Qwen:
        neither). `parse_special` maps special-token text (e.g. `<|im_start|>`) to its id;
        otherwise that text is tokenized as ordinary text."""
        if not isinstance(text, str):
            raise TypeError(f"text must be str, not {type(text).__name__}")
        hf = self._hf if parse_special else self._plain()
        try:
            ids: list[int] = hf.encode(text, add_special_tokens=False).ids
        except TypeError:
            # tokenizers refuses str that is not valid Unicode (lone surrogates, which JSON
            # escapes like "\ud800" can produce)
            bad = next((i for i, c in enumerate(text) if "\ud800" <= c <= "\udfff"), None)
            if bad is None:
                raise
            raise ValueError(
                f"text is not valid Unicode: lone surrogate U+{ord(text[bad]):04X} at index {bad}"
            ) from None
        if add_special:
            if self._add_bos and self._bos is not None:
                ids.insert(0, self._bos)
            if self._add_eos and self._eos is not None:
                ids.append(self._eos)
        return ids

    def encode_continuation(self, text: str) -> list[int]:
        """Ids of `text` where it continues a sequence: `encode` (special-token text the
        special token) without a SentencePiece vocabulary's space prefix, which llama.cpp
        adds to the start of every text it tokenizes (llguidance tokenizes forced text so:
        with the prefix, a grammar's forced "{" became " {")."""
        if not self._prefixed:
            return self.encode(text)
        if self._hf_cont is None:
            from tokenizers import Tokenizer as HFTokenizer

            cont = HFTokenizer.from_str(self._hf.to_str())
            cont.normalizer = tokenizer_spm.normalizer(False)
            self._hf_cont = cont
        return list(self._hf_cont.encode(text, add_special_tokens=False).ids)

    def _plain(self) -> Any:
        if self._hf_plain is None:
            from tokenizers import Tokenizer as HFTokenizer

            plain = HFTokenizer.from_str(self._hf.to_str())
            plain.encode_special_tokens = True
            self._hf_plain = plain
        return self._hf_plain

    def decode_bytes(self, ids: Iterable[int], skip_special: bool = False) -> bytes:
        out = bytearray()
        for i in ids:
            self._check_id(i)
            if skip_special and i in self._special:
                continue
            out += self._piece[i]
        return bytes(out)

    def decode(self, ids: Iterable[int], skip_special: bool = False) -> str:
        """Text of `ids`; invalid UTF-8 becomes U+FFFD (as HF's ByteLevel decoder does)."""
        return self.decode_bytes(ids, skip_special).decode("utf-8", "replace")

    def detokenizer(self, skip_special: bool = False) -> IncrementalDetokenizer:
        return IncrementalDetokenizer(self, skip_special)

    # ---- chat template -------------------------------------------------------------------

    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = True,
        **kwargs: Any,
    ) -> str:
        """Render the GGUF's `tokenizer.chat_template` (jinja2, sandboxed, with the globals
        HF provides: raise_exception, strftime_now, the tojson filter). Extra keyword
        arguments (tools, enable_thinking, ...) are passed to the template."""
        if not self.chat_template:
            raise ChatTemplateError("the model has no chat template (tokenizer.chat_template)")
        template = _compile_template(self.chat_template)
        bos = self._tokens[self._bos] if self._bos is not None else ""
        eos = self._tokens[self._eos] if self._eos is not None else ""
        ctx = {"bos_token": bos, "eos_token": eos, **kwargs}
        import jinja2

        try:
            out: str = template.render(
                messages=list(messages), add_generation_prompt=add_generation_prompt, **ctx
            )
        except jinja2.TemplateError as e:
            raise ChatTemplateError(f"chat template: {e}") from None
        except (TypeError, AttributeError, KeyError, IndexError, ValueError) as e:
            raise ChatTemplateError(f"chat template could not render the messages: {e}") from None
        return out


_TEMPLATES: dict[str, Any] = {}


def check_template(source: str) -> None:
    """ChatTemplateError unless `source` compiles as a chat template."""
    import jinja2

    try:
        _compile_template(source)
    except jinja2.TemplateError as e:
        raise ChatTemplateError(f"chat template: {e}") from None


def _compile_template(source: str) -> Any:
    t = _TEMPLATES.get(source)
    if t is not None:
        return t
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise jinja2.TemplateError(message)

    def tojson(
        x: Any,
        ensure_ascii: bool = False,
        indent: int | None = None,
        separators: tuple[str, str] | None = None,
        sort_keys: bool = False,
    ) -> str:
        return json.dumps(
            x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
        )

    def strftime_now(fmt: str) -> str:
        return datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[jinja2.ext.loopcontrols, _GenerationTag],
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    try:
        t = env.from_string(source)
    except jinja2.TemplateError as e:
        raise ChatTemplateError(f"chat template does not compile: {e}") from None
    if len(_TEMPLATES) > 16:
        _TEMPLATES.clear()
    _TEMPLATES[source] = t
    return t


def _generation_tag() -> Any:
    import jinja2.ext
    from jinja2 import nodes

    class GenerationTag(jinja2.ext.Extension):
        """`{% generation %}…{% endgeneration %}` (HF's assistant-mask marker): renders its body."""

        tags = {"generation"}  # noqa: RUF012 (jinja2's class attribute)

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.Scope(body, lineno=lineno)

    return GenerationTag


_GenerationTag = _generation_tag()


class Pieces(Protocol):
    """What detokenizing needs of a tokenizer (`Tokenizer`, the server's `ServerTokenizer`)."""

    def token_bytes(self, token_id: int) -> bytes: ...

    def is_special(self, token_id: int) -> bool: ...


class IncrementalDetokenizer:
    """Feed token ids one at a time; get text pieces that never split a UTF-8 sequence.
    Incomplete trailing bytes are held back until the next token completes them; bytes that
    can never become valid UTF-8 come out as U+FFFD. Call `flush()` at the end. O(1) per
    token: the text is the tokens' bytes in order (what `Tokenizer.decode` gives), decoded by
    an incremental UTF-8 decoder. The one detokenizer of the project (`LLM.generate` and the
    server)."""

    def __init__(self, tokenizer: Pieces, skip_special: bool = False) -> None:
        self._tok = tokenizer
        self._skip = skip_special
        self._dec = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, token_id: int) -> str:
        tok = self._tok
        if self._skip and tok.is_special(token_id):
            return ""
        return self._dec.decode(tok.token_bytes(token_id), final=False)

    def feed_all(self, ids: Iterable[int]) -> str:
        """`feed` over several ids, the pieces joined."""
        return "".join(self.feed(t) for t in ids)

    def pending(self) -> bytes:
        """Bytes held back (the start of an unfinished character)."""
        return self._dec.getstate()[0]

    def flush(self) -> str:
        """End of stream: held-back bytes come out (as U+FFFD: they were incomplete)."""
        out: str = self._dec.decode(b"", final=True)
        self._dec.reset()
        return out


class StopMatcher:
    """Stop strings over streamed text. `feed(text)` returns `(emit, stopped)`: the text safe to
    send (anything that might be the start of a stop string is held back) and whether a stop
    string was completed. Once stopped, text from the stop string on is dropped. `flush()`
    returns the held-back text at the end of a generation that did not stop."""

    def __init__(self, stops: Iterable[str]) -> None:
        self.stops = sorted({s for s in stops if s}, key=len)
        self._buf = ""
        self.stopped = False
        self.matched: str | None = None
        self._longest = max((len(s) for s in self.stops), default=0)

    def feed(self, text: str) -> tuple[str, bool]:
        if self.stopped:
            return "", True
        if not self.stops:
            return text, False
        buf = self._buf + text
        # earliest complete stop string
        best = -1
        for s in self.stops:
            i = buf.find(s)
            if i != -1 and (best == -1 or i < best):
                best, self.matched = i, s
        if best != -1:
            self._buf = ""
            self.stopped = True
            return buf[:best], True
        # hold back the longest suffix that is a proper prefix of some stop string
        hold = 0
        for k in range(min(len(buf), self._longest - 1), 0, -1):
            tail = buf[-k:]
            if any(s.startswith(tail) for s in self.stops):
                hold = k
                break
        self._buf = buf[len(buf) - hold :]
        return buf[: len(buf) - hold], False

    def flush(self) -> str:
        out, self._buf = ("" if self.stopped else self._buf), ""
        return out
