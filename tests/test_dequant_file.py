"""A GGUF file whose tensors ggml itself quantized (ggml_quantize_chunk, the quantizer
llama-quantize uses, with an importance matrix where the type needs one), written by gguf-py's
GGUFWriter, then checked tensor by tensor: Strata's reader + dequantization against gguf-py's.

IQ2_XXS, IQ2_XS, IQ2_S, IQ1_S and IQ1_M are not quantized by ggml here: its one-time grid set-up
for them takes 5-50 s each on a small machine. Their tensors are random blocks with a finite f16
scale instead (their kernels are covered bit for bit by test_dequant.py)."""

from __future__ import annotations

from pathlib import Path

import ggml_oracle
import numpy as np
import numpy.typing as npt
from gguf import GGMLQuantizationType as T
from gguf import GGUFWriter
from gguf.constants import GGML_QUANT_SIZES
from gguf_dequant_check import check_file

QUANTIZED = [
    "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
    "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M", "IQ4_NL", "IQ4_XS",
    "TQ1_0", "TQ2_0", "MXFP4", "NVFP4", "Q1_0", "F16", "BF16",
]  # fmt: skip
SLOW_TO_QUANTIZE = {"IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ1_S", "IQ1_M"}
# Byte offset of the f16 d in the blocks filled at random (IQ1_M has no plain d field).
D_OFFSET = {"IQ2_XXS": 0, "IQ2_XS": 0, "IQ2_S": 0, "IQ1_S": 0}


def random_blocks(
    rng: np.random.Generator, name: str, rows: int, n_per_row: int
) -> npt.NDArray[np.uint8]:
    blck, size = GGML_QUANT_SIZES[T[name]]
    blocks = rng.integers(0, 256, size=(rows * n_per_row // blck, size), dtype=np.uint8)
    if name in D_OFFSET:
        d = np.float16(0.01).tobytes()
        blocks[:, D_OFFSET[name] : D_OFFSET[name] + 2] = np.frombuffer(d, dtype=np.uint8)
    return blocks.reshape(rows, -1)


def write_model(path: Path, ggml: ggml_oracle.Ggml) -> None:
    rng = np.random.default_rng(11)
    w = GGUFWriter(path, "qwen3moe")
    w.add_uint32("qwen3moe.block_count", 1)
    for name in QUANTIZED:
        # 3-D like an expert stack: (experts=2, rows=3, cols=512), ggml quantizes row by row.
        x = (rng.standard_normal((2, 3, 512)) * 0.05).astype(np.float32)
        if name in SLOW_TO_QUANTIZE:
            q = random_blocks(rng, name, rows=6, n_per_row=512)
        else:
            q = ggml_oracle.quantize(ggml, int(T[name]), x.reshape(6, 512))
        w.add_tensor(f"blk.0.{name.lower()}.weight", q.reshape(2, 3, -1), raw_dtype=T[name])
    w.add_tensor("f32.weight", rng.standard_normal((4, 64)).astype(np.float32))
    w.add_tensor("i32.weight", np.arange(16, dtype=np.int32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_ggml_quantized_file_matches_gguf_py(tmp_path: Path) -> None:
    ggml = ggml_oracle.load()
    assert ggml is not None, "llama-cpp-python (libggml-base), a test dependency, is missing"
    path = tmp_path / "quantized.gguf"
    write_model(path, ggml)
    r = check_file(path, ggml)
    assert r.problems == []
    assert sorted(r.checked) == sorted([*QUANTIZED, "F32"])
    assert r.refused == ["i32.weight"]
