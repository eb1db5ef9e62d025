"""Where the server's threads go beside the engine's compute threads (`pin_server`)."""

from __future__ import annotations

from strata.config import Config
from strata.placement import physical_cores, server_cpu

# CPU numbers no machine here has: sysfs says nothing, so each is its own core
CPUS = [1000, 1001, 1002, 1003]


def test_physical_cores_without_sysfs_are_the_allowed_cpus() -> None:
    assert physical_cores(CPUS) == CPUS
    assert physical_cores([]) == []


def test_auto_pins_only_when_the_compute_threads_take_every_core() -> None:
    assert server_cpu(Config(), CPUS) == 1003  # threads 0: one per physical core
    assert server_cpu(Config(threads=4), CPUS) == 1003
    assert server_cpu(Config(threads=6), CPUS) == 1003
    assert server_cpu(Config(threads=3), CPUS) is None  # a core is free for the server


def test_on_off_and_one_core() -> None:
    assert server_cpu(Config(threads=1, pin_server="on"), CPUS) == 1003
    assert server_cpu(Config(pin_server="off"), CPUS) is None
    assert server_cpu(Config(pin_server="on"), CPUS[:1]) is None  # nothing to keep apart
