"""Shared fixtures, and the `gpu` marker's skip: tests marked `gpu` run only where
`strata._core.gpu_status()` finds a usable GPU, and are skipped with its reason elsewhere."""

from __future__ import annotations

import pytest
from models import TestModels


@pytest.fixture(scope="session")
def test_models() -> TestModels:
    """Generated qwen3moe test models, built on first use into tests/.models/ (or
    $STRATA_TEST_MODELS) and reused while the generator's parameters are unchanged."""
    return TestModels.default_cache()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpu_items = [i for i in items if i.get_closest_marker("gpu") is not None]
    if not gpu_items:
        return
    from strata._core import gpu_status

    ok, why = gpu_status()
    if ok:
        return
    skip = pytest.mark.skip(reason=why)
    for item in gpu_items:
        item.add_marker(skip)
