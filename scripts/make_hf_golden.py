#!/usr/bin/env python3
"""Float oracle for the qwen3moe forward pass: HF transformers' Qwen3MoeForCausalLM.

Builds a random-weight model (weights drawn with numpy from a fixed seed by
tests/qwen3moe_file.random_tensors, so the test rebuilds the identical F32 GGUF with gguf-py
without torch), loads the weights into transformers (norm_topk_prob=True, float32, CPU,
eager attention), runs several prompts of ≥ 64 positions and saves their logits with
everything needed to rebuild the GGUF:

    python scripts/make_hf_golden.py --out tests/golden

writes tests/golden/hf_qwen3moe_logits.npz (keys: shape_json, seed, prompts [P, L],
logits [P, L, V] float32, transformers_version). Needs torch and transformers.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import qwen3moe_file as qf

SEED = 20261129
N_PROMPTS = 4
PROMPT_LEN = 80


def hf_model(s: qf.Shape, t: dict[str, np.ndarray]) -> object:
    import torch
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    kw: dict[str, object] = dict(
        vocab_size=s.n_vocab,
        hidden_size=s.n_embd,
        intermediate_size=s.n_ff_exp * s.n_expert_used,
        moe_intermediate_size=s.n_ff_exp,
        num_hidden_layers=s.n_layer,
        num_attention_heads=s.n_head,
        num_key_value_heads=s.n_head_kv,
        head_dim=s.head_dim,
        num_experts=s.n_expert,
        num_experts_per_tok=s.n_expert_used,
        norm_topk_prob=True,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        rms_norm_eps=s.rms_eps,
        max_position_embeddings=s.n_ctx_train,
        tie_word_embeddings=False,
        attention_bias=False,
        rope_theta=s.rope_base,
    )
    cfg = Qwen3MoeConfig(**kw)
    # transformers ≥ 5 keeps the RoPE base in rope_parameters.
    rp = getattr(cfg, "rope_parameters", None)
    if isinstance(rp, dict):
        rp["rope_theta"] = s.rope_base
        rp.setdefault("rope_type", "default")
    cfg._attn_implementation = "eager"
    model = Qwen3MoeForCausalLM(cfg).to(torch.float32).eval()

    sd = model.state_dict()
    new: dict[str, np.ndarray] = {}

    def put(name: str, arr: np.ndarray) -> None:
        want = tuple(sd[name].shape)
        if arr.shape == want:
            new[name] = arr
        elif arr.ndim == 3 and arr.transpose(0, 2, 1).shape == want:
            new[name] = arr.transpose(0, 2, 1)
        else:
            raise SystemExit(f"{name}: have {arr.shape}, model wants {want}")

    put("model.embed_tokens.weight", t["token_embd.weight"])
    put("model.norm.weight", t["output_norm.weight"])
    put("lm_head.weight", t["output.weight"])
    for i in range(s.n_layer):
        g, h = f"blk.{i}.", f"model.layers.{i}."
        put(h + "input_layernorm.weight", t[g + "attn_norm.weight"])
        put(h + "post_attention_layernorm.weight", t[g + "ffn_norm.weight"])
        for a, b in [("q_proj", "attn_q"), ("k_proj", "attn_k"), ("v_proj", "attn_v")]:
            put(h + f"self_attn.{a}.weight", t[g + f"{b}.weight"])
        put(h + "self_attn.o_proj.weight", t[g + "attn_output.weight"])
        put(h + "self_attn.q_norm.weight", t[g + "attn_q_norm.weight"])
        put(h + "self_attn.k_norm.weight", t[g + "attn_k_norm.weight"])
        put(h + "mlp.gate.weight", t[g + "ffn_gate_inp.weight"])
        gate, up = t[g + "ffn_gate_exps.weight"], t[g + "ffn_up_exps.weight"]  # (E, F, H)
        down = t[g + "ffn_down_exps.weight"]  # (E, H, F)
        if h + "mlp.experts.gate_up_proj" in sd:  # fused (transformers ≥ 5): [E, 2F, H]
            put(h + "mlp.experts.gate_up_proj", np.concatenate([gate, up], axis=1))
            put(h + "mlp.experts.down_proj", down)
        else:
            for e in range(s.n_expert):
                put(h + f"mlp.experts.{e}.gate_proj.weight", gate[e])
                put(h + f"mlp.experts.{e}.up_proj.weight", up[e])
                put(h + f"mlp.experts.{e}.down_proj.weight", down[e])
    missing = set(sd) - set(new)
    if missing:
        raise SystemExit(f"weights not set: {sorted(missing)}")
    model.load_state_dict({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in new.items()})
    return model


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("tests/golden"))
    args = ap.parse_args()

    import torch
    import transformers

    torch.set_grad_enabled(False)
    s = qf.Shape()  # hidden 256, 4 layers, 16 experts top-4, head_dim 64, vocab 512
    t = qf.random_tensors(s, SEED)
    model = hf_model(s, t)
    rng = np.random.default_rng(SEED + 1)
    prompts = rng.integers(0, s.n_vocab - 3, (N_PROMPTS, PROMPT_LEN)).astype(np.int64)
    logits = np.stack(
        [model(torch.from_numpy(p[None])).logits[0].float().numpy() for p in prompts]  # type: ignore[operator]
    ).astype(np.float32)
    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out / "hf_qwen3moe_logits.npz"
    np.savez_compressed(
        out,
        shape_json=json.dumps(dataclasses.asdict(s)),
        seed=SEED,
        prompts=prompts,
        logits=logits,
        transformers_version=transformers.__version__,
    )
    print(f"wrote {out}: prompts {prompts.shape}, logits {logits.shape}, std {logits.std():.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
