"""Writes a published MoE model's shape at full width and truncated depth, random F32 weights,
for the CPU benchmarks of the newer families (issue 18: Qwen3.5-35B-A3B), with the test
writer that the oracle tests check against llama.cpp (tests/qwen3moe_file.py); quantize it
with llama.cpp's llama-quantize afterwards.

    python bench/write_family_model.py qwen35moe-35b-a3b OUT.gguf [--layers 4]
        [--experts 32] [--vocab 32768]    # a smaller file, every other width as published

Shapes (from the published configs): Qwen3.5-35B-A3B — hidden 2048, 16 query / 2 KV heads
of 256 (a quarter rotated, M-RoPE sections 11/11/10), 256 experts of 512 (top 8) and a shared
expert of 512, vocabulary 248,320, Gated DeltaNet with 16 key / 32 value heads of 128 and a
conv of 4, full attention every 4th layer (so 4 layers = 3 DeltaNet + 1 attention).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import qwen3moe_file as qf

SHAPES = {
    "qwen35moe-35b-a3b": dict(
        n_embd=2048, n_head=16, n_head_kv=2, head_dim=256, n_expert=256, n_expert_used=8,
        n_ff_exp=512, n_ff_shexp=512, n_vocab=248320, rope_base=1e7, arch="qwen35moe",
        n_rot=64, mrope=(11, 11, 10), attn_every=4, ssm_conv=4, ssm_state=128,
        ssm_groups=16, ssm_v_heads=32, rms_eps=1e-6,
    ),
}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("shape", choices=sorted(SHAPES))
    ap.add_argument("out", type=Path)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--experts", type=int, help="fewer routed experts (top-k kept): a smaller file")
    ap.add_argument("--vocab", type=int, help="a smaller vocabulary: a smaller file")
    a = ap.parse_args()
    over = {"n_expert": a.experts, "n_vocab": a.vocab}
    shape = {**SHAPES[a.shape], **{k: v for k, v in over.items() if v}}
    s = qf.Shape(n_layer=a.layers, **shape)  # type: ignore[arg-type]
    qf.write(a.out, s, qf.random_tensors(s, 7))
    print(f"wrote {a.out} ({a.out.stat().st_size / 2**30:.1f} GiB)")


if __name__ == "__main__":
    main()
