"""The engine pieces without processes: frames, the scheduler over the fake backend, and the
server's UTF-8-safe detokenizer and stop matcher (oracle: decoding / searching the whole text)."""

from __future__ import annotations

import random
import socket
import threading

import pytest
from strata import toytok
from strata.engine.backend import FakeBackend
from strata.engine.protocol import (
    MAX_FRAME,
    PROTOCOL_VERSION,
    Abort,
    Failed,
    FrameSocket,
    FromEngine,
    Loaded,
    Progress,
    ProtocolError,
    Shutdown,
    Start,
    Submit,
    Tokens,
    decode_from_engine,
    decode_to_engine,
    encode,
    frame_length,
)
from strata.engine.scheduler import Scheduler
from strata.sampling import SamplingParams
from strata.server.tokenizing import ToyTokenizer
from strata.tokenizer import IncrementalDetokenizer, StopMatcher

GREEDY = SamplingParams(temperature=0)
EOG = sorted(toytok.EOG_IDS)


def test_frames_roundtrip_and_limits() -> None:
    msgs = [Start(1, {"n_ctx": 64}), Submit(3, [1, 2], GREEDY, 5, EOG), Abort(3)]
    for m in msgs:
        assert decode_to_engine(encode(m)[4:]) == m
    back = [Loaded(1, 9, 264, 128, 64, 2, {"kind": "fake"}), Tokens(3, [5], [-0.1], [[(5, -0.1)]])]
    for m in back:
        assert decode_from_engine(encode(m)[4:]) == m
    with pytest.raises(ProtocolError):
        decode_to_engine(b"\x81\xa1t\xa4nope")
    with pytest.raises(ProtocolError):
        frame_length((MAX_FRAME + 1).to_bytes(4, "big"))


def test_frame_socket_reassembles_split_frames() -> None:
    a, b = socket.socketpair()
    with a, b:
        fs = FrameSocket(b)
        data = b"".join(encode(Abort(i)) for i in range(50))
        for i in range(0, len(data), 7):  # dribble the bytes
            a.sendall(data[i : i + 7])
        got = []
        while len(got) < 50:
            got += [decode_to_engine(p) for p in fs.recv_ready(1.0)]
        assert got == [Abort(i) for i in range(50)]
        assert fs.recv_ready(0.0) == []
        a.sendall(encode(Abort(7)) + encode(Abort(8)))
        a.close()  # frames sent before the close still arrive, then the end
        assert [decode_to_engine(p) for p in fs.recv_ready(1.0)] == [Abort(7), Abort(8)]
        with pytest.raises(EOFError):
            fs.recv_ready(1.0)


def run(sched: Scheduler, limit: int = 1000) -> list[Progress | Tokens]:
    out: list[Progress | Tokens] = []
    for _ in range(limit):
        if not sched.has_work():
            return out
        out += sched.step()
    raise AssertionError("scheduler did not finish")


def text_of(events: list[Progress | Tokens], rid: int) -> bytes:
    return bytes(t for e in events if isinstance(e, Tokens) and e.rid == rid for t in e.ids)


def finish_of(events: list[Progress | Tokens], rid: int) -> str | None:
    return next(e.finish for e in events if isinstance(e, Tokens) and e.rid == rid and e.finish)


def test_fifo_slots_and_echo() -> None:
    fb = FakeBackend(n_ctx_seq=64, max_slots=1)
    sched = Scheduler(fb, prefill_chunk=4, max_slots=1)
    for rid, word in enumerate([b"first", b"second", b"third"]):
        assert sched.add(Submit(rid, list(word), GREEDY, 50, EOG)) == []
    ev = run(sched)
    firsts = [e.rid for e in ev if isinstance(e, Tokens) and e.ids]
    assert firsts == sorted(firsts)  # one slot: strictly one after another, in order
    assert [text_of(ev, r) for r in range(3)] == [b"first", b"second", b"third"]
    assert [finish_of(ev, r) for r in range(3)] == ["stop"] * 3
    # chunked prefill: "second" (6 tokens, chunk 4) reports one progress
    assert [(e.done, e.total) for e in ev if isinstance(e, Progress) and e.rid == 1] == [(4, 6)]


