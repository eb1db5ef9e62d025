"""The `device` setting: Config field (environment STRATA_DEVICE, the CLI flag), passed to
`Model.open`, and a clear GpuError where no GPU can run the model. Runs everywhere; the GPU
forward pass itself is tested in test_gpu_model.py (marker gpu)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from models import TestModels
from strata import _core
from strata.config import Config
from strata.errors import ConfigError, GpuError


def test_config_device_field() -> None:
    assert Config.load({}, env={}).device == "cpu"
    assert Config.load({}, env={"STRATA_DEVICE": "cuda"}).device == "cuda"
    assert Config.load({"device": "cpu"}, env={"STRATA_DEVICE": "cuda"}).device == "cpu"
    with pytest.raises(ConfigError, match="device"):
        Config.load({"device": "tpu"}, env={})
    p = argparse.ArgumentParser()
    Config.add_arguments(p)
    assert Config.from_args(p.parse_args(["--device", "cuda"])).device == "cuda"


def test_unknown_device_is_refused(test_models: TestModels) -> None:
    micro = TestModels(test_models.root, test_models.spec.micro()).f32()
    with pytest.raises(ConfigError, match="device"):
        _core.Model.open(micro, n_ctx=32, device="tpu")


def test_cuda_without_gpu_says_why(test_models: TestModels) -> None:
    ok, why = _core.gpu_status()
    if ok:
        pytest.skip(f"a GPU is present ({why}): test_gpu_model.py runs the model on it")
    micro: Path = TestModels(test_models.root, test_models.spec.micro()).f32()
    with pytest.raises(GpuError) as ei:
        _core.Model.open(micro, n_ctx=32, device="cuda")
    assert str(ei.value), "the error says why"


def test_hybrid_settings_without_gpu_say_why(test_models: TestModels) -> None:
    """The hybrid mode's settings reach `Model.open`; without a GPU the error is the same
    GpuError (the hybrid step itself: test_gpu_hybrid.py, marker gpu)."""
    ok, why = _core.gpu_status()
    if ok:
        pytest.skip(f"a GPU is present ({why}): test_gpu_hybrid.py runs the hybrid step")
    micro: Path = TestModels(test_models.root, test_models.spec.micro()).f32()
    with pytest.raises(GpuError):
        _core.Model.open(
            micro, n_ctx=32, device="cuda", vram_slots=2, adapt_every=1, tier_async=True
        )
    m = _core.Model.open(micro, n_ctx=32)
    assert m.hybrid_counters() is None and m.hybrid_info() is None
