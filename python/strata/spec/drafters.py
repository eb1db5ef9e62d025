"""Drafters: what proposes the tokens a speculative window verifies.

One interface (`Drafter`): `propose(slot, history, k, params, rng) -> Draft` gives up to `k`
tokens that may follow `history` (the sequence's prompt and output so far, the last token not yet
run by the target), with the draft distribution q of each one; `rollback(slot, n)` tells the
drafter that the sequence of `slot` now holds only its first `n` tokens (the target rejected the
rest), `release(slot)` that the slot's sequence ended. `propose_many` drafts for several
sequences at once (the draft model runs them as one batched step per drafted position).

- `NgramDrafter` (prompt lookup, as vLLM's ngram drafter and llama.cpp's ngram speculation):
  the longest recent n-gram (`NGRAM_MAX` down to `NGRAM_MIN` tokens) that ends the history and
  occurred before in it proposes the tokens that followed that earlier occurrence. q is one-hot.
- `ModelDrafter`: a smaller GGUF with the same vocabulary (the shipped dense qwen3 draft of the
  trained default, any qwen3/qwen3moe file) on the CPU (one thread, the caller's: measured
  faster for the shipped draft than two, whose pool thread competes with the target's), its
  own KV slots kept in step with the target's (same slot ids; what they hold is tracked and
  re-synced by common prefix). Greedy requests draft its argmax (q one-hot), sampled ones
  draw from its distribution under the request's top-k/top-p/min-p/temperature (q that
  distribution). Drafting stops at a token whose draft probability is below `spec_p_min`
  (llama.cpp's `--draft-p-min`).
- `MtpDrafter`: the target's own NextN / MTP layer (qwen35moe, qwen3next, glm4moe files that
  carry it; `strata._core.Model.set_mtp`), on the CPU path. The target's forward calls keep
  the layer's per-slot KV in step with the slot (it runs over every position the target adds,
  paired with the target's hidden state), and the target's `truncate` cuts it back with the
  target's KV and recurrent state, so `rollback` has nothing to do. A window's first draft
  pairs the last token with the target's hidden state before it, each later one the previous
  draft with the layer's own output (as llama.cpp's draft-mtp). Greedy drafts the argmax,
  sampled requests draw as `ModelDrafter`; `spec_p_min` stops a chain as there. A file
  without such a layer gets a `ConfigError` naming why.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from strata.errors import ConfigError
from strata.sampling import SamplingParams, distribution, draw

F32 = npt.NDArray[np.float32]
I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]

NGRAM_MIN = 2  # shortest n-gram the lookup matches (1-grams draft mostly noise on code)
NGRAM_MAX = 4


@dataclass(slots=True)
class Draft:
    """Proposed tokens and, per token, its draft distribution q as (ids [n], probs [n]);
    `q` is None when every token's q is one-hot (a deterministic drafter)."""

    tokens: list[int] = field(default_factory=list)
    q: list[tuple[I64, F64]] | None = None

    def q_of(self, i: int, token: int) -> float:
        """q of `token` at draft position i."""
        if self.q is None:
            return 1.0 if token == self.tokens[i] else 0.0
        ids, prob = self.q[i]
        return float(prob[ids == token].sum())


@dataclass(slots=True)
class DraftRequest:
    slot: int
    history: Sequence[int]  # prompt + output; the last token not yet run by the target
    k: int  # most tokens to propose
    params: SamplingParams
    rng: np.random.Generator  # the drafter's own draws (never the target sampler's)


class Drafter(Protocol):
    name: str

    def propose_many(self, reqs: Sequence[DraftRequest]) -> list[Draft]: ...

    def rollback(self, slot: int, n: int) -> None:
        """The sequence of `slot` keeps only its first `n` tokens."""
        ...

    def release(self, slot: int) -> None:
        """The slot's sequence ended (its state may go)."""
        ...

    def pause(self, paused: bool) -> None:
        """True: no running sequence will draft (the adaptive window found drafting cannot
        pay for any of them), so a drafter with upkeep in every target step stops it; False:
        a new sequence may draft again."""
        ...