def test_length_context_and_errors() -> None:
    sched = Scheduler(FakeBackend(n_ctx_seq=10, max_slots=2), prefill_chunk=8, max_slots=2)
    sched.add(Submit(1, list(b"abcdef"), GREEDY, 2, EOG))
    sched.add(Submit(2, list(b"abcdefgh"), GREEDY, 50, EOG))  # 2 positions left
    bad = sched.add(Submit(3, [1, 9999], GREEDY, 5, EOG))
    assert bad[0].finish == "error" and "outside" in bad[0].message  # type: ignore[union-attr]
    too_long = sched.add(Submit(4, list(range(10)), GREEDY, 5, EOG))
    assert too_long[0].finish == "error"  # type: ignore[union-attr]
    ev = run(sched)
    assert (text_of(ev, 1), finish_of(ev, 1)) == (b"ab", "length")
    assert (text_of(ev, 2), finish_of(ev, 2)) == (b"ab", "length")


def test_abort_frees_slot_for_the_next() -> None:
    sched = Scheduler(FakeBackend(n_ctx_seq=256, max_slots=1), prefill_chunk=64, max_slots=1)
    sched.add(Submit(1, list(b"x" * 100), GREEDY, 100, EOG))
    sched.add(Submit(2, list(b"next"), GREEDY, 10, EOG))
    ev = sched.step() + sched.step()
    assert text_of(ev, 1) and not text_of(ev, 2)
    ab = sched.abort(1)
    assert [(e.rid, e.ids, e.finish) for e in ab] == [(1, [], "abort")]  # type: ignore[union-attr]
    assert sched.free_slots == [0]
    ev = run(sched)
    assert text_of(ev, 2) == b"next"
    assert sched.abort(1) == []  # already gone


def test_detokenizer_never_splits_characters() -> None:
    tok = ToyTokenizer()
    rng = random.Random(0)
    text = "aé東🎉 ok ñ → 𝄞 " * 5
    ids = list(text.encode())
    for _ in range(20):
        d = IncrementalDetokenizer(tok, skip_special=True)
        parts, i = [], 0
        while i < len(ids):
            n = rng.randint(1, 5)
            parts.append(d.feed_all(ids[i : i + n]))
            i += n
        parts.append(d.flush())
        assert "".join(parts) == text
        assert all("\ufffd" not in p for p in parts)
    broken = [*b"ab", 0xE6, 0x9D]  # a cut 3-byte character at the end
    d = IncrementalDetokenizer(tok, skip_special=True)
    assert "".join(d.feed(t) for t in broken) + d.flush() == tok.decode(broken)


def test_detokenizer_skips_the_servers_textless_tokens() -> None:
    # the server's tokenizer seam drives the project's one detokenizer: specials (here a long
    # run of them, as a random model's pads would be) add no text, the rest is `decode`'s
    tok = ToyTokenizer()
    eog = min(toytok.EOG_IDS)
    ids = [*b"ab", *([eog] * 500), *"é c".encode(), eog, *b"d"]
    d = IncrementalDetokenizer(tok, skip_special=True)
    assert "".join(d.feed(t) for t in ids) + d.flush() == tok.decode(ids) == "abé cd"


@pytest.mark.parametrize("stops", [["needle"], ["ne", "xx"], ["dle h"], ["zzz"]])
def test_stop_matcher_any_split(stops: list[str]) -> None:
    text = "hay hay needle hay"
    hits = [text.find(s) for s in stops if s in text]
    expect = text[: min(hits)] if hits else text
    rng = random.Random(1)
    for _ in range(30):
        m = StopMatcher(stops)
        out, i = [], 0
        while i < len(text) and not m.stopped:
            n = rng.randint(1, 4)
            out.append(m.feed(text[i : i + n])[0])
            i += n
        out.append(m.flush())
        assert "".join(out) == expect
        assert m.stopped == bool(hits)


