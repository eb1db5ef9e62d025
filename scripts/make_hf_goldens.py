#!/usr/bin/env python3
"""Float-oracle goldens: HF transformers' models (float32, eager attention) with random weights,
for every family the engine runs.

    python scripts/make_hf_goldens.py
        [--which tiny,test,qwen2moe,mixtral,glm4moe,gptoss,qwen3next,qwen35moe,ernie45moe]
        [--llama-cpp DIR] [--root DIR]

- `tiny` → tests/data/hf_tiny_logits.npz: Qwen3MoeForCausalLM of `ModelSpec.tiny()` holding
  `modelgen.random_weights(spec, 0)` (the exact values `write_qwen3moe` puts in the tiny F32
  GGUF), converted by `strata.hfconvert.gguf_to_hf`; logits of seeded random token sequences
  with the ids and the spec key (a changed generator makes the goldens stale, and the test
  says so).
- `test` → tests/golden/hf_qwen3moe_logits.npz: the qwen3moe model tests' shape
  (tests/qwen3moe_file.py, vocabulary 512) with `random_tensors(shape, TEST_SEED)`; 4 prompts
  of 80 positions, saved with the shape and seed the test rebuilds the GGUF from.
- `qwen2moe`, `mixtral`, `glm4moe`, `gptoss`, `qwen3next`, `qwen35moe`, `ernie45moe` →
  tests/golden/<family>_f32.gguf and tests/golden/hf_<family>_logits.npz: a random tiny
  `Qwen2MoeForCausalLM` / `MixtralForCausalLM` / `Glm4MoeForCausalLM` / `GptOssForCausalLM` /
  `Qwen3NextForCausalLM` / `Qwen3_5MoeForCausalLM` / `Ernie4_5_MoeForCausalLM` (every weight
  drawn with numpy from a fixed seed in state-dict order: linear std 1/sqrt(fan_in) times the
  family's `SCALES`, embeddings std 1, norms near 1, biases std 0.1), saved with
  `save_pretrained` and converted to an F32 GGUF by llama.cpp's own converter
  (`conversion.get_model_class` from the llama.cpp tree DIR, e.g. the llama-cpp-python
  sdist's vendor/llama.cpp); only the vocabulary is the tests' toy byte-level BPE, written in
  place of the HF tokenizer these random models do not have. Saved: prompts [P, L], logits [P, L, V]
  float32, transformers_version, config_json.
Needs torch and transformers; strata's compiled core is not needed: only its pure-Python
modules are loaded. `--root` writes under another folder (to compare with the committed ones).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
import types
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent

try:
    import strata  # noqa: F401
except ImportError:  # no compiled core here: load the pure-Python modules only
    pkg = types.ModuleType("strata")
    pkg.__path__ = [str(ROOT / "python" / "strata")]
    sys.modules["strata"] = pkg

sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "scripts")]
import qwen3moe_file as qf  # noqa: E402
from strata.hfconvert import gguf_to_hf, hf_config  # noqa: E402
from strata.modelgen import ModelSpec, random_weights  # noqa: E402

TEST_SEED = 20261129
FAMILY_SEED = 20261202
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
    # Sliding-window attention on layer 0 (window 8 < the prompts' 64 positions), full on
    # layer 1; attention sinks; Q/K/V/O, router and expert biases; YaRN as gpt-oss's config
    # writes it but with the correction range truncated (`truncate`: llama.cpp's
    # ggml_rope_yarn_corr_dims always floors/ceils it and the GGUF does not carry the flag).
    "gptoss": (
        "GptOssForCausalLM",
        dict(
            head_dim=16,
            intermediate_size=32,
            num_local_experts=8,
            num_experts_per_tok=2,
            sliding_window=8,
            attention_bias=True,
            rope_parameters={
                "rope_type": "yarn",
                "rope_theta": 150000.0,
                "factor": 32.0,
                "beta_fast": 32.0,
                "beta_slow": 1.0,
                "truncate": True,
                "original_max_position_embeddings": 4096,
            },
        ),
    ),
    # One leading dense layer, two shared experts (one FFN of 2 × 32), softmax routing with
    # the selection bias (moe_statics, drawn like the other biases), NORM RoPE; the dense
    # width is 2 × 64 = 128 because llama.cpp's converter writes the shared experts' width
    # as intermediate_size / num_key_value_heads (= 64 = 2 × moe_intermediate_size here).
    "ernie45moe": (
        "Ernie4_5_MoeForCausalLM",
        dict(
            num_hidden_layers=3,
            intermediate_size=128,
            moe_intermediate_size=32,
            moe_k=2,
            moe_num_experts=8,
            moe_num_shared_experts=2,
            moe_layer_start_index=1,
            moe_layer_interval=1,
            use_bias=False,
            rope_parameters={"rope_theta": 1e6, "rope_type": "default"},
        ),
    ),
    # ERNIE 4.5's dense model (the MoE one's drafts: ERNIE-4.5-0.3B), tied embeddings as there
    "ernie45": (
        "Ernie4_5ForCausalLM",
        dict(
            intermediate_size=96,
            use_bias=False,
            tie_word_embeddings=True,
            rope_parameters={"rope_theta": 5e5, "rope_type": "default"},
        ),
    ),
    # Qwen3-VL's MoE language model (its vision tower, VISION below, is not converted): qwen3moe
    # with interleaved M-RoPE, whose sections (4, 2, 2 of the 8 rotated pairs) all get a text
    # token's one position.
    "qwen3vlmoe": (
        "Qwen3VLMoeForConditionalGeneration",
        dict(
            head_dim=16,
            intermediate_size=64,
            moe_intermediate_size=32,
            num_experts=8,
            num_experts_per_tok=2,
            decoder_sparse_step=1,
            mlp_only_layers=[],
            rope_parameters={
                "rope_theta": 1e6,
                "rope_type": "default",
                "mrope_section": [4, 2, 2],
                "mrope_interleaved": True,
            },
        ),
    ),
    # Hybrids (HYBRID below): Gated DeltaNet layers with full attention every second layer
    # (4 layers: 2 of each), 2 key heads shared by 4 value heads (the grouped / tiled V-head
    # orders differ), gated attention with partial RoPE (head_dim 32 × 0.25 = 8 rotated), a
    # sigmoid-gated shared expert beside softmax top-2 of 8.
    "qwen3next": (
        "Qwen3NextForCausalLM",
        dict(intermediate_size=64, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[]),
    ),
    # qwen35moe: separate q/k/v and z projections, its interleaved M-RoPE with sections
    # covering the 4 rotated pairs (text positions are equal in every section).
    "qwen35moe": (
        "Qwen3_5MoeForCausalLM",
        dict(rope_parameters={"mrope_section": [2, 1, 1], "mrope_interleaved": True}),
    ),
}
# Per family, std multipliers of weights by name (gpt-oss: expert pre-activations of a few
# units, so that the clamp at ±7 of its SwiGLU is reached).
SCALES: dict[str, dict[str, float]] = {"gptoss": {"gate_up_proj": 5.0}}
# Each family's seed offset (FAMILY_SEED + i): the one its committed goldens were made with
# (gpt-oss and qwen3next were added side by side and both took 3; different models, so the
# shared seed is harmless, and both files stay reproducible byte for byte).
SEED_INDEX = dict(
    qwen2moe=0,
    mixtral=1,
    glm4moe=2,
    gptoss=3,
    qwen3next=3,
    qwen35moe=4,
    qwen35moe_mtp=5,
    glm4moe_mtp=6,
    qwen3next_mtp=7,
    ernie45moe=8,
    qwen3vlmoe=9,
    ernie45=10,
)
# Vision-language families: the language model's keys are the text config, beside a tiny
# vision tower the converter leaves out.
VISION: dict[str, dict[str, Any]] = {
    "qwen3vlmoe": dict(
        depth=1,
        hidden_size=32,
        intermediate_size=64,
        num_heads=2,
        patch_size=4,
        out_hidden_size=64,
        num_position_embeddings=16,
        deepstack_visual_indexes=[0],
    ),
}
# Config classes not named after the model class.
CONFIG_CLASS = {
    "qwen35moe": "Qwen3_5MoeTextConfig",
    "qwen3vlmoe": "Qwen3VLMoeConfig",
}
HYBRIDS = ("qwen3next", "qwen35moe")
# What the hybrids share (their own keys go over it, rope_parameters merged).
HYBRID: dict[str, Any] = dict(
    num_hidden_layers=4,
    head_dim=32,
    moe_intermediate_size=32,
    shared_expert_intermediate_size=48,
    num_experts=8,
    num_experts_per_tok=2,
    full_attention_interval=2,
    linear_conv_kernel_dim=4,
    linear_key_head_dim=16,
    linear_value_head_dim=16,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    rope_parameters={"rope_theta": 1e6, "partial_rotary_factor": 0.25, "rope_type": "default"},
)


def family_kwargs(name: str) -> dict[str, Any]:
    """The family's config: COMMON, HYBRID for the hybrids, then its own keys."""
    kw = FAMILIES[name][1]
    if name not in HYBRIDS:
        return {**COMMON, **kw}
    rope = {**HYBRID["rope_parameters"], **kw.get("rope_parameters", {})}
    return {**COMMON, **HYBRID, **kw, "rope_parameters": rope}