def propose(
    drafter: Drafter,
    slot: int,
    history: Sequence[int],
    k: int,
    params: SamplingParams | None = None,
    rng: np.random.Generator | None = None,
) -> list[int]:
    """`propose(history, k) -> tokens` for one sequence (greedy unless `params` says)."""
    req = DraftRequest(
        slot,
        history,
        k,
        params or SamplingParams(temperature=0),
        rng or np.random.default_rng(0),
    )
    return drafter.propose_many([req])[0].tokens


class _NgramIndex:
    """For each n in NGRAM_MIN..NGRAM_MAX: n-gram → position right after its latest occurrence
    that has at least one token after it. The history may end in tokens not yet verified (a
    pipelined window's guess runs on through its predecessor's drafts): `sync` cuts the index
    back to where a new history departs from it (undoing what the cut positions indexed) and
    indexes the rest, so that a rejected draft costs the positions after it, not a re-index of
    the whole history."""

    def __init__(self) -> None:
        self.tokens: list[int] = []  # the history indexed
        self.maps: dict[int, dict[tuple[int, ...], int]] = {
            n: {} for n in range(NGRAM_MIN, NGRAM_MAX + 1)
        }
        # per indexed position e: (n, n-gram, the position it mapped to before e, or -1)
        self.undo: list[list[tuple[int, tuple[int, ...], int]]] = []
        self.fixed = 0  # positions known to be the sequence's own (verified): never cut

    def truncate(self, n: int) -> None:
        h = self.tokens
        while len(h) > n:
            e = len(h) - 1
            if e < len(self.undo):
                for k, key, prev in reversed(self.undo.pop()):
                    m = self.maps[k]
                    if prev < 0:
                        del m[key]
                    else:
                        m[key] = prev
            h.pop()
        self.fixed = min(self.fixed, n)

    def sync(self, history: Sequence[int]) -> None:
        h = self.tokens
        lim = min(len(h), len(history))
        i = min(self.fixed, lim)
        while i < lim and h[i] == history[i]:  # past the verified part only
            i += 1
        self.truncate(i)
        for t in history[i:]:
            h.append(int(t))
            e = len(h) - 1  # the n-grams ending at e now have h[e] after them
            if e < 1:
                continue
            log: list[tuple[int, tuple[int, ...], int]] = []
            for n, m in self.maps.items():
                if e >= n:
                    key = tuple(h[e - n : e])
                    log.append((n, key, m.get(key, -1)))
                    m[key] = e
            while len(self.undo) < e:
                self.undo.append([])
            self.undo.append(log)

    def lookup(self, k: int) -> list[int]:
        h = self.tokens
        for n in range(NGRAM_MAX, NGRAM_MIN - 1, -1):
            if len(h) <= n:
                continue
            e = self.maps[n].get(tuple(h[len(h) - n :]))
            if e is not None:
                return h[e : e + k]
        return []


class NgramDrafter:
    """Prompt lookup over the history (see the module doc); q one-hot, no model state."""

    name = "ngram"

    def __init__(self) -> None:
        self._index: dict[int, _NgramIndex] = {}

    def propose_many(self, reqs: Sequence[DraftRequest]) -> list[Draft]:
        out = []
        for r in reqs:
            idx = self._index.setdefault(r.slot, _NgramIndex())
            idx.sync(r.history)
            out.append(Draft(idx.lookup(r.k) if r.k > 0 else []))
        return out

    def rollback(self, slot: int, n: int) -> None:
        idx = self._index.get(slot)
        if idx is not None:  # the first n tokens are the sequence's own from now on
            idx.fixed = min(n, len(idx.tokens))

    def release(self, slot: int) -> None:
        self._index.pop(slot, None)

    def pause(self, paused: bool) -> None:
        pass  # no upkeep: the index is built when a sequence drafts


