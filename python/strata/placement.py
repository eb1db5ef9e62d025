"""Where the server process's threads run beside the engine's compute threads (`pin_server`).

The engine's pool pins its workers one per physical core after the first, which the stepping
thread (the pool's caller) keeps. When those compute threads take every core, the server's
work per streamed token (the engine's frame, detokenizing, the SSE write: ~0.4 ms of CPU) lands
on whichever core the kernel picks; on the stepping thread's it delays the publication of the
next step, on a worker's it only delays that worker's share. So the server pins its threads to
the last compute core and the engine's stepping thread to the first; the engine, spawned
before the server pins itself, first resets its own affinity to the set the server started
with (`--cpus`).
"""

from __future__ import annotations

import logging
import os

from strata.config import Config

log = logging.getLogger("strata.server")


def allowed_cpus() -> list[int]:
    """The CPUs this process may run on, ascending."""
    return sorted(os.sched_getaffinity(0))


def pins(config: Config, cores: list[int]) -> tuple[int, int] | None:
    """The CPUs of the engine's stepping thread and of the server's threads, or None (both
    left to the kernel): `pin_server` on, or auto with the engine's compute threads
    (`threads`, 0: one per physical core) taking every one of two or more physical `cores`
    (`_core.physical_cores()`, the pool's own pick); the first of them and the last."""
    if config.pin_server == "off" or len(cores) < 2:
        return None
    threads = config.threads or len(cores)
    if config.pin_server == "auto" and threads < len(cores):
        return None
    return cores[0], cores[-1]


def pin_process(cpu: int) -> None:
    """Every thread of this process onto `cpu` (threads started later inherit it)."""
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), {cpu})
        except OSError as e:  # a thread that has just exited, or a refused set
            log.debug("pin thread %s: %s", tid, e)
    log.info("server threads on CPU %d (pin_server)", cpu)
