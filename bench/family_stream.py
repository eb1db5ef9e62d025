"""Streamed writers of the gpt-oss and glm4moe shapes at full width (bench/write_family_model.py):
one tensor in memory at a time (a GLM-4.5-Air layer's experts are 2.2 G weights), F16 matrices
and F32 norms, biases, sinks and routers, in the names and orientations llama.cpp's converter
writes (the layouts of tests/test_gpu_gptoss.py `write_f32` and tests/qwen3moe_file.py
`random_tensors`, which the oracle tests check against llama.cpp and HF).

Values: linear weights normal with std scale/sqrt(fan_in), embeddings std 1, norm weights near 1,
biases std 0.1 (docs/test-models.md "Weight scales"); routers scaled up so that routing is
decisive (a flat random router has many k-th/(k+1)-th expert near-ties).

Tensors are given in numpy order (ggml ne reversed).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import qwen3moe_file as qf
from strata import modelgen


@dataclass(frozen=True)
class T:
    """One tensor of the plan: numpy shape, kind ("lin", "vec", "embd"), and its scale (lin:
    std × sqrt(fan_in); vec: std) and mean (vec)."""

    name: str
    shape: tuple[int, ...]
    kind: str = "lin"
    scale: float = 1.0
    mean: float = 0.0

    @property
    def f16(self) -> bool:
        """Weight matrices F16; the router F32 (as llama-quantize keeps it), and biases F32
        whatever their rank (gpt-oss's per-expert biases are 2-D; ggml adds them in F32)."""
        n = self.name
        return len(self.shape) >= 2 and n.endswith(".weight") and "ffn_gate_inp" not in n


def gptoss_plan(d: dict[str, Any], layers: int) -> list[T]:
    """gpt-oss: Q/K/V/O biases, sinks, router with bias, experts with biases (E, F, H) /
    (E, H, F); the scales of tests/test_gpu_gptoss.py (decisive routing, moderate outputs)."""
    h, nh, nkv, hd = d["n_embd"], d["n_head"], d["n_head_kv"], d["head_dim"]
    e, f, v = d["n_expert"], d["n_ff_exp"], d["n_vocab"]
    out = [
        T("token_embd.weight", (v, h), "embd"),
        T("output_norm.weight", (h,), "vec", 0.1, 1.0),
        T("output.weight", (v, h), "lin", 4.0),
    ]
    for i in range(layers):
        b = f"blk.{i}."
        out += [
            T(b + "attn_norm.weight", (h,), "vec", 0.1, 1.0),
            T(b + "attn_q.weight", (nh * hd, h), "lin", 0.5),
            T(b + "attn_q.bias", (nh * hd,), "vec", 0.1),
            T(b + "attn_k.weight", (nkv * hd, h), "lin", 0.5),
            T(b + "attn_k.bias", (nkv * hd,), "vec", 0.1),
            T(b + "attn_v.weight", (nkv * hd, h)),
            T(b + "attn_v.bias", (nkv * hd,), "vec", 0.1),
            T(b + "attn_output.weight", (h, nh * hd), "lin", 0.5),
            T(b + "attn_output.bias", (h,), "vec", 0.1),
            T(b + "attn_sinks.weight", (nh,), "vec", 1.0),
            T(b + "post_attention_norm.weight", (h,), "vec", 0.1, 1.0),
            T(b + "ffn_gate_inp.weight", (e, h), "lin", 4.0),
            T(b + "ffn_gate_inp.bias", (e,), "vec", 0.1),
            T(b + "ffn_gate_exps.weight", (e, f, h), "lin", 2.0),
            T(b + "ffn_gate_exps.bias", (e, f), "vec", 0.1),
            T(b + "ffn_up_exps.weight", (e, f, h), "lin", 2.0),
            T(b + "ffn_up_exps.bias", (e, f), "vec", 0.1),
            T(b + "ffn_down_exps.weight", (e, h, f), "lin", 0.1),
            T(b + "ffn_down_exps.bias", (e, h), "vec", 0.1),
        ]
    return out


def glm4moe_plan(s: qf.Shape, router_scale: float = 4.0, bias_scale: float = 0.1) -> list[T]:
    """glm4moe as tests/qwen3moe_file.py `random_tensors` writes it (no NextN layer): Q/K/V
    biases, the leading dense layers, then routed experts with the selection bias and a shared
    expert."""
    h, d, e, f = s.n_embd, s.head_dim, s.n_expert, s.n_ff_exp
    out = [
        T("token_embd.weight", (s.n_vocab, h), "embd"),
        T("output_norm.weight", (h,), "vec", 0.1, 1.0),
        T("output.weight", (s.n_vocab, h)),
    ]
    for i in range(s.n_layer):
        p = f"blk.{i}."
        out += [
            T(p + "attn_norm.weight", (h,), "vec", 0.1, 1.0),
            T(p + "attn_q.weight", (s.n_head * d, h)),
            T(p + "attn_k.weight", (s.n_head_kv * d, h)),
            T(p + "attn_v.weight", (s.n_head_kv * d, h)),
            T(p + "attn_output.weight", (h, s.n_head * d)),
            T(p + "attn_q.bias", (s.n_head * d,), "vec", 0.1),
            T(p + "attn_k.bias", (s.n_head_kv * d,), "vec", 0.1),
            T(p + "attn_v.bias", (s.n_head_kv * d,), "vec", 0.1),
            T(p + "post_attention_norm.weight", (h,), "vec", 0.1, 1.0),
        ]
        if i < s.n_dense_lead:
            out += [
                T(p + "ffn_gate.weight", (s.n_ff_dense, h)),
                T(p + "ffn_up.weight", (s.n_ff_dense, h)),
                T(p + "ffn_down.weight", (h, s.n_ff_dense)),
            ]
            continue
        out += [
            T(p + "exp_probs_b.bias", (e,), "vec", bias_scale),
            T(p + "ffn_gate_shexp.weight", (s.n_ff_shexp, h)),
            T(p + "ffn_up_shexp.weight", (s.n_ff_shexp, h)),
            T(p + "ffn_down_shexp.weight", (h, s.n_ff_shexp)),
            T(p + "ffn_gate_inp.weight", (e, h), "lin", router_scale),
            T(p + "ffn_gate_exps.weight", (e, f, h)),
            T(p + "ffn_up_exps.weight", (e, f, h)),
            T(p + "ffn_down_exps.weight", (e, h, f)),
        ]
    return out


def values(t: T, rng: np.random.Generator) -> np.ndarray:
    """The tensor's values in its stored type, generated a leading slice at a time (the F32
    intermediate of one expert, not of the whole tensor)."""
    dt = np.float16 if t.f16 else np.float32
    out = np.empty(t.shape, dt)
    rows = out.reshape(t.shape[0], -1) if len(t.shape) > 1 else out.reshape(1, -1)
    std = {"lin": t.scale / np.sqrt(t.shape[-1]), "vec": t.scale, "embd": 1.0}[t.kind]
    for r in range(0, rows.shape[0], max(1, (1 << 24) // rows.shape[1])):
        n = min(rows.shape[0] - r, max(1, (1 << 24) // rows.shape[1]))
        x = rng.standard_normal((n, rows.shape[1]), dtype=np.float32)
        x *= np.float32(std)
        x += np.float32(t.mean)
        rows[r : r + n] = x
    return out


def write(path: Path, arch: str, header: Callable[[Any], None], plan: list[T], seed: int) -> Path:
    """Writes `plan`'s tensors streamed after the metadata `header(writer)` sets."""
    import gguf

    w = gguf.GGUFWriter(path, arch)
    header(w)
    for t in plan:
        dt = np.dtype(np.float16 if t.f16 else np.float32)
        w.add_tensor_info(t.name, t.shape, dt, int(np.prod(t.shape)) * dt.itemsize)
    rng = np.random.default_rng(seed)
    try:
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        for t in _progress(plan):
            w.write_tensor_data(values(t, rng))
        w.flush()
    finally:
        w.close()
    return path


def _progress(plan: list[T]) -> Iterator[T]:
    for i, t in enumerate(plan):
        if "exps" in t.name and t.name.endswith(".weight"):
            print(f"  {i}/{len(plan)} {t.name}", file=sys.stderr, flush=True)
        yield t


def gptoss_header(d: dict[str, Any], layers: int) -> Callable[[Any], None]:
    """gpt-oss's keys as llama.cpp's converter writes GptOssForCausalLM (tests/golden's
    gptoss_f32.gguf), YaRN ×32 over 4096, the test tokenizer at the published vocabulary."""

    def header(w: Any) -> None:
        a = "gpt-oss"
        w.add_type("model")
        w.add_name("strata-bench-gptoss")
        w.add_file_type(1)  # mostly F16
        w.add_quantization_version(2)
        for key, v in (
            ("block_count", layers),
            ("context_length", d["n_ctx_train"]),
            ("embedding_length", d["n_embd"]),
            ("feed_forward_length", d["n_ff_exp"]),
            ("expert_feed_forward_length", d["n_ff_exp"]),
            ("attention.head_count", d["n_head"]),
            ("attention.head_count_kv", d["n_head_kv"]),
            ("attention.key_length", d["head_dim"]),
            ("attention.value_length", d["head_dim"]),
            ("attention.sliding_window", d["window"]),
            ("expert_count", d["n_expert"]),
            ("expert_used_count", d["n_expert_used"]),
            ("rope.scaling.original_context_length", d["rope_orig_ctx"]),
        ):
            w.add_uint32(f"{a}.{key}", v)
        w.add_string(f"{a}.rope.scaling.type", "yarn")
        for key, x in (
            ("rope.scaling.factor", d["rope_factor"]),
            ("rope.scaling.yarn_beta_fast", 32.0),
            ("rope.scaling.yarn_beta_slow", 1.0),
            ("rope.freq_base", d["rope_base"]),
            ("attention.layer_norm_rms_epsilon", d["rms_eps"]),
        ):
            w.add_float32(f"{a}.{key}", x)
        qf.vocab_of(d["n_vocab"]).add_to_writer(w)

    return header


def glm4moe_header(s: qf.Shape) -> Callable[[Any], None]:
    def header(w: Any) -> None:
        modelgen._add_header(w, s.spec(), qf.vocab_of(s.n_vocab), "random weights", 1)
        qf.family_keys(w, s, "glm4moe")

    return header
