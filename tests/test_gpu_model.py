"""The GPU forward pass (`Model.open(..., device="cuda")`, rust/src/gpu) on the device.

1. Each model kernel against its numpy reference on fresh random inputs (the cases of
   gpu_model_cases.py, the same ones the CPU emulation runs, with their stated bounds).
2. The whole model against the CPU path on the repo's test models (tests/models.py: F32,
   Q8_0, Q4_K_M, IQ3_S), following test_model_llamacpp.py's protocol with the CPU path as the
   reference: top-1 agreement ≥ 99% at the reference's sure positions (top-1/top-2 logit
   margin ≥ MARGIN), greedy 64-token continuations identical up to the reference's first
   near-tie on ≥ 9 of 10 prompts; the unfiltered figures are printed beside. In decode
   chunks (≤ 8 tokens) the GPU quantizes activations exactly as the CPU does (q8_0 / q8_K)
   but sums in another order; prefill chunks multiply f16 activations on tensor cores, so
   near-ties may flip, as between the CPU path and llama.cpp.
3. Slot semantics (lengths, truncate, free, errors, a failed call leaving the slot as it was),
   several slots interleaved, and the graph-replayed decode against the kernel-by-kernel one.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from gpu_model_cases import *  # noqa: F403  (the shared kernel cases)
from models import TestModels
from strata import _core
from strata._core import Model, _testing
from strata.modelgen import ModelSpec

pytestmark = pytest.mark.gpu

MARGIN = 0.1
# The devices of the layer split's two stages in the split and pipeline tests: one GPU as two
# stages by default; STRATA_TEST_GPUS="0,1" runs them on two cards (the two-GPU issue's check).
TWO_GPUS = os.environ.get("STRATA_TEST_GPUS", "0,0")
N_CTX = 256
KV_NAME = {0: "f16", 1: "q8_0"}
# (model file type, KV cache type)
CASES = [
    pytest.param(ty, kv, id=f"{ty}-{kv}kv")
    for ty, kv in [
        ("F32", "f16"),
        ("Q8_0", "f16"),
        ("Q4_K_M", "f16"),
        ("IQ3_S", "f16"),
        ("Q4_K_M", "q8_0"),
    ]
]


class GpuKernels:
    """The emulation library's entry points (cuda/tests/model_sim.cpp) over the device
    launchers: same arguments, outputs written into the arrays passed."""

    def sim_norm_rms(self, x: Any, w: Any, out: Any, rows: int, n: int, eps: float) -> None:
        out[...] = _testing.gpu_norm_rms(x, w, eps)

    def sim_norm_add_rms(
        self, x: Any, y: Any, w: Any, out: Any, rows: int, n: int, eps: float
    ) -> None:
        x2, o = _testing.gpu_norm_add_rms(x, y, w, eps)
        x[...] = x2
        out[...] = o

    def sim_rope_neox(self, x: Any, c: Any, s: Any, sp: Any, *dims: int) -> None:
        n_rot, n_pos = dims[-2], dims[-1]
        x[...] = _testing.gpu_rope_neox(x, c[:n_pos], s[:n_pos], int(sp[0]), n_rot)

    def sim_rope_qkv(self, kv: int, q: Any, k: Any, v: Any, qn: Any, kn: Any, qb: Any,
                     kb: Any, vb: Any, c: Any, s: Any, sp: Any, kc: Any, vc: Any, stride: int,
                     *rest: Any) -> None:  # fmt: skip
        n_rot, eps, norm, bias, neox = rest[-6], rest[-4], rest[-3], rest[-2], rest[-1]
        q2, k2, v2 = _testing.gpu_rope_qkv(
            KV_NAME[kv], q, k, v, qn if norm else None, kn if norm else None,
            (qb, kb, vb) if bias else None, c, s, int(sp[0]), int(sp[1]), kc, vc, n_rot, eps,
            bool(neox),
        )  # fmt: skip
        q[...], kc[...], vc[...] = q2, k2, v2

    def sim_attn_decode(self, kv: int, d: int, q: Any, kc: Any, vc: Any, stride: int, sp: Any,
                        po: Any, pml: Any, out: Any, *rest: Any) -> None:  # fmt: skip
        n_split, scale = rest[-2], rest[-1]
        out[...] = _testing.gpu_attention(
            KV_NAME[kv], q, kc, vc, int(sp[0]), int(sp[1]), n_split, scale
        )

    def sim_attn_prefill(self, kv: int, d: int, q: Any, kc: Any, vc: Any, stride: int, sp: Any,
                         out: Any, *rest: Any) -> None:  # fmt: skip
        out[...] = _testing.gpu_attention(
            KV_NAME[kv], q, kc, vc, int(sp[0]), int(sp[1]), 0, rest[-1]
        )

    def sim_router_topk(self, logits: Any, ids: Any, w: Any, *dims: int) -> None:
        k, norm = dims[-2], dims[-1]
        i, ww = _testing.gpu_router_topk(logits, k, bool(norm))
        ids[...], w[...] = i, ww

    def sim_argmax(self, x: Any, out: Any, rows: int, n: int) -> None:
        out[...] = _testing.gpu_argmax(x)

    def sim_add(self, x: Any, y: Any, n: int) -> None:
        s, c = _testing.gpu_add_copy(x, y)
        assert np.array_equal(c, x), "the copy kernel"
        x[...] = s


@pytest.fixture(scope="module")
def kern() -> GpuKernels:
    return GpuKernels()


# ---- the whole model ---------------------------------------------------------------------


# The test models (tests/models.py) at a size that travels to the GPU machine: 3 layers of 8
# experts (top-2), tiny's widths (every row a multiple of 256, so every quant type applies).
SPEC = ModelSpec.tiny(n_layer=3, n_expert=8, n_expert_used=2)
TYPES = ("F32", "Q8_0", "Q4_K_M", "IQ3_S")
# Copies of the files, named by type: made on first use where llama.cpp can quantize, read
# as they are where it cannot (the GPU machine has neither llama-cpp-python nor gguf-py).
# The folder is $STRATA_GPU_MODELS, else tests/.gpu-models; `python tests/test_gpu_model.py`
# fills it (scripts/build_device_wheel does, into .whl/gpu-models, which scripts/gpu_suite
# points the variable at on the device).
CARRY = Path(os.environ.get("STRATA_GPU_MODELS") or Path(__file__).resolve().parent / ".gpu-models")


def model_files(types: tuple[str, ...] = TYPES) -> dict[str, Path]:
    """The test model's files of `types`: the carried ones, the others made here (the
    quantized ones need llama-cpp-python, which the GPU machine lacks: a device run carries
    them, and a test file names only the types it uses)."""
    carried = {t: CARRY / f"{SPEC.key()}-{t}.gguf" for t in types}
    missing = [t for t, p in carried.items() if not p.is_file()]
    if missing:
        tm = TestModels.default_cache(SPEC)
        CARRY.mkdir(exist_ok=True)
        for t in missing:
            shutil.copyfile(tm.f32() if t == "F32" else tm.quantized(t), carried[t])
    return carried


class TypeFiles(dict[str, Path]):
    """The test model's files, each made (or found carried) when a test first asks for its
    type: a device run that carries some types runs the tests of those (the others error at
    their first use, never pass)."""

    def __missing__(self, ty: str) -> Path:
        self[ty] = model_files((ty,))[ty]
        return self[ty]


@pytest.fixture(scope="module")
def files() -> dict[str, Path]:
    return TypeFiles()


def margin(logits: np.ndarray) -> np.ndarray:
    top2 = np.sort(logits, axis=-1)[..., -2:]
    return np.asarray(top2[..., 1] - top2[..., 0])


def prompts(n: int, length: int, seed: int, vocab: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [[int(t) for t in rng.integers(0, vocab, length)] for _ in range(n)]


def open_pair(path: Path, kv: str, chunk: int, **gpu: Any) -> tuple[Model, Model]:
    cpu = Model.open(path, n_ctx=N_CTX, kv_type=kv, prefill_chunk=chunk)
    cuda = Model.open(path, n_ctx=N_CTX, kv_type=kv, prefill_chunk=chunk, device="cuda", **gpu)
    assert cuda.device == "cuda" and cuda.hparams["device"] == "cuda"
    return cpu, cuda


@pytest.mark.parametrize("ty, kv", CASES)
def test_logits_agree_with_cpu(files: dict[str, Path], ty: str, kv: str) -> None:
    assert logits_vs_cpu(files[ty], f"{ty} {kv} KV", kv) >= 0.99


def logits_vs_cpu(path: Path, label: str, kv: str = "f16", **gpu: Any) -> float:
    """Top-1 agreement of the GPU's logits with the CPU path's at the CPU's sure positions
    over 10 prompts of 32 tokens (printed with the unfiltered figures)."""
    # chunk 24: a 32-token prompt runs a prefill chunk (24 > 8 tokens: the tensor-core
    # attention) and a short one (8: the split decode attention)
    cpu, cuda = open_pair(path, kv, chunk=24, **gpu)
    top1, sure, errs = [], [], []
    for toks in prompts(10, 32, seed=1, vocab=cpu.n_vocab):
        cpu.free(0)
        cuda.free(0)
        ref = cpu.forward(0, toks, logits="all")
        ours = cuda.forward(0, toks, logits="all")
        assert ours.shape == ref.shape == (32, cpu.n_vocab)
        assert np.isfinite(ours).all()
        top1.extend(ours.argmax(1) == ref.argmax(1))
        sure.extend(margin(ref) >= MARGIN)
        errs.append(np.abs(ours - ref).max() / np.abs(ref).max())
    top1_a, sure_a = np.array(top1), np.array(sure)
    agree = float(top1_a[sure_a].mean())
    print(
        f"{label}: top-1 agreement {agree:.4f} over {sure_a.sum()} sure positions "
        f"({top1_a.mean():.4f} over all {len(top1)}); max |Δlogit|/max|logit| "
        f"{max(errs):.2e}"
    )
    return agree


@pytest.mark.parametrize("ty, kv", CASES)
def test_greedy_continuations_match_cpu(files: dict[str, Path], ty: str, kv: str) -> None:
    same, agree, _ = greedy_vs_cpu(files[ty], f"{ty} {kv} KV", kv)
    assert same >= 9
    assert agree >= 0.99


def greedy_vs_cpu(path: Path, label: str, kv: str = "f16", **gpu: Any) -> tuple[int, float, Model]:
    """Greedy 64-token continuations of 10 prompts on the GPU against the CPU path's: how
    many are identical up to the CPU's first near-tie, the GPU's top-1 agreement along the
    CPU's path at its sure steps (the decode graph captured), and the GPU model."""
    cpu, cuda = open_pair(path, kv, chunk=64, **gpu)
    same = full = 0
    cuts: list[int] = []
    forced: list[bool] = []  # along the reference's path: our top-1 == its choice
    for toks in prompts(10, 8, seed=2, vocab=cpu.n_vocab):
        refs: list[int] = []
        sure: list[bool] = []
        cpu.free(0)
        logits = cpu.forward(0, toks)
        cut = 64
        for i in range(64):
            sure.append(bool(margin(logits) >= MARGIN))
            if cut == 64 and not sure[-1]:
                cut = i  # the reference's first near-tie
            refs.append(int(logits.argmax()))
            logits = cpu.forward(0, refs[-1:])
        cuda.free(0)
        ours: list[int] = []
        logits = cuda.forward(0, toks)
        for _ in range(64):
            ours.append(int(logits.argmax()))
            logits = cuda.forward(0, ours[-1:])
        cuda.free(0)
        logits = cuda.forward(0, toks)
        for r, ok in zip(refs, sure, strict=True):
            if ok:
                forced.append(int(logits.argmax()) == r)
            logits = cuda.forward(0, [r])
        same += ours[:cut] == refs[:cut]
        full += ours == refs
        cuts.append(cut)
    assert cuda.cuda_graph_captured, cuda.cuda_graph_state
    agree = float(np.mean(forced))
    print(
        f"{label}: {same}/10 identical up to the first near-tie {cuts}; {full}/10 in full;"
        f" along the CPU's path top-1 {agree:.4f} over {len(forced)} sure decode steps"
    )
    return same, agree, cuda


