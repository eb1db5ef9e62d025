"""Our forward pass against llama.cpp (llama-cpp-python) on the same GGUF files: random-weight
qwen3moe models written by gguf-py (F32) and quantized by llama.cpp's own quantizer.

Thresholds (issue 4): top-1 agreement ≥ 99% of positions, mean KL(llama.cpp ‖ ours) ≤ 1e-3,
greedy 64-token continuations identical on ≥ 9 of 10 prompts. llama.cpp runs without flash
attention with its default f16 KV cache; we use an f16 cache too.

Our arithmetic follows ggml's CPU backend on an AVX2+FMA machine (activations quantized like
ggml's x86 path; ggml's float order in the dot kernels, the batch-dependent tinyBLAS, tiled
and repacked-gemm orders, softmax, SwiGLU, RoPE and f16 attention; docs/MODEL_ORACLES.md
lists them), so the logits are llama.cpp's bit for bit where llama.cpp runs those AVX2 paths
too, and the unfiltered thresholds are asserted on every file in EXACT. On a CPU where
llama.cpp's build reports AVX-512 (its system info), ggml takes other float orders (512-bit
tinyBLAS, the AVX-512 repacked gemms, vec.cpp's reductions), so EXACT is empty there and each
unfiltered check is reported as skipped with that reason (`*_unfiltered_where_bitwise`). The
filtered figures of docs/test-models.md "Weight scales" (top-1 where the reference is sure,
margin >= MARGIN; greedy continuations up to the reference's first near-tie) are asserted on
every CPU: they are what a file that is not matched bit for bit is held to.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import llama_cpp  # the oracle: a declared test dependency, never skipped
import numpy as np
import pytest
import qwen3moe_file as qf
from strata._core import Model, runnable_types
from strata.gguf import GGUFFile

N_CTX = 256
MARGIN = 0.1
ROUTER_SCALE = 1.0
# (llama.cpp ftype, the weight type it is built around); the KV types to compare with.
FTYPES = {"F32": "F32", "Q8_0": "Q8_0", "Q4_K_M": "Q4_K", "IQ3_S": "IQ3_S"}
CASES = [pytest.param(ty, kv, id=f"{ty}-{kv}kv") for ty in FTYPES for kv in ("f16",)]
# the quantized caches against llama.cpp's: its quantized V needs its flash attention, whose
# order Strata's quantized caches follow; it rotates quantized caches (Hadamard) unless
# LLAMA_ATTN_ROT_DISABLE is set: Strata rotates its q4_0 cache as it does, not its q8_0 one
# (stored as the GPU kernels store theirs), so for q8_0 the comparison turns it off
QUANT_KV = [pytest.param("Q8_0", kv, id=f"Q8_0-{kv}kv") for kv in ("q8_0", "q4_0")]
GGML_KV = {"f16": 1, "f32": 0, "q8_0": 8, "q4_0": 2}


def ggml_isa_paths() -> tuple[str, str]:
    """(the x86 path llama.cpp's CPU backend runs here, its system info line)."""
    info = llama_cpp.llama_print_system_info().decode()
    feats = dict(re.findall(r"([A-Z0-9_]+) = (\d)", info))
    if any(k.startswith("AVX512") and v == "1" for k, v in feats.items()):
        return "avx512", info
    if feats.get("AVX2") == "1" and feats.get("FMA") == "1":
        return "avx2", info
    return "other", info


GGML_PATH, GGML_INFO = ggml_isa_paths()
# Files on which our forward pass repeats llama.cpp's arithmetic bit for bit: every file when
# ggml runs the AVX2+FMA paths our kernels follow, none otherwise.
EXACT = set(FTYPES) if GGML_PATH == "avx2" else set()
NOT_EXACT_WHY = (
    f"llama.cpp runs its {GGML_PATH} paths on this CPU ({GGML_INFO.strip()}); our kernels "
    "follow ggml's AVX2 float orders, so only the filtered thresholds hold here"
)


@pytest.fixture(scope="module")
def f32_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    s = qf.Shape()
    t = qf.random_tensors(s, 0, router_scale=ROUTER_SCALE)
    return qf.write(tmp_path_factory.mktemp("m") / "f32.gguf", s, t)


def model_file(f32_path: Path, ty: str) -> Path:
    if ty == "F32":
        return f32_path
    assert FTYPES[ty] in runnable_types(), f"{ty}: no dot kernel for {FTYPES[ty]}"
    out = f32_path.with_name(f"{ty}.gguf")
    if not out.exists():
        qf.quantize(f32_path, out, ty)
    with GGUFFile(out) as g:
        missing = sorted({t.type for t in g.tensors.values()} - set(runnable_types()) - {"F32"})
    assert not missing, f"{ty}: no dot kernels for {', '.join(missing)}"
    return out


def llama(path: Path, kv: str) -> Any:
    quantized = kv not in ("f16", "f32")
    before = os.environ.get("LLAMA_ATTN_ROT_DISABLE")
    if kv == "q8_0":  # read when the context is made
        os.environ["LLAMA_ATTN_ROT_DISABLE"] = "1"
    try:
        return llama_cpp.Llama(
            str(path),
            logits_all=True,
            n_ctx=N_CTX,
            n_threads=1,
            verbose=False,
            flash_attn=quantized,
            type_k=GGML_KV[kv],
            type_v=GGML_KV[kv],
        )
    finally:
        if before is None:
            os.environ.pop("LLAMA_ATTN_ROT_DISABLE", None)
        else:
            os.environ["LLAMA_ATTN_ROT_DISABLE"] = before


def ref_logits(ll: Any, toks: list[int]) -> np.ndarray:
    ll.reset()
    ll.eval(toks)
    return np.array(ll.scores[: len(toks)], dtype=np.float32)


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def margin(logits: np.ndarray) -> np.ndarray:
    top2 = np.sort(logits, axis=-1)[..., -2:]
    return np.asarray(top2[..., 1] - top2[..., 0])


def prompts(n: int, length: int, seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [[int(t) for t in rng.integers(0, 509, length)] for _ in range(n)]


@dataclass(frozen=True)
class LogitsRun:
    agree: float  # top-1 agreement where llama.cpp is sure (margin >= MARGIN)
    top1_all: float  # top-1 agreement over every position
    kl: float  # mean KL(llama.cpp || ours)


@dataclass(frozen=True)
class GreedyRun:
    same: int  # prompts identical up to llama.cpp's first near-tie
    full: int  # prompts identical over all 64 tokens
    agree: float  # along llama.cpp's path: our top-1 == its choice on sure steps


_RUNS: dict[tuple[str, Path, str], Any] = {}  # each comparison runs once per file


def logits_run(path: Path, ty: str, kv: str) -> LogitsRun:
    key = ("logits", path, kv)
    if key in _RUNS:
        return _RUNS[key]  # type: ignore[no-any-return]
    ll = llama(path, kv)
    # One chunk per prompt, as llama.cpp runs the 32 tokens as one batch: ggml's float order
    # depends on the batch (rows per matmul, rows routed to each expert).
    m = Model.open(path, n_ctx=N_CTX, n_slots=1, kv_type=kv, prefill_chunk=64)
    top1, sure, kls = [], [], []
    for toks in prompts(10, 32, seed=1):
        m.free(0)
        ours = m.forward(0, toks, logits="all")  # [32, n_vocab]
        ref = ref_logits(ll, toks)  # [32, n_vocab]
        assert ours.shape == ref.shape == (32, m.n_vocab)
        top1.extend(ours.argmax(1) == ref.argmax(1))
        sure.extend(margin(ref) >= MARGIN)
        lp, lq = log_softmax(ref), log_softmax(ours)
        kls.extend((np.exp(lp) * (lp - lq)).sum(1))
    top1_a, sure_a = np.array(top1), np.array(sure)
    run = LogitsRun(float(top1_a[sure_a].mean()), float(top1_a.mean()), float(np.mean(kls)))
    print(
        f"{ty} {kv} KV: top-1 agreement {run.agree:.4f} over {sure_a.sum()} sure positions "
        f"({run.top1_all:.4f} over all {len(top1)}), mean KL {run.kl:.2e}"
    )
    _RUNS[key] = run
    return run


def greedy_run(path: Path, ty: str, kv: str) -> GreedyRun:
    key = ("greedy", path, kv)
    if key in _RUNS:
        return _RUNS[key]  # type: ignore[no-any-return]
    ll = llama(path, kv)
    m = Model.open(path, n_ctx=N_CTX, n_slots=1, kv_type=kv, prefill_chunk=64)
    same = full = 0
    cuts: list[int] = []
    forced: list[bool] = []  # along llama.cpp's path: our decode-step top-1 == its choice
    for toks in prompts(10, 8, seed=2):
        m.free(0)
        ours: list[int] = []
        logits = m.forward(0, toks)
        for _ in range(64):
            ours.append(int(logits.argmax()))
            logits = m.forward(0, ours[-1:])
        ll.reset()
        ll.eval(toks)
        ref: list[int] = []
        sure: list[bool] = []
        cut = 64
        for i in range(64):
            row = ll.scores[ll.n_tokens - 1]
            sure.append(bool(margin(row) >= MARGIN))
            if cut == 64 and not sure[-1]:
                cut = i  # the reference's first near-tie
            ref.append(int(np.argmax(row)))
            ll.eval(ref[-1:])
        m.free(0)
        logits = m.forward(0, toks)
        for r, ok in zip(ref, sure, strict=True):
            if ok:
                forced.append(int(logits.argmax()) == r)
            logits = m.forward(0, [r])
        same += ours[:cut] == ref[:cut]
        full += ours == ref
        cuts.append(cut)
    run = GreedyRun(same, full, float(np.mean(forced)))
    print(
        f"{ty} {kv} KV: {same}/10 identical up to the first near-tie {cuts}; {full}/10 in full;"
        f" along llama.cpp's path top-1 {run.agree:.4f} over {len(forced)} sure decode steps"
    )
    _RUNS[key] = run
    return run


def require_exact(ty: str) -> None:
    if ty not in EXACT:
        pytest.skip(f"bit-for-bit check not asserted for {ty}: {NOT_EXACT_WHY}")


@pytest.mark.parametrize("ty, kv", CASES + QUANT_KV)
def test_logits_agree_with_llamacpp(f32_path: Path, ty: str, kv: str) -> None:
    """The filtered thresholds, asserted on every CPU."""
    run = logits_run(model_file(f32_path, ty), ty, kv)
    assert run.agree >= 0.99
    assert run.kl <= 1e-3


@pytest.mark.parametrize("ty, kv", CASES)
def test_logits_unfiltered_where_bitwise(f32_path: Path, ty: str, kv: str) -> None:
    """Top-1 over every position, near-ties included: holds only where the float orders match."""
    require_exact(ty)
    assert logits_run(model_file(f32_path, ty), ty, kv).top1_all >= 0.99


@pytest.mark.parametrize("ty, kv", CASES + QUANT_KV)
def test_greedy_continuations_match_llamacpp(f32_path: Path, ty: str, kv: str) -> None:
    """The filtered thresholds, asserted on every CPU."""
    run = greedy_run(model_file(f32_path, ty), ty, kv)
    assert run.same >= 9
    assert run.agree >= 0.99


@pytest.mark.parametrize("ty, kv", CASES)
def test_greedy_unfiltered_where_bitwise(f32_path: Path, ty: str, kv: str) -> None:
    """Whole 64-token continuations, past near-ties: holds only where the float orders match."""
    require_exact(ty)
    assert greedy_run(model_file(f32_path, ty), ty, kv).full >= 9


@pytest.mark.parametrize(
    "scaling, factor, orig", [("linear", 2.0, 0), ("yarn", 4.0, 1024)], ids=["linear", "yarn"]
)
def test_rope_scaling_agrees_with_llamacpp(
    tmp_path: Path, scaling: str, factor: float, orig: int
) -> None:
    s = qf.Shape(n_layer=2, rope_scaling=scaling, rope_factor=factor, rope_orig_ctx=orig)
    path = qf.write(tmp_path / "m.gguf", s, qf.random_tensors(s, 3))
    m = Model.open(path, n_ctx=N_CTX, kv_type="f16")
    assert scaling.capitalize() in m.hparams["rope_scaling"]
    ll = llama(path, "f16")
    for toks in prompts(2, 96, seed=4):
        m.free(0)
        ours = m.forward(0, toks, logits="all")
        ref = ref_logits(ll, toks)
        rel = np.abs(ours - ref).max() / np.abs(ref).max()
        assert rel < 2e-3, rel


# llama.cpp's penalties sampler's arguments in its order (last n, repeat, frequency, presence),
# named as SamplingParams names them
PENALTIES = {
    "repeat_last_n": 64,
    "repetition_penalty": 1.3,
    "frequency_penalty": 0.1,
    "presence_penalty": 0.2,
}


def llama_chain_greedy(ll: Any, toks: list[int], n: int, bias: dict[int, float]) -> list[int]:
    """`n` greedy tokens through llama.cpp's own sampler chain in common_sampler's order: its
    logit-bias sampler, its penalties (PENALTIES; the prompt's tokens accepted first, as
    llama-server does), then greedy."""
    arr = (llama_cpp.llama_logit_bias * len(bias))()
    for i, (t, b) in enumerate(bias.items()):
        arr[i].token, arr[i].bias = t, b
    n_vocab = llama_cpp.llama_vocab_n_tokens(ll._model.vocab)
    chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
    try:
        for s in (
            llama_cpp.llama_sampler_init_logit_bias(n_vocab, len(bias), arr),
            llama_cpp.llama_sampler_init_penalties(n_vocab, *PENALTIES.values()),
            llama_cpp.llama_sampler_init_greedy(),
        ):
            llama_cpp.llama_sampler_chain_add(chain, s)
        for t in toks:
            llama_cpp.llama_sampler_accept(chain, t)
        ll.reset()
        ll.eval(toks)
        out: list[int] = []
        for _ in range(n):
            out.append(int(llama_cpp.llama_sampler_sample(chain, ll._ctx.ctx, -1)))
            ll.eval(out[-1:])  # (the sample call accepted the token into the chain)
        return out
    finally:
        llama_cpp.llama_sampler_free(chain)


def test_logit_bias_and_penalties_follow_llama_cpps_sampler_chain(f32_path: Path) -> None:
    """`logit_bias` (a banned token, raised and lowered ones) with the penalties, greedy, on
    the F32 file: Strata's sampler against llama.cpp's own chain, 8 tokens from 6 prompts; at
    most one continuation may part at a near-tie. Each bias changes llama.cpp's output."""
    from strata.llm import LLM

    ll = llama(f32_path, "f16")
    ours = LLM(f32_path, n_ctx=N_CTX, threads=1)
    rng = np.random.default_rng(7)
    same = 0
    for toks in prompts(6, 8, seed=9):
        plain = llama_chain_greedy(ll, toks, 8, {})
        bias = {plain[0]: -math.inf, plain[1]: -3.0}
        bias.update({int(t): 2.5 for t in rng.integers(0, 509, 4)})
        ref = llama_chain_greedy(ll, toks, 8, bias)
        assert ref != plain
        out = ours.generate_ids(
            toks, max_tokens=8, stop_ids=[], temperature=0, logit_bias=bias, **PENALTIES
        )
        got = [t for t, _ in out]
        same += got == ref
    assert same >= 5
