"""Importance matrices for llama.cpp's quantizer, computed from the model by llama.cpp itself.

The IQ1/IQ2 types (and mixes that use them) need an importance matrix: for every weight matrix,
the mean of the squared input activations per input column (per expert for the 3-D expert
tensors), over calibration text. This runs the model in llama.cpp (llama-cpp-python) with an
eval callback that sees each matrix multiplication's input, the quantity llama-imatrix
collects, and returns the dictionary `strata.modelgen.quantize(imatrix=...)` takes.

The callback reads ggml tensors through ctypes. The `ggml_tensor` layout below is checked
against ggml's own accessors (ggml_get_name, ggml_get_data, ggml_nelements) on every tensor
seen, so a layout change is an error, never a silent misread.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path
from typing import Any

import numpy as np

GGML_MAX_DIMS = 4
GGML_MAX_OP_PARAMS = 64
GGML_MAX_SRC = 10
GGML_MAX_NAME = 64
GGML_TYPE_F32 = 0
GGML_TYPE_I32 = 26


class GGMLTensor(ctypes.Structure):
    """struct ggml_tensor (ggml.h)."""


GGMLTensor._fields_ = [
    ("type", ctypes.c_int),
    ("buffer", ctypes.c_void_p),
    ("ne", ctypes.c_int64 * GGML_MAX_DIMS),
    ("nb", ctypes.c_size_t * GGML_MAX_DIMS),
    ("op", ctypes.c_int),
    ("op_params", ctypes.c_int32 * (GGML_MAX_OP_PARAMS // 4)),
    ("flags", ctypes.c_int32),
    ("src", ctypes.POINTER(GGMLTensor) * GGML_MAX_SRC),
    ("view_src", ctypes.POINTER(GGMLTensor)),
    ("view_offs", ctypes.c_size_t),
    ("data", ctypes.c_void_p),
    ("name", ctypes.c_char * GGML_MAX_NAME),
    ("extra", ctypes.c_void_p),
    ("padding", ctypes.c_char * 8),
]


class ImatrixError(RuntimeError):
    """The importance matrix could not be computed."""


def _ggml_base() -> ctypes.CDLL:
    import llama_cpp

    lib = ctypes.CDLL(str(Path(llama_cpp.__file__).parent / "lib" / "libggml-base.so"))
    tp = ctypes.POINTER(GGMLTensor)
    lib.ggml_get_name.argtypes, lib.ggml_get_name.restype = [tp], ctypes.c_char_p
    lib.ggml_get_data.argtypes, lib.ggml_get_data.restype = [tp], ctypes.c_void_p
    lib.ggml_nelements.argtypes, lib.ggml_nelements.restype = [tp], ctypes.c_int64
    lib.ggml_nbytes.argtypes, lib.ggml_nbytes.restype = [tp], ctypes.c_size_t
    lib.ggml_op_name.argtypes, lib.ggml_op_name.restype = [ctypes.c_int], ctypes.c_char_p
    lib.ggml_backend_tensor_get.argtypes = [tp, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t]
    lib.ggml_backend_tensor_get.restype = None
    return lib


class _Collector:
    """Sums of squared activations per weight (per expert for MUL_MAT_ID) and row counts."""

    def __init__(self, lib: ctypes.CDLL, weights: set[str]) -> None:
        self.lib = lib
        self.weights = weights
        self.sums: dict[str, np.ndarray[Any, Any]] = {}
        self.counts: dict[str, np.ndarray[Any, Any]] = {}
        self.error: str | None = None
        self.seen = 0

    def _check(self, t: Any) -> None:
        lib = self.lib
        ok = (
            lib.ggml_get_name(t) == t.contents.name
            and lib.ggml_get_data(t) == t.contents.data
            and lib.ggml_nelements(t) == int(np.prod(list(t.contents.ne)))
        )
        if not ok:
            raise ImatrixError("ggml_tensor layout differs from the one this module assumes")

    def _read(self, t: Any) -> np.ndarray[Any, Any]:
        """The tensor as an array of numpy shape (ne3, ne2, ne1, ne0), whatever its strides."""
        self._check(t)
        c = t.contents
        if c.type not in (GGML_TYPE_F32, GGML_TYPE_I32):
            raise ImatrixError(f"activation tensor {c.name!r} has ggml type {c.type}")
        nbytes = int(self.lib.ggml_nbytes(t))
        buf = np.empty(nbytes, dtype=np.uint8)
        self.lib.ggml_backend_tensor_get(t, buf.ctypes.data, 0, nbytes)
        dt = np.float32 if c.type == GGML_TYPE_F32 else np.int32
        shape = tuple(int(x) for x in reversed(c.ne))
        strides = tuple(int(x) for x in reversed(c.nb))
        arr = np.lib.stride_tricks.as_strided(buf.view(dt), shape=shape, strides=strides)
        return np.array(arr)

    def want(self, t: Any) -> bool:
        c = t.contents
        op = self.lib.ggml_op_name(c.op)
        if op not in (b"MUL_MAT", b"MUL_MAT_ID") or not c.src[0]:
            return False
        return c.src[0].contents.name.decode(errors="replace") in self.weights

    def observe(self, t: Any) -> None:
        c = t.contents
        w = c.src[0]
        name = w.contents.name.decode()
        k = int(w.contents.ne[0])
        x = self._read(c.src[1])  # (ne3, ne2, ne1, K)
        if x.shape[-1] != k:
            raise ImatrixError(f"{name}: activation width {x.shape[-1]} != {k}")
        if self.lib.ggml_op_name(c.op) == b"MUL_MAT":
            sq = (x.reshape(-1, k).astype(np.float64)) ** 2
            self.sums[name] = self.sums.get(name, 0) + sq.sum(axis=0)
            self.counts[name] = self.counts.get(name, 0) + np.array([sq.shape[0]])
        else:
            n_exp = int(w.contents.ne[2])
            ids = self._read(c.src[2])[0, 0]  # (T, n_used) expert ids
            xs = x[0]  # (T, ne11, K); ne11 is n_used or 1 (broadcast)
            s = self.sums.setdefault(name, np.zeros((n_exp, k)))
            n = self.counts.setdefault(name, np.zeros(n_exp))
            for slot in range(ids.shape[1]):
                rows = xs[:, slot % xs.shape[1], :].astype(np.float64) ** 2  # (T, K)
                e = ids[:, slot]
                np.add.at(s, e, rows)
                np.add.at(n, e, 1)
        self.seen += 1

    def result(self) -> dict[str, np.ndarray[Any, Any]]:
        out = {}
        for name, s in self.sums.items():
            n = self.counts[name]
            if s.ndim == 1:
                out[name] = (s / max(float(n[0]), 1.0)).astype(np.float32)
                continue
            # experts no calibration token reached get the mean of the others
            used = n > 0
            mean = s[used].sum(axis=0) / n[used].sum() if used.any() else np.ones(s.shape[1])
            per = np.where(used[:, None], s / np.maximum(n, 1)[:, None], mean[None, :])
            out[name] = per.astype(np.float32).ravel()  # expert-major, length K × n_expert
        return out


def calibration_text() -> str:
    from strata._corpus import corpus_lines

    return "\n".join(corpus_lines(repeat=1, synthetic=200))


def compute_imatrix(
    model_path: str | os.PathLike[str],
    text: str | None = None,
    n_ctx: int = 256,
    max_chunks: int = 8,
) -> dict[str, np.ndarray[Any, Any]]:
    """Run the (unquantized) model over calibration text in llama.cpp, chunk by chunk of
    `n_ctx` tokens, and return {weight name: mean squared input activation per column}
    (length ne0 × n_expert for expert tensors, expert-major)."""
    import gguf
    import llama_cpp

    from strata.modelgen import _captured_llama_log
    from strata.tokenizer import Tokenizer

    path = os.fspath(model_path)
    reader = gguf.GGUFReader(path)
    weights = {t.name for t in reader.tensors if len(t.shape) >= 2}
    del reader
    tok = Tokenizer.from_gguf(path)
    ids = tok.encode(text if text is not None else calibration_text(), parse_special=False)
    chunks = [ids[i : i + n_ctx] for i in range(0, len(ids), n_ctx)][:max_chunks]
    chunks = [c for c in chunks if len(c) > 1]
    if not chunks:
        raise ImatrixError("calibration text is too short")

    lib = _ggml_base()
    col = _Collector(lib, weights)

    tensor_p = ctypes.POINTER(GGMLTensor)

    def cb(addr: Any, ask: bool, user_data: Any) -> bool:
        try:
            t = ctypes.cast(addr, tensor_p)
            if ask:
                return col.want(t)
            if col.error is None:
                col.observe(t)
        except Exception as e:  # an exception must not cross into C
            col.error = f"{type(e).__name__}: {e}"
        return True

    cb_c = llama_cpp.ggml_backend_sched_eval_callback(cb)
    log: list[str] = []
    with _captured_llama_log(log):
        _run(llama_cpp, path, chunks, n_ctx, cb_c, col)
    if col.seen == 0:
        raise ImatrixError("no matrix multiplication was observed")
    return col.result()


def _run(
    llama_cpp: Any, path: str, chunks: list[list[int]], n_ctx: int, cb_c: Any, col: Any
) -> None:
    mparams = llama_cpp.llama_model_default_params()
    model = llama_cpp.llama_model_load_from_file(path.encode(), mparams)
    if not model:
        raise ImatrixError(f"llama.cpp could not load {path}")
    try:
        cparams = llama_cpp.llama_context_default_params()
        cparams.n_ctx = n_ctx
        cparams.n_batch = n_ctx
        cparams.n_ubatch = n_ctx
        cparams.cb_eval = cb_c
        cparams.cb_eval_user_data = None
        ctx = llama_cpp.llama_init_from_model(model, cparams)
        if not ctx:
            raise ImatrixError("llama.cpp could not create a context")
        try:
            for chunk in chunks:
                llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(ctx), True)
                arr = (llama_cpp.llama_token * len(chunk))(*chunk)
                rc = llama_cpp.llama_decode(ctx, llama_cpp.llama_batch_get_one(arr, len(chunk)))
                if rc != 0:
                    raise ImatrixError(f"llama_decode failed (rc={rc})")
                if col.error:
                    raise ImatrixError(col.error)
        finally:
            llama_cpp.llama_free(ctx)
    finally:
        llama_cpp.llama_model_free(model)
