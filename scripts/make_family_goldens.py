#!/usr/bin/env python3
"""Float oracles for the qwen2moe, Mixtral-style llama and glm4moe families: HF transformers'
models written to GGUF by llama.cpp's own converter.

    python scripts/make_family_goldens.py --llama-cpp DIR [--out tests/golden]

For each family, builds a random tiny `Qwen2MoeForCausalLM` / `MixtralForCausalLM` /
`Glm4MoeForCausalLM` (float32,
eager attention; every weight drawn with numpy from a fixed seed in state-dict order:
linear std 1/sqrt(fan_in), embeddings std 1, norms near 1, biases std 0.1), saves it with
`save_pretrained`, converts it with llama.cpp's converter (`conversion.get_model_class` from
the llama.cpp tree DIR, e.g. the llama-cpp-python sdist's vendor/llama.cpp: `pip download
--no-binary :all: --no-deps llama-cpp-python` and unpack) to an F32 GGUF, and runs several
prompts through the HF model. The converter writes every tensor and hyper-parameter; only
the vocabulary is the tests' toy byte-level BPE (`tests/qwen3moe_file.vocab`), written in
place of the HF tokenizer, which these random models do not have.

Writes tests/golden/<family>_f32.gguf (the converter's file) and
tests/golden/hf_<family>_logits.npz (prompts [P, L], logits [P, L, V] float32,
transformers_version, config_json). Needs torch and transformers.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

SEED = 20261202
N_PROMPTS = 3
PROMPT_LEN = 64
COMMON: dict[str, Any] = dict(
    vocab_size=512,
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    rms_norm_eps=1e-6,
    max_position_embeddings=4096,
    tie_word_embeddings=False,
)
FAMILIES: dict[str, tuple[str, dict[str, Any]]] = {
    # norm_topk_prob=False: llama.cpp's qwen2moe graph does not renormalize.
    "qwen2moe": (
        "Qwen2MoeForCausalLM",
        dict(
            intermediate_size=64,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=96,
            num_experts=8,
            num_experts_per_tok=2,
            norm_topk_prob=False,
            decoder_sparse_step=1,
            mlp_only_layers=[],
            rope_theta=1e6,
        ),
    ),
    "mixtral": (
        "MixtralForCausalLM",
        dict(intermediate_size=32, num_local_experts=8, num_experts_per_tok=2, rope_theta=1e6),
    ),
    # One leading dense layer, one shared expert, sigmoid routing with the selection bias
    # (e_score_correction_bias, drawn like the other biases), partial RoPE.
    "glm4moe": (
        "Glm4MoeForCausalLM",
        dict(
            num_hidden_layers=3,
            intermediate_size=96,
            moe_intermediate_size=32,
            n_routed_experts=8,
            n_shared_experts=1,
            num_experts_per_tok=2,
            n_group=1,
            topk_group=1,
            first_k_dense_replace=1,
            norm_topk_prob=True,
            routed_scaling_factor=2.5,
            attention_bias=True,
            use_qk_norm=False,
            num_nextn_predict_layers=0,
            rope_parameters={
                "rope_theta": 1e6,
                "partial_rotary_factor": 0.5,
                "rope_type": "default",
            },
        ),
    ),
}


def randomize(model: Any, seed: int) -> None:
    import torch

    rng = np.random.default_rng(seed)
    sd = model.state_dict()
    new = {}
    for name in sorted(sd):
        shape = tuple(sd[name].shape)
        if name.endswith("norm.weight") or "layernorm" in name:
            a = 1.0 + 0.1 * rng.standard_normal(shape)
        elif "embed_tokens" in name:
            a = rng.standard_normal(shape)
        elif name.endswith(".bias"):
            a = 0.1 * rng.standard_normal(shape)
        else:
            a = rng.standard_normal(shape) / np.sqrt(shape[-1])
        new[name] = torch.from_numpy(a.astype(np.float32))
    model.load_state_dict(new)


def convert(llama_cpp: Path, src: Path, dst: Path, name: str) -> None:
    """llama.cpp's converter on `src`, with the toy vocabulary in place of a HF tokenizer."""
    sys.path[:0] = [str(llama_cpp), str(llama_cpp / "gguf-py")]
    import gguf
    import qwen3moe_file as qf
    import torch
    from conversion import ModelBase, get_model_architecture, get_model_class
    from conversion.base import ModelType

    hparams = ModelBase.load_hparams(src, False)
    cls = get_model_class(get_model_architecture(hparams, ModelType.TEXT), mmproj=False)

    def toy_vocab() -> None:
        qf.vocab_of(hparams["vocab_size"]).add_to_writer(m.gguf_writer)

    with torch.inference_mode():
        m = cls(src, gguf.LlamaFileType.ALL_F32, dst, eager=True, model_name=name)
        m.set_vocab = toy_vocab  # the converter's own writer, our vocabulary
        m.write()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--llama-cpp", type=Path, required=True)
    ap.add_argument("--out", type=Path, default=ROOT / "tests" / "golden")
    a = ap.parse_args()
    import torch
    import transformers

    a.out.mkdir(parents=True, exist_ok=True)
    for i, (fam, (cls_name, kw)) in enumerate(FAMILIES.items()):
        cfg_cls = getattr(transformers, cls_name.replace("ForCausalLM", "Config"))
        cfg = cfg_cls(**{**COMMON, **kw})
        cfg._attn_implementation = "eager"
        model = getattr(transformers, cls_name)(cfg).to(torch.float32).eval()
        randomize(model, SEED + i)
        gguf_path = a.out / f"{fam}_f32.gguf"
        with tempfile.TemporaryDirectory() as d:
            model.save_pretrained(d)
            convert(a.llama_cpp, Path(d), gguf_path, f"strata-test-{fam}")
        rng = np.random.default_rng(SEED + 100 + i)
        prompts = rng.integers(0, COMMON["vocab_size"] - 8, (N_PROMPTS, PROMPT_LEN))
        with torch.no_grad():
            logits = np.stack([model(torch.tensor(p[None])).logits[0].numpy() for p in prompts])
        np.savez_compressed(
            a.out / f"hf_{fam}_logits.npz",
            prompts=prompts,
            logits=logits.astype(np.float32),
            transformers_version=np.array(transformers.__version__),
            config_json=np.array(json.dumps({**COMMON, **kw})),
        )
        print(f"{fam}: wrote {gguf_path} and its logits (transformers {transformers.__version__})")


if __name__ == "__main__":
    main()