def decode_run(m: Model, slot: int, toks: list[int], steps: int) -> Iterator[np.ndarray]:
    logits = m.forward(slot, toks)
    yield logits
    for _ in range(steps):
        logits = m.forward(slot, [int(logits.argmax())])
        yield logits


def test_graph_replay_equals_kernel_by_kernel(files: dict[str, Path]) -> None:
    path = files["Q4_K_M"]
    g = Model.open(path, n_ctx=N_CTX, device="cuda", n_slots=2)
    e = Model.open(path, n_ctx=N_CTX, device="cuda", n_slots=2, cuda_graph=False)
    toks = prompts(1, 12, seed=3, vocab=g.n_vocab)[0]
    a = np.stack(list(decode_run(g, 1, toks, 24)))
    b = np.stack(list(decode_run(e, 1, toks, 24)))
    assert g.cuda_graph_captured, g.cuda_graph_state
    assert not e.cuda_graph_captured and e.cuda_graph_state == "off"
    diff = np.abs(a - b).max()
    print(f"graph vs kernel-by-kernel decode: max |Δ| {diff:.3e} (bitwise: {diff == 0})")
    assert np.allclose(a, b, rtol=0, atol=1e-5 * np.abs(b).max()), diff
    assert (a.argmax(1) == b.argmax(1)).all()


