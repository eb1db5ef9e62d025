"""Shared fixtures."""

from __future__ import annotations

import pytest
from models import TestModels


@pytest.fixture(scope="session")
def test_models() -> TestModels:
    """Generated qwen3moe test models, built on first use into tests/.models/ (or
    $STRATA_TEST_MODELS) and reused while the generator's parameters are unchanged."""
    return TestModels.default_cache()
