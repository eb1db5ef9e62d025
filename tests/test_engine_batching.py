"""The scheduler's continuous batching and prefix reuse over the fake backend (a deterministic
toy model whose greedy output is a function of the token sequence: the oracle is running each
request alone on a fresh scheduler), and the prompt cache's bookkeeping."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np
import pytest
from strata import toytok
from strata.engine.backend import Entry, FakeBackend
from strata.engine.prefix import PromptCache, SlotCache, common_prefix
from strata.engine.protocol import Progress, Submit, Tokens
from strata.engine.scheduler import Scheduler
from strata.sampling import SamplingParams

GREEDY = SamplingParams(temperature=0)
EOG = sorted(toytok.EOG_IDS)


class Recording(FakeBackend):
    """The fake model, recording each step's batch as [(slot, n tokens, logits wanted)]."""

    def __init__(self, **kw: object) -> None:
        super().__init__(**kw)  # type: ignore[arg-type]
        self.batches: list[list[tuple[int, int, str]]] = []

    def forward_batch(self, entries: Sequence[Entry]) -> list[np.ndarray | None]:
        self.batches.append([(s, len(ids), w) for s, ids, w in entries])
        return super().forward_batch(entries)


def run(sched: Scheduler, limit: int = 2000) -> list[Progress | Tokens]:
    out: list[Progress | Tokens] = []
    for _ in range(limit):
        if not sched.has_work():
            return out
        out += sched.step()
    raise AssertionError("scheduler did not finish")


def result(events: list[Progress | Tokens], rid: int) -> tuple[list[int], str | None, int]:
    """(output ids, finish, cached_tokens) of one request."""
    toks = [e for e in events if isinstance(e, Tokens) and e.rid == rid]
    fin = [e for e in toks if e.finish]
    assert len(fin) == 1
    return [t for e in toks for t in e.ids], fin[0].finish, fin[0].cached_tokens


def alone(prompt: list[int], max_tokens: int, params: SamplingParams = GREEDY) -> list[int]:
    sched = Scheduler(FakeBackend(n_ctx_seq=256, max_slots=1), prefill_chunk=7, max_slots=1)
    sched.add(Submit(0, prompt, params, max_tokens, EOG))
    return result(run(sched), 0)[0]


def words(rng: np.random.Generator, n: int) -> list[int]:
    return [int(b) for b in rng.integers(ord("a"), ord("z") + 1, n)]


def test_requests_join_and_leave_each_step_and_match_alone() -> None:
    rng = np.random.default_rng(0)
    be = Recording(n_ctx_seq=256, max_slots=4)
    sched = Scheduler(be, prefill_chunk=7, max_slots=4, max_batch_tokens=12)
    prompts = [words(rng, int(n)) for n in rng.integers(3, 30, 10)]
    params = [GREEDY, SamplingParams(temperature=0.9, seed=5)] * 5
    events: list[Progress | Tokens] = []
    for rid, (p, sp) in enumerate(zip(prompts, params, strict=True)):
        sched.add(Submit(rid, p, sp, 20, EOG))
        events += sched.step()  # one arrives per step: it joins the running batch
    events += run(sched)
    for rid, (p, sp) in enumerate(zip(prompts, params, strict=True)):
        assert result(events, rid)[0] == alone(p, 20, sp), rid
    for batch in be.batches:
        assert sum(n for _, n, _ in batch) <= 12
        assert len({s for s, _, _ in batch}) == len(batch)
    # decodes and prompt chunks of other sequences shared steps
    mixed = [b for b in be.batches if {n for _, n, _ in b} - {1} and sum(n == 1 for _, n, _ in b)]
    assert mixed


def test_max_batch_tokens_below_the_prefill_chunk_is_kept() -> None:
    """A step runs at most max_batch_tokens tokens even where that is less than a prompt
    chunk: the chunks are cut to fit (the value was raised to prefill_chunk, silently)."""
    rng = np.random.default_rng(1)
    be = Recording(n_ctx_seq=256, max_slots=2)
    sched = Scheduler(be, prefill_chunk=16, max_slots=2, max_batch_tokens=5)
    prompts = [words(rng, 23), words(rng, 9)]
    for rid, p in enumerate(prompts):
        sched.add(Submit(rid, p, GREEDY, 6, EOG))
    events = run(sched)
    for rid, p in enumerate(prompts):
        assert result(events, rid)[0] == alone(p, 6, GREEDY), rid
    assert max(sum(n for _, n, _ in b) for b in be.batches) == 5


