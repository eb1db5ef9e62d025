"""Small qwen3moe GGUF files for the model tests: the test shapes, their random weights (numpy,
seeded) and a minimal byte-level BPE tokenizer that llama.cpp accepts, written by
`strata.modelgen.write_arrays` (gguf-py's writer with the metadata llama.cpp uses, docs/FORMATS.md
§4). Shared by the model tests and scripts/make_hf_goldens.py.

`Shape.arch` also writes the other MoE families the engine runs (hybrids included:
`qwen3next`, `qwen35moe`, see `hybrid_tensors`), in the layout llama.cpp's converter writes
them (tests/test_model_families.py checks it against the converter's own files in
tests/golden): `qwen2moe` (Q/K/V biases, no q/k norms, a shared expert
ffn_{gate,up,down}_shexp (Fs, H)/(H, Fs) with its gate ffn_gate_inp_shexp (1, H)) and the
Mixtral-style `llama` (no q/k norms, expert width in feed_forward_length).

Tensors are given in numpy order (ggml ne reversed): token_embd (V, H), attn_q (Nh·D, H),
attn_k/attn_v (Nkv·D, H), attn_output (H, Nh·D), ffn_gate_inp (E, H), ffn_gate_exps /
ffn_up_exps (E, F, H), ffn_down_exps (E, H, F), norms (H,) or (D,).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from strata import modelgen
from strata.vocabgen import GGUFVocab

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


@dataclass
class Shape:
    n_layer: int = 4
    n_embd: int = 256
    n_head: int = 4
    n_head_kv: int = 2
    head_dim: int = 64
    n_expert: int = 16
    n_expert_used: int = 4
    n_ff_exp: int = 256
    n_vocab: int = 512
    rms_eps: float = 1e-6
    rope_base: float = 1e6
    n_ctx_train: int = 4096
    rope_scaling: str = "none"  # "none", "linear" or "yarn"
    rope_factor: float = 1.0
    rope_orig_ctx: int = 0
    arch: str = "qwen3moe"  # "qwen3moe", "qwen2moe", "llama", "glm4moe", "ernie4_5-moe", …
    n_ff_shexp: int = 0  # the shared expert's width (qwen2moe, glm4moe, ernie4_5-moe)
    # glm4moe, ernie4_5-moe: leading dense layers and their FFN width; glm4moe: rotated dims,
    # expert weight scale
    n_dense_lead: int = 0
    n_ff_dense: int = 0
    n_rot: int = 0  # 0: head_dim
    weights_scale: float = 1.0
    n_nextn: int = 0  # glm4moe, hybrids: NextN (MTP) layers stored after the trunk
    tied: bool = False  # no output.weight: the head is token_embd (ernie4_5)
    # qwen3next / qwen35moe (hybrids): full attention in every `attn_every`-th layer, Gated
    # DeltaNet in the others with conv width Kc, head size S, Nk key and Nv value heads
    attn_every: int = 4
    ssm_conv: int = 4
    ssm_state: int = 16
    ssm_groups: int = 2
    ssm_v_heads: int = 4
    n_ff: int = 0  # qwen3next: feed_forward_length as its converter writes it (unused)
    # qwen35moe: M-RoPE sections (t, h, w) of the rotated pairs, as Qwen3.5's [11, 11, 10]
    # covering every pair (a text token has one position in every section)
    mrope: tuple[int, int, int] = (2, 1, 1)

    def spec(self) -> modelgen.ModelSpec:
        """The same shapes as the product's model spec (the writer's and the HF oracle's)."""
        return modelgen.ModelSpec(
            n_embd=self.n_embd,
            n_layer=self.n_layer,
            n_expert=self.n_expert,
            n_expert_used=self.n_expert_used,
            n_ff_exp=self.n_ff_exp,
            n_head=self.n_head,
            n_head_kv=self.n_head_kv,
            head_dim=self.head_dim,
            n_vocab=self.n_vocab,
            n_ctx_train=self.n_ctx_train,
            rope_freq_base=self.rope_base,
            rms_eps=self.rms_eps,
            name="strata-test-qwen3moe",
        )


def byte_tokens() -> list[str]:
    """GPT-2's byte-to-unicode table, in byte order."""
    bs = list(range(ord("!"), ord("~") + 1))
    bs += list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    table = dict(zip(bs, cs, strict=True))
    return [chr(table[b]) for b in range(256)]


