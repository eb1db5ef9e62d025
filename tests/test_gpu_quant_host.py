"""The GPU kernels' decode and dot math, checked on the CPU (no GPU needed).

cuda/tests/quant_host.cu runs the same __host__ __device__ functions the kernels use
(cuda/qdecode.cuh, cuda/common.cuh) on the host:
- dequantization of random blocks (finite f16 scales) is bit-exact with strata's CPU
  dequantization (itself bit-exact with gguf-py);
- the q8_1 activation quantizer: |q| ≤ 127, d = f16(amax/127), |x − d·q| ≤ d/2 (+ a clamp
  term of amax·2⁻¹⁰), s = f16(d·Σq);
- the int8 item dot against q8_1: |dot − Σ ŵ·x̂| ≤ (items + 10)·u·Σ T·|x̂| (ŵ the dequantized
  weight, x̂ the dequantized activation, T the magnitude of each weight term, u = 2⁻²⁴);
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
from gpu_quant_ref import q8_1_parts
from strata import _core

QUANT_TYPES = [
    "Q8_0", "Q4_0", "Q5_0", "IQ4_NL", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS",
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


def q8_1_values(blocks: bytes) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(d, s, q) per block and the dequantized values d·q, from raw q8_1 blocks."""
    b = np.frombuffer(blocks, np.uint8).reshape(-1, 36)
    d = b[:, 0:2].copy().view(np.float16)[:, 0].astype(np.float64)
    s = b[:, 2:4].copy().view(np.float16)[:, 0]
    q = b[:, 4:].view(np.int8).astype(np.int64)
    return d, s, q, (d[:, None] * q).reshape(-1)


def test_q8_1_quantizer(host: Path, tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    x = np.concatenate([dot_util.random_act_f32(rng, 32 * 500), np.zeros(32, np.float32)])
    x[32 * 7 : 32 * 8] *= 1e-3
    x.tofile(tmp_path / "x.bin")
    run(host, "q8_1", tmp_path / "x.bin", tmp_path / "q.bin")
    d, s, q, xh = q8_1_values((tmp_path / "q.bin").read_bytes())
    xb = x.reshape(-1, 32).astype(np.float64)
    amax = np.abs(xb).max(axis=1)
    want_d = (x.reshape(-1, 32).__abs__().max(axis=1) / np.float32(127)).astype(np.float16)
    assert np.array_equal(d, want_d.astype(np.float64))
    assert np.abs(q).max() <= 127
    err = np.abs(xb - xh.reshape(-1, 32))
    assert np.all(err <= (d / 2 + amax * 2.0**-10)[:, None] + 1e-30)
    want_s = (d.astype(np.float32) * q.sum(axis=1).astype(np.float32)).astype(np.float16)
    assert np.array_equal(s.view(np.uint16), want_s.view(np.uint16))
    # The numpy emulation the device tests use is the same computation, value for value.
    ed, eq = q8_1_parts(x)
    assert np.array_equal(ed[:, 0].astype(np.float64), d)
    assert np.array_equal(eq.astype(np.int64), q)


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
    run(host, "q8_1", tmp_path / "x.bin", tmp_path / "q.bin")
    xh = q8_1_values((tmp_path / "q.bin").read_bytes())[3].reshape(n_tok, k)
    w = np.stack([dequant_cpu(t, r, k) for r in w_rows]).astype(np.float64)
    mag = np.stack([dequant_cpu(t, dot_util.magnitude_row(t, r), k) for r in w_rows])
    mag = np.abs(mag.astype(np.float64))
    want = xh @ w.T
    bound = (k // 32 + 10) * U * (np.abs(xh) @ mag.T)
    err = np.abs(got - want)
    worst = float(np.max(err / np.maximum(bound, 1e-300)))
    assert np.all(err <= bound), f"{t}: error/bound up to {worst:.3g}"
    # Against the exact f32 activations: the q8_1 rounding term Σ|ŵ|·|x − x̂| on top.
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
