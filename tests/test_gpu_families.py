"""The MoE families beside qwen3moe on the GPU and hybrid paths (`model::arch::GPU_FAMILIES`),
with the CPU path as the reference: qwen2moe (Q/K/V biases, no q/k norms, softmax routing
without renormalization, a shared expert scaled by silu(g)/g of its gate), the
Mixtral-style llama (NORM RoPE, top-2 of 8 with renormalized softmax) and glm4moe (a leading
dense layer, sigmoid routing with the selection bias, renormalized and scaled by 2.5, an
ungated shared expert, Q/K/V biases, partial RoPE) and ernie4_5-moe (a leading dense layer,
softmax routing with the selection bias, renormalized, an ungated shared expert, NORM RoPE)
and qwen3vlmoe (Qwen3-VL's language model: qwen3moe's graph, its M-RoPE on text).

The files are test_model_families.py's (`family_file`: gguf-py writes the F32 file in the
layout llama.cpp's converter writes, llama.cpp's quantizer makes the others; that test checks
the layout against the converter and the CPU path against HF and llama.cpp). The protocol is
test_gpu_model.py's: top-1 ≥ 99% at the CPU's sure positions (prefill and decode chunks),
greedy 64-token continuations identical up to the CPU's first near-tie on ≥ 9 of 10 prompts
and top-1 ≥ 99% along the CPU's path. The hybrid placement with 25% of the experts in VRAM
slots (the misses on the CPU pool, a swap choice after every step) is held to the same
protocol; with every expert in a slot it is bitwise the pure-GPU path.

glm4moe's file (routed experts scaled by 2.5 on random weights) is chaotic: the CPU path
against itself with a q8_0 instead of an f16 KV cache agrees on top-1 at only 95.0% of its
sure positions (the other families: 100%). There the GPU's 97.9-98.7% misses the 99% bound
(xfail, strict) and is held to the CPU's own spread instead; the same layout with the scale
at 1 (`glm4moe_s1`: CPU against itself 99.6%) is held to the full protocol.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from strata._core import Model
from test_gpu_model import MARGIN, N_CTX, greedy_vs_cpu, logits_vs_cpu, margin, prompts

pytestmark = pytest.mark.gpu

FAMILIES = ["qwen2moe", "mixtral", "glm4moe", "ernie45moe", "qwen3vlmoe", "glm4moe_s1"]
# measured on the H200: top-1 97.9% (Q4_K_M) / 98.7% (Q8_0) at sure positions, 98.7% along
# the CPU's path; greedy 10/10 up to the first near-tie
CHAOTIC = {"glm4moe"}
CHAOTIC_WHY = "glm4moe at routed scale 2.5: the CPU path against itself agrees on 95.0%"
TYPES = ["Q8_0", "Q4_K_M"]
# F32 files are written where the test runs (gguf-py alone: the GPU machine too), so these run
# there without carried files; glm4moe's chaotic file is left out
F32_FAMILIES = ["qwen2moe", "mixtral", "ernie45moe", "qwen3vlmoe"]
# (and ernie45, dense: the GPU against the CPU, no hybrid placement without experts)
# family_file's shapes: 2 layers of 8 routed experts, top-2 (glm4moe, ernie4_5-moe: after
# their dense layer)
N_MOE_LAYER, N_EXPERT = 2, 8
N_ROUTED = N_MOE_LAYER * N_EXPERT
QUARTER = N_ROUTED // 4
# Copies of the files, named by family and type: made here where gguf-py and llama.cpp are,
# read as they are on the GPU machine ($STRATA_GPU_MODELS, as test_gpu_model.py's).
CARRY = Path(os.environ.get("STRATA_GPU_MODELS") or Path(__file__).resolve().parent / ".gpu-models")


def family_path(fam: str, ty: str) -> Path:
    carried = CARRY / f"family-{fam}-{ty}.gguf"
    if not carried.is_file() and ty == "F32" and fam != "glm4moe_s1":
        # gguf-py alone writes it (on the GPU machine too: nothing to carry)
        import qwen3moe_file as qf

        CARRY.mkdir(exist_ok=True)
        s = qf.family_shape(fam)
        qf.write(carried, s, qf.random_tensors(s, 5))
    if not carried.is_file():
        import tempfile

        from test_model_families import family_file

        CARRY.mkdir(exist_ok=True)
        with tempfile.TemporaryDirectory() as root:
            if fam == "glm4moe_s1":
                made = glm4moe_scale_one(Path(root), ty)
            else:
                made = family_file(fam, Path(root), ty)
            shutil.copyfile(made, carried)
    return carried


def glm4moe_scale_one(root: Path, ty: str) -> Path:
    """family_file's glm4moe layout and weights with the routed scale at 1."""
    import qwen3moe_file as qf

    s = qf.Shape(
        n_layer=3, n_expert=8, n_expert_used=2, arch="glm4moe", n_ff_shexp=256,
        n_dense_lead=1, n_ff_dense=512, n_rot=32, weights_scale=1.0,
    )  # fmt: skip
    f32 = qf.write(root / "glm4moe_s1-F32.gguf", s, qf.random_tensors(s, 5))
    return f32 if ty == "F32" else qf.quantize(f32, root / f"glm4moe_s1-{ty}.gguf", ty)


