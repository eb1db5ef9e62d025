"""LLM: load a GGUF model, compute logits, generate tokens.

    llm = strata.LLM("model.gguf", n_ctx=4096)
    for ev in llm.generate("Hello", max_tokens=32, temperature=0):
        print(ev.text, end="", flush=True)

The forward pass runs in Rust (`strata._core.Model`) with the GIL released; this module only
validates arguments, samples and detokenizes. `logits` and `generate` use a private KV slot
(a new prompt reuses the cached prefix it shares with the previous one); the engine drives
`config.parallel` further slots through the batched step API (`forward_batch`, `truncate`,
`kv_export`/`kv_import`, `free`). Every slot holds `n_ctx_seq` = n_ctx / parallel positions
(llama.cpp's meaning of n_ctx: the context of all parallel sequences together); the engine
opens its model without the private slot, so the server's KV cache is n_ctx positions.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from os import PathLike
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from strata._core import HybridCounters, Model, Profile, RoutingCounters
from strata.config import Config
from strata.dry import dry_table
from strata.errors import ModelError
from strata.gguf import GGUFFile
from strata.infill import infill_filter
from strata.sampling import LogitsProcessor, Sampler, SamplingParams
from strata.tiering import (
    LabeledStat,
    open_tier,
    readahead_threads,
    stage_stats,
    tier_info,
    tier_stats,
    vram_info,
    vram_stats,
)

__all__ = ["LLM", "TokenEvent"]

Prompt = str | Sequence[int] | Sequence[dict[str, Any]]


@dataclass(frozen=True, slots=True)
class TokenEvent:
    """One generated token: its id, the text it completes (may be empty while a UTF-8
    sequence or a possible stop string is held back), and why generation ended (None while
    it goes on; "stop" for an end-of-generation token or a stop string, "length" for
    max_tokens or a full context)."""

    id: int
    text: str
    finish_reason: str | None


_DEFAULT = SamplingParams()
# llama.cpp's keyword names for SamplingParams fields
_ALIASES = {"repeat_penalty": "repetition_penalty"}


def _params(sampling: dict[str, Any]) -> SamplingParams:
    """SamplingParams from keywords, errors naming the caller's keyword."""
    fields = {_ALIASES.get(k, k): v for k, v in sampling.items()}
    try:
        return SamplingParams(**fields).validate()
    except TypeError as e:
        raise ValueError(f"sampling: {e}") from None
    except ValueError as e:
        name = getattr(e, "param", "")
        back = {v: k for k, v in _ALIASES.items() if k in sampling}
        if name in back:
            raise ValueError(str(e).replace(name, back[name], 1)) from None
        raise


def _as_ids(tokens: Iterable[int], what: str) -> list[int]:
    ids = list(tokens)
    for t in ids:
        if isinstance(t, bool) or not isinstance(t, int | np.integer):
            raise ValueError(f"{what}: token ids must be integers, got {t!r}")
    return [int(t) for t in ids]


