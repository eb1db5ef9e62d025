"""Small qwen3moe GGUF files for the model tests: the test shapes, their random weights (numpy,
seeded) and a minimal byte-level BPE tokenizer that llama.cpp accepts, written by
`strata.modelgen.write_arrays` (gguf-py's writer with the metadata llama.cpp uses, docs/FORMATS.md
§4). Shared by the model tests and scripts/make_hf_goldens.py.

Tensors are given in numpy order (ggml ne reversed): token_embd (V, H), attn_q (Nh·D, H),
attn_k/attn_v (Nkv·D, H), attn_output (H, Nh·D), ffn_gate_inp (E, H), ffn_gate_exps /
ffn_up_exps (E, F, H), ffn_down_exps (E, H, F), norms (H,) or (D,).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

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
    for i in range(s.n_layer):
        p = f"blk.{i}."
        t[p + "attn_norm.weight"] = norm(h)
        t[p + "attn_q.weight"] = lin(s.n_head * d, h)
        t[p + "attn_k.weight"] = lin(s.n_head_kv * d, h)
        t[p + "attn_v.weight"] = lin(s.n_head_kv * d, h)
        t[p + "attn_output.weight"] = lin(h, s.n_head * d)
        t[p + "attn_q_norm.weight"] = norm(d)
        t[p + "attn_k_norm.weight"] = norm(d)
        t[p + "ffn_norm.weight"] = norm(h)
        t[p + "ffn_gate_inp.weight"] = lin(e, h) * np.float32(router_scale)
        t[p + "ffn_gate_exps.weight"] = lin(e, f, h)
        t[p + "ffn_up_exps.weight"] = lin(e, f, h)
        t[p + "ffn_down_exps.weight"] = lin(e, h, f)
    return t


def write(
    path: Path,
    s: Shape,
    tensors: dict[str, np.ndarray],
    arch: str = "qwen3moe",
    drop: tuple[str, ...] = (),
) -> Path:
    """Writes the file; `drop` names metadata keys to leave out (for refusal tests)."""
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
    )


def quantize(src: Path, dst: Path, ftype_name: str) -> Path:
    """Quantizes with llama.cpp's own quantizer (`LLAMA_FTYPE_MOSTLY_<ftype_name>`)."""
    return modelgen.quantize(src, dst, ftype_name, nthread=2)
