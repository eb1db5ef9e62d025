"""The GPU runtime's plumbing on a machine without a GPU: tests/cuda_mock/libcuda_mock.c, a
fake CUDA driver compiled against the real cuda.h (so its prototypes are the driver's), is
loaded as libcuda.so.1 by a child pytest that runs tests/test_gpu_core.py's `gpu` tests.
This checks symbol binding, copies and their bounds, graph capture/replay, events, kernel
lookup in the embedded fatbins, the parameter-list check and argument marshalling; the mock
runs only the smoke kernel (in C). The real check is the device suite (scripts/gpu_suite)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from cuda_host import find_nvcc
from strata import _core

ROOT = Path(__file__).resolve().parent.parent


def cuda_include() -> Path | None:
    nvcc = find_nvcc()
    if nvcc is None:
        return None
    inc = nvcc.parent.parent / "include"
    return inc if (inc / "cuda.h").is_file() else None


def test_runtime_against_the_mock_driver(tmp_path: Path) -> None:
    inc = cuda_include()
    required = os.environ.get("STRATA_REQUIRE_KERNELS") == "1"
    if inc is None or shutil.which("gcc") is None:
        if required:
            pytest.fail("STRATA_REQUIRE_KERNELS=1 but cuda.h (next to nvcc) or gcc is missing")
        pytest.skip("needs cuda.h from the CUDA toolkit and gcc")
    if not _core.gpu_info()["kernels_built"]:
        if required:
            pytest.fail("STRATA_REQUIRE_KERNELS=1 but this build has no kernels")
        pytest.skip("this build has no kernels: " + str(_core.gpu_info()["kernels"]))
    lib = tmp_path / "libcuda.so.1"
    src = ROOT / "tests" / "cuda_mock" / "libcuda_mock.c"
    subprocess.run(
        [
            "gcc",
            "-O1",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-shared",
            "-fPIC",
            f"-I{inc}",
            "-o",
            str(lib),
            str(src),
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    env = dict(os.environ, LD_LIBRARY_PATH=f"{tmp_path}:{os.environ.get('LD_LIBRARY_PATH', '')}")
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-rs",
            "-p",
            "no:cacheprovider",
            "-m",
            "gpu",
            str(ROOT / "tests" / "test_gpu_core.py"),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    m = re.search(r"(\d+) passed", out)
    assert m and int(m.group(1)) >= 8, out
    assert not re.search(r"\d+ (failed|error|skipped)", out), out
