"""Prefix reuse: what each slot's KV holds, where a new prompt goes, and the host-RAM prompt cache.

A new prompt is placed in the free slot whose cached tokens share the longest prefix with it
(ties: the least recently used slot); only the rest is prefilled. With a prompt cache, the KV of
a slot's sequence is kept in RAM (in the KV type, as `kv_export` gives it) when a new prompt is
about to overwrite it, and restored by longest prefix into the chosen slot when that beats what
the free slots hold; entries are evicted least recently used first. At least the prompt's last
token is always run (its logits pick the first output token), as llama-server does.
"""

from __future__ import annotations

import logging
import os
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

I32 = npt.NDArray[np.int32]
log = logging.getLogger("strata.engine")

# A slot's sequence is saved to the prompt cache when a new prompt would drop at least this
# many of its tokens (shorter tails are cheaper to prefill again than to keep).
MIN_SAVE_TOKENS = 16
AUTO_CACHE_MAX_MIB = 8192


class KvBackend(Protocol):
    def truncate(self, slot: int, n: int) -> None: ...

    def free(self, slot: int) -> None: ...


class KvTransfer(Protocol):
    def kv_export(self, slot: int, n: int) -> bytes: ...

    def kv_import(self, slot: int, data: bytes) -> int: ...


def common_prefix(a: Sequence[int] | I32, b: Sequence[int] | I32) -> int:
    """Length of the longest common prefix of two token sequences."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    x = np.asarray(a[:n], dtype=np.int64)
    y = np.asarray(b[:n], dtype=np.int64)
    diff = np.flatnonzero(x != y)
    return int(diff[0]) if diff.size else n


def auto_cache_bytes(mib: int) -> int:
    """`prompt_cache_mib` in bytes: -1 is a tenth of the available RAM (at most 8 GiB)."""
    if mib >= 0:
        return mib << 20
    return min(available_ram() // 10, AUTO_CACHE_MAX_MIB << 20)


def available_ram() -> int:
    """Bytes of RAM available to new allocations: /proc/meminfo's MemAvailable (free memory
    plus the page cache the kernel can drop, which a filled model file mostly is), else the
    free pages (SC_AVPHYS_PAGES, which counts the page cache as used)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) << 10
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return 0


def reuse_chunks(
    cached: Sequence[int], prompt: Sequence[int], n_past: int, min_len: int
) -> list[tuple[int, int]]:
    """The chunks (cached position, length) that llama-server's `--cache-reuse` moves: from
    the common prefix `n_past` on, a run of at least `min_len` tokens of `cached` equal to
    the prompt's next tokens is taken and both go on after it; else the cache skips a
    token. Their lengths add up to the prompt positions they fill after `n_past`."""
    chunks: list[tuple[int, int]] = []
    head_c = head_p = n_past
    while head_c < len(cached) and head_p < len(prompt):
        n = 0
        while (
            head_c + n < len(cached)
            and head_p + n < len(prompt)
            and cached[head_c + n] == prompt[head_p + n]
        ):
            n += 1
        if n >= min_len:
            chunks.append((head_c, n))
            head_c += n
            head_p += n
        else:
            head_c += 1
    return chunks


@dataclass(slots=True)
class Entry:
    tokens: I32  # [n] the sequence whose KV `data` holds
    data: bytes  # kv_export of its n positions


