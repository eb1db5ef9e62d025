"""numpy emulation of the GPU kernels' q8_1 activation quantizer (cuda/quantize.cu), shared by
tests/test_gpu_quant.py (device) and tests/test_gpu_quant_host.py (checks it against the host
build of the kernel's own math)."""

from __future__ import annotations

import numpy as np


def q8_1_parts(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """x f32 [..., k] → (d f32 [..., k/32, 1], q f32 [..., k/32, 32]) in the kernel's IEEE
    float32 steps: d = f16(amax/127), q = clip(rint(x·(1/d)), ±127) (q = 0 when d = 0)."""
    xb = x.astype(np.float32).reshape(*x.shape[:-1], -1, 32)
    amax = np.abs(xb).max(axis=-1, keepdims=True)
    d = (amax / np.float32(127)).astype(np.float16).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(d > 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
    q = np.clip(np.rint(xb * inv), -127, 127).astype(np.float32)
    return d, q


def q8_1(x: np.ndarray) -> np.ndarray:
    """The q8_1 values d·q of x (float64, the shape of x)."""
    d, q = q8_1_parts(x)
    return (d.astype(np.float64) * q).reshape(x.shape)