class ModelDrafter:
    """A draft model on the CPU (see the module doc). Shapes: V = vocabulary size."""

    name = "draft"

    def __init__(self, path: str, n_slots: int, n_ctx: int, p_min: float, threads: int = 0) -> None:
        from strata._core import Model

        self.path = path
        self.model = Model.open(path, n_ctx=n_ctx, n_slots=n_slots, threads=threads)
        self.n_vocab = int(self.model.n_vocab)
        self.n_ctx = n_ctx
        self.p_min = p_min
        self.cached: list[list[int]] = [[] for _ in range(n_slots)]  # per slot, in KV order
        self.steps = 0  # forward steps the draft model ran

    def _sync(self, slot: int, history: Sequence[int]) -> list[int]:
        """Truncate the slot's KV to the prefix it shares with `history` (always leaving the
        last token to run: its logits draft the first token); returns the tokens to feed."""
        have = self.cached[slot]
        n = 0
        for a, b in zip(have, history[:-1], strict=False):
            if a != b:
                break
            n += 1
        self.model.truncate(slot, n)
        del have[n:]
        return [int(t) for t in history[n:]]

    def _pick(self, row: F32, r: DraftRequest) -> tuple[int, tuple[I64, F64] | None, float]:
        return _pick(row, r, self.n_vocab)

    def propose_many(self, reqs: Sequence[DraftRequest]) -> list[Draft]:
        drafts = [Draft(q=None if r.params.greedy else []) for r in reqs]
        # each live request: (index, tokens to feed next)
        live = [(i, self._sync(r.slot, r.history)) for i, r in enumerate(reqs) if r.k > 0]
        live = [(i, feed) for i, feed in live if len(reqs[i].history) + reqs[i].k < self.n_ctx]
        while live:
            entries = [(reqs[i].slot, feed, "last") for i, feed in live]
            rows = self.model.forward_batch(entries)
            self.steps += 1
            nxt = []
            for (i, feed), row in zip(live, rows, strict=True):
                r, d = reqs[i], drafts[i]
                self.cached[r.slot].extend(feed)
                assert row is not None  # logits "last"
                tok, q, prob = self._pick(row, r)
                if prob < self.p_min and d.tokens:  # not sure enough to go on
                    continue
                d.tokens.append(tok)
                if d.q is not None and q is not None:
                    d.q.append(q)
                if len(d.tokens) < r.k:
                    nxt.append((i, [tok]))
            live = nxt
        return drafts

    def rollback(self, slot: int, n: int) -> None:
        if len(self.cached[slot]) > n:
            self.model.truncate(slot, n)
            del self.cached[slot][n:]

    def release(self, slot: int) -> None:
        pass  # the KV stays: a later prompt sharing its prefix reuses it through `_sync`

    def pause(self, paused: bool) -> None:
        pass  # the draft model runs only when a sequence drafts


def _pick(row: F32, r: DraftRequest, n_vocab: int) -> tuple[int, tuple[I64, F64] | None, float]:
    """A drafted token from draft logits `row` [V]: (token, its q or None when one-hot, the
    draft's top probability). The last is what `p_min` is held against (llama.cpp's draft
    loop: the best candidate's p): fixed before the draw, so stopping on it leaves the drafted
    tokens distributed as q, which verification assumes."""
    x = np.asarray(row, dtype=np.float32)[:n_vocab]
    if r.params.greedy:
        tok = int(np.argmax(x))
        z = np.exp(x.astype(np.float64) - float(x[tok]))
        return tok, None, float(1.0 / z.sum())
    ids, prob = distribution(x, r.params)
    tok = draw(ids, prob, r.rng)
    return tok, (ids, prob), float(prob.max())