@pytest.mark.parametrize("ty", ["Q4_K_M", "Q8_0"])
def test_fused_chain_is_bitwise_the_separate_kernels(files: dict[str, Path], ty: str) -> None:
    """The decode chain's fused kernels (`set_gpu_fusion`, the default: the attention norm and
    the decode attention quantizing their outputs for the products that read them) compute
    what the separate kernels compute: logits bitwise those of a model opened with the fusion
    off, for a prefill chunk (the norm's tail only),
    a 5-token decode chunk and one-token steps (graph replay), on q8_K (Q4_K_M) and q8_0
    (Q8_0) activations."""
    prev = _core.set_gpu_fusion(False)
    try:
        sep = Model.open(files[ty], n_ctx=N_CTX, device="cuda", prefill_chunk=16)
        _core.set_gpu_fusion(True)
        fused = Model.open(files[ty], n_ctx=N_CTX, device="cuda", prefill_chunk=16)
    finally:
        _core.set_gpu_fusion(prev)
    toks = prompts(1, 29, seed=12, vocab=sep.n_vocab)[0]
    for chunk in (toks[:24], toks[24:]):  # 16 + 8 rows, then 5
        a = sep.forward(0, chunk, logits="all")
        b = fused.forward(0, chunk, logits="all")
        assert np.array_equal(a, b)
    for _ in range(12):
        nxt = [int(a[-1].argmax())]
        a = sep.forward(0, nxt)[None]
        b = fused.forward(0, nxt)[None]
        assert np.array_equal(a, b)
    assert fused.cuda_graph_captured, fused.cuda_graph_state