def test_oldest_prompt_moves_when_decodes_fill_the_batch() -> None:
    be = Recording(n_ctx_seq=256, max_slots=3)
    sched = Scheduler(be, prefill_chunk=1, max_slots=3, max_batch_tokens=1)
    for rid in range(3):
        sched.add(Submit(rid, list(b"abcdef"), GREEDY, 30, EOG))
    events = run(sched)
    assert all(result(events, rid)[0] == list(b"abcdef") for rid in range(3))


def test_slot_with_longest_common_prefix_is_chosen() -> None:
    be = Recording(n_ctx_seq=256, max_slots=2)
    sched = Scheduler(be, prefill_chunk=64, max_slots=2)
    a, b = list(b"alpha alpha alpha"), list(b"bravo bravo bravo")
    sched.add(Submit(1, a, GREEDY, 3, EOG))
    sched.add(Submit(2, b, GREEDY, 3, EOG))
    run(sched)
    slot_b = next(s for s in (0, 1) if sched.slots.tokens[s][: len(b)] == b)
    follow = b + list(b"!? ok")
    sched.add(Submit(3, follow, GREEDY, 10, EOG))
    be.batches.clear()
    ev = run(sched)
    out, _, cached = result(ev, 3)
    assert cached == len(b)  # b's prompt; its outputs differ from "!? ok"
    assert be.batches[0] == [(slot_b, len(follow) - len(b), "last")]
    assert out == alone(follow, 10)


def test_reuse_of_a_whole_conversation_and_the_log_line(caplog: pytest.LogCaptureFixture) -> None:
    sched = Scheduler(FakeBackend(n_ctx_seq=256, max_slots=1), prefill_chunk=5, max_slots=1)
    p1 = list(b"hello there")
    sched.add(Submit(1, p1, GREEDY, 20, EOG))
    out1, fin, cached = result(run(sched), 1)
    assert (fin, cached) == ("stop", 0)
    p2 = p1 + out1 + list(b"more")  # the next turn resends the history
    with caplog.at_level(logging.INFO, logger="strata.engine"):
        sched.add(Submit(2, p2, GREEDY, 20, EOG))
        out2, _, cached = result(run(sched), 2)
    # everything the slot ran: the prompt and every reported output (the stop id is never fed)
    assert cached == len(p1) + len(out1)
    assert out2 == alone(p2, 20)
    want = f"request 2: prompt {len(p2)} tokens: {cached} reused + {len(p2) - cached} read"
    assert any(want in r.getMessage() for r in caplog.records)


def test_identical_prompt_still_runs_its_last_token() -> None:
    sched = Scheduler(FakeBackend(n_ctx_seq=256, max_slots=1), prefill_chunk=64, max_slots=1)
    p = list(b"same prompt")
    for rid in (1, 2):
        sched.add(Submit(rid, p, GREEDY, 1, EOG))
        out, _, cached = result(run(sched), rid)
        assert out == list(b"s")
        assert cached == (0 if rid == 1 else len(p) - 1)


def test_prompt_cache_restores_into_any_slot() -> None:
    be = Recording(n_ctx_seq=512, max_slots=1)
    sched = Scheduler(be, prefill_chunk=64, max_slots=1, prompt_cache_bytes=1 << 20)
    rng = np.random.default_rng(3)
    a, b = words(rng, 40), words(rng, 30)
    for rid, p in ((1, a), (2, b)):
        sched.add(Submit(rid, p, GREEDY, 2, EOG))
        run(sched)
    cache = sched.slots.cache
    assert cache is not None and len(cache) == 1 and cache.saves == 1  # a, saved when b came
    a2 = a + words(rng, 9)
    sched.add(Submit(3, a2, GREEDY, 15, EOG))
    be.batches.clear()
    out, _, cached = result(run(sched), 3)
    # a's slot ran a and its first output (the second was never fed)
    assert cached == common_prefix(a + alone(a, 2)[:1], a2[:-1]) >= len(a)
    assert be.batches[0] == [(0, len(a2) - cached, "last")]
    assert out == alone(a2, 15)
    assert cache.restores == 1


