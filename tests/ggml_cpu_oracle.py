"""ggml itself as an oracle, through ctypes on llama-cpp-python's libggml-base / libggml-cpu.

Struct layouts from ggml.h (`struct ggml_type_traits`) and ggml-cpu.h
(`struct ggml_type_traits_cpu`) of the installed llama-cpp-python.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import numpy as np
from ggml_oracle import _Traits

TO_FLOAT = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)
FROM_FLOAT = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)
# void vec_dot(int n, float *s, size_t bs, const void *x, size_t bx, const void *y,
#              size_t by, int nrc)
VEC_DOT = ctypes.CFUNCTYPE(
    None,
    ctypes.c_int,
    ctypes.POINTER(ctypes.c_float),
    ctypes.c_size_t,
    ctypes.c_void_p,
    ctypes.c_size_t,
    ctypes.c_void_p,
    ctypes.c_size_t,
    ctypes.c_int,
)


# The layout of `struct ggml_type_traits` is checked once, in ggml_oracle.
TypeTraits = _Traits


class TypeTraitsCpu(ctypes.Structure):
    _fields_ = [
        ("from_float", ctypes.c_void_p),
        ("vec_dot", ctypes.c_void_p),
        ("vec_dot_type", ctypes.c_int),
        ("nrows", ctypes.c_int64),
    ]


class Ggml:
    def __init__(self) -> None:
        import llama_cpp

        lib = Path(llama_cpp.__file__).parent / "lib"
        self.base = ctypes.CDLL(str(lib / "libggml-base.so"), mode=ctypes.RTLD_GLOBAL)
        self.cpu = ctypes.CDLL(str(lib / "libggml-cpu.so"), mode=ctypes.RTLD_GLOBAL)
        self.base.ggml_get_type_traits.restype = ctypes.POINTER(TypeTraits)
        self.base.ggml_get_type_traits.argtypes = [ctypes.c_int]
        self.cpu.ggml_get_type_traits_cpu.restype = ctypes.POINTER(TypeTraitsCpu)
        self.cpu.ggml_get_type_traits_cpu.argtypes = [ctypes.c_int]
        self.cpu.ggml_cpu_init.restype = None
        self.cpu.ggml_cpu_init()

    def traits(self, t: int) -> TypeTraits:
        return self.base.ggml_get_type_traits(t).contents

    def traits_cpu(self, t: int) -> TypeTraitsCpu:
        return self.cpu.ggml_get_type_traits_cpu(t).contents

    def row_bytes(self, t: int, n: int) -> int:
        tr = self.traits(t)
        assert n % tr.blck_size == 0
        return n // tr.blck_size * tr.type_size

    def quantize_ref(self, t: int, x: np.ndarray) -> bytes:
        """`from_float_ref` of type t (the reference quantizer)."""
        x = np.ascontiguousarray(x, dtype=np.float32)
        out = ctypes.create_string_buffer(self.row_bytes(t, x.size))
        fn = self.traits(t).from_float_ref
        assert fn, f"type {t} has no from_float_ref"
        TO_FLOAT(fn)(x.ctypes.data, ctypes.addressof(out), x.size)
        return out.raw

    def quantize_cpu(self, t: int, x: np.ndarray) -> bytes:
        """The CPU backend's `from_float` (possibly SIMD) of type t."""
        x = np.ascontiguousarray(x, dtype=np.float32)
        out = ctypes.create_string_buffer(self.row_bytes(t, x.size))
        fn = self.traits_cpu(t).from_float
        assert fn, f"type {t} has no CPU from_float"
        FROM_FLOAT(fn)(x.ctypes.data, ctypes.addressof(out), x.size)
        return out.raw

    def dequantize(self, t: int, data: bytes, n: int) -> np.ndarray:
        if t == 0:  # F32 has no to_float
            return np.frombuffer(data, np.float32, n).copy()
        out = np.zeros(n, dtype=np.float32)
        buf = ctypes.create_string_buffer(bytes(data), len(data))
        TO_FLOAT(self.traits(t).to_float)(ctypes.addressof(buf), out.ctypes.data, n)
        return out

    def vec_dot_type(self, t: int) -> int:
        return int(self.traits_cpu(t).vec_dot_type)

    def vec_dot(self, t: int, n: int, row: bytes, act: bytes) -> float:
        """ggml's CPU `vec_dot` of weight type t with an activation of its vec_dot_type."""
        s = ctypes.c_float(0.0)
        x = ctypes.create_string_buffer(bytes(row), len(row))
        y = ctypes.create_string_buffer(bytes(act), len(act))
        fn = VEC_DOT(self.traits_cpu(t).vec_dot)
        fn(n, ctypes.byref(s), 0, ctypes.addressof(x), 0, ctypes.addressof(y), 0, 1)
        return float(s.value)


@functools.cache
def ggml() -> Ggml:
    return Ggml()
