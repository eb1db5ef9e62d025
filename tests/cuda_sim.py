"""Builds a CPU emulation library of CUDA kernels: g++ compiles `cuda/tests/<main>` (which
includes the kernels' .cu files under cuda/tests/sim.h, the emulation of blocks, barriers,
warp shuffles and mma.sync) into a shared library, once per hash of its sources, cached in
pytest's cache. Used by the test_gpu_*_sim.py files.

    dll = build_sim(request, tmp_path_factory, "model_sim.cpp", ["model.cuh", "norm.cu", ...])
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest

CUDA = Path(__file__).resolve().parent.parent / "cuda"


def build_sim(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    main: str,
    sources: list[str],
) -> ctypes.CDLL:
    """The library of `cuda/tests/<main>`, rebuilt when it, sim.h or any of `sources` (paths
    under cuda/) changes; skips the test where g++ is missing (fails it under
    STRATA_REQUIRE_KERNELS=1)."""
    gxx = shutil.which("g++")
    if gxx is None:
        if os.environ.get("STRATA_REQUIRE_KERNELS") == "1":
            # where the kernels are required (CI: scripts/test), their emulation is too
            pytest.fail(
                "STRATA_REQUIRE_KERNELS=1 but g++ (the CUDA emulation's compiler) is missing"
            )
        pytest.skip("g++ is not installed: the CUDA emulation is built with g++")
    h = hashlib.sha256()
    for s in sorted({f"tests/{main}", "tests/sim.h", *sources}):
        h.update((CUDA / s).read_bytes())
    stem = Path(main).stem
    cfg_cache = getattr(request.config, "cache", None)
    if cfg_cache is not None:
        cache = Path(cfg_cache.mkdir(f"gpu_{stem}"))
    else:
        cache = tmp_path_factory.mktemp(f"gpu_{stem}")
    lib = cache / f"{stem}-{h.hexdigest()[:16]}.so"
    if not lib.exists():
        tmp = lib.with_suffix(".tmp.so")
        cmd = [gxx, "-std=c++20", "-O1", "-pthread", "-shared", "-fPIC", "-DSTRATA_SIM"]
        cmd += ["-I", str(CUDA), str(CUDA / "tests" / main), "-o", str(tmp)]
        subprocess.run(cmd, check=True)
        tmp.rename(lib)
    return ctypes.CDLL(str(lib))