def randomize(model: Any, seed: int, scales: dict[str, float] | None = None) -> None:
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
        a = a * next((v for k, v in (scales or {}).items() if name.endswith(k)), 1.0)
        new[name] = torch.from_numpy(a.astype(np.float32))
    model.load_state_dict(new)


def convert(llama_cpp: Path, src: Path, dst: Path, name: str, no_mtp: bool = False) -> None:
    """llama.cpp's converter on `src`, with the toy vocabulary in place of a HF tokenizer
    (`no_mtp`: as `--no-mtp`, for the hybrids, whose converter otherwise expects MTP
    weights)."""
    sys.path[:0] = [str(llama_cpp), str(llama_cpp / "gguf-py")]
    import gguf
    import torch
    from conversion import ModelBase, get_model_architecture, get_model_class
    from conversion.base import ModelType

    hparams = ModelBase.load_hparams(src, False)
    cls = get_model_class(get_model_architecture(hparams, ModelType.TEXT), mmproj=False)
    if no_mtp:
        # A random model without MTP weights: the converter's `--no-mtp`.
        cls = type(cls.__name__, (cls,), {"no_mtp": True, "model_arch": cls.model_arch})

    def toy_vocab() -> None:
        n_vocab = hparams.get("vocab_size") or hparams["text_config"]["vocab_size"]
        qf.vocab_of(n_vocab).add_to_writer(m.gguf_writer)

    with torch.inference_mode():
        m = cls(src, gguf.LlamaFileType.ALL_F32, dst, eager=True, model_name=name)
        m.set_vocab = toy_vocab  # the converter's own writer, our vocabulary
        m.write()


