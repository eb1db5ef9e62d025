"""The MoE families beside qwen3moe, on the CPU path: qwen2moe (Q/K/V biases, softmax routing
without renormalization, a shared expert with a sigmoid gate), the Mixtral-style `llama`
(NORM RoPE, top-2 of 8 with renormalized softmax), glm4moe (a leading dense layer, sigmoid
routing with the selection bias, renormalized and scaled, an ungated shared expert, Q/K/V
biases, partial RoPE) and ernie4_5-moe (ERNIE 4.5: a leading dense layer, softmax routing with
the selection bias, renormalized, an ungated shared expert of two experts' width, NORM RoPE;
its converter writes the selection bias as [E, 1]).

Oracles:
- HF transformers (`Qwen2MoeForCausalLM`, `MixtralForCausalLM`, `Glm4MoeForCausalLM`,
  `Ernie4_5_MoeForCausalLM`, the hybrids'): random
  tiny models written to GGUF by llama.cpp's own converter, with their float32 logits, both
  made by scripts/make_hf_goldens.py (tests/golden). F32 KV: max |Δ| / max |ref| ≤ 1e-4.
- llama.cpp (llama-cpp-python) on larger files of the same layout written by gguf-py
  (`qwen3moe_file`, whose layout is checked here against the converter's files) and quantized
  by llama.cpp's quantizer: the filtered thresholds of tests/test_model_llamacpp.py (greedy
  equal up to llama.cpp's first near-tie on ≥ 9/10 prompts; top-1 where llama.cpp is sure).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
import qwen3moe_file as qf
from strata._core import Model
from strata.errors import ModelError
from test_model_llamacpp import GGML_PATH, NOT_EXACT_WHY, greedy_run, logits_run

GOLDEN = Path(__file__).parent / "golden"
ARCH = qf.FAMILY_ARCH
HYBRID = dict(attn_every=2, ssm_conv=4, ssm_groups=2, ssm_v_heads=4)
# The shapes scripts/make_hf_goldens.py gives transformers, as the test writer's Shape.
GOLDEN_SHAPES = {
    "qwen2moe": qf.Shape(
        n_layer=2, n_embd=64, n_head=4, n_head_kv=2, head_dim=16, n_expert=8, n_expert_used=2,
        n_ff_exp=32, n_vocab=512, rope_base=1e6, arch="qwen2moe", n_ff_shexp=96,
    ),
    "mixtral": qf.Shape(
        n_layer=2, n_embd=64, n_head=4, n_head_kv=2, head_dim=16, n_expert=8, n_expert_used=2,
        n_ff_exp=32, n_vocab=512, rope_base=1e6, arch="llama",
    ),
    "glm4moe": qf.Shape(
        n_layer=3, n_embd=64, n_head=4, n_head_kv=2, head_dim=16, n_expert=8, n_expert_used=2,
        n_ff_exp=32, n_vocab=512, rope_base=1e6, arch="glm4moe", n_ff_shexp=32,
        n_dense_lead=1, n_ff_dense=96, n_rot=8, weights_scale=2.5,
    ),
    "qwen3next": qf.Shape(
        n_layer=4, n_embd=64, n_head=4, n_head_kv=2, head_dim=32, n_expert=8, n_expert_used=2,
        n_ff_exp=32, n_vocab=512, rope_base=1e6, arch="qwen3next", n_ff_shexp=48, n_rot=8,
        ssm_state=16, n_ff=64, **HYBRID,
    ),
    "qwen35moe": qf.Shape(
        n_layer=4, n_embd=64, n_head=4, n_head_kv=2, head_dim=32, n_expert=8, n_expert_used=2,
        n_ff_exp=32, n_vocab=512, rope_base=1e6, arch="qwen35moe", n_ff_shexp=48, n_rot=8,
        ssm_state=16, **HYBRID,
    ),
    "ernie45moe": qf.Shape(
        n_layer=3, n_embd=64, n_head=4, n_head_kv=2, head_dim=16, n_expert=8, n_expert_used=2,
        n_ff_exp=32, n_vocab=512, rope_base=1e6, arch="ernie4_5-moe", n_ff_shexp=64,
        n_dense_lead=1, n_ff_dense=128,
    ),
    "ernie45": qf.Shape(
        n_layer=2, n_embd=64, n_head=4, n_head_kv=2, head_dim=128, n_vocab=512, rope_base=5e5,
        arch="ernie4_5", n_ff_dense=96, tied=True,
    ),
    "qwen3vlmoe": qf.Shape(
        n_layer=2, n_embd=64, n_head=4, n_head_kv=2, head_dim=16, n_expert=8, n_expert_used=2,
        n_ff_exp=32, n_vocab=512, rope_base=1e6, arch="qwen3vlmoe", n_ff=64, mrope=(4, 2, 2),
    ),
}  # fmt: skip
FAMILIES = list(GOLDEN_SHAPES)
# served and tiered as MoE models (ernie45, dense, is the MoE one's draft: a draft model is
# opened as a `Model`, never served, as the dense qwen3)
MOE_FAMILIES = [f for f in FAMILIES if f != "ernie45"]


def metadata(path: Path) -> tuple[dict[str, Any], dict[str, tuple[tuple[int, ...], str]]]:
    """The architecture's hyper-parameters and every tensor's (ggml ne, type)."""
    r = gguf.GGUFReader(path)
    arch = r.fields["general.architecture"].contents()
    kv = {k: f.contents() for k, f in r.fields.items() if k.startswith(f"{arch}.")}
    tensors = {t.name: (tuple(int(d) for d in t.shape), t.tensor_type.name) for t in r.tensors}
    return kv, tensors


@pytest.mark.parametrize("fam", FAMILIES)
def test_logits_match_transformers(fam: str) -> None:
    assert hf_worst(fam, ARCH[fam]) <= 1e-4


def hf_worst(fam: str, arch: str, chunk: int = 32, deltanet_chunked: int = 0) -> float:
    """Max |Δ| / max |ref| of our f32-KV logits against the family's HF golden logits (top-1
    agreeing on ≥ 99% of positions per prompt); `deltanet_chunked` as
    `Model.set_deltanet_chunked` (hybrids only)."""
    g = np.load(GOLDEN / f"hf_{fam}_logits.npz")
    prompts, refs = g["prompts"], g["logits"]
    assert prompts.shape[1] >= 64 and len(prompts) >= 3
    m = Model.open(GOLDEN / f"{fam}_f32.gguf", n_ctx=128, kv_type="f32", prefill_chunk=chunk)
    if deltanet_chunked:
        m.set_deltanet_chunked(deltanet_chunked)
    assert m.hparams["architecture"] == arch
    worst = 0.0
    for p, ref in zip(prompts, refs, strict=True):
        m.free(0)
        ours = m.forward(0, [int(x) for x in p], logits="all")
        worst = max(worst, float(np.abs(ours - ref).max() / np.abs(ref).max()))
        assert (ours.argmax(1) == ref.argmax(1)).mean() >= 0.99
    v = g["transformers_version"]
    print(f"{fam} chunk {chunk}: max |Δ| / max |ref| = {worst:.2e} (transformers {v})")
    return worst


@pytest.mark.parametrize("fam", FAMILIES)
def test_test_writer_has_the_converters_layout(fam: str, tmp_path: Path) -> None:
    """The gguf-py files the llama.cpp comparisons below run have the tensors, shapes, types
    and hyper-parameters llama.cpp's converter writes for the family."""
    s = GOLDEN_SHAPES[fam]
    ours = qf.write(tmp_path / "w.gguf", s, qf.random_tensors(s, 0))
    kv_conv, t_conv = metadata(GOLDEN / f"{fam}_f32.gguf")
    kv_ours, t_ours = metadata(ours)
    assert t_ours == t_conv
    arrays = {k for k, v in kv_conv.items() if isinstance(v, list)}  # exact; numbers approx
    assert {k: kv_ours.get(k) for k in arrays} == {k: kv_conv[k] for k in arrays}
    scalars = {k: v for k, v in kv_conv.items() if k not in arrays}
    assert {k: kv_ours.get(k) for k in scalars} == pytest.approx(scalars)


