"""gpt-oss on the GPU and hybrid paths, with the CPU path (tests/test_model_gptoss.py's
oracles: HF transformers and llama.cpp) as the reference: Q/K/V/O biases, attention sinks,
sliding-window attention on the even layers, the router bias and the softmax over the
selected top-K, experts with biases and the clamped SwiGLU, YaRN; MXFP4 experts.

The file: the GPU attention runs head dims 64 and 128, so the converter's golden file of
test_model_gptoss.py (head dim 16) does not fit it. `gptoss_file` writes the same layout
(that file's metadata and tokenizer, its tensor names and orientations) with gguf-py at the
GPU's widths: 3 layers (0 and 2 windowed to 8 positions, the prompts 32 long), head dim 64,
8 experts top-2, and llama.cpp's quantizer makes the Q8_0 and MXFP4_MOE (MXFP4 experts)
files. Its weights are tamed where a random model is chaotic (q and k halved against YaRN's
mscale, decisive routing, small expert outputs; gate/up pre-activations of std ~2, so the clamp
at ±7 is reached now and then): the CPU path against itself with a q8_0 instead of an f16 KV
cache then agrees on top-1 at 100% of its sure positions on each file (the first draft, at
the golden file's scales, agreed on 92-97% only).
`test_file_runs_as_llamacpp_runs_it` holds the CPU path to llama.cpp on it (greedy, as
test_model_gptoss.py), so the reference below is itself checked.

The protocol is test_gpu_families.py's: top-1 ≥ 99% at the CPU's sure positions (prefill and
decode chunks), greedy 64-token continuations identical up to the CPU's first near-tie on
≥ 9 of 10 prompts and top-1 ≥ 99% along the CPU's path; the hybrid placement with 25% of the
experts in VRAM slots (the misses on the CPU pool) the same; with every expert in a slot it
is bitwise the pure-GPU path.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from strata._core import Model

GOLDEN = Path(__file__).resolve().parent / "golden" / "gptoss_f32.gguf"
TYPES = ["F32", "Q8_0", "MXFP4_MOE"]
N_LAYER, N_EXPERT, N_USED = 3, 8, 2
N_ROUTED = N_LAYER * N_EXPERT
QUARTER = N_ROUTED // 4
DIMS = dict(n_embd=128, n_head=4, n_kv=2, head_dim=64, n_ff=64, window=8)
# Made here (gguf-py, llama.cpp's quantizer), read as they are on the GPU machine.
CARRY = Path(os.environ.get("STRATA_GPU_MODELS") or Path(__file__).resolve().parent / ".gpu-models")


def write_f32(dst: Path, seed: int = 7) -> Path:
    """The golden file's metadata and tokenizer at DIMS, with random F32 tensors in the
    converter's names and orientations (numpy shapes are the GGUF dims reversed)."""
    import gguf

    r = gguf.GGUFReader(GOLDEN)
    d = DIMS
    over = {
        "gpt-oss.block_count": N_LAYER,
        "gpt-oss.embedding_length": d["n_embd"],
        "gpt-oss.feed_forward_length": d["n_ff"],
        "gpt-oss.expert_feed_forward_length": d["n_ff"],
        "gpt-oss.attention.head_count": d["n_head"],
        "gpt-oss.attention.head_count_kv": d["n_kv"],
        "gpt-oss.attention.key_length": d["head_dim"],
        "gpt-oss.attention.value_length": d["head_dim"],
        "gpt-oss.attention.sliding_window": d["window"],
        "gpt-oss.expert_count": N_EXPERT,
        "gpt-oss.expert_used_count": N_USED,
    }
    w = gguf.GGUFWriter(dst, "gpt-oss")
    for k, f in r.fields.items():
        if k.startswith("GGUF.") or k == "general.architecture":
            continue
        v, ty = (over[k], f.types[0]) if k in over else (f.contents(), f.types[0])
        if ty == gguf.GGUFValueType.ARRAY:
            w.add_key_value(k, v, ty, sub_type=f.types[-1])
        else:
            w.add_key_value(k, v, ty)
    rng = np.random.default_rng(seed)
    h, nh, nkv, hd, f = (d[k] for k in ("n_embd", "n_head", "n_kv", "head_dim", "n_ff"))
    e, v = N_EXPERT, len(r.fields["tokenizer.ggml.tokens"].contents())

    def lin(*shape: int, scale: float = 1.0) -> np.ndarray:
        return np.asarray(rng.normal(0, scale / np.sqrt(shape[-1]), shape), np.float32)

    def vec(n: int, mean: float = 0.0, std: float = 0.1, *lead: int) -> np.ndarray:
        return np.asarray(rng.normal(mean, std, (*lead, n)), np.float32)

    t: dict[str, np.ndarray] = {
        "token_embd.weight": np.asarray(rng.normal(0, 1, (v, h)), np.float32),
        "output_norm.weight": vec(h, 1.0),
        "output.weight": lin(v, h, scale=4.0),  # logit margins of a few units
    }
    for i in range(N_LAYER):
        b = f"blk.{i}."
        t |= {
            b + "attn_norm.weight": vec(h, 1.0),
            b + "attn_q.weight": lin(nh * hd, h, scale=0.5),  # YaRN's mscale sharpens q·k
            b + "attn_q.bias": vec(nh * hd),
            b + "attn_k.weight": lin(nkv * hd, h, scale=0.5),
            b + "attn_k.bias": vec(nkv * hd),
            b + "attn_v.weight": lin(nkv * hd, h),
            b + "attn_v.bias": vec(nkv * hd),
            b + "attn_output.weight": lin(h, nh * hd, scale=0.5),
            b + "attn_output.bias": vec(h),
            b + "attn_sinks.weight": vec(nh, 0.0, 1.0),
            b + "post_attention_norm.weight": vec(h, 1.0),
            b + "ffn_gate_inp.weight": lin(e, h, scale=4.0),  # decisive routing
            b + "ffn_gate_inp.bias": vec(e),
            b + "ffn_gate_exps.weight": lin(e, f, h, scale=2.0),
            b + "ffn_gate_exps.bias": vec(f, 0.0, 0.1, e),
            b + "ffn_up_exps.weight": lin(e, f, h, scale=2.0),
            b + "ffn_up_exps.bias": vec(f, 0.0, 0.1, e),
            b + "ffn_down_exps.weight": lin(e, h, f, scale=0.1),  # moderate expert outputs
            b + "ffn_down_exps.bias": vec(h, 0.0, 0.1, e),
        }
    for name, a in t.items():
        w.add_tensor(name, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


def gptoss_file(ty: str) -> Path:
    carried = CARRY / f"gptoss-gpu-{ty}.gguf"
    if not carried.is_file():
        import tempfile

        import qwen3moe_file as qf

        CARRY.mkdir(exist_ok=True)
        with tempfile.TemporaryDirectory() as root:
            f32 = write_f32(Path(root) / "gptoss-F32.gguf")
            made = f32 if ty == "F32" else qf.quantize(f32, Path(root) / f"gptoss-{ty}.gguf", ty)
            shutil.copyfile(made, carried)
    return carried


def test_file_runs_as_llamacpp_runs_it() -> None:
    """The reference: the CPU path on the F32 file against llama.cpp, greedy (as
    test_model_gptoss.py holds the converter's file; its quantizations are llama.cpp's and the
    CPU path's MXFP4 is test_model_gptoss.py's), and the files' blocks as asked."""
    import gguf
    from test_model_llamacpp import greedy_run

    r = gguf.GGUFReader(gptoss_file("MXFP4_MOE"))
    types = {t.name: t.tensor_type.name for t in r.tensors}
    assert {types[f"blk.{i}.ffn_{p}_exps.weight"] for i in range(N_LAYER) for p in
            ("gate", "up", "down")} == {"MXFP4"}  # fmt: skip
    assert r.fields["gpt-oss.attention.key_length"].contents() == DIMS["head_dim"]
    run = greedy_run(gptoss_file("F32"), "gptoss-gpu F32", "f16")
    assert run.same >= 9
    assert run.agree >= 0.99


@pytest.mark.parametrize("ty", TYPES)
def test_file_is_not_chaotic(ty: str) -> None:
    """The protocol's premise: the CPU path against itself with a q8_0 instead of an f16 KV
    cache keeps top-1 at ≥ 99% of its sure positions (else GPU sums could not be held to it)."""
    from test_gpu_model import MARGIN, N_CTX, margin, prompts

    path = gptoss_file(ty)
    a = Model.open(path, n_ctx=N_CTX, kv_type="f16", prefill_chunk=24)
    b = Model.open(path, n_ctx=N_CTX, kv_type="q8_0", prefill_chunk=24)
    top1, sure = [], []
    for toks in prompts(10, 32, seed=1, vocab=a.n_vocab):
        a.free(0)
        b.free(0)
        ra, rb = a.forward(0, toks, logits="all"), b.forward(0, toks, logits="all")
        top1.extend(ra.argmax(1) == rb.argmax(1))
        sure.extend(margin(ra) >= MARGIN)
    agree = float(np.array(top1)[np.array(sure)].mean())
    print(f"gpt-oss {ty}: CPU f16 vs q8_0 KV top-1 {agree:.4f} over {sum(sure)} sure positions")
    assert agree >= 0.99


# ---- on the GPU ----------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("ty", TYPES)
def test_logits_agree_with_cpu(ty: str) -> None:
    from test_gpu_model import logits_vs_cpu

    assert logits_vs_cpu(gptoss_file(ty), f"gpt-oss {ty}") >= 0.99


@pytest.mark.gpu
@pytest.mark.parametrize("ty", TYPES)
def test_greedy_continuations_match_cpu(ty: str) -> None:
    from test_gpu_model import greedy_vs_cpu

    same, agree, _ = greedy_vs_cpu(gptoss_file(ty), f"gpt-oss {ty}")
    assert same >= 9
    assert agree >= 0.99


def hybrid(**kw: Any) -> dict[str, Any]:
    return dict(pcie_frac=0.0, threads=2, **kw)


@pytest.mark.gpu
def test_hybrid_quarter_matches_cpu() -> None:
    """25% of the experts in VRAM slots, the misses (with their biases) on the CPU pool,
    swaps after every step: the greedy protocol against the CPU path."""
    from test_gpu_model import greedy_vs_cpu

    same, agree, cuda = greedy_vs_cpu(
        gptoss_file("MXFP4_MOE"), "gpt-oss MXFP4_MOE hybrid 25%",
        **hybrid(vram_slots=QUARTER, adapt_every=1),
    )  # fmt: skip
    info, c = cuda.hybrid_info(), cuda.hybrid_counters()
    assert info is not None and c is not None
    assert info["n_slots"] == QUARTER and info["n_experts"] == N_ROUTED
    h, mc, mp = c.totals()
    print(f"gpt-oss hybrid: hits {h}, CPU misses {mc}, swaps {c.snapshot()['swaps']}")
    assert mc > 0 and h > 0 and mp == 0
    assert same >= 9
    assert agree >= 0.99


@pytest.mark.gpu
def test_hybrid_all_resident_is_bitwise_the_pure_path() -> None:
    from test_gpu_model import N_CTX, prompts

    path = gptoss_file("MXFP4_MOE")
    kw: dict[str, Any] = dict(n_ctx=N_CTX, prefill_chunk=24, device="cuda")
    pure = Model.open(path, threads=2, **kw)
    hy = Model.open(path, **kw, **hybrid(vram_slots=N_ROUTED, adapt_every=0))
    for toks in prompts(2, 32, seed=11, vocab=pure.n_vocab):
        pure.free(0)
        hy.free(0)
        a = pure.forward(0, toks, logits="all")  # chunks of 24 (grouped kernels) and 8
        b = hy.forward(0, toks, logits="all")
        assert np.array_equal(a, b)
        for _ in range(4):
            nxt = [int(a[-1].argmax())]
            a = pure.forward(0, nxt)[None]
            b = hy.forward(0, nxt)[None]
            assert np.array_equal(a, b)
    assert hy.cuda_graph_state == "captured (per layer)"