def hf_model(spec: ModelSpec, weights: dict[str, np.ndarray]) -> Any:
    """transformers' Qwen3MoeForCausalLM of `spec` holding the GGUF-named `weights`."""
    import torch
    import transformers

    cfg = transformers.Qwen3MoeConfig(**hf_config(spec))
    rp = getattr(cfg, "rope_parameters", None)  # transformers ≥ 5 keeps the RoPE base here
    if isinstance(rp, dict):
        rp["rope_theta"] = spec.rope_freq_base
        rp.setdefault("rope_type", "default")
    cfg._attn_implementation = "eager"
    model = transformers.Qwen3MoeForCausalLM(cfg).float().eval()
    keys = set(model.state_dict())
    hf = gguf_to_hf(weights, spec, fused=any("gate_up_proj" in k for k in keys))
    if keys != set(hf):
        raise SystemExit(f"state dict mismatch: {sorted(keys ^ set(hf))[:8]}")
    model.load_state_dict({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in hf.items()})
    return model


def logits_of(model: Any, ids: np.ndarray) -> np.ndarray:
    import torch

    with torch.no_grad():
        return model(torch.from_numpy(ids[None].astype(np.int64))).logits[0].float().numpy()


def tiny(seqs: int, length: int, root: Path) -> Path:
    import transformers

    spec = ModelSpec.tiny()
    model = hf_model(spec, random_weights(spec, 0))
    rng = np.random.default_rng(1)
    out: dict[str, np.ndarray] = {"spec_key": np.array(spec.key(0, "f32"))}
    for i in range(seqs):
        ids = rng.integers(0, spec.n_vocab - 8, length)  # ordinary tokens, no pads
        out[f"ids{i}"] = ids
        out[f"logits{i}"] = logits_of(model, ids)
    path = root / "tests/data/hf_tiny_logits.npz"
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(path, transformers=np.array(transformers.__version__), **out)
    return path


