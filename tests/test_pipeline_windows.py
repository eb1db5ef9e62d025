"""Pipelined windows in the scheduler (`pipeline_windows` 2; docs/PROTOCOL.md): window K+1 is
drafted on the guess that K is accepted whole and launched before K's verdict; it goes on
when the guess held and is discarded otherwise. Here over the fake engine's emulation of the
GPU path's launch / finish / settle calls (the device suite runs the real ones:
tests/test_gpu_pipeline.py); greedy output must equal the serial loop's, also when guesses are
forced wrong."""

from __future__ import annotations

import numpy as np
import pytest
from strata import toytok
from strata.engine.backend import FakeBackend
from strata.engine.protocol import Submit, Tokens
from strata.engine.scheduler import Scheduler
from strata.sampling import SamplingParams
from strata.spec import Speculator
from strata.spec.drafters import NgramDrafter
from test_spec import GREEDY, outputs, run

EOG = sorted(toytok.EOG_IDS)


def prompts() -> list[list[int]]:
    rng = np.random.default_rng(1)
    text = b"abc abd abc abe " * 3
    return [list(text) + [int(t) for t in rng.integers(97, 123, n)] for n in (3, 9, 20, 40)]


def sched_for(pipeline: int, spec: bool, force_miss: int = 0) -> tuple[Scheduler, FakeBackend]:
    be = FakeBackend(n_ctx_seq=512, max_slots=4, pipeline_windows=pipeline)
    sp = Speculator(NgramDrafter(), 1, 6, adaptive=False) if spec else None
    sched = Scheduler(
        be, prefill_chunk=16, max_slots=4, max_batch_tokens=64, speculator=sp,
        force_miss=force_miss,
    )  # fmt: skip
    return sched, be


def fake_run(
    pipeline: int, spec: bool, ps: list[list[int]], max_tokens: int, force_miss: int = 0
) -> tuple[list[tuple[list[int], str | None]], Scheduler]:
    sched, _ = sched_for(pipeline, spec, force_miss)
    for rid, p in enumerate(ps):
        sched.add(Submit(rid, p, GREEDY, max_tokens, EOG))
    return outputs(run(sched), len(ps)), sched


@pytest.mark.parametrize("force_miss", [0, 2, 3])
def test_pipelined_greedy_equals_the_serial_loop(force_miss: int) -> None:
    ps = prompts()
    for max_tokens in (1, 5, 100):
        want, _ = fake_run(1, False, ps, max_tokens)
        got, sched = fake_run(2, True, ps, max_tokens, force_miss)
        assert got == want, (max_tokens, force_miss)
        if max_tokens == 100:
            assert sched.pipelined and sched.pipe_windows > 0
            assert sched.pipe_held > 0  # guesses held: windows ran back to back
            if force_miss:
                assert sched.pipe_held < sched.pipe_windows  # and the wrong ones were dropped
            stats = {s.name: s.value for s in sched.stats()}
            assert stats["pipeline_windows_total"] == sched.pipe_windows
            assert sched.info()["pipeline"]["guesses_held"] == sched.pipe_held


def test_one_sequence_runs_windows_back_to_back() -> None:
    ps = prompts()[:1]
    want, _ = fake_run(1, False, ps, 60)
    got, sched = fake_run(2, True, ps, 60, force_miss=2)
    assert got == want
    assert sched.pipe_held > 0 and sched.pipe_held < sched.pipe_windows


def test_sampled_requests_and_an_abort_in_flight() -> None:
    """Sampling (no equality: the draws differ from the serial loop's) and a request aborted
    while its window is in flight: every other request ends normally, nothing is left in
    flight."""
    sched, be = sched_for(2, True, force_miss=3)
    ps = prompts()
    params = SamplingParams(temperature=0.8, seed=7)
    for rid, p in enumerate(ps):
        sched.add(Submit(rid, p, params, 80, EOG))
    events: list[Tokens] = []
    aborted = -1
    for _ in range(5000):
        if not sched.has_work():
            break
        events += [e for e in sched.step() if isinstance(e, Tokens)]
        w = sched._inflight
        if aborted < 0 and w is not None and sched.steps > 10:
            aborted = w.seqs[0].req.rid  # its window is in flight
            events += [e for e in sched.abort(aborted) if isinstance(e, Tokens)]
    assert aborted >= 0 and not sched.has_work() and not be._flights
    ends = {e.rid: e.finish for e in events if e.finish}
    assert ends[aborted] == "abort"
    assert all(ends[r] in ("stop", "length") for r in range(4) if r != aborted), ends