def family_file(fam: str, root: Path, ty: str) -> Path:
    s = qf.family_shape(fam)
    f32 = root / f"{fam}-F32.gguf"
    if not f32.exists():
        qf.write(f32, s, qf.random_tensors(s, 5))
    if ty == "F32":
        return f32
    out = root / f"{fam}-{ty}.gguf"
    if not out.exists():
        qf.quantize(f32, out, ty)
    return out


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("families")


@pytest.mark.parametrize("ty", ["F32", "Q8_0", "Q4_K_M"])
@pytest.mark.parametrize("fam", FAMILIES)
def test_greedy_matches_llamacpp(fam: str, ty: str, root: Path) -> None:
    run = greedy_run(family_file(fam, root, ty), f"{fam} {ty}", "f16")
    assert run.same >= 9
    assert run.agree >= 0.99


# glm4moe's Q4_K_M file is not bit for bit llama.cpp's yet (mean KL 8e-6 over 10 × 32
# positions, 6/10 whole continuations; F32 and Q8_0 are). The cause measured so far: a dense
# Q6_K matrix inside a layer (the shared expert's ffn_down_shexp, which Q4_K_M makes Q6_K in
# its third layer) is not in llama.cpp's float order; the Q6_K output head and Q6_K experts are.
# A 3-layer qwen2moe Q4_K_M file shows it too (mean KL 1.7e-7); the 2-layer one here has no
# Q6_K shared expert. The filtered checks above hold.
# The hybrids' Q4_K_M files have it too (ffn_down_shexp Q6_K in layers 2 and 3): 8/10 whole
# continuations each; their F32 and Q8_0 files are bit for bit.
# qwen3vlmoe: llama.cpp's own logits for that architecture differ from transformers' by 2.6e-4
# of their range on the HF golden file (ours: 4.9e-7), and from its qwen3moe graph on the same
# weights (which ours equal bit for bit): its M-RoPE path is not the NEOX path's float order,
# which the quantized files' activation rounding turns into whole-continuation differences
# (5/10 and 4/10; 10/10 up to the first near-tie, F32 10/10).
NOT_BITWISE = {
    ("glm4moe", "Q4_K_M"),
    ("qwen3next", "Q4_K_M"),
    ("qwen35moe", "Q4_K_M"),
    ("qwen3vlmoe", "Q8_0"),
    ("qwen3vlmoe", "Q4_K_M"),
}