def test_shape(root: Path) -> Path:
    import transformers

    s = qf.Shape()  # hidden 256, 4 layers, 16 experts top-4, head_dim 64, vocab 512
    model = hf_model(s.spec(), qf.random_tensors(s, TEST_SEED))
    rng = np.random.default_rng(TEST_SEED + 1)
    prompts = rng.integers(0, s.n_vocab - 3, (4, 80)).astype(np.int64)
    logits = np.stack([logits_of(model, p) for p in prompts]).astype(np.float32)
    path = root / "tests/golden/hf_qwen3moe_logits.npz"
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(
        path,
        shape_json=json.dumps(dataclasses.asdict(s)),
        seed=TEST_SEED,
        prompts=prompts,
        logits=logits,
        transformers_version=transformers.__version__,
    )
    return path


def hf_family_model(name: str, seed: int) -> tuple[Any, Any]:
    """(config, model): the family's transformers model (float32, eager attention) with
    `randomize`'s weights from `seed`."""
    import torch
    import transformers

    cls_name = FAMILIES[name][0]
    cfg_name = CONFIG_CLASS.get(name, cls_name.replace("ForCausalLM", "Config"))
    if name in VISION:
        cfg = getattr(transformers, cfg_name)(
            text_config=family_kwargs(name), vision_config=VISION[name], tie_word_embeddings=False
        )
    else:
        cfg = getattr(transformers, cfg_name)(**family_kwargs(name))
    cfg._attn_implementation = "eager"
    model = getattr(transformers, cls_name)(cfg).to(torch.float32).eval()
    randomize(model, seed, SCALES.get(name))
    return cfg, model


def experts_as_released(d: Path) -> None:
    """Qwen3-VL's stacked experts in the layout of its released checkpoints, which llama.cpp's
    converter reads: transformers 5 saves gate_up_proj [E, 2F, H] and down_proj [E, H, F]; the
    released files hold [E, H, 2F] and [E, F, H]."""
    from safetensors.torch import load_file, save_file

    for f in d.glob("*.safetensors"):
        sd = load_file(f)
        for k in sd:
            if k.endswith(("mlp.experts.down_proj", "mlp.experts.gate_up_proj")):
                sd[k] = sd[k].permute(0, 2, 1).contiguous()
        save_file(sd, f, metadata={"format": "pt"})


