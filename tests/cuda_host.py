"""Host checks of CUDA device math without a GPU: nvcc compiles `cuda/tests/<name>_host.cu`
(host code calling the kernels' `__host__ __device__` functions) into an executable, which
runs here. Used by tests/test_cuda_host.py; docs/GPU.md says how to add a check.

    from cuda_host import find_nvcc, run_host_check
    res = run_host_check("smoke")    # compiles cuda/tests/smoke_host.cu, runs it
    assert res.returncode == 0, res.stdout + res.stderr

nvcc is found like rust/build.rs finds it: $STRATA_NVCC, `nvcc` on PATH, $CUDA_HOME/bin, then
the PyPI toolkit in this Python's site-packages (nvidia/cu13/bin/nvcc).
"""

from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CUDA = ROOT / "cuda"
HOST_TESTS = CUDA / "tests"


def find_nvcc() -> Path | None:
    """The nvcc the build would use, or None."""
    if env := os.environ.get("STRATA_NVCC"):
        return Path(env) if Path(env).is_file() else None
    if found := shutil.which("nvcc"):
        return Path(found)
    if home := os.environ.get("CUDA_HOME"):
        p = Path(home) / "bin" / "nvcc"
        if p.is_file():
            return p
    dirs = [*sys.path, *sysconfig.get_paths().values(), *site.getsitepackages()]
    for d in dirs:
        for rel in ("nvidia/cu13/bin/nvcc", "nvidia/cuda_nvcc/bin/nvcc"):
            p = Path(d) / rel
            if d and p.is_file():
                return p
    return None


def host_checks() -> list[str]:
    """Names of the checks: `cuda/tests/<name>_host.cu`."""
    return sorted(p.name.removesuffix("_host.cu") for p in HOST_TESTS.glob("*_host.cu"))


def run_host_check(
    name: str, args: list[str] | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """Compiles `cuda/tests/<name>_host.cu` (with `-I cuda`) and runs it with `args`.
    Raises RuntimeError with nvcc's output when the compile fails or nvcc is missing."""
    nvcc = find_nvcc()
    if nvcc is None:
        raise RuntimeError("nvcc not found (see find_nvcc)")
    src = HOST_TESTS / f"{name}_host.cu"
    with tempfile.TemporaryDirectory(prefix="strata-host-") as tmp:
        exe = Path(tmp) / name
        cmd = [str(nvcc), "-std=c++17", "-O2", f"-I{CUDA}", "-o", str(exe), str(src)]
        lib = nvcc.parent.parent / "lib"  # the PyPI toolkit keeps cudart_static here
        if (lib / "libcudart_static.a").is_file():
            cmd.insert(1, f"-L{lib}")
        comp = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        if comp.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)}\n{comp.stdout}{comp.stderr}")
        return subprocess.run(
            [str(exe), *(args or [])], capture_output=True, text=True, timeout=timeout
        )
