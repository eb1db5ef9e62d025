"""The GPU runtime (rust/src/cuda): copies, the smoke kernel, graph replay, events and typed
errors. Tests marked `gpu` need a usable GPU (scripts/gpu_suite runs them on the device);
the others run everywhere and check that a machine without one gets a clear reason and
typed errors, never a crash."""

from __future__ import annotations

import math
import os

import numpy as np
import pytest
from strata import _core
from strata._core import _testing
from strata.errors import ConfigError, GpuError, ShapeError, StrataError


def fresh_rng() -> tuple[np.random.Generator, int]:
    """A generator on fresh entropy, and its seed for the failure message."""
    seed = int(np.random.SeedSequence().entropy) % (1 << 63)
    return np.random.default_rng(seed), seed


# ---- everywhere ------------------------------------------------------------------------------


def test_gpu_error_is_a_strata_error() -> None:
    assert issubclass(GpuError, StrataError)


def test_status_is_a_clear_answer_and_gpu_calls_raise_typed_errors() -> None:
    ok, why = _core.gpu_status()
    assert isinstance(ok, bool) and isinstance(why, str) and why
    if ok:
        assert "sm_" in why and "GiB" in why, why
        return
    # No usable GPU here: the reason names what is missing, and every entry point that needs
    # the device raises GpuError with that same reason.
    assert any(w in why for w in ("driver", "device", "kernels", "CUDA")), why
    x = np.ones(8, dtype=np.float32)
    calls = [
        lambda: _testing.gpu_smoke(x, 1.0, 2.0),
        lambda: _testing.gpu_smoke_graph(x, 1.0, 2.0, 3),
        lambda: _testing.gpu_roundtrip(b"abc"),
        lambda: _testing.gpu_time_smoke(16, 1),
        lambda: _testing.gpu_kernel_params("strata_smoke_axpb"),
        lambda: _testing.gpu_bad_launch(),
    ]
    for call in calls:
        with pytest.raises(GpuError) as e:
            call()
        assert str(e.value) == why


def test_kernels_built_when_required() -> None:
    info = _core.gpu_info()
    assert isinstance(info["kernels_built"], bool) and info["kernels"]
    if os.environ.get("STRATA_REQUIRE_KERNELS") == "1":
        # CI builds with the PyPI nvcc: every cuda/*.cu must be in the binary.
        assert info["kernels_built"], info["kernels"]
    if info["kernels_built"]:
        assert "smoke" in info["kernel_files"]
        assert "nvcc" in info["kernels"]
    else:
        assert info["kernel_files"] == []


# ---- on the device ---------------------------------------------------------------------------


@pytest.mark.gpu
def test_device_info() -> None:
    info = _core.gpu_info()
    assert info["kernels_built"]
    assert info["name"] and info["sm_count"] > 0
    assert info["cc"][0] >= 8, info["cc"]
    assert 0 < info["mem_free"] <= info["mem_total"]
    assert info["max_shmem_optin"] >= 48 * 1024


@pytest.mark.gpu
def test_upload_download_round_trip() -> None:
    rng, seed = fresh_rng()
    for n in (0, 1, 7, 4097, (1 << 20) + 3):
        data = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
        assert _testing.gpu_roundtrip(data) == data, f"n={n} seed={seed}"
        if n > 2:
            off = int(rng.integers(0, n - 1))
            length = int(rng.integers(0, n - off + 1))
            got = _testing.gpu_roundtrip(data, off, length)
            assert got == data[off : off + length], f"n={n} off={off} len={length} seed={seed}"


@pytest.mark.gpu
def test_out_of_range_copies_are_shape_errors() -> None:
    data = bytes(range(100))
    with pytest.raises(ShapeError):
        _testing.gpu_roundtrip(data, 99, 2)
    with pytest.raises(ShapeError):
        _testing.gpu_roundtrip(data, 101, 0)
    with pytest.raises(ShapeError):
        _testing.gpu_roundtrip(data, 1, (1 << 64) - 1)  # offset + length overflows
    assert _testing.gpu_roundtrip(data, 100, 0) == b""  # the end itself is in range
    # The context is still healthy afterwards.
    assert _testing.gpu_roundtrip(data) == data


@pytest.mark.gpu
def test_smoke_kernel_matches_numpy() -> None:
    rng, seed = fresh_rng()
    for n in (0, 1, 255, 256, 257, int(rng.integers(1, 1 << 20))):
        x = rng.standard_normal(n).astype(np.float32) * np.float32(100)
        a, b = np.float32(rng.standard_normal()), np.float32(rng.standard_normal())
        y = _testing.gpu_smoke(x, float(a), float(b))
        want = a * x + b  # float32 product, rounded, then float32 sum: the kernel's math
        assert y.dtype == np.float32 and y.shape == (n,)
        np.testing.assert_array_equal(y, want, err_msg=f"n={n} seed={seed}")


@pytest.mark.gpu
def test_graph_replays_the_captured_step() -> None:
    rng, seed = fresh_rng()
    n = int(rng.integers(1, 50_000))
    x = rng.uniform(-1, 1, n).astype(np.float32)
    a, b = np.float32(rng.uniform(0.5, 1.0)), np.float32(rng.uniform(-0.5, 0.5))
    for replays in (0, 1, int(rng.integers(2, 20))):
        got = _testing.gpu_smoke_graph(x, float(a), float(b), replays)
        want = x.copy()
        for _ in range(replays):
            want = a * want + b
        np.testing.assert_array_equal(got, want, err_msg=f"replays={replays} seed={seed}")


@pytest.mark.gpu
def test_events_time_the_work() -> None:
    ms = _testing.gpu_time_smoke(1 << 22, 20)
    assert math.isfinite(ms) and 0 < ms < 5_000, ms


@pytest.mark.gpu
def test_unknown_kernel_is_a_gpu_error_naming_it() -> None:
    with pytest.raises(GpuError, match="strata_no_such_kernel"):
        _testing.gpu_kernel_params("strata_no_such_kernel")
    params = _testing.gpu_kernel_params("strata_smoke_axpb")
    assert params is None or params == [8, 8, 4, 4, 4], params


@pytest.mark.gpu
def test_wrong_launch_arguments_are_refused() -> None:
    if _testing.gpu_kernel_params("strata_smoke_axpb") is None:
        pytest.skip("this driver cannot list kernel parameters (cuFuncGetParamInfo)")
    with pytest.raises(ConfigError, match="strata_smoke_axpb"):
        _testing.gpu_bad_launch()
    x = np.arange(5, dtype=np.float32)
    np.testing.assert_array_equal(_testing.gpu_smoke(x, 2.0, 1.0), 2 * x + 1)