def vocab(n_vocab: int) -> tuple[list[str], list[int], list[str]]:
    """Tokens, token types and merges: 256 byte tokens, merged pairs of letters, then the
    specials (CONTROL) at the end."""
    toks = byte_tokens()
    merges: list[str] = []
    letters = "etaoinsrhl"
    for a in letters:
        for b in letters:
            if len(toks) >= n_vocab - len(SPECIALS):
                break
            merges.append(f"{a} {b}")
            toks.append(a + b)
    while len(toks) < n_vocab - len(SPECIALS):
        toks.append(f"[PAD{len(toks)}]")
    types = [1] * len(toks)
    for s in SPECIALS:
        toks.append(s)
        types.append(3)
    return toks, types, merges


def vocab_of(n_vocab: int) -> GGUFVocab:
    toks, types, merges = vocab(n_vocab)
    bos = toks.index("<|endoftext|>")
    return GGUFVocab(toks, types, merges, bos, toks.index("<|im_end|>"), bos, CHAT_TEMPLATE)


def random_tensors(s: Shape, seed: int, router_scale: float = 1.0) -> dict[str, np.ndarray]:
    """Random weights with the spread docs/test-models.md "Weight scales" gives: linear and
    router std 1/sqrt(fan_in), embeddings std 1, norm weights near 1. `router_scale`
    multiplies the router weights: trained routers are peaked, and a flat random one has many
    4th/5th-expert near-ties."""
    rng = np.random.default_rng(seed)

    def lin(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)

    def norm(n: int) -> np.ndarray:
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    h, d, e, f = s.n_embd, s.head_dim, s.n_expert, s.n_ff_exp
    t: dict[str, np.ndarray] = {
        "token_embd.weight": rng.standard_normal((s.n_vocab, h)).astype(np.float32),
        "output_norm.weight": norm(h),
        "output.weight": lin(s.n_vocab, h),
    }
    if s.tied:
        del t["output.weight"]
    if s.arch in HYBRIDS:
        return hybrid_tensors(s, t, rng, lin, norm, router_scale)
    for i in range(s.n_layer + s.n_nextn):
        p = f"blk.{i}."
        t[p + "attn_norm.weight"] = norm(h)
        t[p + "attn_q.weight"] = lin(s.n_head * d, h)
        t[p + "attn_k.weight"] = lin(s.n_head_kv * d, h)
        t[p + "attn_v.weight"] = lin(s.n_head_kv * d, h)
        t[p + "attn_output.weight"] = lin(h, s.n_head * d)
        if s.arch in ("qwen3moe", "qwen3vlmoe"):
            t[p + "attn_q_norm.weight"] = norm(d)
            t[p + "attn_k_norm.weight"] = norm(d)
        if s.arch == "glm4moe":
            for n, w in (("q", s.n_head * d), ("k", s.n_head_kv * d), ("v", s.n_head_kv * d)):
                t[p + f"attn_{n}.bias"] = (0.1 * rng.standard_normal(w)).astype(np.float32)
            t[p + "post_attention_norm.weight"] = norm(h)
            if i < s.n_dense_lead:
                swiglu(t, p + "ffn_{}.weight", s.n_ff_dense, h, lin)
                continue
            if i >= s.n_layer:  # a NextN layer: its own input projection and norms
                t[p + "nextn.eh_proj.weight"] = lin(h, 2 * h)
                t[p + "nextn.enorm.weight"] = norm(h)
                t[p + "nextn.hnorm.weight"] = norm(h)
            t[p + "exp_probs_b.bias"] = (0.1 * rng.standard_normal(e)).astype(np.float32)
            swiglu(t, p + "ffn_{}_shexp.weight", s.n_ff_shexp, h, lin)
        elif s.arch == "ernie4_5":  # dense: one SwiGLU FFN in every layer
            t[p + "ffn_norm.weight"] = norm(h)
            swiglu(t, p + "ffn_{}.weight", s.n_ff_dense, h, lin)
            continue
        elif s.arch == "ernie4_5-moe":
            t[p + "ffn_norm.weight"] = norm(h)
            if i < s.n_dense_lead:
                swiglu(t, p + "ffn_{}.weight", s.n_ff_dense, h, lin)
                continue
            # (1, E) as the converter writes HF's moe_statics (ggml [E, 1])
            t[p + "exp_probs_b.bias"] = (0.1 * rng.standard_normal((1, e))).astype(np.float32)
            swiglu(t, p + "ffn_{}_shexp.weight", s.n_ff_shexp, h, lin)
        else:
            t[p + "ffn_norm.weight"] = norm(h)
        t[p + "ffn_gate_inp.weight"] = lin(e, h) * np.float32(router_scale)
        t[p + "ffn_gate_exps.weight"] = lin(e, f, h)
        t[p + "ffn_up_exps.weight"] = lin(e, f, h)
        t[p + "ffn_down_exps.weight"] = lin(e, h, f)
        if s.arch == "qwen2moe":
            for n, w in (("q", s.n_head * d), ("k", s.n_head_kv * d), ("v", s.n_head_kv * d)):
                t[p + f"attn_{n}.bias"] = (0.1 * rng.standard_normal(w)).astype(np.float32)
            t[p + "ffn_gate_inp_shexp.weight"] = lin(1, h)
            t[p + "ffn_gate_shexp.weight"] = lin(s.n_ff_shexp, h)
            t[p + "ffn_up_shexp.weight"] = lin(s.n_ff_shexp, h)
            t[p + "ffn_down_shexp.weight"] = lin(h, s.n_ff_shexp)
    return t