def test_slots_interleaved_equal_separate_runs(files: dict[str, Path]) -> None:
    """The captured step reads slot and position from device memory: decoding two slots in
    turn gives what each gives alone."""
    m = Model.open(files["Q8_0"], n_ctx=N_CTX, device="cuda", n_slots=3)
    p0, p1 = prompts(2, 9, seed=4, vocab=m.n_vocab)
    alone0 = np.stack(list(decode_run(m, 0, p0, 10)))
    m.free(0)
    alone1 = np.stack(list(decode_run(m, 2, p1, 10)))
    m.free(2)
    r0, r1 = decode_run(m, 0, p0, 10), decode_run(m, 2, p1, 10)
    both0, both1 = [], []
    for _ in range(11):
        both0.append(next(r0))
        both1.append(next(r1))
    tol = 1e-5 * np.abs(alone0).max()
    assert np.allclose(np.stack(both0), alone0, rtol=0, atol=tol)
    assert np.allclose(np.stack(both1), alone1, rtol=0, atol=tol)
    assert m.slot_len(0) == m.slot_len(2) == 19 and m.slot_len(1) == 0


def test_slot_semantics_match_cpu(files: dict[str, Path]) -> None:
    path = files["Q8_0"]
    cpu = Model.open(path, n_ctx=64, n_slots=2, prefill_chunk=16)
    cuda = Model.open(path, n_ctx=64, n_slots=2, prefill_chunk=16, device="cuda")
    v = cpu.n_vocab
    toks = prompts(1, 46, seed=5, vocab=v)[0]
    for m in (cpu, cuda):
        assert m.slot_len(1) == 0
        m.forward(1, toks[:30], logits="none")
        assert m.slot_len(1) == 30
    bad_calls: list[tuple[str, Any]] = [
        ("slot_len", (2,)),
        ("truncate", (1, 31)),
        ("truncate", (2, 0)),
        ("free", (5,)),
        ("forward", (2, [1])),
        ("forward", (1, [v])),  # outside the vocabulary
        ("forward", (1, toks[:35])),  # 30 + 35 > n_ctx
        ("forward", (1, [])),  # no last logits
    ]
    for name, args in bad_calls:
        errs = []
        for m in (cpu, cuda):
            with pytest.raises(Exception) as ei:
                getattr(m, name)(*args)
            errs.append((type(ei.value), str(ei.value)))
            assert m.slot_len(1) == 30, f"{name}{args} changed the slot"
        assert errs[0] == errs[1], f"{name}{args}: CPU {errs[0]}, GPU {errs[1]}"
    assert cuda.forward(1, [], logits="all").shape == (0, v)
    # Truncate to a prefix, then continue: the logits are those of a fresh run of the prefix.
    # The GPU's numerics depend on a chunk's kernel path (≤ 8 tokens: int8 activations and the
    # split attention; more: f16 tensor cores), as ggml-cuda's do, so both runs give every
    # position the same path: slot 1 runs [0, 16) [16, 30), then [20, 36) [36, 45); slot 0
    # [0, 16) [16, 32) [32, 45), all prefill chunks; then one decode step each.
    cuda.truncate(1, 20)
    assert cuda.slot_len(1) == 20
    cont = cuda.forward(1, toks[20:45], logits="all")
    cuda.free(0)
    fresh = cuda.forward(0, toks[:45], logits="all")[20:]
    tol = 1e-4 * np.abs(fresh).max()
    assert np.allclose(cont, fresh, rtol=0, atol=tol), np.abs(cont - fresh).max()
    step1, step0 = cuda.forward(1, toks[45:46]), cuda.forward(0, toks[45:46])
    assert np.allclose(step1, step0, rtol=0, atol=tol), np.abs(step1 - step0).max()
    # Chunks that split positions differently: continuing with toks[20:40] runs [20, 36)
    # [36, 40) against a fresh [0, 16) [16, 32) [32, 40). Positions 20..31 take the
    # tensor-core path in both and must agree; 32..39 do not (printed: the paths' difference).
    cuda.truncate(1, 20)
    cont = cuda.forward(1, toks[20:40], logits="all")
    cuda.free(0)
    fresh = cuda.forward(0, toks[:40], logits="all")[20:]
    diff = np.abs(cont - fresh).max(axis=1)
    print(
        f"continued vs fresh, max |Δlogit|: positions 20-31 (same path) {diff[:12].max():.2e}, "
        f"32-39 (other paths) {diff[12:].max():.2e}; max |logit| {np.abs(fresh).max():.2f}"
    )
    assert diff[:12].max() <= tol
    cuda.free(1)
    assert cuda.slot_len(1) == 0


