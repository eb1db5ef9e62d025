"""Compile and run the host-side CUDA checks (cuda/tests/*_host.cu): the kernels' decode and dot
math (STRATA_HD functions) executed on the CPU, so it is verified without a GPU.

nvcc is searched as build.rs does (GPU_SPEC.md §1): $STRATA_NVCC, nvcc on PATH,
$CUDA_HOME/bin/nvcc, the PyPI toolkit of this Python (site-packages/nvidia/cu13/bin/nvcc). Without
nvcc the same sources are compiled as plain C++ (they are written to allow it), so the check
still runs.
"""

from __future__ import annotations

import os
import shutil
import site
import subprocess
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def find_nvcc() -> Path | None:
    env = os.environ.get("STRATA_NVCC")
    if env:
        return Path(env)
    on_path = shutil.which("nvcc")
    if on_path:
        return Path(on_path)
    home = os.environ.get("CUDA_HOME")
    if home and (Path(home) / "bin" / "nvcc").exists():
        return Path(home) / "bin" / "nvcc"
    dirs = [sysconfig.get_paths()["purelib"], *site.getsitepackages()]
    for d in dirs:
        cand = Path(d) / "nvidia" / "cu13" / "bin" / "nvcc"
        if cand.exists():
            return cand
    return None


def build(name: str, out_dir: Path) -> tuple[Path, str]:
    """Compile cuda/tests/<name>.cu into out_dir; returns (executable, compiler used)."""
    src = ROOT / "cuda" / "tests" / f"{name}.cu"
    exe = out_dir / name
    nvcc = find_nvcc()
    if nvcc is not None:
        lib = nvcc.parent.parent / "lib"
        cmd = [str(nvcc), "-O2", "-std=c++17", "-arch=sm_90", "-o", str(exe), str(src)]
        if lib.is_dir():
            cmd[1:1] = [f"-L{lib}"]
        used = f"nvcc ({nvcc})"
    else:
        cxx = shutil.which("c++") or shutil.which("g++") or "c++"
        cmd = [cxx, "-O2", "-std=c++17", "-x", "c++", "-o", str(exe), str(src)]
        used = f"{cxx} (no nvcc found)"
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{res.stdout}\n{res.stderr}")
    return exe, used


def run(exe: Path, *args: str | Path) -> None:
    res = subprocess.run([str(exe), *map(str, args)], capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"{exe.name} {args} failed ({res.returncode}): {res.stderr}")