def test_toy_tokenizer_specials() -> None:
    tok = ToyTokenizer()
    t = tok.apply_chat_template(
        [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    )
    assert tok.encode(t, True) == [257, 115, 260, 258, 117, 260, 259]
    assert tok.encode("<|user|>", False) == list(b"<|user|>")  # user text stays text


def _engine_thread() -> tuple[socket.socket, threading.Thread, list[int]]:
    from strata.engine.core import serve

    a, b = socket.socketpair()
    rc: list[int] = []
    t = threading.Thread(target=lambda: rc.append(serve(b)), daemon=True)
    t.start()
    return a, t, rc


def _recv(fs: FrameSocket, n: int = 1) -> list[object]:
    out: list[object] = []
    for _ in range(200):
        out += [decode_from_engine(p) for p in fs.recv_ready(0.1)]
        if len(out) >= n:
            return out
    raise AssertionError(f"engine sent {out}")


def test_engine_loop_in_a_thread() -> None:
    from dataclasses import asdict

    from strata.config import Config

    a, t, rc = _engine_thread()
    fs = FrameSocket(a)
    cfg = asdict(Config.load({"engine": "fake", "parallel": 2, "n_ctx": 64}, env={}))
    fs.send(Start(PROTOCOL_VERSION, cfg))
    loaded = _recv(fs)[0]
    assert isinstance(loaded, Loaded) and loaded.max_slots == 2 and loaded.n_ctx_seq == 32
    fs.send(Submit(1, list(b"pong"), GREEDY, 10, EOG))
    got: list[object] = []
    while not any(isinstance(m, Tokens) and m.finish for m in got):
        got += _recv(fs)
    assert bytes(i for m in got if isinstance(m, Tokens) for i in m.ids) == b"pong"
    fs.send(Shutdown())
    t.join(5)
    assert rc == [0]
    a.close()


def test_engine_refuses_other_protocol_version() -> None:
    a, t, rc = _engine_thread()
    fs = FrameSocket(a)
    fs.send(Start(PROTOCOL_VERSION + 1, {}))
    failed = _recv(fs)[0]
    assert isinstance(failed, Failed) and "protocol version" in failed.message
    t.join(5)
    assert rc == [1]
    a.close()


def test_seq_stream_deadline_wakes_a_waiting_reader_once_armed() -> None:
    """A stream's deadline: events queued before it are returned; a reader waiting past it
    gets DeadlineExceeded from the stream's one timer (armed at the first wait, not per
    event), and reading the stream's last event cancels that timer."""
    import asyncio
    import time

    from strata.engine.client import DeadlineExceeded, SeqStream
    from strata.sampling import SamplingParams

    async def main() -> None:
        sub = Submit(1, [1, 2], SamplingParams(), 4, [])
        s = SeqStream(1, sub, time.monotonic() + 0.2)
        s.queue.put_nowait(Tokens(1, [5]))
        assert (await s.next()).ids == [5]
        assert s.timer is None  # nothing waited yet
        t0 = time.monotonic()
        waiting = asyncio.ensure_future(s.next())
        await asyncio.sleep(0.01)
        timer = s.timer  # armed by the wait
        with pytest.raises(DeadlineExceeded):
            await waiting
        # not before it (asyncio may run a timer up to its clock resolution early)
        assert s.deadline is not None and time.monotonic() >= s.deadline - 0.01
        assert time.monotonic() - t0 < 30.0  # (a watchdog bound: the wake came)
        # a finished stream: its timer is cancelled and its events are read as they came
        f = SeqStream(2, sub, time.monotonic() + 30)
        reader = asyncio.ensure_future(f.next())
        await asyncio.sleep(0.01)
        assert f.timer is not None
        armed = f.timer
        f.queue.put_nowait(Tokens(2, [7], finish="length"))
        assert (await reader).ids == [7]  # its last event: reading it cancels the timer
        assert armed.cancelled() and f.timer is None
        assert timer is not None

    asyncio.run(main())


def test_engine_connection_splits_frames_and_keeps_their_order() -> None:
    """The server's end of the engine socket (`EngineConnection`): frames cut anywhere across
    reads, or several in one read, come out whole and in order; the first resolves `first`,
    those before `attach` are handed over at it; an oversized frame ends the connection with
    ProtocolError (oracle: the frames as encoded)."""
    import asyncio

    from strata.engine.client import EngineConnection

    class Transport:
        closed = False

        def is_closing(self) -> bool:
            return self.closed

        def close(self) -> None:
            self.closed = True

    frames: list[FromEngine] = [Loaded(PROTOCOL_VERSION, 7, 100, 128, 64, 2, {}, [])]
    frames += [Tokens(i % 3, [i, i + 1], finish="stop" if i % 5 == 4 else None) for i in range(40)]
    frames += [Progress(2, 17, 30), Failed("boom")]
    wire = b"".join(encode(f) for f in frames)

    async def main() -> None:
        rng = random.Random(3)
        for attach_at in (0, 1, 10, len(wire)):
            conn = EngineConnection()
            conn.connection_made(Transport())  # type: ignore[arg-type]
            got: list[object] = []
            lost: list[BaseException] = []
            i = 0
            while i < len(wire):
                if i >= attach_at and not got and conn.first.done():
                    conn.attach(got.append, lost.append)
                n = rng.choice([1, 2, 3, 7, 50, 400])
                conn.data_received(wire[i : i + n])
                i += n
            if attach_at == len(wire):
                conn.attach(got.append, lost.append)
            assert conn.first.result() == frames[0]
            assert got == frames[1:]
            assert lost == []
            conn.connection_lost(None)
            assert len(lost) == 1 and isinstance(lost[0], EOFError)
        # an oversized frame: the connection ends (once) with ProtocolError and is closed
        bad = EngineConnection()
        t = Transport()
        bad.connection_made(t)  # type: ignore[arg-type]
        bad.data_received(encode(frames[0]))
        seen: list[BaseException] = []
        bad.attach(lambda _m: None, seen.append)
        bad.data_received((MAX_FRAME + 1).to_bytes(4, "big") + b"x")
        bad.connection_lost(None)
        assert len(seen) == 1 and isinstance(seen[0], ProtocolError) and t.closed
        # the engine gone before its first frame: `first` carries the error
        early = EngineConnection()
        early.connection_made(Transport())  # type: ignore[arg-type]
        early.connection_lost(None)
        with pytest.raises(EOFError):
            await early.first

    asyncio.run(main())


def test_a_request_whose_sampling_raises_ends_alone() -> None:
    """Sampling that raises (a bug, or a processor's error) ends that request with the error
    and drops its KV; the scheduler and the other requests go on (the engine process used to
    exit, failing every request it held)."""

    def boom(logits: object) -> object:
        raise ValueError("boom")

    sched = Scheduler(FakeBackend(n_ctx_seq=64, max_slots=3), prefill_chunk=4, max_slots=3)
    for rid, word in enumerate([b"alpha", b"beta", b"gamma"]):
        sched.add(Submit(rid, list(word), GREEDY, 50, EOG))
    sched.waiting[2].sampler.sample = boom  # type: ignore[method-assign]  # its first token
    ev = sched.step() + sched.step()  # the prompts read, first tokens out
    (s1,) = [s for s in sched.running.values() if s.req.rid == 1]
    s1.sampler.sample = boom  # type: ignore[method-assign]  # a later token
    ev += run(sched)
    assert (text_of(ev, 0), finish_of(ev, 0)) == (b"alpha", "stop")
    for rid in (1, 2):
        (end,) = [e for e in ev if isinstance(e, Tokens) and e.rid == rid and e.finish]
        assert end.finish == "error" and end.message == "sampling failed: ValueError: boom"
    assert not sched.running and len(sched.free_slots) == 3
