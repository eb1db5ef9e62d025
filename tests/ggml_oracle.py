"""ggml's own reference dequantization (`ggml_get_type_traits(t)->to_float`) through ctypes on
llama-cpp-python's libggml-base, used as a second oracle next to gguf-py.

The struct layout is `struct ggml_type_traits` from the ggml.h installed with llama-cpp-python:
    const char *type_name; int64_t blck_size; int64_t blck_size_interleave; size_t type_size;
    bool is_quantized; ggml_to_float_t to_float; ggml_from_float_t from_float_ref;
`load()` checks the layout by reading back names and block sizes of known types.
"""

from __future__ import annotations

import ctypes
import importlib.util
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

# void (*ggml_to_float_t)(const void * x, float * y, int64_t k)
_TO_FLOAT = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.POINTER(ctypes.c_float), ctypes.c_int64)


class _Traits(ctypes.Structure):
    _fields_ = [
        ("type_name", ctypes.c_char_p),
        ("blck_size", ctypes.c_int64),
        ("blck_size_interleave", ctypes.c_int64),
        ("type_size", ctypes.c_size_t),
        ("is_quantized", ctypes.c_bool),
        ("to_float", ctypes.c_void_p),
        ("from_float_ref", ctypes.c_void_p),
    ]


def library_path() -> Path | None:
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent / "lib" / "libggml-base.so"
    return path if path.exists() else None


class Ggml:
    def __init__(self, path: Path) -> None:
        self.lib: Any = ctypes.CDLL(str(path))
        self.lib.ggml_get_type_traits.restype = ctypes.POINTER(_Traits)
        self.lib.ggml_get_type_traits.argtypes = [ctypes.c_int]
        # Layout check: names and (block, bytes) of a few types whose values are fixed.
        known = [(0, b"f32", 1, 4), (8, b"q8_0", 32, 34), (23, b"iq4_xs", 256, 136)]
        for ty, name, blck, size in known:
            tr = self.traits(ty)
            got = (tr.type_name, tr.blck_size, tr.type_size)
            assert got == (name, blck, size), f"ggml_type_traits layout mismatch: {got}"

    def traits(self, ty: int) -> _Traits:
        tr: _Traits = self.lib.ggml_get_type_traits(ty).contents
        return tr

    def dequantize(self, ty: int, blocks: npt.NDArray[np.uint8]) -> npt.NDArray[np.float32]:
        tr = self.traits(ty)
        assert tr.to_float, f"ggml has no to_float for type {ty}"
        data = np.ascontiguousarray(blocks, dtype=np.uint8).reshape(-1)
        assert data.size % tr.type_size == 0
        n = data.size // tr.type_size * tr.blck_size
        out = np.empty(n, dtype=np.float32)
        fn = _TO_FLOAT(tr.to_float)
        fn(data.ctypes.data, out.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), n)
        return out


def load() -> Ggml | None:
    path = library_path()
    return Ggml(path) if path is not None else None


def _quantize_setup(g: Ggml) -> None:
    if getattr(g, "_quantize_ready", False):
        return
    g.lib.ggml_quantize_chunk.restype = ctypes.c_size_t
    g.lib.ggml_quantize_chunk.argtypes = [
        ctypes.c_int,
        ctypes.c_void_p,
        ctypes.c_void_p,
        ctypes.c_int64,
        ctypes.c_int64,
        ctypes.c_int64,
        ctypes.c_void_p,
    ]
    g.lib.ggml_quantize_requires_imatrix.restype = ctypes.c_bool
    g.lib.ggml_quantize_requires_imatrix.argtypes = [ctypes.c_int]
    g._quantize_ready = True  # type: ignore[attr-defined]


def quantize(g: Ggml, ty: int, rows: npt.NDArray[np.float32]) -> npt.NDArray[np.uint8]:
    """ggml's own quantizer (`ggml_quantize_chunk`, what llama-quantize calls) on a 2-D
    float32 array (nrows, n_per_row); returns (nrows, row_bytes) uint8. Types that need an
    importance matrix get one made of the column mean squares."""
    _quantize_setup(g)
    rows = np.ascontiguousarray(rows, dtype=np.float32)
    nrows, n_per_row = rows.shape
    tr = g.traits(ty)
    assert n_per_row % tr.blck_size == 0
    out = np.zeros((nrows, n_per_row // tr.blck_size * tr.type_size), dtype=np.uint8)
    imatrix = None
    if g.lib.ggml_quantize_requires_imatrix(ty):
        imatrix = np.ascontiguousarray((rows * rows).mean(axis=0) + 1e-3, dtype=np.float32)
    written = g.lib.ggml_quantize_chunk(
        ty,
        rows.ctypes.data,
        out.ctypes.data,
        0,
        nrows,
        n_per_row,
        None if imatrix is None else imatrix.ctypes.data,
    )
    assert written == out.nbytes, (ty, written, out.nbytes)
    return out
