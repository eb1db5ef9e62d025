"""The GPU kernels' decode and dot math, checked on the CPU (no GPU needed).

cuda/tests/quant_host.cu runs the same __host__ __device__ functions the kernels use
(cuda/qdecode.cuh, cuda/common.cuh) on the host:
- dequantization of random blocks (finite f16 scales) is bit-exact with strata's CPU
  dequantization (itself bit-exact with gguf-py);
- the activation quantizers (q8_0 and q8_K): the same scales and int8 values as the CPU
  path's quantizer (`_core.quantize_act`, ggml's x86 rounding), bit for bit;
- the int8 item dot against the type's activations: |dot − Σ ŵ·x̂| ≤ (items + 10)·u·Σ T·|x̂|
  (ŵ the dequantized weight, x̂ the dequantized activation, T the magnitude of each weight
  term, u = 2⁻²⁴);
- the f32 → f16 rounding equals numpy's.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import dot_util
import numpy as np
import pytest
from cuda_host import CUDA, HOST_TESTS, find_nvcc
from gpu_quant_ref import act_kind, act_parts
from strata import _core

QUANT_TYPES = [
    "Q8_0", "Q4_0", "Q5_0", "IQ4_NL", "MXFP4", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS",
    "IQ3_S", "IQ3_XXS", "IQ2_XS",
]  # fmt: skip
U = 2.0**-24


def build(out_dir: Path) -> tuple[Path, str]:
    """cuda/tests/quant_host.cu compiled by nvcc (as tests/cuda_host.py does) or, without nvcc,
    as plain C++ (the headers allow it), so the check runs either way."""
    src = HOST_TESTS / "quant_host.cu"
    exe = out_dir / "quant_host"
    nvcc = find_nvcc()
    if nvcc is not None:
        cmd = [str(nvcc), "-std=c++17", "-O2", f"-I{CUDA}", "-o", str(exe), str(src)]
        lib = nvcc.parent.parent / "lib"
        if (lib / "libcudart_static.a").is_file():
            cmd.insert(1, f"-L{lib}")
    else:
        cxx = shutil.which("c++") or shutil.which("g++") or "c++"
        cmd = [cxx, "-std=c++17", "-O2", "-x", "c++", f"-I{CUDA}", "-o", str(exe), str(src)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0, f"{' '.join(cmd)}\n{res.stdout}{res.stderr}"
    return exe, cmd[0]


def run(exe: Path, *args: str | Path) -> None:
    res = subprocess.run([str(exe), *map(str, args)], capture_output=True, text=True)
    assert res.returncode == 0, f"quant_host {args} failed ({res.returncode}): {res.stderr}"


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Path:
    exe, used = build(tmp_path_factory.mktemp("cuda_host"))
    print(f"quant_host built with {used}")
    return exe


def dequant_cpu(t: str, row: bytes, n: int) -> np.ndarray:
    return _core.dequantize_bytes(t, np.frombuffer(row, np.uint8), n)


@pytest.mark.parametrize("t", QUANT_TYPES)
def test_dequant_bit_exact(host: Path, tmp_path: Path, t: str) -> None:
    rng = np.random.default_rng([7, *t.encode()])
    n = 256 * 48
    row = dot_util.random_row(t, n, rng)
    (tmp_path / "w.bin").write_bytes(row)
    run(host, "dequant", t, tmp_path / "w.bin", tmp_path / "y.bin")
    got = np.fromfile(tmp_path / "y.bin", np.float32)
    want = dequant_cpu(t, row, n)
    bad = np.flatnonzero(got.view(np.uint32) != want.view(np.uint32))
    assert bad.size == 0, (
        f"{t}: {bad.size}/{n} differ, first {bad[0]}: {got[bad[0]]} vs {want[bad[0]]}"
    )


def act_blocks(blocks: bytes) -> tuple[np.ndarray, np.ndarray]:
    """(d f32 [n], q int64 [n, 32]) from raw activation blocks (f32 d, 32 × int8)."""
    b = np.frombuffer(blocks, np.uint8).reshape(-1, 36)
    return b[:, :4].copy().view(np.float32)[:, 0], b[:, 4:].view(np.int8).astype(np.int64)


@pytest.mark.parametrize("kind", ["q8_0", "q8_k"])
def test_act_quantizer_equals_cpu(host: Path, tmp_path: Path, kind: str) -> None:
    rng = np.random.default_rng([3, *kind.encode()])
    x = np.concatenate([dot_util.random_act_f32(rng, 256 * 40), np.zeros(256, np.float32)])
    x[256 * 7 : 256 * 8] *= 1e-3
    x[256 * 9 + 5] = -np.abs(x[256 * 9 : 256 * 10]).max() * 3  # a negative largest element
    x[256 * 10 + 3] = 4.0  # equal magnitudes: the first one sets q8_K's sign
    x[256 * 10 + 200] = -4.0
    x[256 * 11 + 100] = -4.0
    x[256 * 11 + 101] = 4.0
    x.tofile(tmp_path / "x.bin")
    run(host, "act", kind, tmp_path / "x.bin", tmp_path / "q.bin")
    d, q = act_blocks((tmp_path / "q.bin").read_bytes())
    want_d, want_q = act_parts(kind, x)
    assert np.array_equal(d.view(np.uint32), want_d.astype(np.float32).view(np.uint32))
    assert np.array_equal(q, want_q)
    assert np.abs(q).max() <= 127


@pytest.mark.parametrize("t", QUANT_TYPES)
def test_int8_dot_bound(host: Path, tmp_path: Path, t: str) -> None:
    rng = np.random.default_rng([11, *t.encode()])
    k, rows, n_tok = 1024, 24, 3
    w_rows = [dot_util.random_row(t, k, rng) for _ in range(rows)]
    x = np.stack([dot_util.random_act_f32(rng, k) for _ in range(n_tok)])
    (tmp_path / "w.bin").write_bytes(b"".join(w_rows))
    x.tofile(tmp_path / "x.bin")
    run(host, "dot", t, str(k), tmp_path / "w.bin", tmp_path / "x.bin", tmp_path / "y.bin")
    got = np.fromfile(tmp_path / "y.bin", np.float32).reshape(n_tok, rows).astype(np.float64)
    run(host, "act", act_kind(t), tmp_path / "x.bin", tmp_path / "q.bin")
    d, q = act_blocks((tmp_path / "q.bin").read_bytes())
    xh = (d.astype(np.float64)[:, None] * q).reshape(n_tok, k)
    w = np.stack([dequant_cpu(t, r, k) for r in w_rows]).astype(np.float64)
    mag = np.stack([dequant_cpu(t, dot_util.magnitude_row(t, r), k) for r in w_rows])
    mag = np.abs(mag.astype(np.float64))
    want = xh @ w.T
    bound = (k // 32 + 10) * U * (np.abs(xh) @ mag.T)
    err = np.abs(got - want)
    worst = float(np.max(err / np.maximum(bound, 1e-300)))
    assert np.all(err <= bound), f"{t}: error/bound up to {worst:.3g}"
    # Against the exact f32 activations: the activation rounding term Σ|ŵ|·|x − x̂| on top.
    full_bound = bound + np.abs(x.astype(np.float64) - xh) @ np.abs(w).T
    assert np.all(np.abs(got - x.astype(np.float64) @ w.T) <= full_bound)


def test_f32_to_f16_rounding(host: Path, tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    x = np.concatenate(
        [
            (rng.standard_normal(20000) * 2.0 ** rng.uniform(-30, 17, 20000)).astype(np.float32),
            np.array([0.0, -0.0, 65504, 65519.99, 65520, 1e9, -1e9, 2.0**-24, 2.0**-25,
                      3 * 2.0**-26, 2.0**-14, 6.1e-5, np.inf, -np.inf], np.float32),
        ]
    )  # fmt: skip
    x.tofile(tmp_path / "x.bin")
    run(host, "f16", tmp_path / "x.bin", tmp_path / "h.bin")
    got = np.fromfile(tmp_path / "h.bin", np.uint16)
    with np.errstate(over="ignore"):
        want = x.astype(np.float16).view(np.uint16)
    assert np.array_equal(got, want)
