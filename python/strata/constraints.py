"""Structured output: grammars for llguidance and the per-request token mask.

Why llguidance (the PyPI package): it is the engine behind OpenAI's, llama.cpp's and vLLM's
structured outputs, takes JSON schemas and Lark grammars (tool calls mix both), needs no
per-grammar precompilation (a schema arrives with each request), and computes a mask in
25–130 µs on the default model's vocabulary, 0.14–0.48 ms on Qwen3's (a contended 2-core
machine: `bench/bench_constraints.py`, docs/BENCHMARKS.md §Constraint overhead). xgrammar and
outlines-core were not measured.

Two sides:
- the server turns `response_format` / forced tool calls into one grammar (a Lark text,
  `json_schema_grammar`, `json_object_grammar`, `with_reasoning`) and checks it
  (`check_grammar`: a bad schema is a 400 before anything is queued); the grammar travels to
  the engine in `SamplingParams.grammar`;
- the engine builds a `GrammarProcessor` per constrained sequence (`Constraints.for_request`,
  the scheduler's processor factory; one llguidance tokenizer per model vocabulary). It is a
  logits processor (`strata.sampling.LogitsProcessor`): `processor(logits)` sets the logits of
  the tokens the grammar forbids to -inf in place; `processor.accept(token)` advances the
  grammar and starts computing the next mask on a worker thread, so the mask is ready while
  the next forward pass runs.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from strata._core import apply_token_bitmask

log = logging.getLogger("strata.engine")
COMPILED_CACHE = 16  # compiled grammars kept for the next request with the same one

# JSON as Python's json.dumps writes it (what chat templates show models): fixed separators,
# no other whitespace; with free whitespace a weak model can pad until max_tokens.
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


class ConstraintError(ValueError):
    """A grammar or schema llguidance refuses (the message says why)."""


def _llg() -> Any:
    import llguidance

    return llguidance


# -- grammars (server side) ---------------------------------------------------------------------


def schema_text(schema: Mapping[str, Any]) -> str:
    """`schema` as the text after a Lark `%json` (with llguidance's JSON options)."""
    s = dict(schema)
    s.setdefault("x-guidance", JSON_OPTIONS)
    return json.dumps(s, ensure_ascii=False)


def json_schema_grammar(schema: Mapping[str, Any]) -> str:
    """A Lark grammar whose whole text is one JSON value valid for `schema`."""
    return f"start: %json {schema_text(schema)}\n"


def json_object_grammar() -> str:
    """`response_format: json_object`: any JSON object."""
    return json_schema_grammar({"type": "object"})


def regex_grammar(pattern: str) -> str:
    """The whole text matches `pattern` (Rust regex syntax, as llguidance reads it)."""
    out, escaped = [], False
    for ch in pattern:  # "/" closes a Lark regex literal: escape the unescaped ones
        out.append("\\/" if ch == "/" and not escaped else ch)
        escaped = ch == "\\" and not escaped
    return f"start: /{''.join(out)}/\n"


def choice_grammar(choices: Sequence[str]) -> str:
    """The whole text is one of `choices`."""
    return "start: " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices) + "\n"


def cfg_grammar(text: str) -> str:
    """A GBNF grammar (llama.cpp's; `root` is its start) or a Lark one, as Lark text."""
    from llguidance.gbnf_to_lark import any_to_lark

    try:
        return str(any_to_lark(text))
    except Exception as e:  # the converter's own parse errors (any type)
        raise ConstraintError(f"not a GBNF or Lark grammar: {e}") from None


# A Lark grammar's pieces that are not rule names: strings, regexes, comments.
_LARK_SKIP = re.compile(r'"(?:[^"\\\n]|\\.)*"|/(?![/*])(?:[^/\\\n]|\\.)+/[imslux]*|//[^\n]*')
_START_NAME = re.compile(r"(?<![\w.])start(?!\w)")
ANSWER = "answer__"  # the answer's rule once a grammar is wrapped (no user rule ends in "__")