class PromptCache:
    """Host-RAM KV of past sequences, LRU-evicted to stay under `capacity` bytes."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.used = 0
        self._entries: OrderedDict[int, Entry] = OrderedDict()  # oldest first
        self._next = 0
        self.saves = 0
        self.restores = 0
        self.restored_tokens = 0
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._entries)

    def best(self, prompt: Sequence[int]) -> tuple[int, int]:
        """(entry key, common prefix length) of the entry sharing the longest prefix with
        `prompt`; (-1, 0) when none shares any."""
        key, best = -1, 0
        for k, e in self._entries.items():
            n = common_prefix(e.tokens, prompt)
            if n > best:
                key, best = k, n
        return key, best

    def covers(self, tokens: Sequence[int]) -> bool:
        """True when an entry already holds `tokens` as a prefix of its own."""
        n = len(tokens)
        return any(
            len(e.tokens) >= n and common_prefix(e.tokens, tokens) == n
            for e in self._entries.values()
        )

    def put(self, tokens: Sequence[int], data: bytes) -> None:
        """Keep a sequence's KV; entries it extends are dropped, the oldest go when full."""
        if len(data) > self.capacity:
            return
        arr = np.asarray(tokens, dtype=np.int32)
        for k in [
            k
            for k, e in self._entries.items()
            if len(e.tokens) <= len(arr) and common_prefix(e.tokens, arr) == len(e.tokens)
        ]:
            self._drop(k)
        while self.used + len(data) > self.capacity and self._entries:
            self._drop(next(iter(self._entries)))
            self.evictions += 1
        self._entries[self._next] = Entry(arr, data)
        self._next += 1
        self.used += len(data)
        self.saves += 1

    def take(self, key: int) -> Entry:
        """The entry, marked most recently used."""
        self._entries.move_to_end(key)
        return self._entries[key]

    def _drop(self, key: int) -> None:
        self.used -= len(self._entries.pop(key).data)


