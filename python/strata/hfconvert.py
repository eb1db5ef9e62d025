"""HF transformers Qwen3-MoE ↔ GGUF qwen3moe: config and tensor-name mapping (docs/FORMATS.md §4).

For the float oracle: build `Qwen3MoeForCausalLM` from `hf_config(spec)` and load
`gguf_to_hf(weights, spec)` into it, or convert an HF state dict with `hf_to_gguf` and write it
with `strata.modelgen.write_qwen3moe(..., weights=...)`. Arrays are numpy, in numpy shapes;
torch is not needed here.

Expert weights: GGUF stacks experts on the slowest axis, gate/up `(E, I, H)` and down
`(E, H, I)`. HF checkpoints hold per-expert `mlp.experts.{e}.{gate,up,down}_proj.weight`
(`[I, H]`, `[H, I]`); transformers v5 modules hold the fused `mlp.experts.gate_up_proj`
`[E, 2I, H]` (gate first) and `mlp.experts.down_proj` `[E, H, I]`. Both are read; `fused`
chooses which `gguf_to_hf` writes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from strata.modelgen import ModelSpec

Array = np.ndarray[Any, Any]

# per-layer names: GGUF suffix ↔ HF suffix (after "model.layers.N.")
_LAYER = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate_inp.weight": "mlp.gate.weight",
}
_EXPERTS = (("gate_exps", "gate_proj"), ("up_exps", "up_proj"), ("down_exps", "down_proj"))
# the dense qwen3 FFN: GGUF ffn_{gate,up,down}.weight ↔ HF mlp.{gate,up,down}_proj.weight
_DENSE = (("gate", "gate_proj"), ("up", "up_proj"), ("down", "down_proj"))
_GLOBAL = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}


def hf_config(spec: ModelSpec, vocab_size: int | None = None) -> dict[str, Any]:
    """Keyword arguments for transformers' `Qwen3MoeConfig` describing the same model (every
    layer MoE, top-k renormalized as llama.cpp does); for arch "qwen3", `Qwen3Config`'s."""
    common = {
        "vocab_size": vocab_size if vocab_size is not None else spec.n_vocab,
        "hidden_size": spec.n_embd,
        "num_hidden_layers": spec.n_layer,
        "num_attention_heads": spec.n_head,
        "num_key_value_heads": spec.n_head_kv,
        "head_dim": spec.head_dim,
        "rms_norm_eps": spec.rms_eps,
        "rope_theta": spec.rope_freq_base,
        "max_position_embeddings": spec.n_ctx_train,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "hidden_act": "silu",
    }
    if spec.arch == "qwen3":
        return {**common, "intermediate_size": spec.n_ff_exp}
    return {
        **common,
        "intermediate_size": spec.n_ff_exp * spec.n_expert_used,
        "moe_intermediate_size": spec.n_ff_exp,
        "num_experts": spec.n_expert,
        "num_experts_per_tok": spec.n_expert_used,
        "norm_topk_prob": True,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
    }


def spec_from_hf_config(cfg: Mapping[str, Any], vocab: str = "small") -> ModelSpec:
    """The ModelSpec of an HF Qwen3-MoE config (a config.json dict), or of a dense Qwen3 one
    (no `num_experts`: arch "qwen3", the FFN width in n_ff_exp)."""
    dense = "num_experts" not in cfg
    if not dense and (cfg.get("mlp_only_layers") or cfg.get("decoder_sparse_step", 1) != 1):
        raise ValueError("config has dense layers; qwen3moe in llama.cpp is MoE in every layer")
    rope = cfg.get("rope_theta")
    if rope is None:  # transformers v5 keeps it under rope_parameters
        rope = (cfg.get("rope_parameters") or {}).get("rope_theta", 10000.0)
    return ModelSpec(
        n_embd=int(cfg["hidden_size"]),
        n_layer=int(cfg["num_hidden_layers"]),
        n_expert=1 if dense else int(cfg["num_experts"]),
        n_expert_used=1 if dense else int(cfg["num_experts_per_tok"]),
        n_ff_exp=int(cfg["intermediate_size" if dense else "moe_intermediate_size"]),
        n_head=int(cfg["num_attention_heads"]),
        n_head_kv=int(cfg.get("num_key_value_heads") or cfg["num_attention_heads"]),
        head_dim=int(cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]),
        n_vocab=int(cfg["vocab_size"]),
        n_ctx_train=int(cfg.get("max_position_embeddings", 4096)),
        rope_freq_base=float(rope),
        rms_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        vocab=vocab,
        arch="qwen3" if dense else "qwen3moe",
    )


