"""What the engine loop needs from a model: the `Backend` protocol and its two implementations.

- `FakeBackend`: a deterministic toy "model" over the byte vocabulary of `strata.toytok`, for
  tests and `STRATA_ENGINE=fake`. Greedy decoding echoes the last run of byte tokens of the
  prompt (for a chat: the last message's content) and then emits EOS; the logits are that
  target plus seeded noise, so sampling with temperature spreads around it. Test-only faults
  (`Config.test_faults`): a prompt containing `#stall#` makes the engine hang, `#crash#` makes
  the process exit, both after two generated tokens.
- `LLMBackend`: wraps `strata.llm.LLM` (imported lazily; the Rust forward pass).

Shapes: V = vocabulary size, B = sequences in a decode step.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Sequence
from typing import Any, Literal, Protocol

import numpy as np
import numpy.typing as npt

from strata import toytok
from strata.config import Config
from strata.engine.protocol import Stat

F32 = npt.NDArray[np.float32]


class Backend(Protocol):
    n_vocab: int
    n_ctx: int  # positions per slot
    max_slots: int

    def prefill(self, slot: int, ids: Sequence[int], pos: int) -> F32:
        """Run prompt tokens `ids` at positions pos.. of `slot` (pos 0 starts the slot afresh);
        returns the logits [V] after the last one."""
        ...

    def decode(self, slots: Sequence[int], tokens: Sequence[int]) -> F32:
        """One token for each slot (at its next position); returns logits [B, V]."""
        ...

    def free(self, slot: int) -> None: ...

    def vocabulary(self) -> Any:
        """The model's tokenizer, for grammar constraints (`strata.constraints.Vocabulary`)."""
        ...

    def stats(self) -> list[Stat]:
        """Counters and gauges for /metrics (names without the strata_ prefix)."""
        ...

    def info(self) -> dict[str, Any]:
        """Description for /v1/status (kind, model, tier state)."""
        ...

    def settling(self) -> bool:
        """True while background work (the tier's fill) moves the stats without any step:
        the engine keeps sending them until it ends."""
        ...


