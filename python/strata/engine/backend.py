"""What the engine loop needs from a model: the `Backend` protocol and its two implementations.

- `FakeBackend`: a deterministic toy "model" over the byte vocabulary of `strata.toytok`, for
  tests and `STRATA_ENGINE=fake`. Greedy decoding echoes the last run of byte tokens of the
  prompt (for a chat: the last message's content) and then emits EOS; the logits are that
  target plus seeded noise, so sampling with temperature spreads around it. Test-only faults
  (`Config.test_faults`): a prompt containing `#stall#` makes the engine hang, `#crash#` makes
  the process exit, both after two generated tokens.
- `LLMBackend`: wraps `strata.llm.LLM` (imported lazily; the Rust forward pass).

Shapes: V = vocabulary size, T = tokens of one entry.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import time
from collections.abc import Callable, Sequence
from typing import Any, Literal, Protocol

import numpy as np
import numpy.typing as npt

from strata import toytok
from strata.config import Config
from strata.engine.protocol import Stat

F32 = npt.NDArray[np.float32]


# One entry of a forward batch: (slot, token ids, logits wanted: "none" | "last" | "all" |
# "window" (as "all", each row bitwise a one-token step's: a speculative window)); the
# tokens continue the slot at its current length.
Entry = tuple[int, Sequence[int], str]


class Backend(Protocol):
    n_vocab: int
    n_ctx: int  # positions of all slots together (llama.cpp's n_ctx; resolved when 0)
    n_ctx_seq: int  # positions per slot (n_ctx / parallel)
    max_slots: int

    def forward_batch(self, entries: Sequence[Entry]) -> list[F32 | None]:
        """Run every entry in one forward pass; per entry None, logits [V] ("last") or
        [T, V] ("all")."""
        ...

    def truncate(self, slot: int, n: int) -> None:
        """Keep the first `n` positions of `slot`'s KV."""
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
        n_ctx_seq: int = 4096,
        max_slots: int = 4,
        seed: int = 0,
        step_ms: float = 0.0,
        faults: bool = False,
        pipeline_windows: int = 1,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.n_vocab = toytok.N_VOCAB
        self._sleep_fn = sleep  # how a step's `step_ms` passes (tests: a virtual clock's)
        # pipelined windows as the GPU path has them (`launch_batch`, `finish_batch`,
        # `settle`): each window runs at launch; its outputs and its slots' lengths before it
        # wait in `_flights` for the verdict
        self.pipeline_windows = pipeline_windows
        self._flights: list[tuple[list[F32 | None], dict[int, int]]] = []
        self._verdict = False
        self._launching = False
        self.n_ctx_seq = n_ctx_seq
        self.max_slots = max_slots
        self.n_ctx = n_ctx_seq * max_slots
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

    def _logits(self, slot: int, end: int | None = None) -> F32:
        """The next-token logits after the slot's first `end` tokens (all of them: None)."""
        toks = self._tokens[slot][:end]
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
        if n > self.n_ctx_seq:
            raise ValueError(f"slot {slot}: {n} positions exceed the context of {self.n_ctx_seq}")

    def truncate(self, slot: int, n: int) -> None:
        """Keeps n positions; what follows is a new prompt until an entry asks for logits."""
        self.rollback(slot, n)
        self._n_prompt.pop(slot, None)  # reading a prompt
        self._fault.pop(slot, None)

    def rollback(self, slot: int, n: int) -> None:
        """Keeps n positions of a generating sequence (a speculative window cut back to its
        accepted prefix): it goes on generating."""
        self._check(slot, n)
        self._idle(slot)
        toks = self._tokens.setdefault(slot, [])
        if n > len(toks):
            raise ValueError(f"slot {slot}: truncate to {n} but it holds {len(toks)} tokens")
        del toks[n:]

    def forward_batch(self, entries: Sequence[Entry]) -> list[F32 | None]:
        if self._flights and not self._launching:
            raise ValueError("forward_batch: a pipelined window is in flight")
        slots = [slot for slot, _, _ in entries]
        if len(set(slots)) != len(slots):
            raise ValueError("forward_batch: a slot appears twice")
        for slot, ids, _ in entries:
            self._check(slot, len(self._tokens.get(slot, ())) + len(ids))
        out: list[F32 | None] = []
        for slot, ids, want in entries:
            toks = self._tokens.setdefault(slot, [])
            toks.extend(int(t) for t in ids)
            if slot in self._n_prompt:  # generating: ids are output tokens
                self._decode_tokens += len(ids)
                fault = self._fault.get(slot)
                if fault and len(toks) - self._n_prompt[slot] >= 2:
                    self._inject(fault)
            else:
                self._prefill_tokens += len(ids)
                if want != "none":  # the prompt's last chunk
                    self._n_prompt[slot] = len(toks)
                    self._scan_faults(slot)
            if want in ("all", "window") and slot in self._n_prompt:  # [T, V]: a window's rows
                n = len(toks)
                rows = [self._logits(slot, n - len(ids) + 1 + i) for i in range(len(ids))]
                out.append(np.stack(rows))
                continue
            out.append(None if want == "none" else self._logits(slot))
        self._steps += 1
        self._sleep()
        return out

    def _idle(self, slot: int) -> None:
        """Refuses a slot that a pipelined window in flight runs in (as the GPU path does)."""
        if any(slot in starts for _, starts in self._flights):
            raise ValueError(f"slot {slot} is in a pipelined window in flight")

    def launch_batch(self, entries: Sequence[Entry]) -> None:
        if self._verdict:
            self.settle(True)
        if len(self._flights) >= self.pipeline_windows:
            raise ValueError(f"{len(self._flights)} windows in flight; finish one")
        starts = {slot: len(self._tokens.get(slot, ())) for slot, _, _ in entries}
        self._launching = True
        try:
            out = self.forward_batch(entries)
        finally:
            self._launching = False
        self._flights.append((out, starts))

    def finish_batch(self) -> list[F32 | None]:
        if self._verdict or not self._flights:
            raise ValueError("no window to finish (or its verdict is not settled)")
        self._verdict = True
        return self._flights[0][0]

    def settle(self, accepted: bool) -> None:
        if not self._verdict:
            raise ValueError("no verdict to settle")
        self._verdict = False
        self._flights.pop(0)
        if not accepted:  # the later windows are discarded: their slots as before them
            for _, starts in reversed(self._flights):
                for slot, n in starts.items():
                    del self._tokens[slot][n:]
            self._flights.clear()

    def _scan_faults(self, slot: int) -> None:
        if self.faults:
            text = bytes(t for t in self._tokens[slot] if toytok.is_byte(t))
            for fault in ("stall", "crash"):
                if f"#{fault}#".encode() in text:
                    self._fault[slot] = fault

    def kv_export(self, slot: int, n: int) -> bytes:
        """The toy's "KV": its first n token ids."""
        return np.asarray(self._tokens[slot][:n], dtype=np.int32).tobytes()

    def kv_import(self, slot: int, data: bytes) -> int:
        self._check(slot, len(data) // 4)
        self._tokens[slot] = [int(t) for t in np.frombuffer(data, dtype=np.int32)]
        self._n_prompt.pop(slot, None)
        return len(self._tokens[slot])

    def kv_shift(self, slot: int, keep: int, chunks: list[tuple[int, int]]) -> int:
        """The toy's "KV" moved as the model's: its first `keep` ids, then each chunk's (in
        order, apart, within what the slot holds: ValueError otherwise, the slot as it was)."""
        self._check(slot, keep)
        toks = self._tokens.get(slot, [])
        end = keep
        for f, n in chunks:
            if f < end or n < 0 or f + n > len(toks):
                raise ValueError(f"KV shift: chunk ({f}, {n}) out of order or past {len(toks)}")
            end = f + n
        if keep > len(toks):
            raise ValueError(f"KV shift: cannot keep {keep} of {len(toks)} positions")
        self._tokens[slot] = toks[:keep] + [t for f, n in chunks for t in toks[f : f + n]]
        self._n_prompt.pop(slot, None)
        return len(self._tokens[slot])

    def _inject(self, fault: str) -> None:  # TEST-ONLY (Config.test_faults)
        if fault == "crash":
            os._exit(70)
        deadline = time.monotonic() + 3600.0  # the server's watchdog kills us long before
        while time.monotonic() < deadline:
            time.sleep(0.5)
        os._exit(71)

    def _sleep(self) -> None:
        if self.step_s > 0:
            self._sleep_fn(self.step_s)

    def vocabulary(self) -> Any:
        return toytok.Vocabulary()

    def free(self, slot: int) -> None:
        self._idle(slot)
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
FAKE_TRAIN_CTX = 4096  # the fake engine's toy model's "training context" (for n_ctx 0)
SERVER_FIELDS = Config.names("server", "test")


class LLMBackend:
    """Adapter over `strata.llm.LLM` (`LLM(path, **config)`).

    With the batched step API (`forward_batch(entries)`, `truncate(slot, n)`, `free(slot)`,
    optional `kv_export`/`kv_import`, `max_slots`, `stats()`, `info()`) it forwards to it.
    An `LLM`-shaped object with only `logits(ids) -> [T, V]` is run over each slot's whole
    sequence instead (correct, O(T) per token: for stand-ins in tests).
    """

    def __init__(self, config: Config, factory: Any = None) -> None:
        path = config.model
        self.default_model = not path
        if not path:
            from strata import modelgen  # type: ignore[attr-defined, unused-ignore]

            path = str(modelgen.shipped_model_path("default"))
        self.path = path
        if factory is None:
            from strata import llm as llm_mod  # type: ignore[attr-defined, unused-ignore]

            # the server's resolved settings as they are: the environment is not read again
            # (a STRATA_* value a flag overrode in the server would be checked anew here)
            self.llm: Any = llm_mod.LLM.from_config(
                dataclasses.replace(config, model=path), private_slot=False
            )
        else:
            self.llm = factory(path, **{k: getattr(config, k) for k in MODEL_FIELDS})
        n_vocab = getattr(self.llm, "n_vocab", None)
        if n_vocab is None:
            n_vocab = self.llm.tokenizer.n_vocab
        self.n_vocab = int(n_vocab)
        # the model's (n_ctx 0, llama.cpp's -c 0, resolved to its training context)
        self.n_ctx = int(getattr(self.llm, "n_ctx", config.n_ctx))
        self.n_ctx_seq = int(getattr(self.llm, "n_ctx_seq", config.n_ctx_seq))
        self.stepwise = callable(getattr(self.llm, "forward_batch", None))
        self.max_slots = int(getattr(self.llm, "max_slots", config.parallel))
        # prompt tokens per scheduler step (the hybrid mode's streamed chunk when it has one)
        self.prefill_piece = int(getattr(self.llm, "prefill_piece", config.prefill_chunk))
        self._seqs: dict[int, list[int]] = {}  # slot → tokens (full-sequence fallback only)
        # A model whose slots keep a recurrent state: no KV moves; a prefix is reused whole or
        # up to a checkpoint (each prompt's end is marked: `checkpoint`, `checkpoints`).
        self.recurrent = bool(getattr(self.llm, "recurrent", False))
        if self.stepwise and self.recurrent:
            self.checkpoint = self.llm.checkpoint
            self.checkpoints = self.llm.checkpoints
        if self.stepwise and not self.recurrent and callable(getattr(self.llm, "kv_export", None)):
            self.kv_export = self.llm.kv_export
            self.kv_import = self.llm.kv_import
            self.kv_shift = self.llm.kv_shift
        # pipelined windows (`pipeline_windows` 2): launch, verdict and settle apart; a window
        # is one step of at most `prefill_chunk` rows
        self.pipeline_windows = int(getattr(self.llm, "pipeline_windows", 1))
        self.step_rows = config.prefill_chunk
        if self.pipeline_windows > 1:
            self.launch_batch = self.llm.launch_batch
            self.finish_batch = self.llm.finish_batch
            self.settle = self.llm.settle

    def forward_batch(self, entries: Sequence[Entry]) -> list[F32 | None]:
        if self.stepwise:
            out: list[F32 | None] = self.llm.forward_batch(entries)
            return out
        rows: list[F32 | None] = []
        for slot, ids, want in entries:
            seq = self._seqs.setdefault(slot, [])
            seq.extend(int(t) for t in ids)
            if want == "none":
                rows.append(None)
                continue
            full = np.asarray(self.llm.logits(seq), dtype=np.float32)  # [T, V]
            rows.append(full[-1] if want == "last" else full[-len(ids) :])  # all, window
        return rows

    def truncate(self, slot: int, n: int) -> None:
        if self.stepwise:
            self.llm.truncate(slot, n)
        else:
            del self._seqs.setdefault(slot, [])[n:]

    def vocabulary(self) -> Any:
        return self.llm.tokenizer

    def free(self, slot: int) -> None:
        self._seqs.pop(slot, None)
        if self.stepwise:
            self.llm.free(slot)

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

    def tier_counts(self, slot: int) -> tuple[int, int, int] | None:
        """The VRAM tier counters (hits, CPU misses, PCIe misses) of the pairs `slot`'s
        sequences fed so far; None without a VRAM tier."""
        fn = getattr(self.llm, "tier_counts", None)
        return fn(slot) if fn is not None else None

    def info(self) -> dict[str, Any]:
        extra = getattr(self.llm, "info", None)
        d: dict[str, Any] = dict(extra()) if extra is not None else {}
        d.setdefault("kind", "llm")
        d.setdefault("path", self.path)
        d.setdefault("step_api", "batched" if self.stepwise else "full-sequence logits")
        if self.default_model:
            from strata import modelgen  # type: ignore[attr-defined, unused-ignore]

            d["weights"] = modelgen.TRAINED_DEFAULT_WEIGHTS
        return d


def make_backend(config: Config) -> Backend:
    if config.engine == "fake":
        if config.fake_load_s > 0:
            time.sleep(config.fake_load_s)
        # the toy model's "training context" where n_ctx is 0 (llama.cpp's -c 0)
        return FakeBackend(
            n_ctx_seq=config.with_train_ctx(FAKE_TRAIN_CTX).n_ctx_seq,
            max_slots=config.parallel,
            step_ms=config.fake_step_ms,
            faults=config.test_faults,
        )
    return LLMBackend(config)