def family(name: str, llama_cpp: Path | None, root: Path) -> Path:
    import transformers

    if llama_cpp is None:
        raise SystemExit(f"{name}: --llama-cpp DIR (a llama.cpp tree with its converter) is needed")
    i = SEED_INDEX[name]
    kw = family_kwargs(name)
    _, model = hf_family_model(name, FAMILY_SEED + i)
    out = root / "tests" / "golden"
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as d:
        model.save_pretrained(d)
        if name in VISION:
            experts_as_released(Path(d))
        hybrid = name in HYBRIDS
        convert(llama_cpp, Path(d), out / f"{name}_f32.gguf", f"strata-test-{name}", hybrid)
    rng = np.random.default_rng(FAMILY_SEED + 100 + i)
    prompts = rng.integers(0, COMMON["vocab_size"] - 8, (N_PROMPTS, PROMPT_LEN))
    logits = np.stack([logits_of(model, p) for p in prompts])
    path = out / f"hf_{name}_logits.npz"
    np.savez_compressed(
        path,
        prompts=prompts,
        logits=logits.astype(np.float32),
        transformers_version=np.array(transformers.__version__),
        config_json=np.array(json.dumps(kw)),
    )
    return path


def mtp_family(name: str, llama_cpp: Path | None, root: Path) -> Path:
    """`qwen35moe_mtp`, `glm4moe_mtp` → tests/golden/<name>_f32.gguf and
    tests/golden/mtp_<family>.npz: the family golden's config with one MTP / NextN layer.
    transformers has no module for these layers (it drops them on load), so their weights are
    written beside the saved model as the released checkpoints name them, drawn as
    `randomize` draws: Qwen3.5's `mtp.fc` (H, 2H), `mtp.pre_fc_norm_{embedding,hidden}`,
    `mtp.norm`, `mtp.layers.0.*` (`mtp_num_hidden_layers` 1); GLM-4.5's
    `model.layers.{N}.{eh_proj, enorm, hnorm, shared_head.norm, shared_head.head,
    embed_tokens}` and the decoder layer's own (`num_nextn_predict_layers` 1). The decoder
    layer's names and shapes are those of the trunk's last full-attention MoE layer.
    llama.cpp's converter writes them as `blk.{N}.nextn.*` / `blk.{N}.*` with
    `nextn_predict_layers` 1. The oracle is llama.cpp's own MTP graph (scripts/mtp_oracle.py)
    over that file: per prompt the MTP logits of every position [L, V] and one chained draft
    step's [V] (at CHAIN_AT + 1)."""
    import safetensors.torch
    import torch
    from mtp_oracle import mtp_logits  # type: ignore[import-not-found]

    if llama_cpp is None:
        raise SystemExit(f"{name}: --llama-cpp DIR (a llama.cpp tree with its converter) is needed")
    i = SEED_INDEX[name]
    base = name.removesuffix("_mtp")
    kw = family_kwargs(base)
    cfg, model = hf_family_model(base, FAMILY_SEED + i)
    n = kw["num_hidden_layers"]
    h, v = kw["hidden_size"], kw["vocab_size"]
    rng = np.random.default_rng(FAMILY_SEED + 200 + i)
    if base == "glm4moe":
        src, dst = f"model.layers.{n - 1}.", f"model.layers.{n}."
        extra = {
            f"{dst}eh_proj.weight": (h, 2 * h),
            f"{dst}enorm.weight": (h,),
            f"{dst}hnorm.weight": (h,),
            f"{dst}shared_head.norm.weight": (h,),
            f"{dst}shared_head.head.weight": (v, h),
            f"{dst}embed_tokens.weight": (v, h),
        }
        count = {"num_nextn_predict_layers": 1}
    else:
        types = getattr(cfg, "layer_types", None) or []
        full = max(j for j, t in enumerate(types) if t == "full_attention")
        src, dst = f"model.layers.{full}.", "mtp.layers.0."
        extra = {
            "mtp.fc.weight": (h, 2 * h),
            "mtp.pre_fc_norm_embedding.weight": (h,),
            "mtp.pre_fc_norm_hidden.weight": (h,),
            "mtp.norm.weight": (h,),
        }
        count = {"mtp_num_hidden_layers": 1}
    shapes = {
        f"{dst}{k[len(src) :]}": tuple(t.shape)
        for k, t in model.state_dict().items()
        if k.startswith(src)
    }
    shapes |= extra
    mtp = {}
    for k in sorted(shapes):
        shape = shapes[k]
        if k.endswith("norm.weight") or "layernorm" in k:
            a = 1.0 + 0.1 * rng.standard_normal(shape)
        elif "embed_tokens" in k:
            a = rng.standard_normal(shape)
        elif k.endswith(".bias") or k.endswith("e_score_correction_bias"):
            a = 0.1 * rng.standard_normal(shape)
        else:
            a = rng.standard_normal(shape) / np.sqrt(shape[-1])
        mtp[k] = torch.from_numpy(a.astype(np.float32))
    if base == "glm4moe":  # its converter takes a NextN layer's experts one by one
        gu, dn = mtp.pop(f"{dst}mlp.experts.gate_up_proj"), mtp.pop(f"{dst}mlp.experts.down_proj")
        f = gu.shape[1] // 2  # gate_up_proj [E, 2F, H], down_proj [E, H, F]
        for x in range(gu.shape[0]):
            e = f"{dst}mlp.experts.{x}."
            mtp[e + "gate_proj.weight"] = gu[x, :f].contiguous()
            mtp[e + "up_proj.weight"] = gu[x, f:].contiguous()
            mtp[e + "down_proj.weight"] = dn[x].contiguous()
    out = root / "tests" / "golden"
    out.mkdir(parents=True, exist_ok=True)
    gguf_path = out / f"{name}_f32.gguf"
    with tempfile.TemporaryDirectory() as d:
        model.save_pretrained(d)
        st = Path(d) / "model.safetensors"
        sd = safetensors.torch.load_file(st)
        safetensors.torch.save_file({**sd, **mtp}, st, metadata={"format": "pt"})
        cj = Path(d) / "config.json"
        conf = json.loads(cj.read_text())
        conf.update(count)
        cj.write_text(json.dumps(conf))
        convert(llama_cpp, Path(d), gguf_path, f"strata-test-{name}")
    rng = np.random.default_rng(FAMILY_SEED + 100 + i)
    prompts = rng.integers(0, COMMON["vocab_size"] - 8, (N_PROMPTS, PROMPT_LEN))
    pairs = [mtp_logits(str(gguf_path), p, CHAIN_AT) for p in prompts]
    path = out / f"mtp_{base}.npz"
    np.savez_compressed(
        path,
        prompts=prompts,
        logits=np.stack([a for a, _ in pairs]),
        chain_at=CHAIN_AT,
        chained=np.stack([b for _, b in pairs]),
        config_json=np.array(json.dumps({**kw, **count})),
    )
    return path


CHAIN_AT = 40  # the MTP golden's chained draft step runs at position CHAIN_AT + 1
MTP_GOLDENS = ("qwen35moe_mtp", "glm4moe_mtp", "qwen3next_mtp")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--which", default="tiny,test," + ",".join(FAMILIES))
    ap.add_argument("--seqs", type=int, default=3, help="tiny: sequences")
    ap.add_argument("--len", type=int, default=64, help="tiny: tokens per sequence")
    ap.add_argument("--llama-cpp", type=Path, default=None, help="the families' converter tree")
    ap.add_argument("--root", type=Path, default=ROOT, help="write under ROOT/tests/...")
    a = ap.parse_args()
    for w in a.which.split(","):
        if w == "tiny":
            path = tiny(a.seqs, a.len, a.root)
        elif w == "test":
            path = test_shape(a.root)
        elif w in FAMILIES:
            path = family(w, a.llama_cpp, a.root)
        elif w in MTP_GOLDENS:
            path = mtp_family(w, a.llama_cpp, a.root)
        else:
            raise SystemExit(f"--which: unknown golden {w!r} (tiny, test, {', '.join(FAMILIES)})")
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