def renamed_start(grammar: str, name: str = ANSWER) -> str:
    """`grammar` with its rule `start` named `name` (its definition and every reference,
    not the words in its strings, regexes and comments): a rule of a larger grammar.
    ValueError when it has no start rule."""
    out, at = [], 0
    for m in _LARK_SKIP.finditer(grammar):
        out.append(_START_NAME.sub(name, grammar[at : m.start()]))
        out.append(m.group())
        at = m.end()
    out.append(_START_NAME.sub(name, grammar[at:]))
    body = "".join(out)
    if not re.search(rf"(?m)^\s*{name}\s*:", body):
        raise ValueError("grammar has no start rule")
    return body


def with_reasoning(grammar: str, mode: str) -> str:
    """Let a thinking block precede the constrained answer. `mode`: "none" (no thinking),
    "open" (the prompt already opened `<think>`: the answer follows the reasoning's close),
    "optional" (the model may open one). The grammar's `start` rule becomes `ANSWER`."""
    if mode == "none":
        return grammar
    body = renamed_start(grammar)
    head = {
        "open": f"start: think_text__ /\\n{{0,2}}/ {ANSWER}",
        "optional": f'start: ("<think>" think_text__ /\\n{{0,2}}/ {ANSWER}) | {ANSWER}',
    }[mode]
    # lazy: the text ends at the first close tag (a plain terminal would try to go on)
    return f"{body.rstrip()}\n{head}\n" + "think_text__[lazy]: /(?s:.*)<\\/think>/\n"


def check_grammar(grammar: str) -> None:
    """Raises ConstraintError with llguidance's message when the grammar does not compile."""
    llg = _llg()
    is_error, msgs = llg.LLMatcher.validate_grammar_with_warnings(_lark(grammar))
    if is_error:
        raise ConstraintError(msgs[0] if msgs else "invalid grammar")


def _lark(grammar: str) -> str:
    return str(_llg().LLMatcher.grammar_from_lark(grammar))


# -- the engine side ----------------------------------------------------------------------------


def llg_tokenizer(
    token_bytes: Sequence[bytes],
    special_ids: Iterable[int],
    eog_ids: Iterable[int],
    encode: Callable[[str], list[int]],
) -> Any:
    """An llguidance tokenizer over a vocabulary given as each id's bytes (empty: never
    produced), its special ids (matched only as `<name>` tokens, never as text) and its
    end-of-generation ids (what the mask allows once the grammar is complete). `encode`
    tokenizes text (special-token text becomes the special token), for forced text."""
    llg = _llg()
    eog = sorted(eog_ids)
    if not eog:
        raise ConstraintError("the vocabulary has no end-of-generation token")

    class _Vocab:
        def __init__(self) -> None:
            self.eos_token_id = eog[0]
            self.bos_token_id = None
            self.tokens = list(token_bytes)
            self.special_token_ids = sorted(special_ids)

        def __call__(self, s: str | bytes) -> list[int]:
            if isinstance(s, bytes):
                s = s.decode("utf-8", errors="replace")
            return encode(s)

    return llg.LLTokenizer(llg.TokenizerWrapper(_Vocab()), n_vocab=len(token_bytes), eos_token=eog)


F32 = npt.NDArray[np.float32]


class Vocabulary(Protocol):
    """What a constraint needs of a tokenizer (`strata.tokenizer.Tokenizer` is one)."""

    @property
    def n_vocab(self) -> int: ...

    @property
    def eog_ids(self) -> frozenset[int]: ...

    def token_bytes(self, token_id: int) -> bytes: ...

    def is_special(self, token_id: int) -> bool: ...

    def is_control(self, token_id: int) -> bool:
        """A token a grammar matches only as `<name>`, never as text (the special tokens and
        any control token rendered as text)."""
        ...

    def encode(self, text: str) -> list[int]: ...

    def encode_continuation(self, text: str) -> list[int]:
        """`encode` of text that continues a sequence (a SentencePiece vocabulary's space
        prefix not added): what llguidance tokenizes forced text with."""
        ...


