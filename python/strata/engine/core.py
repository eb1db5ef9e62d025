"""The engine process: receive requests, step the scheduler, run the model, emit tokens.

Started by the server as `python -m strata.engine --fd N` with one end of a socketpair on fd N.
The first frame is `Start` (protocol version + the server's Config); the engine loads its
backend, answers `Loaded` (or `Failed`), then loops: read whatever frames arrived (blocking
only when idle), run one scheduler step, send its events. It exits on `Shutdown` or when the
server's end closes.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import time
from typing import Any

from strata.config import Config
from strata.constraints import Constraints
from strata.engine.backend import Backend, make_backend
from strata.engine.prefix import auto_cache_bytes
from strata.engine.protocol import (
    PROTOCOL_VERSION,
    Abort,
    Failed,
    FrameSocket,
    FromEngine,
    Loaded,
    ProtocolError,
    Shutdown,
    SlotAction,
    SlotDone,
    Start,
    Stats,
    Submit,
    Tokens,
    decode_to_engine,
)
from strata.engine.scheduler import Scheduler
from strata.reasoning_budget import processor_factory
from strata.spec import Speculator, make_speculator

STATS_INTERVAL_S = 1.0


def _load(conn: FrameSocket) -> tuple[Config, Backend, Speculator | None] | None:
    frames = conn.recv_ready(None)
    first = decode_to_engine(frames[0])
    if not isinstance(first, Start):
        conn.send(Failed(f"expected a start frame, got {type(first).__name__}"))
        return None
    if first.version != PROTOCOL_VERSION:
        conn.send(Failed(f"protocol version {first.version} != engine's {PROTOCOL_VERSION}"))
        return None
    try:
        config = Config(**first.config)
        backend = make_backend(config)
        spec = make_speculator(config, backend)
    except Exception as e:  # report any load failure to the server, which shows it on /health
        conn.send(Failed(f"engine failed to load: {type(e).__name__}: {e}"))
        return None
    conn.send(
        Loaded(
            PROTOCOL_VERSION,
            os.getpid(),
            backend.n_vocab,
            backend.n_ctx,
            backend.n_ctx_seq,
            min(config.parallel, backend.max_slots),
            backend.info(),
            backend.stats(),
        )
    )
    return config, backend, spec


def batch_limit(config: Config, piece: int, speculating: bool) -> int:
    """The scheduler's max_batch_tokens: the setting, or, where the prefill piece is the hybrid
    mode's streamed chunk (longer than prefill_chunk), enough to run it uncut beside every
    slot's decode or speculative window."""
    if piece <= config.prefill_chunk:
        return config.max_batch_tokens
    window = 1 + (config.spec_max if speculating else 0)
    return max(config.max_batch_tokens, piece + config.parallel * window)


def serve(sock: socket.socket, host_cpu: int = -1) -> int:
    conn = FrameSocket(sock)
    try:
        loaded = _load(conn)
    except (EOFError, ProtocolError, OSError):
        return 2
    if loaded is None:
        return 1
    config, backend, spec = loaded
    piece = int(getattr(backend, "prefill_piece", config.prefill_chunk))
    # token masks of constrained requests; the llguidance vocabulary is built in the background
    constraints = Constraints(backend.vocabulary, backend.n_vocab)
    constraints.warm()
    if host_cpu >= 0:
        # after the load and the helper threads it starts (a thread inherits its creator's
        # set): only this thread, the pool's caller, keeps the first core
        os.sched_setaffinity(0, {host_cpu})
    sched = Scheduler(
        backend,
        piece,
        config.parallel,
        max_batch_tokens=batch_limit(config, piece, spec is not None),
        prompt_cache_bytes=auto_cache_bytes(config.prompt_cache_mib) if config.cache_prompt else 0,
        reuse=config.cache_prompt,
        cache_reuse=config.cache_reuse if config.cache_prompt else 0,
        processors=processor_factory(constraints.for_request, backend.vocabulary),
        speculator=spec,
        force_miss=config.test_pipeline_miss,
        model=lambda: _fingerprint(backend),
    )

    def stats() -> Stats:
        return Stats(backend.stats() + sched.stats(), {**backend.info(), **sched.info()})

    last_stats = 0.0
    dirty = True  # counters moved since the last Stats frame
    was_settling = False
    while True:
        try:
            frames = conn.recv_ready(0.0 if sched.has_work() else STATS_INTERVAL_S)
        except (EOFError, OSError):
            return 0
        out: list[FromEngine] = []
        acted: list[SlotDone] = []
        for payload in frames:
            msg = decode_to_engine(payload)
            if isinstance(msg, Submit):
                out += sched.add(msg)
            elif isinstance(msg, Abort):
                out += sched.abort(msg.rid)
            elif isinstance(msg, SlotAction):
                acted += sched.slot_action(msg)
            elif isinstance(msg, Shutdown):
                return 0
        acted += sched.run_slot_actions()  # those a finished request freed, before admission
        out += acted
        dirty = dirty or bool(acted)  # a slot's state moved: /slots
        if sched.has_work():
            out += sched.step()
            dirty = True
        # background work (the fill) moves the stats: send them while it runs and once after
        settling = backend.settling()
        dirty, was_settling = dirty or settling or was_settling, settling
        now = time.monotonic()
        finished = bool(acted) or any(isinstance(e, Tokens) and e.finish for e in out)
        if dirty and (finished or now - last_stats >= STATS_INTERVAL_S):
            out.append(stats())
            last_stats, dirty = now, False
        if out:
            try:
                conn.send(*out)
            except OSError:
                return 0


def _fingerprint(backend: Backend) -> str:
    """What a slot file must carry to be restored into this engine: the model file's
    fingerprint (the fake engine's kind otherwise)."""
    info = backend.info()
    path = info.get("path")
    if not path:
        return str(info.get("kind", "unknown"))
    from strata._core import model_fingerprint

    return ":".join(model_fingerprint(path))


def _die_with_parent() -> None:
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, int(signal.SIGKILL), 0, 0, 0)
    except (OSError, AttributeError):
        pass


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m strata.engine", description=__doc__)
    p.add_argument("--fd", type=int, required=True, help="socket file descriptor to the server")
    p.add_argument("--cpus", default="", help="CPUs to run on (the server's set at its start)")
    p.add_argument(
        "--host-cpu", type=int, default=-1, help="the stepping thread's CPU once loaded (-1: any)"
    )
    args: Any = p.parse_args(argv)
    if args.cpus:
        # before the pool's workers start and pin themselves among these
        os.sched_setaffinity(0, {int(c) for c in args.cpus.split(",")})
    # Ctrl-C / SIGTERM reach the whole process group; the server decides when the engine
    # stops (after draining). If the server dies, its socket closes and the engine exits;
    # on Linux the kernel also kills the engine when the server process goes away.
    logging.basicConfig(level=logging.INFO, format="strata.engine: %(message)s")
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _die_with_parent()
    sock = socket.socket(fileno=args.fd)
    try:
        return serve(sock, args.host_cpu)
    finally:
        sock.close()


if __name__ == "__main__":
    sys.exit(main())
