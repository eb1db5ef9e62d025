"""Writes a published MoE model's shape at full width and truncated depth, random weights,
for the CPU benchmarks of the newer families (issue 18: Qwen3.5-35B-A3B, F32, with the test
writer that the oracle tests check against llama.cpp, tests/qwen3moe_file.py; issue 19:
gpt-oss-20b and GLM-4.5-Air, F16, streamed by bench/family_stream.py in the same layouts);
quantize it with llama.cpp's llama-quantize afterwards (MXFP4_MOE, Q4_K_M).

    python bench/write_family_model.py qwen35moe-35b-a3b OUT.gguf [--layers 4]
        [--experts 32] [--vocab 32768]    # a smaller file, every other width as published
    python bench/write_family_model.py gpt-oss-20b OUT.gguf --layers 4
    python bench/write_family_model.py glm-4.5-air OUT.gguf --layers 4   # 1 dense + 3 MoE

Shapes (from the published configs): Qwen3.5-35B-A3B — hidden 2048, 16 query / 2 KV heads
of 256 (a quarter rotated, M-RoPE sections 11/11/10), 256 experts of 512 (top 8) and a shared
expert of 512, vocabulary 248,320, Gated DeltaNet with 16 key / 32 value heads of 128 and a
conv of 4, full attention every 4th layer (so 4 layers = 3 DeltaNet + 1 attention).
gpt-oss-20b — hidden 2880, 64 query / 8 KV heads of 64, 32 experts of 2880 (top 4), vocabulary
201,088, a 128-position window on alternating layers (layer 0 windowed), sinks, YaRN ×32 over
4096. GLM-4.5-Air — hidden 4096, 96 query / 8 KV heads of 128 (half rotated), one leading
dense layer of 10,944, then 128 experts of 1408 (top 8, sigmoid, normalized, scale 1) and a
shared expert of 1408, vocabulary 151,552 (the NextN layer left out).
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

STREAMED = {
    "gpt-oss-20b": dict(
        n_embd=2880, n_head=64, n_head_kv=8, head_dim=64, n_expert=32, n_expert_used=4,
        n_ff_exp=2880, n_vocab=201088, window=128, rope_base=150000.0, rope_factor=32.0,
        rope_orig_ctx=4096, n_ctx_train=131072, rms_eps=1e-5,
    ),
    "glm-4.5-air": dict(
        n_embd=4096, n_head=96, n_head_kv=8, head_dim=128, n_expert=128, n_expert_used=8,
        n_ff_exp=1408, n_ff_shexp=1408, n_dense_lead=1, n_ff_dense=10944, n_rot=64,
        n_vocab=151552, rope_base=1e6, rms_eps=1e-5, n_ctx_train=131072, arch="glm4moe",
    ),
}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("shape", choices=sorted([*SHAPES, *STREAMED]))
    ap.add_argument("out", type=Path)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--experts", type=int, help="fewer routed experts (top-k kept): a smaller file")
    ap.add_argument("--vocab", type=int, help="a smaller vocabulary: a smaller file")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument(
        "--balanced",
        action="store_true",
        help="glm-4.5-air's router at scale 1 and its selection bias at std 0.01 (default 4 and "
        "0.1: decisive, for greedy comparisons, but the sigmoid saturates and the bias picks "
        "nearly the same experts for every token); for cache benchmarks (the hybrid tier)",
    )
    a = ap.parse_args()
    over = {"n_expert": a.experts, "n_vocab": a.vocab}
    if a.shape in STREAMED:
        import family_stream as fs

        d = {**STREAMED[a.shape], **{k: v for k, v in over.items() if v}}
        if a.shape == "gpt-oss-20b":
            head, plan = fs.gptoss_header(d, a.layers), fs.gptoss_plan(d, a.layers)
            fs.write(a.out, "gpt-oss", head, plan, a.seed)
        else:
            g = qf.Shape(n_layer=a.layers, **d)  # type: ignore[arg-type]
            plan = fs.glm4moe_plan(g, *((1.0, 0.01) if a.balanced else ()))
            fs.write(a.out, "glm4moe", fs.glm4moe_header(g), plan, a.seed)
        print(f"wrote {a.out} ({a.out.stat().st_size / 2**30:.1f} GiB)")
        return
    shape = {**SHAPES[a.shape], **{k: v for k, v in over.items() if v}}
    s = qf.Shape(n_layer=a.layers, **shape)  # type: ignore[arg-type]
    qf.write(a.out, s, qf.random_tensors(s, 7))
    print(f"wrote {a.out} ({a.out.stat().st_size / 2**30:.1f} GiB)")


if __name__ == "__main__":
    main()