def test_restore_survives_the_save_that_evicts_its_entry() -> None:
    """One slot, a cache with room for one sequence: a, b, then a again. Placing a saves b's
    sequence, which evicts a's entry, the one being restored: a is still restored whole."""
    be = Recording(n_ctx_seq=256, max_slots=1)
    sched = Scheduler(be, prefill_chunk=64, max_slots=1, prompt_cache_bytes=200)
    rng = np.random.default_rng(5)
    a, b = words(rng, 40), words(rng, 40)
    for rid, p in ((1, a), (2, b), (3, a)):
        sched.add(Submit(rid, p, GREEDY, 3, EOG))
        out, finish, cached = result(run(sched), rid)
        assert finish == "length" and out == alone(p, 3), (rid, finish)
    cache = sched.slots.cache
    assert cache is not None and cache.restores == 1 and cached == len(a) - 1
    assert cache.evictions >= 1


def test_prompt_cache_evicts_least_recently_used() -> None:
    c = PromptCache(capacity=300)
    c.put([1, 2, 3], b"x" * 100)
    c.put([4, 5, 6], b"y" * 100)
    c.put([1, 2, 3, 4], b"z" * 120)  # extends the first: it replaces it
    assert len(c) == 2 and c.used == 220
    key, n = c.best([4, 5, 9])
    assert n == 2
    c.take(key)  # [4, 5, 6] is now the most recent
    c.put([7, 8], b"w" * 100)  # over capacity: [1, 2, 3, 4] goes
    assert c.best([1, 2, 3, 4]) == (-1, 0)
    assert c.best([4, 5, 6])[1] == 3 and c.evictions == 1
    c.put([9], b"v" * 301)  # larger than the whole cache: not kept
    assert c.used == 200


def test_slot_cache_without_kv_transfer_keeps_to_slots() -> None:
    be = FakeBackend(n_ctx_seq=64, max_slots=2)
    sc = SlotCache(be, 2, None)
    assert sc.place([5, 6, 7], [0, 1]) == (0, 0)
    be.forward_batch([(0, [5, 6, 7], "last")])
    sc.fed(0, [5, 6, 7])
    assert sc.place([5, 6, 7, 8], [1, 0]) == (0, 3)
    assert sc.place([5, 6], [1]) == (1, 0)


def test_automatic_prompt_cache_reads_the_available_ram() -> None:
    """-1 sizes the cache from MemAvailable (free memory and the droppable page cache), not
    the free pages alone, which a model file read into the page cache leaves few of."""
    from strata.engine.prefix import auto_cache_bytes, available_ram

    with open("/proc/meminfo") as f:
        avail = next(int(x.split()[1]) << 10 for x in f if x.startswith("MemAvailable:"))
    assert abs(available_ram() - avail) < 64 << 20
    assert abs(auto_cache_bytes(-1) - min(avail // 10, 8 << 30)) < 16 << 20
    assert auto_cache_bytes(0) == 0 and auto_cache_bytes(3) == 3 << 20


def test_a_streamed_chunk_is_never_cut_by_the_decodes_beside_it() -> None:
    """The engine's batch limit where the prefill piece is the hybrid mode's streamed chunk:
    the piece plus every slot's decode (or speculative window), so that the oldest prompt's
    chunk runs whole however many sequences decode."""
    from strata.config import Config
    from strata.engine.core import batch_limit

    cfg = Config(parallel=4, prefill_chunk=512, max_batch_tokens=512, spec_max=8)
    assert batch_limit(cfg, 512, True) == 512  # not streamed: the setting
    assert batch_limit(cfg, 4096, False) == 4096 + 4
    assert batch_limit(cfg, 4096, True) == 4096 + 4 * 9
    be = Recording(n_ctx_seq=8192, max_slots=4)
    sched = Scheduler(be, 4096, 4, max_batch_tokens=batch_limit(cfg, 4096, False))
    rng = np.random.default_rng(9)
    for rid in range(3):  # three sequences decoding
        sched.add(Submit(rid, words(rng, 8), GREEDY, 50, EOG))
    for _ in range(3):
        sched.step()
    sched.add(Submit(9, words(rng, 5000), GREEDY, 2, EOG))
    be.batches.clear()
    sched.step()
    assert [n for slot, n, want in be.batches[0] if n > 1] == [4096]
