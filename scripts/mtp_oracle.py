#!/usr/bin/env python3
"""llama.cpp's own MTP / NextN draft head as the oracle of Strata's (`model::mtp`).

    python scripts/mtp_oracle.py FILE.gguf            # prints the logits of a few positions

Through llama-cpp-python's bindings of llama.cpp's C API (the `llama_batch_ext` /
`llama_process` API and the staging `llama_set_embeddings_nextn` /
`llama_get_embeddings_nextn_ith` of src/llama-ext.h, exported C++-mangled), the way
common/speculative.cpp's `draft-mtp` driver runs it:

- both contexts keep an F32 KV cache (llama.cpp's default F16 one rounds keys and values);
- a target context on the file (`load_mtp`) gives, per position p, h_p: the trunk's hidden
  state after the output norm (`h_nextn`);
- an MTP context (`LLAMA_CONTEXT_TYPE_MTP`, the `DECODER_MTP` graph of the family) runs the
  pairs (x_p, h_{p-1}) at position p, h_{-1} = 0 (the driver's first `pending_h`): its row p
  is the MTP logits after position p, i.e. its guess of x_{p+2};
- a chained draft step runs (x_{n+1}, h'_n) at position n+1, h'_n being the MTP's own
  `h_nextn` of row n (what the driver feeds its second and later draft steps).

`mtp_logits(path, prompt, chain_at)` returns (logits [L, V], chained logits [V]).
"""

from __future__ import annotations

import ctypes
import sys
from pathlib import Path

import numpy as np


def _ext(lib: ctypes.CDLL) -> tuple[ctypes._CFuncPtr, ctypes._CFuncPtr]:
    # C++ names of llama-ext.h's staging API (not extern "C" in this llama.cpp)
    set_nextn = lib._Z26llama_set_embeddings_nextnP13llama_contextbb
    set_nextn.argtypes = [ctypes.c_void_p, ctypes.c_bool, ctypes.c_bool]
    set_nextn.restype = None
    get_ith = lib._Z30llama_get_embeddings_nextn_ithP13llama_contexti
    get_ith.argtypes = [ctypes.c_void_p, ctypes.c_int32]
    get_ith.restype = ctypes.POINTER(ctypes.c_float)
    return set_nextn, get_ith


def mtp_logits(path: str, prompt: np.ndarray, chain_at: int) -> tuple[np.ndarray, np.ndarray]:
    import llama_cpp as lc

    lib = lc.llama_cpp._lib
    set_nextn, get_ith = _ext(lib)
    lc.llama_backend_init()
    mp = lc.llama_model_default_params()
    mp.load_mtp = True
    model = lc.llama_model_load_from_file(path.encode(), mp)
    if not model:
        raise SystemExit(f"llama.cpp could not load {path}")
    if lc.llama_model_n_layer_nextn(model) < 1:
        raise SystemExit(f"{path}: no MTP / NextN layer")
    n_vocab = lc.llama_vocab_n_tokens(lc.llama_model_get_vocab(model))
    L = len(prompt)

    def ctx_params(mtp: bool, other: object = None) -> object:
        cp = lc.llama_context_default_params()
        cp.n_ctx = max(256, L + 8)
        cp.n_batch = cp.n_ubatch = max(256, L + 8)
        cp.n_threads = cp.n_threads_batch = 2
        cp.type_k = cp.type_v = 0  # GGML_TYPE_F32: an F32 KV cache (float logits)
        cp.flash_attn_type = 0  # off: ggml's flash attention rounds to F16 on the CPU
        if mtp:
            cp.ctx_type = 1  # LLAMA_CONTEXT_TYPE_MTP
            cp.n_rs_seq = 0
            cp.ctx_other = other
        return cp

    tgt = lc.llama_init_from_model(model, ctx_params(False))
    set_nextn(tgt, True, False)
    dft = lc.llama_init_from_model(model, ctx_params(True, tgt))
    set_nextn(dft, True, True)
    n_embd = lc.llama_model_n_embd(model)

    def run(ctx: object, rows: list[tuple[int, int, np.ndarray | None]]) -> None:
        b = lc.llama_batch_ext_init(ctx)
        keep = []
        for tok, pos, h in rows:
            idx = lc.llama_batch_ext_add_token(b, 0, int(tok))
            p = (ctypes.c_int32 * 4)(pos, pos, pos, pos)
            lc.llama_batch_ext_set_pos(b, idx, p)
            if h is not None:
                keep.append(h)
                e = lc.llama_embd(h.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), 1, n_embd)
                assert lc.llama_batch_ext_set_embd_token(b, idx, e)
            lc.llama_batch_ext_set_output_logits(b, idx, True)
        rc = lc.llama_process(ctx, 1, b)  # LLAMA_PROCESS_TYPE_DECODE
        lc.llama_batch_ext_free(b)
        if rc != 0:
            raise SystemExit(f"llama_process: {rc}")

    # the target over the prompt: h_p for every p
    run(tgt, [(int(t), p, None) for p, t in enumerate(prompt)])
    h = np.stack([np.ctypeslib.as_array(get_ith(tgt, p), (n_embd,)).copy() for p in range(L)])
    # the MTP over (x_p, h_{p-1}), h_{-1} = 0
    hin = [np.zeros(n_embd, np.float32)] + [np.ascontiguousarray(h[p]) for p in range(L - 1)]
    run(dft, [(int(t), p, hin[p]) for p, t in enumerate(prompt[: chain_at + 1])])
    out = np.stack(
        [
            np.ctypeslib.as_array(lc.llama_get_logits_ith(dft, p), (n_vocab,)).copy()
            for p in range(chain_at + 1)
        ]
    )
    h_mtp = np.ascontiguousarray(np.ctypeslib.as_array(get_ith(dft, chain_at), (n_embd,)).copy())
    # a chained draft step at chain_at + 1 on the MTP's own hidden state
    run(dft, [(int(prompt[chain_at + 1]), chain_at + 1, h_mtp)])
    chained = np.ctypeslib.as_array(lc.llama_get_logits_ith(dft, 0), (n_vocab,)).copy()
    # the rest of the prompt's rows, on the true hidden states again
    mem = lc.llama_get_memory(dft)
    lc.llama_memory_seq_rm(mem, 0, chain_at + 1, -1)
    rest = [(int(prompt[p]), p, hin[p]) for p in range(chain_at + 1, L)]
    run(dft, rest)
    tail = np.stack(
        [
            np.ctypeslib.as_array(lc.llama_get_logits_ith(dft, i), (n_vocab,)).copy()
            for i in range(len(rest))
        ]
    )
    lc.llama_free(dft)
    lc.llama_free(tgt)
    lc.llama_model_free(model)
    return np.concatenate([out, tail]).astype(np.float32), chained.astype(np.float32)


if __name__ == "__main__":
    ids = np.arange(1, 17) * 7 % 400
    lg, ch = mtp_logits(sys.argv[1], ids, 8)
    print(Path(sys.argv[1]).name, lg.shape, lg[:3, :5], ch[:5])
