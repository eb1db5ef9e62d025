"""Generated qwen3moe test models: metadata and tensors as llama.cpp expects (checked by gguf-py's
reader and by llama.cpp loading and running them), determinism, weight scales, quantization."""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path
from typing import Any

import gguf
import llama_cpp
import numpy as np
import pytest
from models import TestModels
from strata import modelgen
from strata.modelgen import ModelSpec


def sha256(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def field(r: gguf.GGUFReader, key: str) -> Any:
    return r.fields[key].contents()


@functools.cache
def run_llama(path: Path, text: bytes = b"Hello world, this is a test.") -> np.ndarray:
    """llama.cpp's logits for every position of `text` (cached per file and text)."""
    m = llama_cpp.Llama(model_path=str(path), logits_all=True, n_ctx=128, verbose=False)
    ids = m.tokenize(text, add_bos=False, special=True)
    m.eval(ids)
    logits = np.array(m.scores[: len(ids)], dtype=np.float32)
    m.close()
    return logits


def test_metadata_and_tensors_match_the_qwen3moe_layout(test_models: TestModels) -> None:
    spec = test_models.spec
    r = gguf.GGUFReader(str(test_models.f32()))
    expect = {
        "general.architecture": "qwen3moe",
        "qwen3moe.block_count": spec.n_layer,
        "qwen3moe.context_length": spec.n_ctx_train,
        "qwen3moe.embedding_length": spec.n_embd,
        "qwen3moe.expert_feed_forward_length": spec.n_ff_exp,
        "qwen3moe.expert_count": spec.n_expert,
        "qwen3moe.expert_used_count": spec.n_expert_used,
        "qwen3moe.attention.head_count": spec.n_head,
        "qwen3moe.attention.head_count_kv": spec.n_head_kv,
        "qwen3moe.attention.key_length": spec.head_dim,
        "qwen3moe.attention.value_length": spec.head_dim,
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "qwen2",
        "tokenizer.ggml.add_bos_token": False,
    }
    for k, v in expect.items():
        assert field(r, k) == v, k
    assert field(r, "qwen3moe.rope.freq_base") == pytest.approx(spec.rope_freq_base)
    assert field(r, "qwen3moe.attention.layer_norm_rms_epsilon") == pytest.approx(spec.rms_eps)
    tokens = field(r, "tokenizer.ggml.tokens")
    assert len(tokens) == spec.n_vocab
    for special in ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"):
        assert special in tokens
    assert tokens[field(r, "tokenizer.ggml.eos_token_id")] == "<|im_end|>"
    assert "<|im_start|>" in field(r, "tokenizer.chat_template")

    # ggml ne, docs/FORMATS.md §4 (gguf-py reports ne order in .shape)
    e, v, ff, ne = spec.n_embd, spec.n_vocab, spec.n_ff_exp, spec.n_expert
    qo, kvo, hd = spec.n_head * spec.head_dim, spec.n_head_kv * spec.head_dim, spec.head_dim
    want = {"token_embd.weight": [e, v], "output_norm.weight": [e], "output.weight": [e, v]}
    for i in range(spec.n_layer):
        p = f"blk.{i}."
        want |= {
            p + "attn_norm.weight": [e],
            p + "attn_q.weight": [e, qo],
            p + "attn_k.weight": [e, kvo],
            p + "attn_v.weight": [e, kvo],
            p + "attn_output.weight": [qo, e],
            p + "attn_q_norm.weight": [hd],
            p + "attn_k_norm.weight": [hd],
            p + "ffn_norm.weight": [e],
            p + "ffn_gate_inp.weight": [e, ne],
            p + "ffn_gate_exps.weight": [e, ff, ne],
            p + "ffn_up_exps.weight": [e, ff, ne],
            p + "ffn_down_exps.weight": [ff, e, ne],
        }
    got = {t.name: [int(x) for x in t.shape] for t in r.tensors}
    assert got == want
    assert {t.tensor_type for t in r.tensors} == {gguf.GGMLQuantizationType.F32}


def test_weight_scales_give_logits_spread(test_models: TestModels) -> None:
    spec = test_models.spec
    r = gguf.GGUFReader(str(test_models.f32()))
    t = {x.name: np.asarray(x.data) for x in r.tensors}
    assert abs(t["token_embd.weight"].std() - 1.0) < 0.02
    assert abs(t["blk.0.attn_q.weight"].std() * np.sqrt(spec.n_embd) - 1.0) < 0.02
    assert abs(t["blk.0.ffn_down_exps.weight"].std() * np.sqrt(spec.n_ff_exp) - 1.0) < 0.02
    assert abs(t["blk.0.ffn_gate_inp.weight"].std() * np.sqrt(spec.n_embd) - 1.0) < 0.05
    norm = t["blk.1.ffn_norm.weight"]
    assert norm.min() > 0.8 and norm.max() < 1.2
    logits = run_llama(test_models.f32())
    assert np.isfinite(logits).all()
    assert 0.5 < logits.std() < 2.0


def test_deterministic_bytes(tmp_path: Path, test_models: TestModels) -> None:
    p = modelgen.write_qwen3moe(tmp_path / "again.gguf", test_models.spec, seed=0)
    assert sha256(p) == sha256(test_models.f32())
    other = modelgen.write_qwen3moe(tmp_path / "seed1.gguf", test_models.spec, seed=1)
    assert sha256(other) != sha256(p)


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_half_precision_files_run(tmp_path: Path, test_models: TestModels, dtype: str) -> None:
    p = modelgen.write_qwen3moe(tmp_path / f"m-{dtype}.gguf", test_models.spec, dtype=dtype)
    # every matrix is gguf-py's rounding of the f32 file's values; norms and router stay f32
    ref_tensors = {t.name: t for t in gguf.GGUFReader(str(test_models.f32())).tensors}
    qt = gguf.GGMLQuantizationType.F16 if dtype == "f16" else gguf.GGMLQuantizationType.BF16
    for t in gguf.GGUFReader(str(p)).tensors:
        ref = np.asarray(ref_tensors[t.name].data)
        if ref.ndim == 1 or t.name.endswith("ffn_gate_inp.weight"):
            assert t.tensor_type == gguf.GGMLQuantizationType.F32
            np.testing.assert_array_equal(np.asarray(t.data), ref)
        else:
            assert t.tensor_type == qt
            want = gguf.quants.quantize(ref.astype(np.float32), qt)
            assert np.asarray(t.data).tobytes() == want.tobytes(), t.name
    # llama.cpp runs it; rounding the weights may flip a near-tie route, so compare loosely
    got, ref_logits = run_llama(p), run_llama(test_models.f32())
    assert np.isfinite(got).all()
    assert np.corrcoef(got.ravel(), ref_logits.ravel())[0, 1] > 0.95


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_K_M", "IQ3_S"])
def test_quantized_variants_run(test_models: TestModels, qtype: str) -> None:
    q = test_models.quantized(qtype)
    r = gguf.GGUFReader(str(q))
    types = {t.name: t.tensor_type.name for t in r.tensors}
    base = qtype.split("_K")[0] + ("_K" if "_K" in qtype else "")
    assert any(v.startswith(base) for v in types.values())
    assert types["blk.0.ffn_gate_inp.weight"] == "F32"  # never quantized
    logits = run_llama(q)
    ref = run_llama(test_models.f32())
    assert np.isfinite(logits).all()
    assert np.corrcoef(logits.ravel(), ref.ravel())[0, 1] > 0.9


def test_quantize_refusals(tmp_path: Path, test_models: TestModels) -> None:
    with pytest.raises(ValueError, match="type_name"):
        modelgen.quantize(test_models.f32(), tmp_path / "x.gguf", "Q9_9")
    # llama.cpp refuses these without an importance matrix: our list is right, and the
    # failure leaves nothing behind
    for t in sorted(modelgen.NEEDS_IMATRIX):
        with pytest.raises(modelgen.QuantizeError, match="importance matrix"):
            modelgen.quantize(test_models.f32(), tmp_path / f"{t}.gguf", t)
    assert list(tmp_path.iterdir()) == []


def test_ensure_default_model_builds_once(tmp_path: Path) -> None:
    p = modelgen.ensure_default_model(tmp_path)
    assert p.parent == tmp_path and p.is_file()
    assert [x.name for x in tmp_path.iterdir()] == [p.name]  # no temporary files left
    mtime = p.stat().st_mtime_ns
    assert modelgen.ensure_default_model(tmp_path) == p
    assert p.stat().st_mtime_ns == mtime
    spec = ModelSpec.default()
    r = gguf.GGUFReader(str(p))
    assert len(field(r, "tokenizer.ggml.tokens")) == spec.n_vocab
    assert np.isfinite(run_llama(p, b"<|im_start|>user\nhi<|im_end|>")).all()


def test_spec_validation() -> None:
    with pytest.raises(ValueError, match="n_head_kv"):
        ModelSpec.tiny(n_head_kv=3)
    with pytest.raises(ValueError, match="n_expert_used"):
        ModelSpec.tiny(n_expert_used=17)
    with pytest.raises(ValueError, match="vocab"):
        ModelSpec.tiny(vocab="llama")
    big = ModelSpec.qwen3_30b_a3b(layers=2)
    assert (big.n_embd, big.n_expert, big.n_ff_exp, big.head_dim) == (2048, 128, 768, 128)
    plan = modelgen.tensor_plan(big, 151936)
    assert len(plan) == 3 + 2 * 12


@pytest.fixture(scope="module")
def micro() -> TestModels:
    return TestModels.default_cache(ModelSpec.micro())


def test_imatrix_matches_numpy_for_the_first_projection(micro: TestModels) -> None:
    from strata.imatrix import calibration_text, compute_imatrix
    from strata.tokenizer import Tokenizer

    src = micro.f32()
    im = compute_imatrix(src, n_ctx=64, max_chunks=2)
    spec = micro.spec
    # attn_q of layer 0 sees RMSNorm(embedding) * attn_norm: compute that mean square in numpy
    r = gguf.GGUFReader(str(src))
    t = {x.name: np.asarray(x.data, dtype=np.float64) for x in r.tensors}
    ids = Tokenizer.from_gguf(src).encode(calibration_text(), parse_special=False)[:128]
    x = t["token_embd.weight"][ids]
    h = x / np.sqrt((x**2).mean(axis=1, keepdims=True) + spec.rms_eps) * t["blk.0.attn_norm.weight"]
    want = (h**2).mean(axis=0)
    got = im["blk.0.attn_q.weight"]
    np.testing.assert_allclose(got, want, rtol=1e-4)
    np.testing.assert_array_equal(im["blk.0.attn_k.weight"], got)  # same input
    assert im["blk.0.ffn_gate_exps.weight"].shape == (spec.n_embd * spec.n_expert,)
    assert im["blk.0.ffn_down_exps.weight"].shape == (spec.n_ff_exp * spec.n_expert,)
    assert all(np.isfinite(v).all() and (v > 0).all() for v in im.values())


# IQ2_XXS stands for the imatrix types here: IQ1_* quantize the same way but take ~30 s more
# (grid set-up); scripts/make_test_model.py makes them all.
@pytest.mark.parametrize("qtype", ["IQ2_XXS"])
def test_imatrix_types_quantize_and_run(micro: TestModels, qtype: str) -> None:
    q = micro.quantized(qtype)
    types = {t.name: t.tensor_type.name for t in gguf.GGUFReader(str(q)).tensors}
    assert types["blk.0.ffn_up_exps.weight"] == qtype
    logits = run_llama(q)
    ref = run_llama(micro.f32())
    assert np.isfinite(logits).all()
    assert np.corrcoef(logits.ravel(), ref.ravel())[0, 1] > 0.5


def _layer0_top_share(spec: ModelSpec) -> tuple[float, Any]:
    """Routing of every vocabulary entry at layer 0's router (RMS-normalized embeddings):
    the share of picks on the top 25% experts, and the pick counts."""
    w = modelgen.random_weights(spec)
    emb = w["token_embd.weight"]
    x = emb / np.sqrt((emb**2).mean(1, keepdims=True))
    logits = x @ w["blk.0.ffn_gate_inp.weight"].T
    top = np.argsort(-logits, axis=1)[:, : spec.n_expert_used]
    cnt = np.bincount(top.ravel(), minlength=spec.n_expert)
    return float(np.sort(cnt)[::-1][: spec.n_expert // 4].sum() / cnt.sum()), cnt


def test_router_zipf_biases_routing_by_rank() -> None:
    """`router_zipf` makes popularity follow the per-layer ranks (Zipf-like, near the share of
    drawing from a Zipf law: 0.65 for 32 experts top-4 at 1.1); without it routing stays
    near uniform (0.25); unbiased specs keep their cache keys and bytes."""
    base = ModelSpec.tiny(n_expert=32, n_expert_used=4)
    uni, _ = _layer0_top_share(base)
    biased_spec = ModelSpec.tiny(n_expert=32, n_expert_used=4, router_zipf=1.1)
    biased, cnt = _layer0_top_share(biased_spec)
    assert uni < 0.35, uni
    assert 0.55 < biased < 0.85, biased
    ranks = modelgen.zipf_ranks(biased_spec, 0)
    # Popularity falls with rank: Spearman correlation of count vs rank strongly negative.
    order = np.argsort(np.argsort(-cnt))
    rho = np.corrcoef(order, ranks)[0, 1]
    assert rho > 0.8, rho
    # Keys of unbiased specs are what they were before router_zipf existed (computed with
    # the generator of that time), so cached test models stay valid.
    assert ModelSpec.tiny().key() == "15f6b5823d9fdd5c"
    assert ModelSpec.micro().key(3, "f16") == "5788bac7e78f1332"
    assert biased_spec.key() != base.key()
    w0 = modelgen.random_weights(ModelSpec.micro())
    w1 = modelgen.random_weights(ModelSpec.micro(router_zipf=0.0))
    assert all(np.array_equal(w0[k], w1[k]) for k in w0)
    with pytest.raises(ValueError, match="router_zipf"):
        ModelSpec.tiny(router_zipf=-1.0)