@pytest.mark.parametrize(
    "fam, ty",
    [
        pytest.param(
            f,
            t,
            marks=[pytest.mark.xfail(strict=True, reason="not bit for bit yet")]
            if (f, t) in NOT_BITWISE
            else [],
        )
        for f in FAMILIES
        for t in ("F32", "Q8_0", "Q4_K_M")
    ],
)
def test_greedy_unfiltered_where_bitwise(fam: str, ty: str, root: Path) -> None:
    """Whole 64-token continuations, past near-ties: where ggml runs the AVX2 float orders."""
    if GGML_PATH != "avx2":
        pytest.skip(f"bit-for-bit check not asserted: {NOT_EXACT_WHY}")
    assert greedy_run(family_file(fam, root, ty), f"{fam} {ty}", "f16").full >= 9


@pytest.mark.parametrize("fam", FAMILIES)
def test_logits_agree_with_llamacpp(fam: str, root: Path) -> None:
    run = logits_run(family_file(fam, root, "Q8_0"), f"{fam} Q8_0", "f16")
    assert run.agree >= 0.99
    assert run.kl <= 1e-3


def test_unsupported_family_is_refused_with_the_list(tmp_path: Path) -> None:
    s = GOLDEN_SHAPES["mixtral"]
    p = qf.write(tmp_path / "g.gguf", s, qf.random_tensors(s, 0), arch="grok")
    with pytest.raises(ModelError, match=r'"grok" is not supported; Strata runs: qwen3moe, qwen3'):
        Model.open(p)
    dense = qf.write(tmp_path / "d.gguf", s, qf.random_tensors(s, 0), drop=("llama.expert_count",))
    with pytest.raises(ModelError, match=r"expert_count = 0.*Mixtral-style llama"):
        Model.open(dense)