class FakeBackend:
    ECHO_BOOST = 10.0  # logit added to the echo target; noise is N(0, 1)

    def __init__(
        self,
        n_ctx: int = 4096,
        max_slots: int = 4,
        seed: int = 0,
        step_ms: float = 0.0,
        faults: bool = False,
    ) -> None:
        self.n_vocab = toytok.N_VOCAB
        self.n_ctx = n_ctx
        self.max_slots = max_slots
        self.seed = seed
        self.step_s = step_ms / 1000.0
        self.faults = faults
        self._tokens: dict[int, list[int]] = {}  # slot → prompt + output tokens
        self._n_prompt: dict[int, int] = {}
        self._fault: dict[int, str] = {}
        self._steps = 0
        self._prefill_tokens = 0
        self._decode_tokens = 0
        # bytes ≥ 0x80 and specials are less likely under noise; unused ids never
        self._bias = np.zeros(self.n_vocab, dtype=np.float32)  # [V]
        self._bias[128:] = -4.0
        self._bias[len(toytok.SPECIALS) + 256 :] = -np.inf

    # -- the toy model ----------------------------------------------------------------------

    def _logits(self, slot: int) -> F32:
        toks = self._tokens[slot]
        n_prompt = self._n_prompt[slot]
        run: list[int] = []  # the last run of byte tokens of the prompt
        for t in reversed(toks[:n_prompt]):
            if not toytok.is_byte(t):
                if run:
                    break
                continue
            run.append(t)
        run.reverse()
        g = len(toks) - n_prompt  # tokens generated so far
        target = run[g] if g < len(run) else toytok.EOS
        h = hashlib.blake2b(
            f"{self.seed}:{len(toks)}:{toks[-1] if toks else -1}".encode(), digest_size=8
        ).digest()
        rng = np.random.default_rng(int.from_bytes(h, "little"))
        x: F32 = rng.standard_normal(self.n_vocab, dtype=np.float32) + self._bias
        x[target] += self.ECHO_BOOST
        return x

    def _check(self, slot: int, n: int) -> None:
        if not (0 <= slot < self.max_slots):
            raise ValueError(f"slot {slot} out of range 0..{self.max_slots - 1}")
        if n > self.n_ctx:
            raise ValueError(f"slot {slot}: {n} positions exceed the context of {self.n_ctx}")

    def prefill(self, slot: int, ids: Sequence[int], pos: int) -> F32:
        self._check(slot, pos + len(ids))
        if pos == 0:
            self._tokens[slot] = []
            self._fault.pop(slot, None)
        toks = self._tokens[slot]
        if len(toks) != pos:
            raise ValueError(f"slot {slot}: prefill at {pos} but it holds {len(toks)} tokens")
        toks.extend(int(t) for t in ids)
        self._n_prompt[slot] = len(toks)
        self._prefill_tokens += len(ids)
        if self.faults:
            text = bytes(t for t in toks if toytok.is_byte(t))
            for fault in ("stall", "crash"):
                if f"#{fault}#".encode() in text:
                    self._fault[slot] = fault
        self._sleep()
        return self._logits(slot)

    def decode(self, slots: Sequence[int], tokens: Sequence[int]) -> F32:
        out = np.empty((len(slots), self.n_vocab), dtype=np.float32)  # [B, V]
        for b, (slot, tok) in enumerate(zip(slots, tokens, strict=False)):
            toks = self._tokens[slot]
            self._check(slot, len(toks) + 1)
            toks.append(int(tok))
            fault = self._fault.get(slot)
            if fault and len(toks) - self._n_prompt[slot] >= 2:
                self._inject(fault)
            out[b] = self._logits(slot)
        self._steps += 1
        self._decode_tokens += len(slots)
        self._sleep()
        return out

    def _inject(self, fault: str) -> None:  # TEST-ONLY (Config.test_faults)
        if fault == "crash":
            os._exit(70)
        deadline = time.monotonic() + 3600.0  # the server's watchdog kills us long before
        while time.monotonic() < deadline:
            time.sleep(0.5)
        os._exit(71)

    def _sleep(self) -> None:
        if self.step_s > 0:
            time.sleep(self.step_s)

    def vocabulary(self) -> Any:
        return toytok.Vocabulary()

    def free(self, slot: int) -> None:
        self._tokens.pop(slot, None)
        self._n_prompt.pop(slot, None)
        self._fault.pop(slot, None)

    def stats(self) -> list[Stat]:
        return [
            Stat("engine_decode_steps_total", "counter", {}, float(self._steps)),
            Stat("engine_prefill_tokens_total", "counter", {}, float(self._prefill_tokens)),
            Stat("engine_decode_tokens_total", "counter", {}, float(self._decode_tokens)),
        ]

    def settling(self) -> bool:
        return False

    def info(self) -> dict[str, Any]:
        return {
            "kind": "fake",
            "weights": "none: a deterministic toy model that echoes the prompt",
            "tiers": {},
        }


# Config fields handed to `LLM(path, **fields)` (the model's own settings; the engine's LLM
# also reads the environment, but flags given to the server reach it only through these), and
# the server's and the tools' own (with the TEST-ONLY switches).
MODEL_FIELDS = Config.names("model")
SERVER_FIELDS = Config.names("server", "test")