def vocabulary_tokenizer(vocab: Vocabulary) -> Any:
    """`llg_tokenizer` over a `Vocabulary`."""
    n = vocab.n_vocab
    return llg_tokenizer(
        [vocab.token_bytes(i) for i in range(n)],
        [i for i in range(n) if vocab.is_control(i)],
        vocab.eog_ids,
        vocab.encode_continuation,
    )


def compile_matcher(tokenizer: Any, grammar: str) -> Any:
    """llguidance's matcher of `grammar` over `tokenizer` (ConstraintError when it does not
    compile)."""
    matcher = _llg().LLMatcher(tokenizer, _lark(grammar), log_level=0)
    if matcher.is_error():
        raise ConstraintError(matcher.get_error())
    return matcher


class GrammarProcessor:
    """The token mask of one constrained sequence (a logits processor). Not thread-safe: one
    sequence, one caller; its only helper thread is the shared mask worker."""

    def __init__(
        self,
        tokenizer: Any,
        grammar: str,
        n_vocab: int,
        worker: ThreadPoolExecutor | None = None,
        matcher: Any = None,
    ) -> None:
        # `matcher`: one compiled from `grammar` already (a fresh copy of a cached one)
        self.matcher = matcher if matcher is not None else compile_matcher(tokenizer, grammar)
        self.n_vocab = n_vocab
        self.eos = list(tokenizer.eos_tokens)
        self.words = (n_vocab + 31) // 32
        self._mask = np.zeros(self.words, dtype=np.int32)  # [ceil(V/32)] bit i: token allowed
        self.worker = worker
        self._pending: Future[None] | None = None
        self.error: str | None = None
        self._start()

    def _compute(self) -> None:
        m = self._mask
        self.matcher.unsafe_compute_mask_ptr(m.ctypes.data, m.nbytes)

    def _start(self) -> None:
        if self.worker is None:
            self._compute()
        else:
            self._pending = self.worker.submit(self._compute)

    def _wait(self) -> None:
        """The matcher is the worker's until its mask is done."""
        if self._pending is not None:
            self._pending.result()
            self._pending = None

    def allowed(self) -> npt.NDArray[np.bool_]:
        """[V] the tokens the grammar allows next."""
        self._wait()
        bits = np.unpackbits(self._mask.view(np.uint8), bitorder="little")
        return bits[: self.n_vocab].astype(bool)

    def __call__(self, logits: F32) -> None:
        """Mask `logits` [>= V] in place: forbidden tokens get -inf. After an error (a token
        the grammar refused) only end-of-generation stays allowed."""
        self._wait()
        if self.error is not None or self.matcher.is_error():
            self.error = self.error or self.matcher.get_error()
            keep = np.full(logits.shape[-1], -np.inf, dtype=logits.dtype)
            keep[self.eos] = logits[self.eos]
            logits[...] = keep
            return
        n = min(self.n_vocab, logits.shape[-1])
        # compiled: one pass over the mask words, writing only where a word forbids something
        # (numpy's gather and add took 3–4x a copy of a 151,936-entry row)
        apply_token_bitmask(logits[:n], self._mask)
        logits[n:] = -np.inf

    def takes(self, tokens: list[int]) -> bool:
        """Whether the grammar takes `tokens` from here (its state unchanged)."""
        self._wait()
        return self.error is None and self.matcher.validate_tokens(tokens) == len(tokens)

    def accept(self, token: int) -> None:
        """Advance the grammar by the sampled token and start on the next mask."""
        self._wait()
        if self.error is not None:
            return
        if not self.matcher.consume_token(token):
            self.error = self.matcher.get_error() or f"token {token} refused by the grammar"
            return
        self._start()

    def done(self) -> bool:
        """The grammar is complete and allows nothing more (only end-of-generation)."""
        self._wait()
        return bool(self.matcher.is_stopped())