@pytest.mark.parametrize("fam", MOE_FAMILIES)
def test_server_serves_the_family(fam: str, tmp_path: Path) -> None:
    """End to end on the converter's file: greedy completions equal `strata.LLM`'s loop, a
    streamed chat completion (the file's chat template) finishes, /v1/status names the file."""
    import openai
    from server_harness import Server
    from strata.llm import LLM
    from test_server_model import reference

    path = GOLDEN / f"{fam}_f32.gguf"
    llm = LLM(str(path))
    srv = Server(engine="llm", model=path, n_ctx=256)
    try:
        assert srv.http.get("/v1/status").json()["model"]["path"] == str(path)
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0)
        model_id = client.models.list().data[0].id
        for prompt in ["The cat sat on", "def main():"]:
            r = client.completions.create(
                model=model_id, prompt=prompt, max_tokens=8, temperature=0
            )
            assert (r.choices[0].text, r.choices[0].finish_reason) == reference(llm, prompt, 8)
        chunks = list(
            client.chat.completions.create(
                model=model_id,
                messages=[{"role": "user", "content": "hello"}],
                max_tokens=6,
                temperature=0,
                stream=True,
            )
        )
        assert chunks[-1].choices[0].finish_reason in ("stop", "length")
    finally:
        srv.stop()


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("fam", FAMILIES)
def test_batched_step_equals_alone(fam: str, threads: int, root: Path) -> None:
    """`forward_batch` on these graphs (biases, shared expert, dense lead, sigmoid routing):
    every entry's logits bitwise those of its calls run alone, on the serial path and the pool."""
    batched_equals_alone(family_file(fam, root, "Q8_0"), threads)


def batched_equals_alone(path: Path, threads: int) -> None:
    """Random batched calls on `path`: every entry's logits bitwise its calls run alone."""
    import random

    from test_batch import N_CTX, N_SLOTS, random_calls, run_batched, same
    from test_batch import alone as run_alone

    m = Model.open(
        path, n_ctx=N_CTX, n_slots=N_SLOTS, kv_type="f16", prefill_chunk=64, threads=threads
    )
    for seed in range(2):
        rng = random.Random(seed)
        seqs = [random_calls(rng, m.n_vocab) for _ in range(rng.randint(2, N_SLOTS))]
        want = [run_alone(m, c) for c in seqs]
        got = run_batched(m, seqs, rng)
        for w, g in zip(want, got, strict=True):
            assert all(same(a, b) for a, b in zip(w, g, strict=True))


@pytest.mark.parametrize("fam", MOE_FAMILIES)
def test_ram_tier_modes_give_the_same_tokens(fam: str) -> None:
    """The RAM tier (resident, and budget with read-ahead) reads these files' experts, layers
    without experts included, and changes no token."""
    from strata.llm import LLM

    path = str(GOLDEN / f"{fam}_f32.gguf")

    def greedy(**kw: Any) -> list[int]:
        llm = LLM(path, **kw)
        ids = llm.tokenizer.encode("hello world")
        return [t for t, _ in llm.generate_ids(ids, max_tokens=8, temperature=0.0)]

    want = greedy()
    assert greedy(ram_mode="resident") == want
    assert greedy(ram_mode="budget", ram_budget_gib=0.0001, readahead="on") == want


def test_glm4moe_nextn_layers_are_not_run(root: Path) -> None:
    """A glm4moe file with a NextN (MTP) layer after the trunk (block_count counts it,
    nextn_predict_layers names it) runs the trunk alone: logits bitwise those of the same file
    without it, with the RAM tier attached too."""
    from strata.llm import LLM

    s = GOLDEN_SHAPES["glm4moe"]
    mtp = dataclasses.replace(s, n_nextn=1)
    trunk = qf.write(root / "trunk.gguf", s, qf.random_tensors(s, 7))
    both = qf.write(root / "mtp.gguf", mtp, qf.random_tensors(mtp, 7))
    assert "blk.3.nextn.eh_proj.weight" in metadata(both)[1]
    toks = list(range(1, 41))
    want = Model.open(trunk, n_ctx=64).forward(0, toks, logits="all")
    m = Model.open(both, n_ctx=64)
    assert m.hparams["n_layer"] == s.n_layer
    assert np.array_equal(m.forward(0, toks, logits="all"), want)
    llm = LLM(str(both), ram_mode="resident")  # the tier's layout skips the NextN layer too
    got = [t for t, _ in llm.generate_ids(toks, max_tokens=4, temperature=0.0)]
    ref = LLM(str(trunk), ram_mode="resident")
    assert got == [t for t, _ in ref.generate_ids(toks, max_tokens=4, temperature=0.0)]
