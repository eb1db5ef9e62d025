"""The server's side of the engine: start/stop/restart the engine process, the FIFO queue into
its slots, per-sequence event streams, cancellation, deadlines and the watchdog.

Runs on the server's asyncio loop. A sequence is queued here (bounded by `max_queue`), sent to
the engine when one of its `parallel` slots is free, and holds that slot until the engine's
finishing `Tokens` arrives (also after an abort, so the slot count is always the engine's).
When the engine dies, or says nothing on a running sequence for `engine_silence_s` (prompt
progress counts), every running sequence fails with `EngineError`, the process is killed and a
new one is started; queued sequences then go to the new engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import os
import socket
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, cast

import msgspec

from strata import placement
from strata._core import physical_cores
from strata.config import Config
from strata.engine.protocol import (
    PROTOCOL_VERSION,
    Abort,
    Failed,
    FrameBuffer,
    FromEngine,
    Loaded,
    Progress,
    ProtocolError,
    Shutdown,
    SlotAction,
    SlotDone,
    SlotVerb,
    Start,
    Stats,
    Submit,
    ToEngine,
    Tokens,
    decode_from_engine,
    encode,
)
from strata.sampling import SamplingParams

State = Literal["stopped", "loading", "ready", "restarting", "failed"]


class EngineError(Exception):
    """The engine failed this sequence (died, went silent, refused it)."""


class QueueFull(Exception):
    def __init__(self, waiting: int) -> None:
        super().__init__(f"server busy: {waiting} requests already waiting")
        self.waiting = waiting


class Unavailable(Exception):
    """The engine is not there (loading failed, shutting down)."""


class DeadlineExceeded(Exception):
    pass


@dataclass(eq=False)
class SeqStream:
    """One sequence: the events the engine sends for it, in order."""

    rid: int
    submit: Submit
    deadline: float | None  # monotonic seconds
    queue: asyncio.Queue[Tokens | Progress | BaseException] = field(default_factory=asyncio.Queue)
    dispatched: bool = False
    cancelled: bool = False
    finished: bool = False
    last_heard: float = 0.0
    t_submit: float = field(default_factory=time.monotonic)
    t_dispatch: float = 0.0
    # wakes a reader waiting past the deadline (armed once, at the first wait: a per-token
    # `wait_for` made a task and a timer for every token)
    timer: asyncio.TimerHandle | None = None

    async def next(self) -> Tokens | Progress:
        """The next event; raises EngineError / DeadlineExceeded."""
        if self.deadline is not None and self.deadline <= time.monotonic():
            raise DeadlineExceeded("request deadline exceeded")
        if not self.queue.empty():  # the common case under load: no waiting
            item = self.queue.get_nowait()
        else:
            if self.deadline is not None and self.timer is None:
                left = self.deadline - time.monotonic()
                self.timer = asyncio.get_running_loop().call_later(left, self._expire)
            item = await self.queue.get()
        if isinstance(item, BaseException) or (isinstance(item, Tokens) and item.finish):
            self.disarm()  # the stream's last event: nothing more to wait for
        if isinstance(item, BaseException):
            raise item
        return item

    def _expire(self) -> None:
        self.queue.put_nowait(DeadlineExceeded("request deadline exceeded"))

    def disarm(self) -> None:
        """No more waiting on this stream's deadline (its last event was read, or its reader
        is gone: `EngineClient.cancel`)."""
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None


class EngineConnection(asyncio.Protocol):
    """The server's end of the engine socket. Frames are decoded in `data_received` and handed
    to the client as they arrive: no reader task between the socket and the sequences' queues
    (one event-loop pass per engine frame instead of three). The first frame (`Loaded` or
    `Failed`) resolves `first`; later ones go to `on_frame` once `attach`ed, in order."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.first: asyncio.Future[FromEngine] = asyncio.get_running_loop().create_future()
        self._frames = FrameBuffer()
        self._early: list[FromEngine] = []  # frames after the first, before `attach`
        self._on_frame: Callable[[FromEngine], None] | None = None
        self._on_lost: Callable[[BaseException], None] | None = None
        self._ended: BaseException | None = None

    def attach(
        self, on_frame: Callable[[FromEngine], None], on_lost: Callable[[BaseException], None]
    ) -> None:
        self._on_frame, self._on_lost = on_frame, on_lost
        early, self._early = self._early, []
        for msg in early:
            on_frame(msg)
        if self._ended is not None:
            on_lost(self._ended)

    def detach(self) -> None:
        """Nothing more reaches the client (the connection is being closed on purpose)."""
        self._on_frame = self._on_lost = None

    def write(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def close(self) -> None:
        self.detach()
        if self.transport is not None:
            self.transport.close()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not `asyncio.Transport` subclasses: no isinstance check
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if self._ended is not None:
            return
        self._frames.feed(data)
        try:
            while (payload := self._frames.take()) is not None:
                msg = decode_from_engine(payload)
                if not self.first.done():
                    self.first.set_result(msg)
                elif self._on_frame is not None:
                    self._on_frame(msg)
                else:
                    self._early.append(msg)
        except ProtocolError as e:
            self._end(e)
            if self.transport is not None:
                self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self._end(exc or EOFError("engine closed its end"))

    def _end(self, exc: BaseException) -> None:
        if self._ended is not None:
            return
        self._ended = exc
        if not self.first.done():
            self.first.set_exception(exc)
        elif self._on_lost is not None:
            self._on_lost(exc)


class EngineClient:
    def __init__(self, config: Config, on_event: Callable[[str], None] | None = None) -> None:
        self.config = config
        self.state: State = "stopped"
        self.error = ""  # why the engine is failed
        self.loaded: Loaded | None = None
        self.stats: Stats | None = None
        self.restarts = 0
        self.draining = False
        self.waiting: deque[SeqStream] = deque()
        self.running: dict[int, SeqStream] = {}
        self._slot_waiters: dict[int, asyncio.Future[SlotDone]] = {}  # rid → its answer
        self._ids = itertools.count(1)
        self._proc: asyncio.subprocess.Process | None = None
        self._conn: EngineConnection | None = None
        self._lost_task: asyncio.Task[None] | None = None
        self._watchdog_task: asyncio.Task[None] | None = None
        self._restart_task: asyncio.Task[None] | None = None
        self._on_event = on_event or (lambda _kind: None)
        self._idle = asyncio.Event()
        self._idle.set()
        # the CPUs the server started with: every engine process gets them back (`--cpus`),
        # also after the server pinned itself (`placement`)
        self._cpus = placement.allowed_cpus()
        # (the engine's stepping thread's CPU, the server's), or None: `pin_server`
        self._pins = placement.pins(config, physical_cores())

    # -- lifecycle ---------------------------------------------------------------------------

    @property
    def slots(self) -> int:
        return self.loaded.max_slots if self.loaded else self.config.parallel

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    async def start(self) -> None:
        """Start the engine and the watchdog; returns once loaded (or failed)."""
        self._watchdog_task = asyncio.create_task(self._watchdog())
        await self._spawn()

    async def _spawn(self) -> None:
        self.state = "loading" if self.restarts == 0 else "restarting"
        self.loaded = None
        self.stats = None  # an engine's figures go with it (/metrics shows none until loaded)
        parent, child = socket.socketpair()
        try:
            self._proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "strata.engine",
                "--fd",
                str(child.fileno()),
                "--cpus",
                ",".join(map(str, self._cpus)),
                *(["--host-cpu", str(self._pins[0])] if self._pins else []),
                pass_fds=(child.fileno(),),
                stdin=asyncio.subprocess.DEVNULL,
            )
        finally:
            child.close()
        if self._pins and self.restarts == 0:
            placement.pin_process(self._pins[1])
        _, conn = await asyncio.get_running_loop().create_unix_connection(
            EngineConnection, sock=parent
        )
        self._conn = conn
        conn.write(encode(Start(PROTOCOL_VERSION, dataclasses.asdict(self.config))))
        try:
            first = await conn.first
        except (EOFError, ProtocolError, OSError) as e:
            await self._fail(f"engine exited while loading ({e})")
            return
        if isinstance(first, Failed):
            await self._fail(first.message)
            return
        if not isinstance(first, Loaded) or first.version != PROTOCOL_VERSION:
            await self._fail(f"engine answered {first!r} to start")
            return
        self.loaded = first
        self.stats = Stats(first.stats, first.info)
        self.state = "ready"
        self._on_event("ready")
        conn.attach(self._on_frame, self._on_lost)
        self._pump()

    async def _fail(self, message: str) -> None:
        self.state = "failed"
        self.error = message
        self.stats = None
        await self._kill()
        while self.waiting:
            self.waiting.popleft().queue.put_nowait(Unavailable(message))
        self._check_idle()

    async def _kill(self) -> None:
        proc, self._proc = self._proc, None
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        if proc is not None and proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(proc.wait(), 10)

    async def close(self) -> None:
        """Stop the engine (after draining, see `drain`)."""
        self.draining = True
        self.state = "stopped"
        for t in (self._watchdog_task, self._restart_task):
            if t is not None:
                t.cancel()
        proc = self._proc
        if proc is not None and proc.returncode is None and self._conn is not None:
            self._conn.detach()  # the engine's exit is expected from here on
            with contextlib.suppress(OSError, RuntimeError):
                self._conn.write(encode(Shutdown()))
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(proc.wait(), 2)  # then killed
        if self._lost_task is not None:
            self._lost_task.cancel()
        await self._kill()
        for s in [*self.waiting, *self.running.values()]:
            s.queue.put_nowait(Unavailable("server shutting down"))
        self.waiting.clear()
        self.running.clear()

    async def drain(self, timeout: float) -> bool:
        """Refuse new work and wait up to `timeout` s for queued and running work to end."""
        self.draining = True
        self._check_idle()
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
            return True
        except asyncio.TimeoutError:
            return False

    def abort_all(self, reason: str) -> None:
        """End every queued and running sequence now with `Unavailable(reason)`."""
        for s in list(self.waiting):
            s.finished = True
            s.queue.put_nowait(Unavailable(reason))
        self.waiting.clear()
        for s in list(self.running.values()):
            if not s.cancelled:
                s.queue.put_nowait(Unavailable(reason))
            s.cancelled = True
            self._send(Abort(s.rid))
        self._check_idle()

    def _check_idle(self) -> None:
        if self.waiting or self.running:
            self._idle.clear()
        else:
            self._idle.set()

    def _lost(self, reason: str) -> None:
        """The engine died or went silent: fail its sequences and start a new one."""
        if self.state != "ready":
            return
        self.stats = None  # the dead engine's gauges are not exported as live
        if self.draining:  # shutting down: fail what is left, start nothing new
            self.state, self.error = "failed", reason
            for s in self.running.values():
                s.finished = True
                s.queue.put_nowait(EngineError(reason))
            self.running.clear()
            self._check_idle()
            self._fail_slot_actions(reason)
            return
        self.state = "restarting"
        self._on_event("restart")
        self._fail_slot_actions(reason)
        for s in self.running.values():
            s.finished = True
            s.queue.put_nowait(EngineError(reason))
        self.running.clear()
        self._check_idle()
        if self._conn is not None:
            self._conn.detach()  # frames after the loss are the old engine's
        if self._lost_task is not None and self._lost_task is not asyncio.current_task():
            self._lost_task.cancel()  # a wait for the old engine's exit code
        self._restart_task = asyncio.create_task(self._restart())

    async def _restart(self) -> None:
        await self._kill()
        self.restarts += 1
        await self._spawn()

    # -- frames ------------------------------------------------------------------------------

    def _send(self, msg: ToEngine) -> None:
        if self._conn is not None:
            self._conn.write(encode(msg))

    def _on_frame(self, msg: FromEngine) -> None:
        if isinstance(msg, (Tokens, Progress)):
            self._deliver(msg)
        elif isinstance(msg, SlotDone):
            fut = self._slot_waiters.pop(msg.rid, None)
            if fut is not None and not fut.done():
                fut.set_result(msg)
        elif isinstance(msg, Stats):
            self.stats = msg
        elif isinstance(msg, Failed):
            self._on_lost(ProtocolError(msg.message))

    def _on_lost(self, e: BaseException) -> None:
        """The connection ended or broke while the engine was running."""
        if self._conn is not None:
            self._conn.detach()
        self._lost_task = asyncio.create_task(self._engine_gone(e))

    async def _engine_gone(self, e: BaseException) -> None:
        proc, code = self._proc, None
        if proc is not None:
            with contextlib.suppress(asyncio.TimeoutError):
                code = await asyncio.wait_for(proc.wait(), 2)
        if proc is not self._proc:  # already replaced (the watchdog's restart)
            return
        why = f"engine process exited (code {code})" if code is not None else str(e)
        self._lost(why)

    def _deliver(self, msg: Tokens | Progress) -> None:
        s = self.running.get(msg.rid)
        if s is None:
            return
        s.last_heard = time.monotonic()
        if isinstance(msg, Tokens) and msg.finish is not None:
            del self.running[msg.rid]
            s.finished = True
            self._pump()
            self._check_idle()
        if not s.cancelled:
            s.queue.put_nowait(msg)

    async def _watchdog(self) -> None:
        silence = self.config.engine_silence_s
        if silence <= 0:
            return
        tick = min(1.0, silence / 4)
        while True:
            await asyncio.sleep(tick)
            if self.state != "ready":
                continue
            now = time.monotonic()
            late = [s for s in self.running.values() if now - s.last_heard > silence]
            if late:
                self._lost(f"engine silent for {silence:g} s on a request; restarting it")

    # -- requests ----------------------------------------------------------------------------

    def check_accepting(self) -> None:
        if self.draining:
            raise Unavailable("server shutting down")
        if self.state == "failed":
            raise Unavailable(self.error or "engine failed")

    def submit(
        self,
        prompts: list[list[int]],
        params: list[SamplingParams],
        max_tokens: list[int],
        stop_ids: list[int],
    ) -> list[SeqStream]:
        """Queue sequences (all or none); raises QueueFull / Unavailable."""
        self.check_accepting()
        free = max(0, self.slots - len(self.running))
        after = len(self.waiting) + len(prompts) - free
        if after > self.config.max_queue:
            raise QueueFull(len(self.waiting))
        timeout = self.config.request_timeout_s
        deadline = time.monotonic() + timeout if timeout > 0 else None
        out = []
        for prompt, p, mt in zip(prompts, params, max_tokens, strict=False):
            rid = next(self._ids)
            s = SeqStream(rid, Submit(rid, prompt, p, mt, stop_ids), deadline)
            self.waiting.append(s)
            out.append(s)
        self._check_idle()
        self._pump()
        return out

    def _pump(self) -> None:
        """Send queued sequences to free engine slots, FIFO."""
        if self.state != "ready":
            return
        while self.waiting and len(self.running) < self.slots:
            s = self.waiting.popleft()
            try:  # encoded before it takes a slot: a frame that cannot be encoded fails alone
                frame = encode(s.submit)
            except (OverflowError, TypeError, ValueError, msgspec.EncodeError) as e:
                s.finished = True
                s.queue.put_nowait(EngineError(f"request cannot be sent to the engine: {e}"))
                continue
            s.dispatched = True
            s.t_dispatch = s.last_heard = time.monotonic()
            self.running[s.rid] = s
            if self._conn is not None:
                self._conn.write(frame)

    async def slot_action(self, slot: int, action: SlotVerb, path: str = "") -> SlotDone:
        """llama-server's slot action, run by the engine once the slot is free; its answer
        (`SlotDone.error` set where it failed). Raises Unavailable / EngineError."""
        self.check_accepting()
        if self.state != "ready":
            raise Unavailable(f"engine {self.state}")
        rid = next(self._ids)
        fut: asyncio.Future[SlotDone] = asyncio.get_running_loop().create_future()
        self._slot_waiters[rid] = fut
        try:
            self._send(SlotAction(rid, slot, action, path))
            return await fut
        finally:
            self._slot_waiters.pop(rid, None)

    def _fail_slot_actions(self, reason: str) -> None:
        for fut in self._slot_waiters.values():
            if not fut.done():
                fut.set_exception(EngineError(reason))
        self._slot_waiters.clear()

    def stop_early(self, s: SeqStream) -> None:
        """The server ends a running sequence itself (a stop string): the engine aborts it,
        and its events up to the finishing one (its acknowledgement, with the sequence's
        figures) are still delivered."""
        if not (s.finished or s.cancelled) and s.rid in self.running:
            self._send(Abort(s.rid))

    def cancel(self, s: SeqStream) -> None:
        """The client is gone: drop a queued sequence, abort a running one."""
        s.disarm()
        if s.finished or s.cancelled:
            return
        s.cancelled = True
        if not s.dispatched:
            with contextlib.suppress(ValueError):
                self.waiting.remove(s)
            self._check_idle()
        elif s.rid in self.running:
            self._send(Abort(s.rid))

    def describe(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "error": self.error,
            "pid": self.pid,
            "restarts": self.restarts,
            "slots": self.slots,
            "running": len(self.running),
            "waiting": len(self.waiting),
            "protocol_version": PROTOCOL_VERSION,
            "server_pid": os.getpid(),
        }
