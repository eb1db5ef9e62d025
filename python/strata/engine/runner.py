"""The engine's model: `strata._core.Model` with one KV slot per engine slot, behind the
per-slot step API that `LLMBackend` drives (`prefill`, `decode`, `free`).

The engine process owns sequences and KV, so it opens the Rust model directly rather than
through `strata.LLM` (which keeps a single slot for its own generate loop)."""

from __future__ import annotations

from collections.abc import Sequence
from os import PathLike
from typing import Any

import numpy as np
import numpy.typing as npt

from strata._core import Model

F32 = npt.NDArray[np.float32]


class ModelRunner:
    def __init__(self, path: str | PathLike[str], **settings: Any) -> None:
        self.n_slots = max(1, int(settings.get("parallel", 1)))
        self.model = Model.open(
            path,
            n_ctx=int(settings.get("n_ctx", 4096)),
            n_slots=self.n_slots,
            kv_type=str(settings.get("kv_type", "f16")),
            prefill_chunk=int(settings.get("prefill_chunk", 512)),
        )
        self.n_vocab: int = self.model.n_vocab
        self.n_ctx: int = self.model.n_ctx
        self.max_slots: int = self.n_slots
        self._prompt_tokens = 0
        self._decode_tokens = 0

    def prefill(self, slot: int, ids: Sequence[int], pos: int) -> F32:
        """Logits after `ids`, appended at position `pos` of the slot (earlier positions are
        reused: a follow-up turn reads only its new tokens)."""
        held = self.model.slot_len(slot)
        if pos > held:
            raise ValueError(f"slot {slot}: prefill at {pos} but it holds {held} tokens")
        if pos < held:
            self.model.truncate(slot, pos)
        self._prompt_tokens += len(ids)
        out: F32 = self.model.forward(slot, list(ids), logits="last")  # [V]
        return out

    def decode(self, slots: Sequence[int], tokens: Sequence[int]) -> F32:
        """One token for each slot: logits [B, V]."""
        rows = [
            self.model.forward(s, [int(t)], logits="last")
            for s, t in zip(slots, tokens, strict=True)
        ]
        self._decode_tokens += len(rows)
        return np.stack(rows) if rows else np.zeros((0, self.n_vocab), np.float32)

    def free(self, slot: int) -> None:
        self.model.free(slot)

    def stats(self) -> dict[str, float]:
        return {
            "model_prompt_tokens_total": float(self._prompt_tokens),
            "model_decode_tokens_total": float(self._decode_tokens),
        }

    def info(self) -> dict[str, Any]:
        return {"kind": "llm", "slots": self.n_slots, "hparams": self.model.hparams}