def hf_to_gguf(state: Mapping[str, Array], spec: ModelSpec) -> dict[str, Array]:
    """HF state dict (numpy arrays) → GGUF tensor names and shapes. Per-expert or fused
    experts; a missing lm_head falls back to the embeddings (tied)."""
    out: dict[str, Array] = {}
    for g, h in _GLOBAL.items():
        if h in state:
            out[g] = np.asarray(state[h])
    if "output.weight" not in out:
        out["output.weight"] = out["token_embd.weight"]
    ff = spec.n_ff_exp
    for i in range(spec.n_layer):
        p, hp = f"blk.{i}.", f"model.layers.{i}."
        for g, h in _LAYER.items():
            if spec.arch == "qwen3" and g == "ffn_gate_inp.weight":
                continue
            out[p + g] = np.asarray(state[hp + h])
        if spec.arch == "qwen3":
            for g, h in _DENSE:
                out[p + f"ffn_{g}.weight"] = np.asarray(state[f"{hp}mlp.{h}.weight"])
            continue
        fused = hp + "mlp.experts.gate_up_proj"
        if fused in state:
            gu = np.asarray(state[fused])  # (E, 2I, H): gate rows first, then up
            out[p + "ffn_gate_exps.weight"] = gu[:, :ff, :]
            out[p + "ffn_up_exps.weight"] = gu[:, ff:, :]
            out[p + "ffn_down_exps.weight"] = np.asarray(state[hp + "mlp.experts.down_proj"])
        else:
            for g, h in _EXPERTS:
                per = [state[f"{hp}mlp.experts.{e}.{h}.weight"] for e in range(spec.n_expert)]
                out[p + f"ffn_{g}.weight"] = np.stack([np.asarray(x) for x in per])
    return out


def gguf_to_hf(
    weights: Mapping[str, Array], spec: ModelSpec, fused: bool = False
) -> dict[str, Array]:
    """GGUF tensor names (numpy shapes) → HF state dict names; experts per expert, or in
    transformers v5's fused form when `fused`."""
    out: dict[str, Array] = {h: np.asarray(weights[g]) for g, h in _GLOBAL.items()}
    for i in range(spec.n_layer):
        p, hp = f"blk.{i}.", f"model.layers.{i}."
        for g, h in _LAYER.items():
            if spec.arch == "qwen3" and g == "ffn_gate_inp.weight":
                continue
            out[hp + h] = np.asarray(weights[p + g])
        if spec.arch == "qwen3":
            for g, h in _DENSE:
                out[f"{hp}mlp.{h}.weight"] = np.asarray(weights[p + f"ffn_{g}.weight"])
            continue
        gate = np.asarray(weights[p + "ffn_gate_exps.weight"])  # (E, I, H)
        up = np.asarray(weights[p + "ffn_up_exps.weight"])  # (E, I, H)
        down = np.asarray(weights[p + "ffn_down_exps.weight"])  # (E, H, I)
        if fused:
            out[hp + "mlp.experts.gate_up_proj"] = np.concatenate([gate, up], axis=1)
            out[hp + "mlp.experts.down_proj"] = down
        else:
            for e in range(spec.n_expert):
                out[f"{hp}mlp.experts.{e}.gate_proj.weight"] = gate[e]
                out[f"{hp}mlp.experts.{e}.up_proj.weight"] = up[e]
                out[f"{hp}mlp.experts.{e}.down_proj.weight"] = down[e]
    return out
