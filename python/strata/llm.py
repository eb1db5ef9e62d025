"""LLM: load a GGUF model, compute logits, generate tokens.

    llm = strata.LLM("model.gguf", n_ctx=4096)
    for ev in llm.generate("Hello", max_tokens=32, temperature=0):
        print(ev.text, end="", flush=True)

The forward pass runs in Rust (`strata._core.Model`) with the GIL released; this module only
validates arguments, samples and detokenizes. `logits` and `generate` use a private KV slot
(a new prompt reuses the cached prefix it shares with the previous one); the engine drives
`config.parallel` further slots through the per-slot step API (`prefill`, `decode`, `free`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from os import PathLike
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from strata._core import HybridCounters, Model, Profile, RoutingCounters
from strata.config import Config
from strata.gguf import GGUFFile
from strata.tiering import (
    LabeledStat,
    open_tier,
    readahead_threads,
    tier_info,
    tier_stats,
    vram_info,
    vram_stats,
)

__all__ = ["LLM", "SamplingArgs", "TokenEvent"]

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


@dataclass(frozen=True, slots=True)
class SamplingArgs:
    """Sampling parameters, validated at construction (ValueError naming the field)."""

    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    seed: int | None = None
    repeat_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repeat_last_n: int = 64

    def __post_init__(self) -> None:
        def num(name: str, lo: float, hi: float, lo_open: bool = False) -> None:
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
                raise ValueError(f"{name}: must be a finite number, got {v!r}")
            if v < lo or v > hi or (lo_open and v == lo):
                left = "(" if lo_open else "["
                raise ValueError(f"{name}: must be in {left}{lo}, {hi}], got {v!r}")

        def integer(name: str, lo: int) -> None:
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise ValueError(f"{name}: must be an integer >= {lo}, got {v!r}")

        num("temperature", 0.0, 100.0)
        integer("top_k", 0)
        num("top_p", 0.0, 1.0, lo_open=True)
        num("min_p", 0.0, 1.0)
        num("repeat_penalty", 0.0, 100.0, lo_open=True)
        num("presence_penalty", -2.0, 2.0)
        num("frequency_penalty", -2.0, 2.0)
        integer("repeat_last_n", 0)
        seed = self.seed
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise ValueError(f"seed: must be an integer or None, got {self.seed!r}")


class _Sampler:
    """Penalties, then greedy (temperature 0) or top-k → top-p → min-p → temperature."""

    def __init__(self, args: SamplingArgs) -> None:
        self.a = args
        self.rng = np.random.default_rng(args.seed)

    def __call__(self, logits: npt.NDArray[np.float32], history: Sequence[int]) -> int:
        a = self.a
        x = logits.astype(np.float64)
        recent = history[-a.repeat_last_n :] if a.repeat_last_n else ()
        if recent and (a.repeat_penalty != 1.0 or a.presence_penalty or a.frequency_penalty):
            ids, counts = np.unique(np.asarray(recent, dtype=np.int64), return_counts=True)
            v = x[ids]
            v = np.where(v > 0, v / a.repeat_penalty, v * a.repeat_penalty)
            x[ids] = v - counts * a.frequency_penalty - a.presence_penalty
        if a.temperature == 0.0:
            return int(np.argmax(x))
        order = np.argsort(-x, kind="stable")
        if a.top_k > 0:
            order = order[: a.top_k]
        v = x[order]
        p = np.exp(v - v[0])
        p /= p.sum()
        if a.top_p < 1.0:
            keep = int(np.searchsorted(np.cumsum(p), a.top_p) + 1)
            order, v, p = order[:keep], v[:keep], p[:keep]
        if a.min_p > 0.0:
            keep_mask = p >= a.min_p * p[0]
            order, v = order[keep_mask], v[keep_mask]
        p = np.exp((v - v[0]) / a.temperature)
        p /= p.sum()
        return int(order[self.rng.choice(len(order), p=p)])


def _as_ids(tokens: Iterable[int], what: str) -> list[int]:
    ids = list(tokens)
    for t in ids:
        if isinstance(t, bool) or not isinstance(t, int | np.integer):
            raise ValueError(f"{what}: token ids must be integers, got {t!r}")
    return [int(t) for t in ids]


class LLM:
    """A qwen3moe GGUF ready to run. Keyword arguments are `strata.config.Config` fields
    (n_ctx, kv_type, prefill_chunk, ...), applied over the environment and config file."""

    def __init__(self, model_path: str | PathLike[str], **config: Any) -> None:
        self.config = Config.load({**config, "model": str(model_path)})
        self.path = Path(self.config.model)
        with GGUFFile(self.path) as g:
            self.metadata: dict[str, Any] = g.metadata
        # Slots 0..parallel-1 belong to the step API; the last one to logits()/generate().
        self.max_slots: int = self.config.parallel
        self._own = self.max_slots
        c = self.config
        # Every setting `Model.open` takes (Config.names("core")); on the GPU, the hybrid
        # mode's start fill follows the profile (the CPU path applies it to the RAM tier).
        profile = Profile.load(c.profile, self.path) if c.profile and c.device == "cuda" else None
        self.model = Model.open(
            self.path,
            n_slots=self.max_slots + 1,
            profile=profile,
            **{k: getattr(c, k) for k in Config.names("core")},
        )
        self.hparams: dict[str, Any] = self.model.hparams
        self.n_ctx: int = self.config.n_ctx
        self.n_vocab: int = self.model.n_vocab
        self._tokenizer: Any = None
        self._cached: list[int] = []  # the tokens the private slot holds
        self._counts = {"prefill_tokens_total": 0, "decode_tokens_total": 0}
        # The RAM tier: residency of every expert, the fill threads (hot experts first when
        # `profile` is set; a profile for another model raises ProfileMismatchError).
        # On the GPU every expert is in VRAM: the tier is only reported, never filled or read.
        on_cpu = self.config.device == "cpu"
        self.tier, self.fill = open_tier(self.config, self.path, start_fill=on_cpu)
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
        if n > self.n_ctx:
            raise ValueError(
                f"{what}: {n} tokens do not fit the context of {self.n_ctx} tokens (n_ctx)"
            )

    def logits(self, token_ids: Sequence[int]) -> npt.NDArray[np.float32]:
        """Logits of every position of `token_ids` on a fresh sequence: (len, n_vocab)."""
        ids = _as_ids(token_ids, "token_ids")
        self._check_len(len(ids), "token_ids")
        self.model.free(self._own)
        self._cached = []
        out = self.model.forward(self._own, ids, logits="all")
        self._cached = ids
        return out

    def _prefill(self, ids: list[int]) -> npt.NDArray[np.float32]:
        """Last-position logits of `ids`, reusing the cached prefix they share."""
        common = 0
        for a, b in zip(self._cached, ids[:-1], strict=False):
            if a != b:
                break
            common += 1
        self.model.truncate(self._own, common)
        self._cached = self._cached[:common]
        out = self.model.forward(self._own, ids[common:], logits="last")
        self._cached = list(ids)
        return out

    # ---- per-slot step API (the engine) ---------------------------------------------------

    def _slot(self, slot: int) -> int:
        if isinstance(slot, bool) or not isinstance(slot, int) or not 0 <= slot < self.max_slots:
            raise ValueError(f"slot: must be in 0..{self.max_slots - 1}, got {slot!r}")
        return slot

    def prefill(self, slot: int, ids: Sequence[int], pos: int) -> npt.NDArray[np.float32]:
        """Runs prompt tokens `ids` at positions pos.. of `slot`, keeping the slot's first
        `pos` cached positions (0 starts afresh); returns the last position's logits [V]."""
        s = self._slot(slot)
        toks = _as_ids(ids, "ids")
        held = self.model.slot_len(s)
        if isinstance(pos, bool) or not isinstance(pos, int) or not 0 <= pos <= held:
            raise ValueError(f"pos: slot {s} holds {held} positions, got {pos!r}")
        self._check_len(pos + len(toks), "prefill")
        self.model.truncate(s, pos)
        out = self.model.forward(s, toks, logits="last")
        self._counts["prefill_tokens_total"] += len(toks)
        return out

    def decode(self, slots: Sequence[int], tokens: Sequence[int]) -> npt.NDArray[np.float32]:
        """One token for each slot, at its next position: logits [B, V]."""
        if len(slots) != len(tokens):
            raise ValueError(f"decode: {len(slots)} slots but {len(tokens)} tokens")
        out = np.empty((len(slots), self.n_vocab), dtype=np.float32)
        for b, (slot, tok) in enumerate(zip(slots, _as_ids(tokens, "tokens"), strict=True)):
            out[b] = self.model.forward(self._slot(slot), [tok], logits="last")
        self._counts["decode_tokens_total"] += len(slots)
        return out

    def free(self, slot: int) -> None:
        """Empties a step-API slot."""
        self.model.free(self._slot(slot))

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
        d.update(tier_stats(self.tier, self.fill, self.model.readahead_stats()))
        return d

    def settling(self) -> bool:
        """True while the tier's fill threads run (its progress moves without any step)."""
        return self.fill is not None and not self.fill.progress()["finished"]

    def labeled_stats(self) -> list[LabeledStat]:
        """Counters with labels for /metrics: the VRAM tier's (none on the CPU-only path)."""
        return vram_stats(self.hybrid)

    def tier_counts(self) -> tuple[int, int, int] | None:
        """(hits, CPU misses, PCIe misses) of the VRAM tier so far; None on the CPU-only path
        (the scheduler's per-request hit rate and PCIe share come from these)."""
        return self.hybrid.totals() if self.hybrid is not None else None

    def info(self) -> dict[str, Any]:
        keys = ("architecture", "n_layer", "n_embd", "n_expert", "n_expert_used", "n_vocab")
        d: dict[str, Any] = {k: self.hparams[k] for k in keys}
        d.update(kv_type=self.config.kv_type, n_ctx=self.n_ctx, max_slots=self.max_slots)
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
        model's chat template (with the generation prompt), token ids pass through."""
        if isinstance(prompt, str):
            ids = list(self.tokenizer.encode(prompt))
        elif isinstance(prompt, Sequence) and prompt and all(isinstance(m, dict) for m in prompt):
            text = self.tokenizer.apply_chat_template(list(prompt), add_generation_prompt=True)
            ids = list(self.tokenizer.encode(text))
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
        **sampling: Any,
    ) -> Iterator[tuple[int, str | None]]:
        """Token ids without text: yields `(id, finish_reason)`. `stop_ids` defaults to the
        tokenizer's end-of-generation ids; the stop token itself is yielded with "stop"."""
        ids = _as_ids(prompt_ids, "prompt")
        self._check_len(len(ids), "prompt")
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise ValueError(f"max_tokens: must be an integer >= 1, got {max_tokens!r}")
        for t in ids:
            if not 0 <= t < self.n_vocab:
                raise ValueError(f"prompt: token id {t} is outside the vocabulary")
        sampler = _Sampler(SamplingArgs(**sampling))
        stops = set(self.tokenizer.eog_ids if stop_ids is None else stop_ids)
        return self._loop(ids, max_tokens, stops, sampler)

    def _loop(
        self, ids: list[int], max_tokens: int, stops: set[int], sampler: _Sampler
    ) -> Iterator[tuple[int, str | None]]:
        history = list(ids)
        logits = self._prefill(ids)
        for i in range(max_tokens):
            tok = sampler(logits, history)
            history.append(tok)
            if tok in stops:
                yield tok, "stop"
                return
            if i + 1 == max_tokens or len(history) >= self.n_ctx:
                yield tok, "length"
                return
            yield tok, None
            logits = self.model.forward(self._own, [tok], logits="last")
            self._cached.append(tok)

    def generate(
        self,
        prompt: Prompt,
        max_tokens: int = 256,
        temperature: float = 0.8,
        top_k: int = 40,
        top_p: float = 0.95,
        min_p: float = 0.05,
        seed: int | None = None,
        repeat_penalty: float = 1.0,
        presence_penalty: float = 0.0,
        frequency_penalty: float = 0.0,
        stop: str | Sequence[str] | None = None,
    ) -> Iterator[TokenEvent]:
        """Streams token events. temperature 0 is greedy. Text held back by a possible stop
        string or an incomplete UTF-8 sequence arrives with a later event."""
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