def test_kv_shift_on_gpu_is_the_cpus(files: dict[str, Path]) -> None:
    """--cache-reuse's move on the GPU's cache: the same bytes as the CPU's move of the GPU's
    export (one shift, on the export both caches share), and the slot goes on from it."""
    path = files["Q8_0"]
    cpu = Model.open(path, n_ctx=64, prefill_chunk=16)
    cuda = Model.open(path, n_ctx=64, prefill_chunk=16, device="cuda")
    toks = prompts(1, 48, seed=7, vocab=cpu.n_vocab)[0]
    cuda.forward(0, toks[:40], logits="none")
    assert cpu.kv_import(0, cuda.kv_export(0, 40)) == 40
    for m in (cpu, cuda):
        assert m.kv_shift(0, 10, [(16, 12), (30, 6)]) == 28 == m.slot_len(0)
    assert cuda.kv_export(0, 28) == cpu.kv_export(0, 28)
    with pytest.raises(ValueError, match="KV shift"):
        cuda.kv_shift(0, 10, [(20, 12)])  # past the slot's 28 positions
    assert cuda.slot_len(0) == 28
    assert cuda.forward(0, toks[40:48], logits="all").shape == (8, cpu.n_vocab)
    assert cuda.slot_len(0) == 36


def test_kv_f32_refused_on_gpu(files: dict[str, Path]) -> None:
    with pytest.raises(_core.ConfigError, match="f16 or q8_0"):
        Model.open(files["Q8_0"], n_ctx=64, kv_type="f32", device="cuda")


def test_llm_runs_on_gpu(files: dict[str, Path]) -> None:
    from strata import LLM

    ids = prompts(1, 16, seed=6, vocab=512)[0]
    cpu = LLM(files["Q4_K_M"], n_ctx=128).logits(ids)
    gpu_llm = LLM(files["Q4_K_M"], n_ctx=128, device="cuda")
    assert gpu_llm.model.device == "cuda"
    got = gpu_llm.logits(ids)
    assert got.shape == cpu.shape
    sure = margin(cpu) >= MARGIN
    assert (got.argmax(1) == cpu.argmax(1))[sure].mean() >= 0.99


if __name__ == "__main__":
    for t, p in model_files().items():
        print(t, p, p.stat().st_size)