HYBRIDS = ("qwen3next", "qwen35moe")


def swiglu(t: dict[str, np.ndarray], name: str, f: int, h: int, lin: Any) -> None:
    """A dense SwiGLU FFN's gate, up (F, H) and down (H, F), drawn in that order, into `t`
    under `name` with "{}" for the projection."""
    t[name.format("gate")] = lin(f, h)
    t[name.format("up")] = lin(f, h)
    t[name.format("down")] = lin(h, f)


def recurrent_layers(s: Shape) -> list[bool]:
    return [(i + 1) % s.attn_every != 0 for i in range(s.n_layer)]


def hybrid_tensors(
    s: Shape,
    t: dict[str, np.ndarray],
    rng: np.random.Generator,
    lin: Any,
    norm: Any,
    router_scale: float,
) -> dict[str, np.ndarray]:
    """A hybrid's layers as llama.cpp's converter writes them: DeltaNet layers attn_qkv (C, H)
    (C = 2·Nk·S + Nv·S), attn_gate (Nv·S, H), ssm_ba (2·Nv, H) (qwen3next) or ssm_beta /
    ssm_alpha (Nv, H) (qwen35moe), ssm_conv1d (C, Kc), ssm_dt.bias and ssm_a (Nv,) (A < 0),
    ssm_norm (S,), ssm_out (H, Nv·S); attention layers attn_q (Nh·2D, H) (q and its output
    gate), attn_k / attn_v, attn_output, q/k norms; every layer post_attention_norm, routed
    experts and a shared expert with its gate ffn_gate_inp_shexp (1, H)."""
    h, d, e, f = s.n_embd, s.head_dim, s.n_expert, s.n_ff_exp
    ss, nk, nv = s.ssm_state, s.ssm_groups, s.ssm_v_heads
    c, vd = 2 * nk * ss + nv * ss, nv * ss
    # the MTP layers after the trunk: full attention, MoE and their own input projection
    for i, rec in enumerate(recurrent_layers(s) + [False] * s.n_nextn):
        p = f"blk.{i}."
        if i >= s.n_layer:
            t[p + "nextn.eh_proj.weight"] = lin(h, 2 * h)
            t[p + "nextn.enorm.weight"] = norm(h)
            t[p + "nextn.hnorm.weight"] = norm(h)
            t[p + "nextn.shared_head_norm.weight"] = norm(h)
        t[p + "attn_norm.weight"] = norm(h)
        t[p + "post_attention_norm.weight"] = norm(h)
        if rec:
            t[p + "attn_qkv.weight"] = lin(c, h)
            t[p + "attn_gate.weight"] = lin(vd, h)
            if s.arch == "qwen3next":
                t[p + "ssm_ba.weight"] = lin(2 * nv, h)
            else:
                t[p + "ssm_beta.weight"] = lin(nv, h)
                t[p + "ssm_alpha.weight"] = lin(nv, h)
            t[p + "ssm_conv1d.weight"] = lin(c, s.ssm_conv)
            t[p + "ssm_dt.bias"] = (0.1 * rng.standard_normal(nv)).astype(np.float32)
            t[p + "ssm_a"] = -np.exp(0.5 * rng.standard_normal(nv)).astype(np.float32)
            t[p + "ssm_norm.weight"] = norm(ss)
            t[p + "ssm_out.weight"] = lin(h, vd)
        else:
            t[p + "attn_q.weight"] = lin(2 * s.n_head * d, h)
            t[p + "attn_k.weight"] = lin(s.n_head_kv * d, h)
            t[p + "attn_v.weight"] = lin(s.n_head_kv * d, h)
            t[p + "attn_output.weight"] = lin(h, s.n_head * d)
            t[p + "attn_q_norm.weight"] = norm(d)
            t[p + "attn_k_norm.weight"] = norm(d)
        t[p + "ffn_gate_inp.weight"] = lin(e, h) * np.float32(router_scale)
        t[p + "ffn_gate_exps.weight"] = lin(e, f, h)
        t[p + "ffn_up_exps.weight"] = lin(e, f, h)
        t[p + "ffn_down_exps.weight"] = lin(e, h, f)
        t[p + "ffn_gate_inp_shexp.weight"] = lin(1, h)
        t[p + "ffn_gate_shexp.weight"] = lin(s.n_ff_shexp, h)
        t[p + "ffn_up_shexp.weight"] = lin(s.n_ff_shexp, h)
        t[p + "ffn_down_shexp.weight"] = lin(h, s.n_ff_shexp)
    return t