class _Lazy:
    """What the lazy grammars share: no mask until their trigger, then the processor's
    (`inner`, compiled off the engine's step: `_inner`, a future)."""

    def __init__(self, inner: Future[GrammarProcessor]) -> None:
        self._inner = inner
        self.inner: GrammarProcessor | None = None

    def __call__(self, logits: F32) -> None:
        if self.inner is not None:
            self.inner(logits)

    def _compiled(self) -> GrammarProcessor | None:
        """The processor, once the trigger came; None where the engine could not compile the
        grammar (the call stays free)."""
        try:
            return self._inner.result()
        except Exception as e:  # the compiler's errors (any type)
            log.warning("a tool call left unconstrained: %s", e)
            return None


class LazyGrammar(_Lazy):
    """A grammar that waits for its trigger (`strata.sampling.GrammarTrigger`): no mask until
    a trigger token is sampled outside a thinking block, then the grammar's, fed that token
    first (llama.cpp's lazy grammar: a tool call the model starts follows the tools'
    schemas). Thinking is what the answer's parser takes as thinking: a block the prompt
    opened, or one the answer opens before anything but blanks, to its close. The grammar is
    compiled off the engine's step (`inner`, a future): a sequence that never calls a tool
    never waits for it; one whose grammar fails to compile stays free."""

    def __init__(
        self, inner: Future[GrammarProcessor], trigger: Any, blank: Callable[[int], bool]
    ) -> None:
        super().__init__(inner)
        self.triggers = frozenset(trigger.tokens)
        self.think = frozenset(trigger.think)
        self.unthink = frozenset(trigger.unthink)
        self.thinking = bool(trigger.opened)
        self.started = bool(trigger.opened)  # past the answer's leading blanks
        self.blank = blank

    def accept(self, token: int) -> None:
        if self.inner is not None:
            self.inner.accept(token)
        elif self.thinking:
            self.thinking = token not in self.unthink
        elif token in self.triggers:
            self._engage(token)
        elif token in self.think and not self.started:
            self.thinking = self.started = True
        elif not self.blank(token):
            self.started = True

    def _engage(self, token: int) -> None:
        inner = self._compiled()
        if inner is None:
            return
        inner.accept(token)
        self.inner = inner


MAX_HEADER_BYTES = 256  # a message header is a role, a channel, a recipient and a type


class HeaderGrammar(_Lazy):
    """A lazy grammar triggered by text in a message header (`GrammarTrigger.pattern`: the
    harmony format's recipient ` to=functions.`, as llama.cpp's gpt-oss triggers): the header
    runs from an anchor token (`<|start|>`, `<|channel|>`; or the answer's start) to an end
    token (`<|message|>`, `<|end|>`), so a message's text never triggers it. When the pattern
    is found, the grammar is fed the header's tokens from its anchor on and constrains the
    rest; a header the grammar refuses leaves the answer free."""

    def __init__(
        self, inner: Future[GrammarProcessor], trigger: Any, piece: Callable[[int], bytes]
    ) -> None:
        super().__init__(inner)
        self.pattern = re.compile(trigger.pattern)
        self.anchors, self.ends = frozenset(trigger.anchors), frozenset(trigger.ends)
        self.piece = piece
        self.held: list[int] | None = [] if trigger.armed else None  # None: in a message's text
        self.text = b""  # the header's text after its anchor

    def accept(self, token: int) -> None:
        if self.inner is not None:
            self.inner.accept(token)
        elif token in self.anchors:
            self.held, self.text = [token], b""
        elif token in self.ends or self.held is None:
            self.held = None
        else:
            self.held.append(token)
            self.text += self.piece(token)
            if len(self.text) > MAX_HEADER_BYTES:  # no header: text (an answer without them)
                self.held = None
            elif self.pattern.search(self.text.decode("utf-8", errors="replace")):
                self._engage(self.held)

    def _engage(self, held: list[int]) -> None:
        self.held = None
        inner = self._compiled()
        if inner is None:
            return
        if not inner.takes(held):  # not a header the grammar knows: left free, the grammar
            log.info("a tool call's header left unconstrained")  # untouched for the next
            return
        for t in held:
            inner.accept(t)
        self.inner = inner


