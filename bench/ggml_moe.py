"""llama.cpp's CPU MoE on the same expert bytes, for bench_pool.py: ggml's `mul_mat_id` graph
(up, gate, silu·mul, down, weight, sum over slots, as llama.cpp's `build_moe_ffn` builds it),
run through llama-cpp-python's libggml with ctypes.

`ggml_graph_compute_with_ctx` makes a thread pool per call (llama.cpp proper keeps one), so
its per-call time includes thread start-up; at T = 1 that overhead is part of the figure.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np
import numpy.typing as npt

GGML_I32 = 26
GGML_F32 = 0
TYPE_IDS = {"F32": 0, "Q8_0": 8, "Q4_K": 12, "IQ3_S": 21, "Q6_K": 14, "Q5_K": 13}


class _Params(ctypes.Structure):
    _fields_ = [
        ("mem_size", ctypes.c_size_t),
        ("mem_buffer", ctypes.c_void_p),
        ("no_alloc", ctypes.c_bool),
    ]


def _libs() -> tuple[ctypes.CDLL, ctypes.CDLL]:
    import llama_cpp

    d = Path(llama_cpp.__file__).parent / "lib"
    base = ctypes.CDLL(str(d / "libggml-base.so"), mode=ctypes.RTLD_GLOBAL)
    cpu = ctypes.CDLL(str(d / "libggml-cpu.so"), mode=ctypes.RTLD_GLOBAL)
    vp, i64 = ctypes.c_void_p, ctypes.c_int64
    sigs = {
        "ggml_init": (vp, [_Params]),
        "ggml_free": (None, [vp]),
        "ggml_new_tensor_2d": (vp, [vp, ctypes.c_int, i64, i64]),
        "ggml_new_tensor_3d": (vp, [vp, ctypes.c_int, i64, i64, i64]),
        "ggml_get_data": (vp, [vp]),
        "ggml_mul_mat_id": (vp, [vp, vp, vp, vp]),
        "ggml_silu": (vp, [vp, vp]),
        "ggml_mul": (vp, [vp, vp, vp]),
        "ggml_permute": (vp, [vp, vp, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]),
        "ggml_cont": (vp, [vp, vp]),
        "ggml_sum_rows": (vp, [vp, vp]),
        "ggml_new_graph": (vp, [vp]),
        "ggml_build_forward_expand": (None, [vp, vp]),
    }
    for name, (res, args) in sigs.items():
        f = getattr(base, name)
        f.restype, f.argtypes = res, args
    cpu.ggml_graph_compute_with_ctx.restype = ctypes.c_int
    cpu.ggml_graph_compute_with_ctx.argtypes = [vp, vp, ctypes.c_int]
    cpu.ggml_cpu_init.restype = None
    cpu.ggml_cpu_init()
    return base, cpu


class GgmlMoE:
    """One MoE layer's experts copied into a ggml context; `run` computes y[T,H]."""

    def __init__(
        self, types: tuple[str, str, str], mats: list[npt.NDArray[np.uint8]], e: int, h: int, i: int
    ) -> None:
        self.g, self.cpu = _libs()
        self.h, self.i, self.e = h, i, e
        total = sum(m.nbytes for m in mats) + (64 << 20)
        self.wctx = self.g.ggml_init(_Params(total, None, False))
        self.w = []
        for ty, m, (ne0, ne1) in zip(types, mats, ((h, i), (h, i), (i, h)), strict=True):
            t = self.g.ggml_new_tensor_3d(self.wctx, TYPE_IDS[ty], ne0, ne1, e)
            ctypes.memmove(self.g.ggml_get_data(t), m.ctypes.data, m.nbytes)
            self.w.append(t)
        self.graphs: dict[tuple[int, int], tuple[int, int, int, int, int, int]] = {}

    def _graph(self, t: int, k: int) -> tuple[int, int, int, int, int, int]:
        if (t, k) in self.graphs:
            return self.graphs[(t, k)]
        g = self.g
        ctx = g.ggml_init(_Params(256 << 20, None, False))
        x = g.ggml_new_tensor_3d(ctx, GGML_F32, self.h, 1, t)
        ids = g.ggml_new_tensor_2d(ctx, GGML_I32, k, t)
        w = g.ggml_new_tensor_3d(ctx, GGML_F32, 1, k, t)
        gate = g.ggml_mul_mat_id(ctx, self.w[0], x, ids)  # [I, k, T]
        up = g.ggml_mul_mat_id(ctx, self.w[1], x, ids)
        par = g.ggml_mul(ctx, g.ggml_silu(ctx, gate), up)
        down = g.ggml_mul_mat_id(ctx, self.w[2], par, ids)  # [H, k, T]
        weighted = g.ggml_mul(ctx, down, w)
        summed = g.ggml_sum_rows(ctx, g.ggml_cont(ctx, g.ggml_permute(ctx, weighted, 1, 0, 2, 3)))
        gf = g.ggml_new_graph(ctx)
        g.ggml_build_forward_expand(gf, summed)  # [1, H, T]
        self.graphs[(t, k)] = (ctx, gf, x, ids, w, summed)
        return self.graphs[(t, k)]

    def run(
        self,
        x: npt.NDArray[np.float32],
        ids: npt.NDArray[np.uint32],
        w: npt.NDArray[np.float32],
        threads: int,
    ) -> npt.NDArray[np.float32]:
        t, k = ids.shape
        ctx, gf, xt, it, wt, out = self._graph(t, k)
        g = self.g
        for dst, src in ((xt, x), (it, ids.astype(np.int32)), (wt, w)):
            a = np.ascontiguousarray(src)
            ctypes.memmove(g.ggml_get_data(dst), a.ctypes.data, a.nbytes)
        if self.cpu.ggml_graph_compute_with_ctx(ctx, gf, threads) != 0:
            raise RuntimeError("ggml_graph_compute_with_ctx failed")
        y = np.empty((t, self.h), dtype=np.float32)
        ctypes.memmove(y.ctypes.data, g.ggml_get_data(out), y.nbytes)
        return y