class LLM:
    """A GGUF of a family the engine runs (qwen3moe, qwen3, qwen2moe, Mixtral-style llama,
    glm4moe, gpt-oss, qwen3next, qwen35moe: rust/src/model/arch.rs) ready to run. Keyword
    arguments are `strata.config.Config` fields (n_ctx, kv_type, prefill_chunk, ...), applied
    over the environment and config file."""

    def __init__(self, model_path: str | PathLike[str], **config: Any) -> None:
        self._open(Config.load({**config, "model": str(model_path)}))

    @classmethod
    def from_config(cls, config: Config, private_slot: bool = True) -> LLM:
        """The model `config.model` names with exactly `config`'s settings: neither the
        environment nor a config file is read again (the engine process builds its model
        from the settings the server resolved, its flags over its environment).
        `private_slot` False: the step API's slots only (`logits`/`generate` refuse)."""
        llm = cls.__new__(cls)
        llm._open(config, private_slot)
        return llm

    def _open(self, config: Config, private_slot: bool = True) -> None:
        self.path = Path(config.model)
        with GGUFFile(self.path) as g:
            self.metadata: dict[str, Any] = g.metadata
        arch = self.metadata.get("general.architecture", "")
        train = self.metadata.get(f"{arch}.context_length", 0)
        if isinstance(train, bool) or not isinstance(train, int) or not 0 <= train < 1 << 40:
            raise ModelError(f"{arch}.context_length: must be a count, found {train!r}")
        self.config = config.with_train_ctx(train)
        config = self.config
        # Slots 0..parallel-1 belong to the step API; the last one (if any) to logits() and
        # generate().
        self.max_slots: int = self.config.parallel
        self._own: int | None = self.max_slots if private_slot else None
        c = self.config
        # Every setting `Model.open` takes (Config.names("core")); on the GPU, the hybrid
        # mode's start fill follows the profile (the CPU path applies it to the RAM tier).
        profile = Profile.load(c.profile, self.path) if c.profile and c.device == "cuda" else None
        self.model = Model.open(
            self.path,
            profile=profile,
            **{
                **{k: getattr(c, k) for k in Config.names("core")},
                # Model.open's n_ctx is the positions of one slot
                "n_ctx": c.n_ctx_seq,
                "n_slots": self.max_slots + int(private_slot),
            },
        )
        self.hparams: dict[str, Any] = self.model.hparams
        # A hybrid family (qwen3next, qwen35moe): each slot keeps a recurrent state, which
        # cannot be cut back (truncate only to 0 or the slot's length, no KV export).
        self.recurrent: bool = bool(self.hparams.get("recurrent", False))
        self.n_ctx: int = self.config.n_ctx  # all slots together, as llama.cpp's n_ctx
        self.n_ctx_seq: int = self.config.n_ctx_seq  # positions one sequence may hold
        self.n_vocab: int = self.model.n_vocab
        tokens = self.metadata.get("tokenizer.ggml.tokens")
        if isinstance(tokens, list) and len(tokens) != self.n_vocab:
            # llama.cpp's rule too: the embedding has one row per token of the vocabulary
            raise ModelError(
                f"token_embd.weight has {self.n_vocab} rows but the tokenizer "
                f"{len(tokens)} tokens (one row per token)"
            )
        self._tokenizer: Any = None
        self._cached: list[int] = []  # the tokens the private slot holds
        self._owner = 0  # the generation (or logits call) the private slot is in step with
        self._counts = {"prefill_tokens_total": 0, "decode_tokens_total": 0}
        self._settled = False  # the tier's fill has finished
        # The RAM tier: residency of every expert, the fill threads (hot experts first when
        # `profile` is set; a profile for another model raises ProfileMismatchError).
        # On the GPU every expert is in VRAM: the tier is only reported, never filled or read.
        on_cpu = self.config.device == "cpu"
        self.tier, self.fill = open_tier(self.config, self.path, start_fill=on_cpu)
        self._tier_read = on_cpu  # the CPU path reads experts through it: its stats mean something
        # The VRAM expert tier's counters, shared with the hybrid GPU path; None on the CPU
        # path and when every weight is in VRAM.
        self.hybrid: HybridCounters | None = self.model.hybrid_counters()
        if on_cpu:
            self.model.set_tier(self.tier)
            # Read-ahead of the next layer's likely experts (budget mode by default).
            self.model.set_readahead(readahead_threads(self.config))
        # None where the routing is not counted (the GPU path with every expert in VRAM)
        self._routing: RoutingCounters | None = (
            self.model.routing_counters(decayed=True) if self.model.counts_routing else None
        )

    @property
    def prefill_piece(self) -> int:
        """Prompt tokens a scheduler should hand `prefill` per call: `prefill_chunk`, or, in the
        hybrid mode whose long chunks stream their missing experts over PCIe, `stream_chunk`
        (each call moves every missing expert once, so shorter pieces move more bytes per
        token; other sequences wait one piece)."""
        info = self.model.hybrid_info()
        sc = int(info["stream_chunk"]) if info else 0
        return sc if sc > 0 else self.config.prefill_chunk

    @property
    def tokenizer(self) -> Any:
        """`strata.tokenizer.Tokenizer` built from the GGUF metadata (loaded on first use)."""
        if self._tokenizer is None:
            from strata.tokenizer import Tokenizer  # type: ignore[import-not-found,unused-ignore]

            self._tokenizer = Tokenizer.from_metadata(self.metadata)
        return self._tokenizer

    # ---- logits --------------------------------------------------------------------------

    def _check_len(self, n: int, what: str) -> None:
        if n == 0:
            raise ValueError(f"{what}: no tokens given")
        if n > self.n_ctx_seq:
            raise ValueError(
                f"{what}: {n} tokens do not fit a sequence's context of {self.n_ctx_seq} tokens "
                "(n_ctx / parallel)"
            )

    def _private(self) -> int:
        if self._own is None:
            raise RuntimeError(
                "this model was opened for the step API only (no private slot for logits/generate)"
            )
        return self._own

    def logits(self, token_ids: Sequence[int]) -> npt.NDArray[np.float32]:
        """Logits of every position of `token_ids` on a fresh sequence: (len, n_vocab)."""
        ids = _as_ids(token_ids, "token_ids")
        self._check_len(len(ids), "token_ids")
        self._owner += 1  # a live generator's slot is gone
        self.model.free(self._private())
        self._cached = []
        out = self.model.forward(self._private(), ids, logits="all")
        self._cached = ids
        return out

    def _prefill(self, ids: list[int]) -> npt.NDArray[np.float32]:
        """Last-position logits of `ids`, reusing the cached prefix they share."""
        common = 0
        for a, b in zip(self._cached, ids[:-1], strict=False):
            if a != b:
                break
            common += 1
        if self.recurrent and common < len(self._cached):
            common = 0  # a recurrent state only starts over
        self.model.truncate(self._private(), common)
        self._cached = self._cached[:common]
        out = self.model.forward(self._private(), ids[common:], logits="last")
        self._cached = list(ids)
        return out

    # ---- per-slot step API (the engine) ---------------------------------------------------

    def _slot(self, slot: int) -> int:
        if isinstance(slot, bool) or not isinstance(slot, int) or not 0 <= slot < self.max_slots:
            raise ValueError(f"slot: must be in 0..{self.max_slots - 1}, got {slot!r}")
        return slot

    def _checked(
        self, entries: Sequence[tuple[int, Sequence[int], str]]
    ) -> list[tuple[int, list[int], str]]:
        checked: list[tuple[int, list[int], str]] = []
        for slot, ids, want in entries:
            s = self._slot(slot)
            toks = _as_ids(ids, "ids")
            if want not in ("none", "last", "all", "window"):
                raise ValueError(f"logits: must be none, last, all or window, got {want!r}")
            self._check_len(self.model.slot_len(s) + len(toks), f"slot {s}")
            if any(not 0 <= t < self.n_vocab for t in toks):
                raise ValueError(f"ids: a token id is outside 0..{self.n_vocab - 1}")
            checked.append((s, toks, want))
        if len({s for s, _, _ in checked}) != len(checked):
            raise ValueError("entries: a slot appears more than once")
        return checked

    def _count(self, checked: list[tuple[int, list[int], str]]) -> None:
        for _, toks, want in checked:
            # a decoded token (or a 1-token chunk), or a speculative window's tokens
            one = (len(toks) == 1 and want != "none") or want == "window"
            self._counts["decode_tokens_total" if one else "prefill_tokens_total"] += len(toks)

    def forward_batch(
        self, entries: Sequence[tuple[int, Sequence[int], str]]
    ) -> list[npt.NDArray[np.float32] | None]:
        """One forward pass over several slots. Each entry `(slot, ids, logits)` continues
        `slot` at its current length with `ids` (a decoded token, a window or a prompt chunk);
        `logits` is "none", "last" ([V]), "all" ([len(ids), V]) or "window" (as "all", each
        row bitwise a one-token step's on the CPU: a speculative window's verification).
        Slots must be distinct."""
        checked = self._checked(entries)
        out = self.model.forward_batch(checked)
        self._count(checked)
        return out

    @property
    def pipeline_windows(self) -> int:
        """Windows the model keeps in flight at most (2: pipelined windows; docs/PROTOCOL.md)."""
        return int(self.model.pipeline_windows)

    def launch_batch(self, entries: Sequence[tuple[int, Sequence[int], str]]) -> None:
        """Launches `entries` (one step, as `forward_batch`'s) as a pipelined window."""
        checked = self._checked(entries)
        self.model.launch_batch(checked)
        self._count(checked)

    def finish_batch(self) -> list[npt.NDArray[np.float32] | None]:
        """The oldest pipelined window's logits (as `forward_batch` returns them)."""
        return self.model.finish_batch()

    def settle(self, accepted: bool) -> None:
        """Settles the oldest window's verdict: False discards the window launched after it."""
        self.model.settle(accepted)

    def truncate(self, slot: int, n: int) -> None:
        """Keeps the first `n` cached positions of a step-API slot."""
        self.model.truncate(self._slot(slot), n)

    def slot_len(self, slot: int) -> int:
        """Positions a step-API slot holds."""
        return self.model.slot_len(self._slot(slot))

    def kv_export(self, slot: int, n: int) -> bytes:
        """The first `n` positions of a slot's KV, in the KV type (for the prompt cache)."""
        return self.model.kv_export(self._slot(slot), n)

    def kv_import(self, slot: int, data: bytes) -> int:
        """Replaces a slot's KV with `kv_export` bytes; returns the positions it now holds."""
        return self.model.kv_import(self._slot(slot), data)

    def kv_shift(self, slot: int, keep: int, chunks: list[tuple[int, int]]) -> int:
        """Keeps a slot's first `keep` positions, then moves each (position, length) chunk
        down after them, keys rotated by the move (`--cache-reuse`); returns its length."""
        return self.model.kv_shift(self._slot(slot), keep, chunks)

    def free(self, slot: int) -> None:
        """Empties a step-API slot."""
        self.model.free(self._slot(slot))

    def checkpoint(self, slot: int) -> None:
        """Marks a hybrid slot's recurrent state at its length, so that `truncate` can come
        back to it (ModelError for a family without a recurrent state)."""
        self.model.checkpoint(self._slot(slot))

    def checkpoints(self, slot: int) -> list[int]:
        """The positions `truncate` can restore a hybrid slot to (besides 0 and its length)."""
        return list(self.model.checkpoints(self._slot(slot)))

    def routing_counts(self) -> npt.NDArray[np.float32]:
        """Router picks per (layer, expert) since load, undecayed: [n_layer, n_expert].
        ConfigError where the routing is not counted (`counts_routing` false)."""
        return self.model.routing_counts()

    @property
    def counts_routing(self) -> bool:
        """Whether the routing is counted (not on the GPU path with every expert in VRAM)."""
        return self.model.counts_routing

    def routing_counters(self) -> RoutingCounters | None:
        """The live decayed routing counters (top experts per layer for status); None where
        the routing is not counted."""
        return self._routing

    def stats(self) -> dict[str, float]:
        d = {k: float(v) for k, v in self._counts.items()}
        if self._tier_read:  # (the GPU and hybrid paths never fill or read the RAM tier)
            d.update(tier_stats(self.tier, self.fill, self.model.readahead_stats()))
        return d

    def settling(self) -> bool:
        """True while the tier's fill threads run (its progress moves without any step). The
        engine asks every step: once the fill has finished it is not asked again."""
        if self.fill is None or self._settled:
            return False
        self._settled = bool(self.fill.progress()["finished"])
        return not self._settled

    def labeled_stats(self) -> list[LabeledStat]:
        """Counters with labels for /metrics: the VRAM tier's and the layer split's stages'
        (none on the CPU-only path)."""
        return vram_stats(self.hybrid) + stage_stats(self.model.stages())

    def tier_counts(self, slot: int | None = None) -> tuple[int, int, int] | None:
        """(hits, CPU misses, PCIe misses) of the VRAM tier so far — of the pairs of the rows
        step-API slot `slot` fed, or of all (None) — None on the CPU-only path (the
        scheduler's per-request hit rate and PCIe share come from a slot's)."""
        if self.hybrid is None:
            return None
        return self.hybrid.totals() if slot is None else self.hybrid.slot_totals(self._slot(slot))

    def info(self) -> dict[str, Any]:
        keys = ("architecture", "n_layer", "n_embd", "n_expert", "n_expert_used", "n_vocab")
        d: dict[str, Any] = {k: self.hparams[k] for k in keys}
        d.update(
            kv_type=self.config.kv_type,
            n_ctx=self.n_ctx,
            n_ctx_seq=self.n_ctx_seq,
            max_slots=self.max_slots,
        )
        tiers = tier_info(
            self.tier, self._routing, self.fill, readahead=self.model.readahead_stats()
        )
        tiers["profile"] = self.config.profile or None
        tiers["vram"] = vram_info(self.hybrid, self.model.hybrid_info())
        d["tiers"] = tiers
        return d

    # ---- generation ----------------------------------------------------------------------

    def encode_prompt(self, prompt: Prompt) -> list[int]:
        """A prompt as token ids: a string is tokenized, chat messages are rendered with the
        model's chat template (with the generation prompt), both led by BOS where the GGUF
        asks for it; token ids pass through."""
        if isinstance(prompt, str):
            ids: list[int] = self.tokenizer.with_bos(list(self.tokenizer.encode(prompt)))
        elif isinstance(prompt, Sequence) and prompt and all(isinstance(m, dict) for m in prompt):
            text = self.tokenizer.apply_chat_template(list(prompt), add_generation_prompt=True)
            ids = self.tokenizer.with_bos(list(self.tokenizer.encode(text)))
        elif isinstance(prompt, Sequence):
            ids = _as_ids(prompt, "prompt")  # type: ignore[arg-type]
        else:
            raise ValueError(f"prompt: expected str, token ids or chat messages, got {prompt!r}")
        if not ids:
            raise ValueError("prompt: it is empty")
        return ids

    def generate_ids(
        self,
        prompt_ids: Sequence[int],
        max_tokens: int = 256,
        stop_ids: Iterable[int] | None = None,
        processor: LogitsProcessor | None = None,
        **sampling: Any,
    ) -> Iterator[tuple[int, str | None]]:
        """Token ids without text: yields `(id, finish_reason)`. `stop_ids` defaults to the
        tokenizer's end-of-generation ids; the stop token itself is yielded with "stop".
        Sampling keywords are `strata.sampling.SamplingParams` fields (`repeat_penalty` is
        llama.cpp's name for `repetition_penalty`); `processor` masks each row first."""
        ids = _as_ids(prompt_ids, "prompt")
        self._check_len(len(ids), "prompt")
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise ValueError(f"max_tokens: must be an integer >= 1, got {max_tokens!r}")
        for t in ids:
            if not 0 <= t < self.n_vocab:
                raise ValueError(f"prompt: token id {t} is outside the vocabulary")
        params = _params(sampling)
        if params.reasoning_budget is not None:  # chained before `processor`, as the engine
            from strata.reasoning_budget import utf8_checker, with_budget

            complete = utf8_checker(lambda: self.tokenizer)
            processor = with_budget(processor, params.reasoning_budget, complete)
        stage = infill_filter(self.tokenizer) if params.infill else None
        dry = dry_table(self.tokenizer, params.dry_sequence_breakers) if params.dry else None
        sampler = Sampler(params, ids, self.n_vocab, processor, stage, dry)
        stops = set(self.tokenizer.eog_ids if stop_ids is None else stop_ids)
        return self._loop(ids, max_tokens, stops, sampler)

    def _loop(
        self, ids: list[int], max_tokens: int, stops: set[int], sampler: Sampler
    ) -> Iterator[tuple[int, str | None]]:
        n = len(ids)
        self._owner += 1
        me = self._owner
        logits = self._prefill(ids)
        for i in range(max_tokens):
            tok = sampler.sample(logits).token
            n += 1
            if tok in stops:
                yield tok, "stop"
                return
            if i + 1 == max_tokens or n >= self.n_ctx_seq:
                yield tok, "length"
                return
            yield tok, None
            if self._owner != me:  # another generation moved the private slot meanwhile
                raise RuntimeError(
                    "LLM: another generation or logits() call used this model's private slot "
                    "while this generator was paused; finish one generator before the next"
                )
            logits = self.model.forward(self._private(), [tok], logits="last")
            self._cached.append(tok)

    def generate(
        self,
        prompt: Prompt,
        max_tokens: int = 256,
        temperature: float = _DEFAULT.temperature,
        top_k: int = _DEFAULT.top_k,
        top_p: float = _DEFAULT.top_p,
        min_p: float = _DEFAULT.min_p,
        seed: int | None = None,
        repeat_penalty: float = _DEFAULT.repetition_penalty,
        presence_penalty: float = _DEFAULT.presence_penalty,
        frequency_penalty: float = _DEFAULT.frequency_penalty,
        stop: str | Sequence[str] | None = None,
        repeat_last_n: int = _DEFAULT.repeat_last_n,
        processor: LogitsProcessor | None = None,
    ) -> Iterator[TokenEvent]:
        """Streams token events. temperature 0 is greedy; sampling as `strata.sampling` says
        (the server's sampler: equal settings and seed give equal tokens). Text held back by
        a possible stop string or an incomplete UTF-8 sequence arrives with a later event."""
        from strata.tokenizer import (  # type: ignore[import-not-found,unused-ignore]
            IncrementalDetokenizer,
            StopMatcher,
        )

        stops = [stop] if isinstance(stop, str) else list(stop or [])
        for s in stops:
            if not isinstance(s, str) or not s:
                raise ValueError(f"stop: entries must be non-empty strings, got {s!r}")
        ids = self.encode_prompt(prompt)
        tokens = self.generate_ids(
            ids,
            max_tokens,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            min_p=min_p,
            seed=seed,
            repeat_penalty=repeat_penalty,
            presence_penalty=presence_penalty,
            frequency_penalty=frequency_penalty,
            repeat_last_n=repeat_last_n,
            processor=processor,
        )
        detok = IncrementalDetokenizer(self.tokenizer)
        matcher = StopMatcher(stops)

        def events() -> Iterator[TokenEvent]:
            for tok, reason in tokens:
                # An end-of-generation token ends the text without adding its own.
                piece = "" if reason == "stop" else detok.feed(tok)
                emit, stopped = matcher.feed(piece)
                if stopped:
                    yield TokenEvent(tok, emit, "stop")
                    return
                if reason is not None:
                    # End of stream: release held-back bytes and text.
                    tail, stopped = matcher.feed(detok.flush())
                    if not stopped:
                        tail += matcher.flush()
                    yield TokenEvent(tok, emit + tail, "stop" if stopped else reason)
                    return
                yield TokenEvent(tok, emit, None)

        return events()