class Constraints:
    """The engine's factory of processors: one llguidance tokenizer for the model's
    vocabulary (`vocabulary()` is called on the first constrained request) and one mask
    worker thread (`overlap`; off: masks are computed when the sampler asks)."""

    def __init__(
        self, vocabulary: Callable[[], Vocabulary], n_vocab: int, overlap: bool = True
    ) -> None:
        self._vocabulary = vocabulary
        self._tok: Any = None
        self.n_vocab = n_vocab
        self._lock = threading.Lock()
        self.overlap = overlap
        self._worker: ThreadPoolExecutor | None = None
        self._compiler: ThreadPoolExecutor | None = None  # lazy grammars' compiles
        self._blank: list[bool] | None = None  # token id → its text is blanks only
        # compiled matchers by grammar, pristine (each sequence gets a copy): an agent sends
        # the same tools every turn
        self._compiled: OrderedDict[str, Any] = OrderedDict()

    @property
    def worker(self) -> ThreadPoolExecutor | None:
        if self.overlap and self._worker is None:
            self._worker = ThreadPoolExecutor(1, thread_name_prefix="strata-mask")
        return self._worker

    def tokenizer(self) -> Any:
        with self._lock:
            if self._tok is None:
                self._tok = vocabulary_tokenizer(self._vocabulary())
            return self._tok

    def warm(self) -> None:
        """Build the llguidance tokenizer on a background thread (seconds for a 150k-entry
        vocabulary), so that the first constrained request does not stall the engine."""

        def build() -> None:
            # a failure is reported by the first constrained request, which builds again
            with contextlib.suppress(Exception):
                self.tokenizer()

        threading.Thread(target=build, name="strata-llg-vocab", daemon=True).start()

    def processor(self, grammar: str) -> GrammarProcessor:
        tok = self.tokenizer()
        with self._lock:
            cached = self._compiled.get(grammar)
            if cached is not None:
                self._compiled.move_to_end(grammar)
                matcher = cached.deep_copy()
        if cached is None:
            matcher = compile_matcher(tok, grammar)
            with self._lock:
                self._compiled[grammar] = matcher.deep_copy()
                while len(self._compiled) > COMPILED_CACHE:
                    self._compiled.popitem(last=False)
        return GrammarProcessor(tok, grammar, self.n_vocab, self.worker, matcher)

    def blank(self, token: int) -> bool:
        """Whether the token's text is blanks only (the answer has not started)."""
        return self._blanks()[token] if 0 <= token < self.n_vocab else False

    def _blanks(self) -> list[bool]:
        with self._lock:
            if self._blank is None:
                v = self._vocabulary()
                self._blank = [not v.token_bytes(i).strip() for i in range(v.n_vocab)]
            return self._blank

    def for_request(self, req: Any) -> GrammarProcessor | LazyGrammar | HeaderGrammar | None:
        """The scheduler's processor factory: a request's (`Submit`) constraint, from
        `params.grammar` (lazy with `params.grammar_trigger`); None when it has none. Raises
        ConstraintError (a ValueError)."""
        grammar = req.params.grammar
        if grammar is None:
            return None
        trigger = req.params.grammar_trigger
        if trigger is None:
            return self.processor(grammar)
        if self._compiler is None:
            self._compiler = ThreadPoolExecutor(1, thread_name_prefix="strata-grammar")
        inner = self._compiler.submit(self.processor, grammar)
        if trigger.pattern:
            return HeaderGrammar(inner, trigger, self._vocabulary().token_bytes)
        self._blanks()
        return LazyGrammar(inner, trigger, self.blank)