def test_a_slot_in_flight_cannot_be_cut() -> None:
    be = FakeBackend(n_ctx_seq=64, max_slots=2, pipeline_windows=2)
    be.forward_batch([(0, [1, 2, 3], "last")])
    be.launch_batch([(0, [4], "last")])
    with pytest.raises(ValueError, match="in flight"):
        be.truncate(0, 1)
    be.launch_batch([(0, [5, 6], "window")])
    with pytest.raises(ValueError, match="windows in flight"):
        be.launch_batch([(1, [7], "last")])
    assert be.finish_batch() is not None
    be.settle(False)  # the second window is discarded: slot 0 as the first left it
    assert be._tokens[0] == [1, 2, 3, 4] and not be._flights
    be.truncate(0, 1)


class WrongDrafter(NgramDrafter):
    """Proposes the n-gram drafter's tokens shifted by one id: never what the model emits."""

    def propose_many(self, reqs):  # type: ignore[no-untyped-def]
        out = super().propose_many(reqs)
        for d, r in zip(out, reqs, strict=True):
            d.tokens = [(t + 1) % toytok.N_VOCAB for t in d.tokens] or [0]
            del r
        return out


class VirtualClock:
    """Time that moves only when a fake step sleeps."""

    def __init__(self) -> None:
        self.t = 0.0

    def now(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += s


def test_guesses_stop_where_they_cost_time() -> None:
    """Whether to run pipelined is measured against serial steps: with a drafter whose
    guesses never hold, on an engine whose steps take time (each window a forward of 2 ms),
    the blocks that guess are slower per emitted token, so after the first one the steps run
    serially (one forward_batch, no launch) and guesses come only in the exploring blocks,
    rarer as the serial arm keeps winning."""
    clock = VirtualClock()  # the steps' 2 ms pass on it alone: no host's load in the costs
    be = FakeBackend(
        n_ctx_seq=2048, max_slots=4, pipeline_windows=2, step_ms=2.0, sleep=clock.sleep
    )
    sp = Speculator(WrongDrafter(), 1, 4, adaptive=False)
    sched = Scheduler(
        be, prefill_chunk=16, max_slots=4, max_batch_tokens=64, speculator=sp, clock=clock.now
    )
    text = list(b"abcdefghijklmnopqrstuvwxyz " * 20)
    serial = Scheduler(
        FakeBackend(n_ctx_seq=2048, max_slots=4), 16, max_slots=4, max_batch_tokens=64
    )
    serial.add(Submit(0, text, GREEDY, 600, EOG))
    want = outputs(run(serial), 1)
    sched.add(Submit(0, text, GREEDY, 600, EOG))
    assert outputs(run(sched), 1) == want  # the serial arm's steps are the serial loop's
    assert sched.pipe_held == 0 and sched.steps > 500, sched.steps
    # the first block of 32 guessing steps; serial blocks after it but for the exploring ones
    # (after 8 blocks, then 16): at most 3 guessing blocks in this run
    assert 32 <= sched.pipe_windows <= 3 * 32 + 1, (sched.pipe_windows, sched.steps)
    assert sched.guesses <= sched.pipe_windows


class Refusing(FakeBackend):
    """Refuses every pipelined launch (as the GPU path refuses a window larger than a step)."""

    def launch_batch(self, entries):  # type: ignore[no-untyped-def]
        raise ValueError("a pipelined window is one step")


def test_a_refused_window_runs_as_a_serial_step() -> None:
    be = Refusing(n_ctx_seq=512, max_slots=4, pipeline_windows=2)
    sp = Speculator(NgramDrafter(), 1, 6, adaptive=False)
    sched = Scheduler(be, prefill_chunk=16, max_slots=4, max_batch_tokens=64, speculator=sp)
    ps = prompts()
    for rid, p in enumerate(ps):
        sched.add(Submit(rid, p, GREEDY, 40, EOG))
    want, _ = fake_run(1, False, ps, 40)
    assert outputs(run(sched), len(ps)) == want
    assert sched.pipe_windows == 0


@pytest.mark.parametrize(("guess_cost", "guesses_win"), [(0.97, False), (0.8, True)])
def test_guess_policy_switches_only_past_the_margin(guess_cost: float, guesses_win: bool) -> None:
    """The guess policy over synthetic block costs (seconds per emitted token, serial 1.0):
    guessing within GUESS_MARGIN of the serial steps leaves the serial arm in place, its
    blocks only the exploring ones, rarer each time; clearly cheaper guessing takes over."""
    from strata.engine.scheduler import GUESS_BLOCK, GUESS_MARGIN

    assert 1 - GUESS_MARGIN < 0.97
    sched, _ = sched_for(2, True)
    arms = []
    for _ in range(400):  # blocks
        arm = sched._guess_pays()
        arms.append(arm)
        for _ in range(GUESS_BLOCK):
            sched._account(guess_cost if arm else 1.0, 1)
    later = arms[200:]
    if guesses_win:
        assert sched._best and sum(later) >= len(later) - 2, sum(later)
    else:
        assert not sched._best
        # blocks 0 (guess) and the explorations after 8, 16, 32, 64, 128, 256 blocks
        assert sum(arms) <= 8 and sum(later) <= 1, [i for i, a in enumerate(arms) if a]


@pytest.mark.parametrize(("guess_cost", "guesses_win"), [(1.05, False), (0.85, True)])
def test_guess_policy_holds_its_choice_while_the_text_drifts(
    guess_cost: float, guesses_win: bool
) -> None:
    """Block costs that follow the text (a slow swing of ±40% over tens of blocks, as easy
    and hard stretches of a document alternate) as much as the arm: the arm that is dearer
    everywhere runs only in the exploring blocks, each judged against the incumbent's blocks
    beside it, not against an average taken on other text."""
    import math

    from strata.engine.scheduler import GUESS_BLOCK

    sched, _ = sched_for(2, True)
    arms = []
    for blk in range(600):
        text = 1 + 0.3 * math.sin(blk / 7) + 0.1 * math.sin(blk / 2.3)
        arm = sched._guess_pays()
        arms.append(arm)
        for _ in range(GUESS_BLOCK):
            sched._account(text * (guess_cost if arm else 1.0), 1)
    later = arms[100:]
    if guesses_win:
        assert sched._best and sum(later) >= len(later) - 8, len(later) - sum(later)
    else:
        assert not sched._best and sum(arms) <= 10, [i for i, a in enumerate(arms) if a]


def test_a_sampling_failure_in_a_window_whose_settle_fails_leaves_nothing_behind() -> None:
    """A request's sampling raises in the step where the backend's settle fails too: every
    request of the window ends with the error, and no sampling failure is left for the slot's
    next request (it ran into the old error)."""
    from strata.engine.protocol import Submit, Tokens
    from test_spec import GREEDY, run

    def boom(logits: object) -> object:
        raise ValueError("boom")

    ps = prompts()
    sched, be = sched_for(2, True, force_miss=0)
    sched.add(Submit(0, ps[3], GREEDY, 100, EOG))
    for _ in range(500):
        if sched._inflight is not None:
            break
        sched.step()
    (victim,) = list(sched.running.values())
    victim.sampler.sample = boom  # type: ignore[method-assign]
    settle = be.settle

    def failing(accepted: bool) -> None:
        be.settle = settle  # type: ignore[method-assign]
        settle(accepted)
        raise RuntimeError("device lost")

    be.settle = failing  # type: ignore[method-assign]
    ends = [e for e in sched.step() if isinstance(e, Tokens) and e.finish]
    assert [(e.rid, e.finish) for e in ends] == [(0, "error")]
    # (failures are a step's own: none is kept on the scheduler for the slot's next request)
    sched.add(Submit(9, ps[1], GREEDY, 20, EOG))
    (end,) = [e for e in run(sched) if isinstance(e, Tokens) and e.finish]
    assert end.rid == 9 and end.finish != "error"
