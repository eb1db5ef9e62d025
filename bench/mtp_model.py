"""A small random qwen35moe with one MTP layer for `bench_spec.py mtp` (random weights: its
MTP layer knows nothing of its trunk), and its "bigram" copy (tests/test_mtp.py
`bigram_copy`: a trunk that predicts from the last token alone and an MTP layer that knows
it, so every draft is right: the speculation machinery at full acceptance).

    /work/wt-arch/.venv/bin/python bench/mtp_model.py --llama-cpp DIR OUT_DIR

Writes OUT_DIR/mtp-bench-{random,bigram}-{F32,Q8_0}.gguf: hidden 1024, 8 layers (full
attention every 4th), 8 query / 2 KV heads of 128, 32 experts top-4 of width 256, a shared
expert of 512, the tests' 512-token toy vocabulary; converted by llama.cpp's converter
(scripts/make_hf_goldens.py `mtp_family`), quantized by llama.cpp's quantizer.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "scripts"), str(ROOT / "tests")]

import make_hf_goldens as mk  # noqa: E402

SHAPE = dict(
    hidden_size=1024,
    num_hidden_layers=8,
    num_attention_heads=8,
    num_key_value_heads=2,
    head_dim=128,
    full_attention_interval=4,
    num_experts=32,
    num_experts_per_tok=4,
    moe_intermediate_size=256,
    shared_expert_intermediate_size=512,
    linear_num_key_heads=4,
    linear_num_value_heads=8,
    linear_key_head_dim=64,
    linear_value_head_dim=64,
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--llama-cpp", type=Path, required=True)
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    mk.HYBRID.update({k: v for k, v in SHAPE.items() if k in mk.HYBRID})
    mk.COMMON.update({k: v for k, v in SHAPE.items() if k not in mk.HYBRID})
    mk.N_PROMPTS = 1  # the oracle's logits are not needed; one prompt keeps it short
    mk.mtp_family("qwen35moe_mtp", a.llama_cpp, a.out / "tmp")
    src = a.out / "tmp/tests/golden/qwen35moe_mtp_f32.gguf"
    from qwen3moe_file import quantize
    from test_mtp import bigram_copy

    random = src.rename(a.out / "mtp-bench-random-F32.gguf")
    bigram = bigram_copy(a.out / "mtp-bench-bigram-F32.gguf", random)
    for f in (random, bigram):
        q = quantize(f, f.with_name(f.name.replace("F32", "Q8_0")), "Q8_0")
        print(f"wrote {f} and {q}")


if __name__ == "__main__":
    main()
