"""The hybrid-attention families (qwen3next, qwen35moe: Gated DeltaNet layers beside gated
full attention, a shared expert with a sigmoid gate) on the GPU and hybrid paths, with the
CPU path as the reference (that path is checked against HF transformers and llama.cpp in
test_model_families.py and test_model_hybrid.py).

The files are test_model_families.py's `family_file` (gguf-py writes the F32 file in the
layout llama.cpp's converter writes, llama.cpp's quantizer makes the others): 4 layers, the
even ones recurrent (Nk = 2 key heads, Nv = 4 value heads, S = 64, Kc = 4), the odd ones
gated attention with partial rotary (16 of 64 dims; qwen35moe's M-RoPE sections as NEOX), 8
routed experts top-2 and a shared expert in every layer. The protocol is test_gpu_model.py's
(and test_gpu_families.py's): top-1 ≥ 99% at the CPU's sure positions (prefill and decode
chunks), greedy 64-token continuations identical up to the CPU's first near-tie on ≥ 9 of
10 prompts and top-1 ≥ 99% along the CPU's path; the hybrid placement with 25% of the
experts in VRAM slots is held to the same protocol, and with every expert in a slot it is
bitwise the pure-GPU path. The Q4_K_M files are chaotic at the 99% bound over tensor-core
prefill chunks (CHAOTIC_WHY below): there the bound is a strict xfail, and the same
prompts prefilled by the decode kernels, and the F32 files, are held to it. The recurrent
state in VRAM follows the CPU path's semantics: a speculative window's checkpoints and a
marked prompt end restore bitwise (the same kernels run the same rows again), other
truncations are refused and change nothing.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import qwen3moe_file as qf
from strata._core import Model
from test_gpu_families import family_path, hybrid
from test_gpu_model import MARGIN, N_CTX, greedy_vs_cpu, logits_vs_cpu, margin, prompts

gpu = pytest.mark.gpu

FAMILIES = ["qwen3next", "qwen35moe"]
TYPES = ["Q8_0", "Q4_K_M"]
# family_file's hybrid shape: 4 layers, each with 8 routed experts (top-2)
N_ROUTED = 4 * 8
QUARTER = N_ROUTED // 4
# The files are chaotic (random weights through the recurrence): the CPU path against itself
# with a q8_0 KV cache instead of f16 agrees on top-1 at 99.43% (qwen3next) and 98.88%
# (qwen35moe) of its sure positions over 30 prompts of 32 tokens; the GPU's tensor-core
# prefill chunks (24 tokens), whose f16 attention moves the logits a little more than its
# decode kernels do, agree at 98.01% / 98.60% over those prompts (98.73% / 98.66% over the
# protocol's 10), its decode kernels (chunks of 8) at 99.29% / 99.72%. The F32 files agree at
# 99.86% / 100% with either chunk (H200). The 99% bound over tensor-core prefill chunks is a
# strict xfail for Q4_K_M; the decode kernels' prefill and the F32 files are held to it.
CHAOTIC_WHY = "chaotic random file: the CPU against itself (q8_0 KV) agrees at 98.9-99.4%"


def marks(ty: str) -> list[Any]:
    return [pytest.mark.xfail(strict=True, reason=CHAOTIC_WHY)] if ty == "Q4_K_M" else []


CASES = [pytest.param(f, t, id=f"{f}-{t}") for f in FAMILIES for t in TYPES]


def bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).view(np.uint32)


def f32_file(fam: str, root: Path, **over: Any) -> Path:
    """test_model_families.py's `family_file(fam, root, "F32")`, written with gguf-py alone
    (the GPU machine has no llama.cpp, which that module imports); the same bytes
    (`test_f32_file_is_the_family_file`). `over`: other shapes (HEADS_256)."""
    s = dataclasses.replace(qf.family_shape(fam), **over)
    return qf.write(root / f"{fam}-F32.gguf", s, qf.random_tensors(s, 5))


# The published attention heads of Qwen3.5-35B-A3B and Qwen3-Next-80B-A3B: 16 query / 2 KV
# heads of 256, a quarter of each rotated (Qwen3.5: M-RoPE sections 11/11/10)
HEADS_256 = dict(n_head=16, n_head_kv=2, head_dim=256, n_rot=64, mrope=(11, 11, 10))


def top1_vs_cpu(path: Path, chunk: int, n: int = 30, **gpu: Any) -> float:
    """Top-1 agreement of the GPU with the CPU path at the CPU's sure positions over `n`
    prompts of 32 tokens, prefill in chunks of `chunk` (≤ 8: the decode kernels); `gpu`:
    more `Model.open` settings of the GPU side (the hybrid placement)."""
    cpu = Model.open(path, n_ctx=N_CTX, prefill_chunk=chunk)
    cuda = Model.open(path, n_ctx=N_CTX, prefill_chunk=chunk, device="cuda", **gpu)
    top: list[bool] = []
    sure: list[bool] = []
    for toks in prompts(n, 32, seed=1, vocab=cpu.n_vocab):
        cpu.free(0)
        cuda.free(0)
        ref, ours = cpu.forward(0, toks, logits="all"), cuda.forward(0, toks, logits="all")
        top.extend(ours.argmax(1) == ref.argmax(1))
        sure.extend(margin(ref) >= MARGIN)
    agree = float(np.array(top)[np.array(sure)].mean())
    print(f"{path.name} chunk {chunk}: top-1 {agree:.4f} over {sum(sure)} sure positions")
    return agree


def test_f32_file_is_the_family_file(tmp_path: Path) -> None:
    from test_model_families import family_file

    for fam in FAMILIES:
        (tmp_path / "a").mkdir(exist_ok=True)
        (tmp_path / "b").mkdir(exist_ok=True)
        ours = f32_file(fam, tmp_path / "a").read_bytes()
        assert ours == family_file(fam, tmp_path / "b", "F32").read_bytes()


@gpu
@pytest.mark.parametrize("fam, ty", [pytest.param(f, t, marks=marks(t)) for f, t in
                                     ((f, t) for f in FAMILIES for t in TYPES)])  # fmt: skip
def test_logits_agree_with_cpu(fam: str, ty: str) -> None:
    assert logits_vs_cpu(family_path(fam, ty), f"{fam} {ty}") >= 0.99


@gpu
@pytest.mark.parametrize("fam", FAMILIES)
def test_f32_logits_agree_with_cpu(fam: str, tmp_path: Path) -> None:
    path = f32_file(fam, tmp_path)
    assert top1_vs_cpu(path, 24) >= 0.99  # tensor-core prefill chunks and a decode chunk
    assert top1_vs_cpu(path, 8) >= 0.99


@gpu
@pytest.mark.parametrize("fam", FAMILIES)
def test_published_head_dim_256_agrees_with_cpu(fam: str, tmp_path: Path) -> None:
    """Heads of 256 (`HEADS_256`; the attention kernels' D = 256 instances: tiles of 32
    positions and two blocks of output dims in prefill, G ≤ 8), pure and hybrid."""
    path = f32_file(fam, tmp_path, **HEADS_256)
    assert top1_vs_cpu(path, 24) >= 0.99  # tensor-core prefill chunks and a decode chunk
    assert top1_vs_cpu(path, 8) >= 0.99
    assert top1_vs_cpu(path, 24, 10, **hybrid(vram_slots=QUARTER, adapt_every=1)) >= 0.99


@gpu
@pytest.mark.parametrize("fam", FAMILIES)
def test_decode_kernel_prefill_agrees_with_cpu(fam: str) -> None:
    """Prefill in chunks of 8 (the decode kernels, int8 activations as the CPU's) on the
    chaotic Q4_K_M file, over 30 prompts."""
    assert top1_vs_cpu(family_path(fam, "Q4_K_M"), 8) >= 0.99


@gpu
@pytest.mark.parametrize("fam, ty", CASES)
def test_greedy_continuations_match_cpu(fam: str, ty: str) -> None:
    same, agree, cuda = greedy_vs_cpu(family_path(fam, ty), f"{fam} {ty}")
    assert cuda.hparams["recurrent"] is True
    assert cuda.hparams["recurrent_state_bytes"] > 0
    assert same >= 9
    assert agree >= 0.99


@gpu
@pytest.mark.parametrize("fam", FAMILIES)
def test_hybrid_quarter_matches_cpu(fam: str) -> None:
    """25% of the experts in VRAM slots, the misses on the CPU pool, swaps after every step;
    the shared experts and the DeltaNet layers on the GPU."""
    path = family_path(fam, "Q4_K_M")
    same, agree, cuda = greedy_vs_cpu(
        path, f"{fam} Q4_K_M hybrid 25%", **hybrid(vram_slots=QUARTER, adapt_every=1)
    )
    info, c = cuda.hybrid_info(), cuda.hybrid_counters()
    assert info is not None and c is not None
    assert info["n_slots"] == QUARTER and info["n_experts"] == N_ROUTED
    h, mc, mp = c.totals()
    print(f"{fam} hybrid: hits {h}, CPU misses {mc}, swaps {c.snapshot()['swaps']}")
    assert mc > 0 and h > 0 and mp == 0
    assert same >= 9
    assert agree >= 0.99


@gpu
@pytest.mark.parametrize("fam", FAMILIES)
def test_hybrid_all_resident_is_bitwise_the_pure_path(fam: str) -> None:
    path = family_path(fam, "Q4_K_M")
    kw: dict[str, Any] = dict(n_ctx=N_CTX, prefill_chunk=24, device="cuda")
    pure = Model.open(path, threads=2, **kw)
    hy = Model.open(path, **kw, **hybrid(vram_slots=N_ROUTED, adapt_every=0))
    for toks in prompts(2, 32, seed=11, vocab=pure.n_vocab):
        pure.free(0)
        hy.free(0)
        a = pure.forward(0, toks, logits="all")  # chunks of 24 and 8
        b = hy.forward(0, toks, logits="all")
        assert np.array_equal(a, b)
        for _ in range(4):
            nxt = [int(a[-1].argmax())]
            a = pure.forward(0, nxt)[None]
            b = hy.forward(0, nxt)[None]
            assert np.array_equal(a, b)
    assert hy.cuda_graph_state == "captured (per layer)"


@gpu
@pytest.mark.parametrize("fam", FAMILIES)
def test_state_checkpoints_restore(fam: str) -> None:
    """A window's checkpoints and a marked prompt end: truncating to one and running the
    same tokens again gives the logits of the first run (bitwise where the rows run in the
    same pieces, as the same kernels then run the same arithmetic from the restored state;
    within 1e-5 of the largest logit where a shorter piece runs them, whose matmuls may sum
    in another order); other positions are refused (ValueError) and change nothing; free
    starts over. The restorable positions are the CPU path's."""
    path = family_path(fam, "Q4_K_M")
    kw: dict[str, Any] = dict(n_ctx=N_CTX, n_slots=2, prefill_chunk=16)
    cuda = Model.open(path, device="cuda", **kw)
    cpu = Model.open(path, **kw)
    toks = prompts(1, 40, seed=7, vocab=cuda.n_vocab)[0]
    first = cuda.forward(1, toks[:20], logits="all")
    cuda.checkpoint(1)  # the prompt's end: a prefix-cache point
    win = cuda.forward(1, toks[20:26], logits="window")  # positions 21..26 checkpointed
    after = cuda.forward(1, toks[26:30], logits="all")
    cpu.forward(1, toks[:20], logits="none")
    cpu.checkpoint(1)
    cpu.forward(1, toks[20:26], logits="window")
    cpu.forward(1, toks[26:30], logits="none")
    assert cuda.checkpoints(1) == cpu.checkpoints(1) == [20, *range(21, 27)]
    with pytest.raises(ValueError, match="recurrent state"):
        cuda.truncate(1, 27)  # past the window: not checkpointed
    assert cuda.slot_len(1) == 30
    # rollback to inside the window (a rejected draft), then the same tokens again
    cuda.truncate(1, 23)
    assert cuda.slot_len(1) == 23 and cuda.checkpoints(1) == [20, 21, 22, 23]
    again = cuda.forward(1, toks[23:26], logits="window")
    cont = cuda.forward(1, toks[26:30], logits="all")
    tol = 1e-5 * np.abs(win).max()
    d = max(np.abs(again - win[3:]).max(), np.abs(cont - after).max())
    print(f"{fam}: rollback into the window, max |Δlogit| {d:.2e} (tolerance {tol:.2e})")
    assert d <= tol
    # back to the marked prompt end: the same pieces again
    cuda.truncate(1, 20)
    assert cuda.checkpoints(1) == [20]
    assert np.array_equal(bits(cuda.forward(1, toks[20:26], logits="window")), bits(win))
    assert np.array_equal(bits(cuda.forward(1, toks[26:30], logits="all")), bits(after))
    # free starts over: the first run again; the other slot's state is its own
    cuda.free(1)
    cuda.forward(0, toks[:7], logits="none")
    assert np.array_equal(bits(cuda.forward(1, toks[:20], logits="all")), bits(first))
    with pytest.raises(Exception, match="recurrent state"):
        cuda.kv_export(1, 4)


if __name__ == "__main__":
    for f in FAMILIES:
        for t in TYPES:
            p = family_path(f, t)
            print(f, t, p, p.stat().st_size)