class LLMBackend:
    """Adapter over `strata.llm.LLM` (`LLM(path, **config)`).

    With the per-slot step API (`prefill(slot, ids, pos) -> [V]`, `decode(slots, tokens) ->
    [B, V]`, `free(slot)`, optional `max_slots`, `stats()`, `info()`) it forwards to it. Until
    that API exists it falls back on `logits(ids) -> [T, V]` over each slot's whole sequence
    (correct, O(T) per token: enough for the small default model, not for real ones).
    """

    def __init__(self, config: Config, factory: Any = None) -> None:
        if factory is None:
            from strata import llm as llm_mod  # type: ignore[attr-defined, unused-ignore]

            factory = llm_mod.LLM
        path = config.model
        self.default_model = not path
        if not path:
            from strata import modelgen  # type: ignore[attr-defined, unused-ignore]

            path = str(modelgen.shipped_model_path("default"))
        self.path = path
        self.llm: Any = factory(path, **{k: getattr(config, k) for k in MODEL_FIELDS})
        n_vocab = getattr(self.llm, "n_vocab", None)
        if n_vocab is None:
            n_vocab = self.llm.tokenizer.n_vocab
        self.n_vocab = int(n_vocab)
        self.n_ctx = int(getattr(self.llm, "n_ctx", config.n_ctx))
        self.stepwise = all(callable(getattr(self.llm, m, None)) for m in ("prefill", "decode"))
        self.max_slots = int(getattr(self.llm, "max_slots", config.parallel))
        # prompt tokens per scheduler step (the hybrid mode's streamed chunk when it has one)
        self.prefill_piece = int(getattr(self.llm, "prefill_piece", config.prefill_chunk))
        self._seqs: dict[int, list[int]] = {}  # slot → tokens (fallback only)

    def _last(self, ids: list[int]) -> F32:
        out: F32 = np.asarray(self.llm.logits(ids), dtype=np.float32)  # [T, V]
        last: F32 = out[-1]
        return last

    def prefill(self, slot: int, ids: Sequence[int], pos: int) -> F32:
        if self.stepwise:
            return np.asarray(self.llm.prefill(slot, list(ids), pos), dtype=np.float32)
        seq = self._seqs.setdefault(slot, [])
        if pos == 0:
            seq.clear()
        if len(seq) != pos:
            raise ValueError(f"slot {slot}: prefill at {pos} but it holds {len(seq)} tokens")
        seq.extend(int(t) for t in ids)
        return self._last(seq)

    def decode(self, slots: Sequence[int], tokens: Sequence[int]) -> F32:
        if self.stepwise:
            out = np.asarray(self.llm.decode(list(slots), list(tokens)), dtype=np.float32)
            return out.reshape(len(slots), -1)
        rows = []
        for slot, tok in zip(slots, tokens, strict=True):
            seq = self._seqs[slot]
            seq.append(int(tok))
            rows.append(self._last(seq))
        return np.stack(rows)  # [B, V]

    def vocabulary(self) -> Any:
        return self.llm.tokenizer

    def free(self, slot: int) -> None:
        self._seqs.pop(slot, None)
        fn = getattr(self.llm, "free", None)
        if self.stepwise and fn is not None:
            fn(slot)

    def stats(self) -> list[Stat]:
        raw = getattr(self.llm, "stats", None)
        labeled = getattr(self.llm, "labeled_stats", None)
        out = [
            Stat(str(name), "counter" if str(name).endswith("_total") else "gauge", {}, float(v))
            for name, v in (dict(raw()) if raw is not None else {}).items()
        ]
        for name, labels, v in labeled() if labeled is not None else []:
            kind: Literal["counter", "gauge"] = (
                "counter" if str(name).endswith("_total") else "gauge"
            )
            out.append(Stat(str(name), kind, dict(labels), float(v)))
        return out

    def settling(self) -> bool:
        fn = getattr(self.llm, "settling", None)
        return bool(fn()) if fn is not None else False

    def tier_counts(self) -> tuple[int, int, int] | None:
        """The model's VRAM tier counters (hits, CPU misses, PCIe misses); None without one."""
        fn = getattr(self.llm, "tier_counts", None)
        return fn() if fn is not None else None

    def info(self) -> dict[str, Any]:
        extra = getattr(self.llm, "info", None)
        d: dict[str, Any] = dict(extra()) if extra is not None else {}
        d.setdefault("kind", "llm")
        d.setdefault("path", self.path)
        d.setdefault("step_api", "per-slot" if self.stepwise else "full-sequence logits")
        if self.default_model:
            from strata import modelgen  # type: ignore[attr-defined, unused-ignore]

            d["weights"] = modelgen.TRAINED_DEFAULT_WEIGHTS
        return d


def make_backend(config: Config) -> Backend:
    if config.engine == "fake":
        if config.fake_load_s > 0:
            time.sleep(config.fake_load_s)
        return FakeBackend(
            n_ctx=config.n_ctx,
            max_slots=config.parallel,
            step_ms=config.fake_step_ms,
            faults=config.test_faults,
        )
    return LLMBackend(config)
