"""The hybrid step's host-side control flow on a machine without a GPU: the mock driver
(tests/cuda_mock/libcuda_mock.c) with STRATA_MOCK_NOOP_KERNELS=1 runs every kernel as a no-op
on zeroed memory, so a real test model runs end to end with every token routed to expert 0;
tests/hybrid_mock_child.py checks the start fill along a profile, the adaptive swaps (sync and
async), streamed prefill chunks and the counters. Values are not checked (no kernel runs): the
device suite does that (tests/test_gpu_hybrid.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from models import TestModels
from strata import _core
from strata.modelgen import ModelSpec
from test_gpu_mock import ROOT, cuda_include


def family_model(fam: str, root: Path) -> Path:
    """A test model of 3 layers of 8 experts, top-2: the qwen3moe test model, or another
    family's F32 file in the converter's layout (qwen2moe: Q/K/V biases and a shared expert
    with its gate, whose launches the hybrid step's host side then checks too)."""
    if fam == "qwen3moe":
        spec = ModelSpec.tiny(n_layer=3, n_expert=8, n_expert_used=2)
        return TestModels.default_cache(spec).quantized("Q8_0")
    import qwen3moe_file as qf

    s = qf.Shape(n_layer=3, n_expert=8, n_expert_used=2, arch=fam, n_ff_shexp=256)
    return qf.write(root / f"{fam}.gguf", s, qf.random_tensors(s, 3))


@pytest.mark.parametrize("fam", ["qwen3moe", "qwen2moe"])
def test_hybrid_control_flow_on_the_mock_driver(tmp_path: Path, fam: str) -> None:
    inc = cuda_include()
    # where the kernels are required (CI: scripts/test), a missing tool is a failure
    required = os.environ.get("STRATA_REQUIRE_KERNELS") == "1"
    if inc is None or shutil.which("gcc") is None:
        if required:
            pytest.fail("STRATA_REQUIRE_KERNELS=1 but cuda.h (next to nvcc) or gcc is missing")
        pytest.skip("needs cuda.h from the CUDA toolkit and gcc")
    if not _core.gpu_info()["kernels_built"]:
        if required:
            pytest.fail("STRATA_REQUIRE_KERNELS=1 but this build has no kernels")
        pytest.skip("this build has no kernels: " + str(_core.gpu_info()["kernels"]))
    model = family_model(fam, tmp_path)
    lib = tmp_path / "libcuda.so.1"
    src = ROOT / "tests" / "cuda_mock" / "libcuda_mock.c"
    cmd = ["gcc", "-O1", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC", f"-I{inc}"]
    subprocess.run([*cmd, "-o", str(lib), str(src)], check=True, capture_output=True, text=True)
    env = dict(
        os.environ,
        LD_LIBRARY_PATH=f"{tmp_path}:{os.environ.get('LD_LIBRARY_PATH', '')}",
        STRATA_MOCK_NOOP_KERNELS="1",
    )
    child = ROOT / "tests" / "hybrid_mock_child.py"
    res = subprocess.run(
        [sys.executable, str(child), str(model)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    assert "vram: ok" in out and "hybrid mock: all passed" in out, out
    assert "batch hybrid=False: ok" in out and "batch hybrid=True: ok" in out, out