def write(
    path: Path,
    s: Shape,
    tensors: dict[str, np.ndarray],
    arch: str | None = None,
    drop: tuple[str, ...] = (),
) -> Path:
    """Writes the file (of `arch`, else `s.arch`: the other families' own keys as llama.cpp's
    converter writes them, `family_keys`); `drop` names metadata keys to leave out (for
    refusal tests)."""
    arch = arch or s.arch
    scaling = None
    if s.rope_scaling != "none":
        scaling = modelgen.RopeScaling(s.rope_scaling, s.rope_factor, s.rope_orig_ctx)
    return modelgen.write_arrays(
        path,
        s.spec(),
        tensors,
        vocab=vocab_of(s.n_vocab),
        arch=arch,
        rope_scaling=scaling,
        drop=drop,
        extra=lambda w: family_keys(w, s, arch),
    )


def family_keys(w: Any, s: Shape, arch: str) -> None:
    """Sets the keys in which a family's file differs from qwen3moe's header (replacing it)."""
    kv = w.kv_data[0]

    def u32(key: str, v: int) -> None:
        kv.pop(f"{arch}.{key}", None)
        w.add_uint32(f"{arch}.{key}", v)

    if arch == "llama":  # the converter's Mixtral: the expert width is feed_forward_length
        u32("feed_forward_length", s.n_ff_exp)
        u32("vocab_size", s.n_vocab)
    elif arch == "qwen2moe":
        u32("expert_shared_feed_forward_length", s.n_ff_shexp)
    elif arch == "glm4moe":  # as the converter writes Glm4MoeForCausalLM
        u32("feed_forward_length", s.n_ff_dense)
        u32("expert_shared_count", s.n_ff_shexp // s.n_ff_exp)
        u32("leading_dense_block_count", s.n_dense_lead)
        u32("expert_gating_func", 2)  # sigmoid
        w.add_float32(f"{arch}.expert_weights_scale", s.weights_scale)
        w.add_bool(f"{arch}.expert_weights_norm", True)
        u32("expert_group_count", 1)
        u32("expert_group_used_count", 1)
        u32("rope.dimension_count", s.n_rot or s.head_dim)
        u32("block_count", s.n_layer + s.n_nextn)
        u32("nextn_predict_layers", s.n_nextn)
    elif arch == "qwen3vlmoe":  # as the converter writes Qwen3VLMoeForConditionalGeneration
        w.add_array(f"{arch}.rope.dimension_sections", [*s.mrope, 0])
        u32("n_deepstack_layers", 1)
        u32("feed_forward_length", s.n_ff)
    elif arch == "ernie4_5":  # as the converter writes Ernie4_5ForCausalLM: no experts
        u32("feed_forward_length", s.n_ff_dense)
        for key in ("expert_count", "expert_used_count", "expert_feed_forward_length"):
            kv.pop(f"{arch}.{key}", None)
    elif arch == "ernie4_5-moe":  # as the converter writes Ernie4_5_MoeForCausalLM
        u32("feed_forward_length", s.n_ff_dense)
        u32("interleave_moe_layer_step", 1)
        u32("leading_dense_block_count", s.n_dense_lead)
        u32("expert_shared_count", s.n_ff_shexp // s.n_ff_exp)
        u32("expert_shared_feed_forward_length", s.n_ff_shexp)
    elif arch in HYBRIDS:  # as the converter writes Qwen3NextForCausalLM / Qwen3_5Moe…
        kv.pop(f"{arch}.feed_forward_length", None)
        if arch == "qwen3next":
            u32("feed_forward_length", s.n_ff)
        u32("expert_shared_feed_forward_length", s.n_ff_shexp)
        u32("rope.dimension_count", s.n_rot or s.head_dim)
        u32("ssm.conv_kernel", s.ssm_conv)
        u32("ssm.state_size", s.ssm_state)
        u32("ssm.group_count", s.ssm_groups)
        u32("ssm.time_step_rank", s.ssm_v_heads)
        u32("ssm.inner_size", s.ssm_v_heads * s.ssm_state)
        w.add_array(f"{arch}.attention.recurrent_layers", recurrent_layers(s) + [False] * s.n_nextn)
        if s.n_nextn:
            u32("block_count", s.n_layer + s.n_nextn)
            u32("nextn_predict_layers", s.n_nextn)
        # The converter writes its default 4 when HF's config carries layer_types only.
        u32("full_attention_interval", 4)
        if arch == "qwen35moe":  # its M-RoPE sections, over the rotated pairs
            w.add_array(f"{arch}.rope.dimension_sections", [*s.mrope, 0])


# The family tests' names (tests/test_model_families.py, the GPU family tests) and their
# `general.architecture`.
FAMILY_ARCH = {
    "qwen2moe": "qwen2moe",
    "mixtral": "llama",
    "glm4moe": "glm4moe",
    "qwen3next": "qwen3next",
    "qwen35moe": "qwen35moe",
    "ernie45moe": "ernie4_5-moe",
    "qwen3vlmoe": "qwen3vlmoe",
    "ernie45": "ernie4_5",
}


def family_shape(fam: str) -> Shape:
    """The family files' shape (hidden 256, 8 experts top-2; `family_file` in
    tests/test_model_families.py writes it with `random_tensors(shape, 5)`): gguf-py alone,
    so the GPU machine, which has no llama.cpp, writes the same F32 file."""
    s = Shape(n_layer=2, n_expert=8, n_expert_used=2, arch=FAMILY_ARCH[fam])
    if fam == "qwen2moe":
        return replace(s, n_ff_shexp=256)
    if fam == "glm4moe":
        return replace(
            s, n_layer=3, n_ff_shexp=256, n_dense_lead=1, n_ff_dense=512, n_rot=32,
            weights_scale=2.5,
        )  # fmt: skip
    if fam == "ernie45moe":
        return replace(s, n_layer=3, n_ff_shexp=512, n_dense_lead=1, n_ff_dense=512)
    if fam == "qwen3vlmoe":  # 32 rotated pairs in interleaved sections, as Qwen3-VL's 24/20/20
        return replace(s, n_ff=512, mrope=(12, 10, 10))
    if fam == "ernie45":  # dense, tied head (ERNIE-4.5-0.3B's layout)
        return replace(s, n_ff_dense=512, tied=True)
    if fam in HYBRIDS:  # the qwen3moe test width: 256-wide rows quantize as asked
        return replace(
            s, n_layer=4, n_ff_shexp=256, n_rot=16, ssm_state=64, n_ff=512, mrope=(3, 3, 2),
            attn_every=2, ssm_conv=4, ssm_groups=2, ssm_v_heads=4,
        )  # fmt: skip
    return s


def quantize(src: Path, dst: Path, ftype_name: str) -> Path:
    """Quantizes with llama.cpp's own quantizer (`LLAMA_FTYPE_MOSTLY_<ftype_name>`)."""
    return modelgen.quantize(src, dst, ftype_name, nthread=2)