class SlotCache:
    """The tokens each slot's KV holds, and the placement of new prompts (see the module doc)."""

    def __init__(
        self,
        backend: KvBackend,
        n_slots: int,
        cache: PromptCache | None,
        reuse: bool = True,
        chunk_reuse: int = 0,
    ) -> None:
        self.backend = backend
        self.cache = cache
        self.reuse = reuse  # False: every prompt starts at position 0
        # --cache-reuse: the shortest chunk moved down by KV shifting (0: off)
        shift = getattr(backend, "kv_shift", None)
        recurrent = bool(getattr(backend, "recurrent", False))
        self.chunk_reuse = chunk_reuse if shift is not None and not recurrent else 0
        if chunk_reuse > 0 and not self.chunk_reuse:  # as llama-server: on, where it can be
            log.warning("cache_reuse is off: this model's slots cannot move their KV")
        self.shifted_tokens = 0  # positions moved instead of run again
        self.tokens: list[list[int]] = [[] for _ in range(n_slots)]  # per slot, in KV order
        self._used = [0] * n_slots  # last placement per slot (LRU on ties)
        self._clock = 0

    def place(
        self, prompt: Sequence[int], free: Sequence[int], reuse: bool = True
    ) -> tuple[int, int]:
        """Choose a free slot for `prompt` and set its KV to the longest reusable prefix
        (none when `reuse` is False: the request's own `cache_prompt`); returns (slot,
        positions reused)."""
        # the last prompt token always runs
        limit = list(prompt[: len(prompt) - 1]) if self.reuse and reuse else []
        recurrent = bool(getattr(self.backend, "recurrent", False))
        slot, reused = max(
            ((s, self._reusable(s, limit, recurrent)) for s in free),
            key=lambda sr: (sr[1], -self._used[sr[0]]),
        )
        try:
            reused = self._set(slot, limit, reused)
        except Exception:
            self.lost(slot)  # what the slot holds is unknown now
            raise
        self._clock += 1
        self._used[slot] = self._clock
        return slot, reused

    def _reusable(self, slot: int, limit: list[int], recurrent: bool) -> int:
        """Positions of the slot a prompt limited to `limit` can keep: the common prefix, or,
        where the slot keeps a recurrent state (which cannot be cut back, only restored), its
        whole sequence when that is a prefix of the prompt, else its last checkpoint within
        the common prefix (`checkpoints`), else none."""
        n = common_prefix(self.tokens[slot], limit)
        if recurrent and n < len(self.tokens[slot]):
            marks = getattr(self.backend, "checkpoints", None)
            return max((p for p in (marks(slot) if marks else []) if p <= n), default=0)
        return n

    def _set(self, slot: int, limit: list[int], reused: int) -> int:
        """Sets the slot's KV to the longest prefix of `limit` it or the cache holds."""
        key, hit = self.cache.best(limit) if self.cache is not None else (-1, 0)
        if hit > reused:
            assert self.cache is not None
            # taken before the slot's own sequence is saved: that save may evict it
            entry = self.cache.take(key)
            self._save(slot, 0)
            n = self._import(slot, entry.data)
            self.tokens[slot] = [int(t) for t in entry.tokens[:n]]
            self.cache.restores += 1
            self.cache.restored_tokens += hit
            reused = self._shift(slot, limit, min(hit, n))
        else:
            self._save(slot, reused)
            reused = self._shift(slot, limit, reused)
        self.backend.truncate(slot, reused)
        del self.tokens[slot][reused:]
        return reused

    def _shift(self, slot: int, limit: list[int], n_past: int) -> int:
        """llama-server's cache reuse: after the common prefix, each run of at least
        `chunk_reuse` tokens the slot holds further on that the prompt has next is moved down
        to its place (the positions between are dropped); returns the positions reused."""
        if self.chunk_reuse <= 0:
            return n_past
        chunks = reuse_chunks(self.tokens[slot], limit, n_past, self.chunk_reuse)
        if not chunks:
            return n_past
        try:
            n = int(self.backend.kv_shift(slot, n_past, chunks))  # type: ignore[attr-defined]
        except Exception as e:  # refused before the import: the slot is as it was
            log.warning("cache reuse skipped: %s", e)
            return n_past
        self.tokens[slot] = list(limit[:n])
        self.shifted_tokens += n - n_past
        return n

    def export(self, slot: int) -> bytes:
        """The backend's KV export of the slot's sequence (empty for an empty slot)."""
        fn = getattr(self.backend, "kv_export", None)
        if fn is None:
            raise RuntimeError("the backend cannot export KV")
        toks = self.tokens[slot]
        data: bytes = fn(slot, len(toks)) if toks else b""
        return data

    def _import(self, slot: int, data: bytes) -> int:
        fn = getattr(self.backend, "kv_import", None)
        if fn is None:
            raise RuntimeError("the backend cannot import KV")
        return int(fn(slot, data))

    def _save(self, slot: int, keep: int) -> None:
        """Keep the slot's sequence in the prompt cache when `keep` positions of it stay and
        enough of the rest would be lost."""
        toks = self.tokens[slot]
        export = getattr(self.backend, "kv_export", None)
        if self.cache is None or export is None or len(toks) - keep < MIN_SAVE_TOKENS:
            return
        if self.cache.covers(toks):
            return
        self.cache.put(toks, export(slot, len(toks)))

    def restore(self, slot: int, tokens: Sequence[int], data: bytes) -> int:
        """The slot's KV set to `data` (a `kv_export` of `tokens`), its own sequence kept in
        the prompt cache first; returns the positions restored. ValueError where the backend
        refuses the data (the slot is then empty)."""
        self._save(slot, 0)
        if not tokens:
            self.lost(slot)
            return 0
        try:
            n = self._import(slot, data)
        except Exception as e:  # the backend's own types: the slot's KV is unknown now
            self.lost(slot)
            raise ValueError(f"the KV does not fit this model's slots: {e}") from e
        self.tokens[slot] = [int(t) for t in tokens[:n]]
        return n

    def fed(self, slot: int, ids: Sequence[int]) -> None:
        """The model ran `ids` at the slot's next positions."""
        self.tokens[slot].extend(int(t) for t in ids)

    def lost(self, slot: int) -> None:
        """The slot's KV is unknown (a failed step): empty it."""
        self.tokens[slot] = []
        self.backend.free(slot)