class MtpDrafter:
    """The target's NextN / MTP layer (see the module doc). Shapes: V = vocabulary size."""

    name = "mtp"

    def __init__(self, model: Any, p_min: float) -> None:
        self.model = model
        model.set_mtp(True)
        self.n_vocab = int(model.n_vocab)
        self.p_min = p_min
        self.steps = 0  # MTP draft steps run
        self.paused = False  # the layer's upkeep switched off (`pause`)

    def propose_many(self, reqs: Sequence[DraftRequest]) -> list[Draft]:
        drafts = []
        for r in reqs:
            d = Draft(q=None if r.params.greedy else [])
            drafts.append(d)
            # the slot must hold the history but its last token, with the layer in step
            if r.k <= 0 or not r.history or self.model.slot_len(r.slot) != len(r.history) - 1:
                continue
            if not self.model.mtp_ready(r.slot):
                continue
            tok = int(r.history[-1])
            for i in range(r.k):
                row = self.model.mtp_draft(r.slot, tok, i == 0)  # [V]
                self.steps += 1
                tok, q, prob = _pick(row, r, self.n_vocab)
                if prob < self.p_min and d.tokens:  # not sure enough to go on
                    break
                d.tokens.append(tok)
                if d.q is not None and q is not None:
                    d.q.append(q)
        return drafts

    def rollback(self, slot: int, n: int) -> None:
        pass  # the target's truncate cuts the layer's state back with its own

    def release(self, slot: int) -> None:
        pass

    def pause(self, paused: bool) -> None:
        """The layer runs over every position the target adds, drafting or not (on a small
        trunk that is a layer's share of each step: 20% of a 4-layer qwen35moe's). Paused, it
        is switched off (its per-slot state freed); resumed, the sequences that ran while it
        was off draft nothing (their slots are behind), new ones draft again."""
        if paused != self.paused:
            self.model.set_mtp(not paused)
            self.paused = paused


def _vocab_tokens(path: str) -> Any:
    from strata.gguf import GGUFFile

    with GGUFFile(path) as g:
        return g.metadata.get("tokenizer.ggml.tokens")


def check_draft(draft_path: str, target_path: str) -> None:
    """ConfigError unless the draft model's vocabulary is the target's (token for token)."""
    if _vocab_tokens(draft_path) != _vocab_tokens(target_path):
        raise ConfigError(
            f"spec_draft_model {draft_path}: its vocabulary differs from the target's"
        )


def _has_mtp(metadata: dict[str, Any]) -> bool:
    return any(k.endswith(".nextn_predict_layers") and v for k, v in metadata.items())


def open_drafter(
    kind: str,
    *,
    target_path: str | None,
    target_metadata: dict[str, Any] | None,
    draft_path: str,
    target_model: Any = None,
    n_slots: int,
    n_ctx: int,
    p_min: float,
    threads: int = 0,
) -> Drafter:
    """The drafter of `kind` ("ngram" | "draft" | "mtp"); ConfigError when it cannot run."""
    if kind == "ngram":
        return NgramDrafter()
    if kind == "mtp":
        if target_metadata is None or not _has_mtp(target_metadata):
            raise ConfigError("spec=mtp: this model carries no MTP layer (nextn_predict_layers)")
        if target_model is None or not getattr(target_model, "has_mtp", False):
            raise ConfigError(
                "spec=mtp: this model's MTP layer does not run here (Strata runs the MTP layer "
                "of qwen35moe, qwen3next and glm4moe files on the CPU path)"
            )
        return MtpDrafter(target_model, p_min)
    if kind != "draft":
        raise ConfigError(f"spec: no drafter {kind!r} (ngram, draft or mtp)")
    if not draft_path:
        raise ConfigError("spec=draft needs spec_draft_model (a GGUF with the same vocabulary)")
    if target_path is None:
        raise ConfigError("spec=draft needs a GGUF target model (not the fake engine)")
    check_draft(draft_path, target_path)
    return ModelDrafter(draft_path, n_slots, n_ctx, p_min, threads)
