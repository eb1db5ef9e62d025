"""Where the server's threads and the engine's stepping thread go (`pin_server`)."""

from __future__ import annotations

from strata import _core
from strata.config import Config
from strata.placement import allowed_cpus, pins

# CPU numbers no machine here has: the choice depends only on the list
CORES = [1000, 1001, 1002, 1003]


def test_the_pools_cores_are_allowed_cpus() -> None:
    cores = _core.physical_cores()
    assert cores and cores == sorted(cores) and set(cores) <= set(allowed_cpus())


def test_auto_pins_only_when_the_compute_threads_take_every_core() -> None:
    assert pins(Config(), CORES) == (1000, 1003)  # threads 0: one per physical core
    assert pins(Config(threads=4), CORES) == (1000, 1003)
    assert pins(Config(threads=6), CORES) == (1000, 1003)
    assert pins(Config(threads=3), CORES) is None  # a core is free for the server


def test_on_off_and_one_core() -> None:
    assert pins(Config(threads=1, pin_server="on"), CORES) == (1000, 1003)
    assert pins(Config(pin_server="off"), CORES) is None
    assert pins(Config(pin_server="on"), CORES[:1]) is None  # nothing to keep apart