def marks(fam: str) -> list[Any]:
    return [pytest.mark.xfail(strict=True, reason=CHAOTIC_WHY)] if fam in CHAOTIC else []


CASES = [
    pytest.param(f, t, id=f"{f}-{t}", marks=marks(f))
    for f in FAMILIES
    for t in TYPES
    if not (f == "glm4moe_s1" and t == "Q8_0")
] + [pytest.param(f, "F32", id=f"{f}-F32") for f in [*F32_FAMILIES, "ernie45"]]


@pytest.mark.parametrize("fam, ty", CASES)
def test_logits_agree_with_cpu(fam: str, ty: str) -> None:
    assert logits_vs_cpu(family_path(fam, ty), f"{fam} {ty}") >= 0.99


@pytest.mark.parametrize("fam, ty", CASES)
def test_greedy_continuations_match_cpu(fam: str, ty: str) -> None:
    same, agree, _ = greedy_vs_cpu(family_path(fam, ty), f"{fam} {ty}")
    assert same >= 9
    assert agree >= 0.99


def hybrid(**kw: Any) -> dict[str, Any]:
    return dict(pcie_frac=0.0, threads=2, **kw)


@pytest.mark.parametrize(
    "fam, ty",
    [pytest.param(f, "Q4_K_M", id=f"{f}-Q4_K_M", marks=marks(f)) for f in FAMILIES]
    + [pytest.param(f, "F32", id=f"{f}-F32") for f in F32_FAMILIES],
)
def test_hybrid_quarter_matches_cpu(fam: str, ty: str) -> None:
    """25% of the experts in VRAM slots, the misses on the CPU pool, swaps after every step:
    the greedy protocol against the CPU path, with misses and swaps counted."""
    path = family_path(fam, ty)
    same, agree, cuda = greedy_vs_cpu(
        path, f"{fam} {ty} hybrid 25%", **hybrid(vram_slots=QUARTER, adapt_every=1)
    )
    info, c = cuda.hybrid_info(), cuda.hybrid_counters()
    assert info is not None and c is not None
    assert info["n_slots"] == QUARTER and info["n_experts"] == N_ROUTED
    h, mc, mp = c.totals()
    print(f"{fam} hybrid: hits {h}, CPU misses {mc}, swaps {c.snapshot()['swaps']}")
    assert mc > 0 and h > 0 and mp == 0
    assert same >= 9
    assert agree >= 0.99


@pytest.mark.parametrize("fam", [f for f in FAMILIES if f != "glm4moe_s1"])
def test_hybrid_all_resident_is_bitwise_the_pure_path(fam: str) -> None:
    path = family_path(fam, "Q4_K_M")
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


def test_glm4moe_departs_no_more_than_the_cpu_from_itself() -> None:
    """On the chaotic glm4moe file: the GPU's top-1 agreement with the CPU path at its sure
    positions is at least the CPU path's own with a q8_0 KV cache instead of f16."""
    path = family_path("glm4moe", "Q4_K_M")
    a = Model.open(path, n_ctx=N_CTX, kv_type="f16", prefill_chunk=24)
    b = Model.open(path, n_ctx=N_CTX, kv_type="q8_0", prefill_chunk=24)
    top: list[bool] = []
    sure: list[bool] = []
    for toks in prompts(10, 32, seed=1, vocab=a.n_vocab):  # logits_vs_cpu's prompts
        a.free(0)
        b.free(0)
        ra, rb = a.forward(0, toks, logits="all"), b.forward(0, toks, logits="all")
        top.extend(ra.argmax(1) == rb.argmax(1))
        sure.extend(margin(ra) >= MARGIN)
    own = float(np.array(top)[np.array(sure)].mean())
    gpu = logits_vs_cpu(path, "glm4moe Q4_K_M")
    print(f"glm4moe: CPU f16 vs q8_0 KV top-1 {own:.4f}; GPU vs CPU {gpu:.4f}")
    assert gpu >= own


if __name__ == "__main__":
    for f in FAMILIES:
        for t in TYPES:
            if f == "glm4moe_s1" and t == "Q8_0":
                continue
            p = family_path(f, t)
            print(f, t, p, p.stat().st_size)
