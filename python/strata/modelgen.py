"""Small random-weight qwen3moe GGUFs (docs/FORMATS.md §4) for tests, benchmarks and the server's
embedded default model.

- `ModelSpec`: the shapes; presets `tiny()`, `default()`, `qwen3_30b_a3b(layers)`.
- `write_qwen3moe(path, spec, seed, dtype)`: writes the file with gguf-py's GGUFWriter, one
  tensor at a time (memory stays at one tensor). Seeded: same arguments, same bytes.
- `quantize(src, dst, type_name)`: llama.cpp's own quantizer through llama-cpp-python.
- `ensure_default_model(cache_dir)`: builds the embedded default model once into the cache.

Weight scales follow docs/test-models.md "Weight scales": linear and router weights have std
1/sqrt(fan_in), embeddings std 1, norm weights near 1, so the logits have a clear spread.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import re
import tempfile
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from strata.vocabgen import GGUFVocab, qwen3_vocab, small_vocab

ARCH = "qwen3moe"
ARCHS = ("qwen3moe", "qwen3")
# Bump when the bytes written for a given (spec, seed, dtype) change, so caches rebuild.
GENERATOR_VERSION = 1

_DTYPES = ("f32", "f16", "bf16", "q8_0")
# llama_ftype: ALL_F32, MOSTLY_F16, MOSTLY_BF16, MOSTLY_Q8_0
_FILE_TYPE = {"f32": 0, "f16": 1, "bf16": 32, "q8_0": 7}


@dataclass(frozen=True)
class ModelSpec:
    """Shapes and hyper-parameters of a qwen3moe model (names as in docs/FORMATS.md §4)."""

    n_embd: int = 256
    n_layer: int = 4
    n_expert: int = 16
    n_expert_used: int = 4
    n_ff_exp: int = 256
    n_head: int = 4
    n_head_kv: int = 2
    head_dim: int = 64
    # Total vocabulary entries (trained tokens + ChatML specials + pads) for vocab="small";
    # ignored for vocab="qwen3" (151936).
    n_vocab: int = 2048
    n_ctx_train: int = 4096
    rope_freq_base: float = 1e6
    rms_eps: float = 1e-6
    vocab: str = "small"  # "small" (trained on the built-in corpus) or "qwen3"
    name: str = "strata-random-qwen3moe"
    # > 0: bias every router towards a Zipf-like expert popularity with this exponent (expert
    # of popularity rank r gets a logit shift of -ZIPF_GAIN·router_zipf·ln(r+1) along a
    # direction shared by all token embeddings); 0: random routers, which route almost
    # uniformly.
    router_zipf: float = 0.0
    # "qwen3moe" (routed experts in every layer) or "qwen3" (the dense variant: one FFN of
    # width n_ff_exp per layer; n_expert and n_expert_used must be 1).
    arch: str = "qwen3moe"

    def __post_init__(self) -> None:
        def bad(field: str, why: str) -> ValueError:
            return ValueError(f"{field}: {why} (got {getattr(self, field)!r})")

        for f in (
            "n_embd",
            "n_layer",
            "n_expert",
            "n_expert_used",
            "n_ff_exp",
            "n_head",
            "n_head_kv",
            "head_dim",
            "n_ctx_train",
        ):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise bad(f, "must be a positive integer")
        if self.n_expert_used > self.n_expert:
            raise bad("n_expert_used", f"must be <= n_expert ({self.n_expert})")
        if self.n_head % self.n_head_kv:
            raise bad("n_head_kv", f"must divide n_head ({self.n_head})")
        if self.head_dim % 2:
            raise bad("head_dim", "must be even (RoPE pairs)")
        if self.arch not in ARCHS:
            raise bad("arch", f"must be one of {', '.join(ARCHS)}")
        if self.arch == "qwen3" and (self.n_expert, self.n_expert_used) != (1, 1):
            raise bad("n_expert", "must be 1 (with n_expert_used 1) for the dense qwen3")
        if self.vocab not in ("small", "qwen3"):
            raise bad("vocab", "must be 'small' or 'qwen3'")
        if not (self.rope_freq_base > 0 and 0 < self.rms_eps < 1):
            raise ValueError("rope_freq_base must be > 0 and rms_eps in (0, 1)")
        if not (isinstance(self.router_zipf, (int, float)) and 0 <= self.router_zipf <= 10):
            raise bad("router_zipf", "must be a number in 0..10")

    # ---- presets -------------------------------------------------------------------------

    @classmethod
    def tiny(cls, **overrides: Any) -> ModelSpec:
        """The test model: hidden 256, 4 layers, 16 experts top-4, expert FF 256, 4 q heads and
        2 kv heads of 64. Every matrix's rows are a multiple of 256, so every K and IQ quant type
        applies to every matrix."""
        return dataclasses.replace(cls(), **overrides)

    @classmethod
    def micro(cls, **overrides: Any) -> ModelSpec:
        """For quant-format tests: tiny's widths (every row a multiple of 256) with 1 layer, 4
        experts top-2 and a 512-entry vocabulary, about 1.3 M weights, so even the slow IQ1/IQ2
        quantizations take seconds."""
        base = cls(n_layer=1, n_expert=4, n_expert_used=2, n_vocab=512, name="strata-micro")
        return dataclasses.replace(base, **overrides)

    @classmethod
    def default(cls, **overrides: Any) -> ModelSpec:
        """The server's embedded default model: tiny's shapes with a 4096-entry vocabulary and a
        longer trained context. Random weights; builds in a few seconds."""
        base = cls(n_vocab=4096, n_ctx_train=8192, name="strata-default-random-qwen3moe")
        return dataclasses.replace(base, **overrides)

    @classmethod
    def qwen3_30b_a3b(cls, layers: int = 8, **overrides: Any) -> ModelSpec:
        """Qwen3-30B-A3B at full width (docs/FORMATS.md §4) with `layers` of its 48 layers and the
        real Qwen3 vocabulary. About 1.8 GB of weights per layer in f32 (0.9 in f16)."""
        base = cls(
            n_embd=2048,
            n_layer=layers,
            n_expert=128,
            n_expert_used=8,
            n_ff_exp=768,
            n_head=32,
            n_head_kv=4,
            head_dim=128,
            n_vocab=151936,
            n_ctx_train=40960,
            vocab="qwen3",
            name=f"strata-random-qwen3-30b-a3b-{layers}l",
        )
        return dataclasses.replace(base, **overrides)

    def key(self, seed: int = 0, dtype: str = "f32") -> str:
        """A short hash of everything that determines the file's bytes."""
        spec = dataclasses.asdict(self)
        if not self.router_zipf:
            del spec["router_zipf"]  # keys of unbiased models stay what they were
        if self.arch == ARCH:
            del spec["arch"]
        what = {"spec": spec, "seed": seed, "dtype": dtype}
        blob = json.dumps({**what, "v": GENERATOR_VERSION}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


def build_vocab(spec: ModelSpec) -> GGUFVocab:
    return qwen3_vocab() if spec.vocab == "qwen3" else small_vocab(spec.n_vocab)


@dataclass(frozen=True)
class _Tensor:
    name: str
    shape: tuple[int, ...]  # numpy order (ggml ne reversed)
    kind: str  # "embed", "linear", "norm"
    fan_in: int
    store: str  # "f32" or the model dtype


def tensor_plan(spec: ModelSpec, n_vocab: int, dtype: str = "f32") -> list[_Tensor]:
    """Every tensor of the model, in file order, with its numpy shape (docs/FORMATS.md §4 table)."""
    e, hd, ff, ne = spec.n_embd, spec.head_dim, spec.n_ff_exp, spec.n_expert
    q_out, kv_out = spec.n_head * hd, spec.n_head_kv * hd
    plan = [
        _Tensor("token_embd.weight", (n_vocab, e), "embed", e, dtype),
        _Tensor("output_norm.weight", (e,), "norm", e, "f32"),
        _Tensor("output.weight", (n_vocab, e), "linear", e, dtype),
    ]
    for i in range(spec.n_layer):
        p = f"blk.{i}."
        if spec.arch == "qwen3":
            ffn = [
                _Tensor(p + "ffn_gate.weight", (ff, e), "linear", e, dtype),
                _Tensor(p + "ffn_up.weight", (ff, e), "linear", e, dtype),
                _Tensor(p + "ffn_down.weight", (e, ff), "linear", ff, dtype),
            ]
        else:
            ffn = [
                # The router stays f32, as llama-quantize leaves it.
                _Tensor(p + "ffn_gate_inp.weight", (ne, e), "linear", e, "f32"),
                # (E, rows, cols): expert x is the contiguous slab [x]; output = W[x] @ input.
                _Tensor(p + "ffn_gate_exps.weight", (ne, ff, e), "linear", e, dtype),
                _Tensor(p + "ffn_up_exps.weight", (ne, ff, e), "linear", e, dtype),
                _Tensor(p + "ffn_down_exps.weight", (ne, e, ff), "linear", ff, dtype),
            ]
        plan += [
            _Tensor(p + "attn_norm.weight", (e,), "norm", e, "f32"),
            _Tensor(p + "attn_q.weight", (q_out, e), "linear", e, dtype),
            _Tensor(p + "attn_k.weight", (kv_out, e), "linear", e, dtype),
            _Tensor(p + "attn_v.weight", (kv_out, e), "linear", e, dtype),
            _Tensor(p + "attn_output.weight", (e, q_out), "linear", q_out, dtype),
            _Tensor(p + "attn_q_norm.weight", (hd,), "norm", hd, "f32"),
            _Tensor(p + "attn_k_norm.weight", (hd,), "norm", hd, "f32"),
            _Tensor(p + "ffn_norm.weight", (e,), "norm", e, "f32"),
            *ffn,
        ]
    return plan


def random_weights(spec: ModelSpec, seed: int = 0) -> dict[str, np.ndarray[Any, Any]]:
    """The float32 values `write_qwen3moe(spec, seed)` writes, by GGUF tensor name (numpy
    shapes). Holds the whole model in memory: for small specs."""
    n_vocab = spec.n_vocab if spec.vocab == "small" else len(build_vocab(spec))
    return {t.name: _biased(spec, t, _values(t, seed), seed) for t in tensor_plan(spec, n_vocab)}


def _values(t: _Tensor, seed: int) -> np.ndarray[Any, Any]:
    # Per-tensor stream keyed by (seed, name): a tensor's values do not depend on the others.
    rng = np.random.default_rng([seed, zlib.crc32(t.name.encode())])
    x = rng.standard_normal(t.shape, dtype=np.float32)
    if t.kind == "norm":
        norm: np.ndarray[Any, Any] = x * np.float32(0.05) + np.float32(1.0)
        return norm
    if t.kind == "linear":
        x *= np.float32(1.0 / np.sqrt(t.fan_in))
    return x


# Scales the Zipf logit shift so that the measured share of routed picks on a layer's top 25%
# experts comes near the share of drawing top-k distinct experts from a Zipf(router_zipf)
# law (a router's top-k of noisy logits is sharper than sampling; bench/router_zipf.py
# prints both).
ZIPF_GAIN = 0.5


def _zipf_direction(n_embd: int, seed: int) -> np.ndarray[Any, Any]:
    """The unit direction shared by every token embedding of a Zipf-biased model."""
    rng = np.random.default_rng([seed, zlib.crc32(b"router-zipf-direction")])
    u = rng.standard_normal(n_embd).astype(np.float64)
    out: np.ndarray[Any, Any] = (u / np.linalg.norm(u)).astype(np.float32)
    return out


def zipf_ranks(spec: ModelSpec, layer: int, seed: int = 0) -> np.ndarray[Any, Any]:
    """Popularity rank (0 = hottest) of each expert of `layer` in a Zipf-biased model: a
    random permutation per layer, so each layer has its own hot experts."""
    rng = np.random.default_rng([seed, zlib.crc32(f"router-zipf-rank-{layer}".encode())])
    ranks: np.ndarray[Any, Any] = rng.permutation(spec.n_expert)
    return ranks


def _biased(
    spec: ModelSpec, t: _Tensor, x: np.ndarray[Any, Any], seed: int
) -> np.ndarray[Any, Any]:
    """Apply `spec.router_zipf`: every token embedding gets the shared unit direction u with
    the norm of a typical row (sqrt(n_embd)), so after RMSNorm each hidden state has a
    component of about sqrt(n_embd / 2) along u; router row e gets u scaled so that this
    component shifts its logit by -ZIPF_GAIN·router_zipf·ln(rank_e + 1). The random part of
    a router logit has std ~1, so popularity falls off roughly like rank^-router_zipf."""
    if not spec.router_zipf:
        return x
    e = spec.n_embd
    if t.name == "token_embd.weight":
        emb: np.ndarray[Any, Any] = x + np.float32(np.sqrt(e)) * _zipf_direction(e, seed)[None, :]
        return emb
    m = re.fullmatch(r"blk\.(\d+)\.ffn_gate_inp\.weight", t.name)
    if m is None:
        return x
    ranks = zipf_ranks(spec, int(m.group(1)), seed)
    shift = -ZIPF_GAIN * spec.router_zipf * np.log(ranks + 1.0)
    along = np.sqrt(e / 2.0)  # the hidden state's expected component along u
    u = _zipf_direction(e, seed)
    # Remove each random row's own component along u first: every hidden state shares that
    # component, so it would be a popularity bias of its own, independent of the ranks.
    x = x - (x @ u)[:, None] * u[None, :]
    router: np.ndarray[Any, Any] = x + (shift[:, None] / along).astype(np.float32) * u[None, :]
    return router


def _encode(x: np.ndarray[Any, Any], store: str) -> np.ndarray[Any, Any]:
    if store == "f32":
        return x
    if store == "f16":
        return x.astype(np.float16)
    if store == "q8_0":
        # gguf-py's Q8_0, bit-exact with ggml's reference quantizer (what llama-quantize runs)
        import gguf

        q8: np.ndarray[Any, Any] = gguf.quants.quantize(x, gguf.GGMLQuantizationType.Q8_0)
        return q8
    # bf16, round to nearest even as gguf-py / ggml do
    u = x.view(np.uint32).astype(np.uint64)
    rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return rounded.astype(np.uint16)


def _iter_tensors(
    plan: list[_Tensor],
    seed: int,
    weights: Mapping[str, np.ndarray[Any, Any]] | None = None,
    spec: ModelSpec | None = None,
) -> Iterator[tuple[_Tensor, np.ndarray[Any, Any]]]:
    for t in plan:
        if weights is None:
            x = _values(t, seed)
            if spec is not None:
                x = _biased(spec, t, x, seed)
        else:
            x = np.ascontiguousarray(weights[t.name], dtype=np.float32)
        yield t, _encode(x, t.store)


def _check_weights(plan: list[_Tensor], weights: Mapping[str, np.ndarray[Any, Any]]) -> None:
    want = {t.name: t.shape for t in plan}
    missing = sorted(set(want) - set(weights))
    extra = sorted(set(weights) - set(want))
    if missing or extra:
        raise ValueError(f"weights: missing {missing[:5]}, unexpected {extra[:5]}")
    for name, shape in want.items():
        if tuple(weights[name].shape) != shape:
            got = tuple(weights[name].shape)
            raise ValueError(f"weights: {name} has shape {got}, the model needs {shape}")


def write_qwen3moe(
    path: str | os.PathLike[str],
    spec: ModelSpec,
    seed: int = 0,
    dtype: str = "f32",
    vocab: GGUFVocab | None = None,
    weights: Mapping[str, np.ndarray[Any, Any]] | None = None,
    description: str | None = None,
) -> Path:
    """Write a random-weight qwen3moe GGUF (or dense qwen3, by `spec.arch`). `dtype` (f32,
    f16, bf16, q8_0) is the matrices' type; norms and the router are always f32. Deterministic in
    (spec, seed, dtype). Returns the path. `description` replaces general.description.
    `weights` (GGUF tensor name → array of the tensor's numpy shape, e.g. from
    `strata.hfconvert.hf_to_gguf`) replaces the random values."""
    import gguf

    if dtype not in _DTYPES:
        raise ValueError(f"dtype: must be one of {', '.join(_DTYPES)} (got {dtype!r})")
    path = Path(path)
    vocab = vocab if vocab is not None else build_vocab(spec)
    n_vocab = len(vocab)
    plan = tensor_plan(spec, n_vocab, dtype)
    if weights is not None:
        _check_weights(plan, weights)

    w = gguf.GGUFWriter(path, spec.arch)
    what = "random weights" if weights is None else "given weights"
    desc = description or f"{what} (not a trained model), made by strata.modelgen"
    _add_header(w, spec, vocab, desc, _FILE_TYPE[dtype])

    np_dtype = {"f32": np.float32, "f16": np.float16, "bf16": np.uint16, "q8_0": np.uint8}
    raws = {"bf16": gguf.GGMLQuantizationType.BF16, "q8_0": gguf.GGMLQuantizationType.Q8_0}
    for t in plan:
        shape = t.shape
        if t.store == "q8_0":  # byte shape: rows of 34-byte blocks of 32 weights
            shape = (*t.shape[:-1], t.shape[-1] // 32 * 34)
        nbytes = int(np.prod(shape)) * np.dtype(np_dtype[t.store]).itemsize
        dt = np.dtype(np_dtype[t.store])
        w.add_tensor_info(t.name, shape, dt, nbytes, raw_dtype=raws.get(t.store))
    try:
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        for _, data in _iter_tensors(plan, seed, weights, spec):
            w.write_tensor_data(data)
        w.flush()
    finally:
        w.close()
    return path


@dataclass(frozen=True)
class RopeScaling:
    """`rope.scaling.*` metadata (llama.cpp's names): kind "linear" or "yarn", the factor, and
    the original context (0: not written)."""

    kind: str
    factor: float
    orig_ctx: int = 0


def _add_header(
    w: Any,
    spec: ModelSpec,
    vocab: GGUFVocab,
    description: str,
    file_type: int,
    rope_scaling: RopeScaling | None = None,
) -> None:
    """Every metadata key of a model file: the hyper-parameters under the writer's
    architecture name, the file type and the tokenizer."""
    import gguf

    w.add_type("model")
    w.add_name(spec.name)
    w.add_description(description)
    w.add_file_type(file_type)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    w.add_block_count(spec.n_layer)
    w.add_context_length(spec.n_ctx_train)
    w.add_embedding_length(spec.n_embd)
    w.add_feed_forward_length(spec.n_ff_exp * spec.n_expert_used)
    if spec.arch == ARCH:
        w.add_expert_feed_forward_length(spec.n_ff_exp)
        w.add_expert_count(spec.n_expert)
        w.add_expert_used_count(spec.n_expert_used)
    w.add_head_count(spec.n_head)
    w.add_head_count_kv(spec.n_head_kv)
    w.add_key_length(spec.head_dim)
    w.add_value_length(spec.head_dim)
    w.add_rope_dimension_count(spec.head_dim)
    w.add_rope_freq_base(spec.rope_freq_base)
    w.add_layer_norm_rms_eps(spec.rms_eps)
    if rope_scaling is not None:
        w.add_rope_scaling_type(gguf.RopeScalingType(rope_scaling.kind))
        w.add_rope_scaling_factor(rope_scaling.factor)
        if rope_scaling.orig_ctx:
            w.add_rope_scaling_orig_ctx_len(rope_scaling.orig_ctx)
    vocab.add_to_writer(w)


def write_arrays(
    path: str | os.PathLike[str],
    spec: ModelSpec,
    arrays: Mapping[str, np.ndarray[Any, Any]],
    *,
    vocab: GGUFVocab | None = None,
    arch: str | None = None,
    rope_scaling: RopeScaling | None = None,
    drop: tuple[str, ...] = (),
) -> Path:
    """Write `arrays` (GGUF tensor name → array in numpy order, stored in its own dtype) as
    they are, with `write_qwen3moe`'s metadata. Nothing is checked, so tests can write the
    files the loader must refuse: `arch` renames the architecture (the keys follow it), `drop`
    removes metadata keys after they are set, and any name, shape or dtype goes in."""
    import gguf

    path = Path(path)
    w = gguf.GGUFWriter(path, arch or spec.arch)
    vocab = vocab if vocab is not None else build_vocab(spec)
    desc = "given weights (not a trained model), made by strata.modelgen"
    _add_header(w, spec, vocab, desc, _FILE_TYPE["f32"], rope_scaling)
    for name, arr in arrays.items():
        w.add_tensor(name, np.ascontiguousarray(arr))
    for key in drop:
        del w.kv_data[0][key]
    try:
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
    finally:
        w.close()
    return path


def write_vocab_only(path: str | os.PathLike[str], vocab: GGUFVocab, spec: ModelSpec) -> Path:
    """A GGUF with the model metadata and the tokenizer but no tensors, for tokenizer tests
    (llama.cpp opens it with vocab_only=True)."""
    import gguf

    path = Path(path)
    w = gguf.GGUFWriter(path, spec.arch)
    _add_header(w, spec, vocab, "tokenizer only, made by strata.modelgen", _FILE_TYPE["f32"])
    try:
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
    finally:
        w.close()
    return path


# ---- quantization through llama.cpp ------------------------------------------------------

# llama_ftype values (llama.h) by the names llama-quantize accepts.
FTYPES: dict[str, int] = {
    "F32": 0,
    "F16": 1,
    "Q4_0": 2,
    "Q4_1": 3,
    "Q8_0": 7,
    "Q5_0": 8,
    "Q5_1": 9,
    "Q2_K": 10,
    "Q3_K_S": 11,
    "Q3_K_M": 12,
    "Q3_K_L": 13,
    "Q4_K_S": 14,
    "Q4_K_M": 15,
    "Q5_K_S": 16,
    "Q5_K_M": 17,
    "Q6_K": 18,
    "IQ2_XXS": 19,
    "IQ2_XS": 20,
    "Q2_K_S": 21,
    "IQ3_XS": 22,
    "IQ3_XXS": 23,
    "IQ1_S": 24,
    "IQ4_NL": 25,
    "IQ3_S": 26,
    "IQ3_M": 27,
    "IQ2_S": 28,
    "IQ2_M": 29,
    "IQ4_XS": 30,
    "IQ1_M": 31,
    "BF16": 32,
    "TQ1_0": 36,
    "TQ2_0": 37,
    "MXFP4_MOE": 38,
}


# Types llama.cpp refuses to make without an importance matrix (found by trying, on the tiny
# model; tests/test_modelgen.py checks the list). IQ3_XXS and IQ3_XS are here because their
# mixes put some tensors (attn_k) in IQ2 types.
NEEDS_IMATRIX = frozenset(
    {"IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ2_M", "IQ3_XXS", "IQ3_XS", "Q2_K_S"}
)


class QuantizeError(RuntimeError):
    """llama.cpp's quantizer refused or failed."""


def quantize(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    type_name: str,
    *,
    imatrix: dict[str, np.ndarray[Any, Any]] | None = None,
    nthread: int = 0,
    pure: bool = False,
) -> Path:
    """Quantize `src` to `dst` with llama.cpp's own quantizer (`llama_model_quantize` from
    llama-cpp-python). `type_name` is a llama-quantize type name (Q8_0, Q4_K_M, IQ3_S, ...).
    `imatrix` maps tensor names to per-column importances (length ne0 × n_expert for 3-D
    expert tensors), as llama-imatrix would give. Writes through a temporary file next to
    `dst`, renamed into place only on success."""
    import ctypes

    import llama_cpp

    key = type_name.upper()
    if key not in FTYPES:
        raise ValueError(f"type_name: unknown quant type {type_name!r}; known: {', '.join(FTYPES)}")
    dst = Path(dst)
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = FTYPES[key]
    params.nthread = nthread
    params.pure = pure
    keep: list[Any] = []  # keeps the ctypes buffers alive during the call
    if imatrix:
        entry_t = getattr(llama_cpp, "llama_model_imatrix_data", None)
        if entry_t is None:
            raise QuantizeError(
                f"llama-cpp-python {llama_cpp.__version__} cannot pass an importance matrix "
                "(it lacks llama_model_imatrix_data; 0.3.36 has it)"
            )
        entries = (entry_t * (len(imatrix) + 1))()
        for i, (name, values) in enumerate(sorted(imatrix.items())):
            arr = np.ascontiguousarray(values, dtype=np.float32)
            keep.append(arr)
            entries[i].name = name.encode()
            entries[i].data = arr.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
            entries[i].size = arr.size
        entries[len(imatrix)].name = None  # terminator
        keep.append(entries)
        params.imatrix = ctypes.cast(entries, ctypes.POINTER(entry_t))
    fd, tmp = tempfile.mkstemp(prefix=dst.name + ".", suffix=".part", dir=dst.parent)
    os.close(fd)
    log: list[str] = []
    try:
        with _captured_llama_log(log):
            rc = llama_cpp.llama_model_quantize(
                os.fsencode(src), os.fsencode(tmp), ctypes.byref(params)
            )
        if rc != 0:
            why = "; ".join(_error_lines("".join(log))) or "no message"
            raise QuantizeError(f"llama.cpp could not quantize {src} to {key}: {why}")
        os.chmod(tmp, 0o644)
        os.replace(tmp, dst)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    del keep
    return dst


_ERROR_LINE = re.compile(r"error|failed|offending|target type", re.IGNORECASE)


def _error_lines(log: str) -> list[str]:
    return [ln.strip(" -") for ln in log.splitlines() if _ERROR_LINE.search(ln)][-4:]


_log_sink: list[list[str]] = []


@contextlib.contextmanager
def _captured_llama_log(out: list[str]) -> Iterator[None]:
    """Route llama.cpp's log into `out` (instead of stderr) for the duration."""
    import ctypes

    import llama_cpp
    from llama_cpp import _logger

    global _log_callback
    if _log_callback is None:

        def cb(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
            if _log_sink:
                _log_sink[-1].append(text.decode("utf-8", "replace"))

        _log_callback = llama_cpp.llama_log_callback(cb)
    _log_sink.append(out)
    llama_cpp.llama_log_set(_log_callback, ctypes.c_void_p(0))
    try:
        yield
    finally:
        _log_sink.pop()
        if not _log_sink:
            llama_cpp.llama_log_set(_logger.llama_log_callback, ctypes.c_void_p(0))


_log_callback: Any = None


# ---- the embedded default model ----------------------------------------------------------

# The trained models shipped inside the package (docs/MODELS.md; made by
# scripts/train_default_model.py): the server's default, and its speculative-decoding draft.
SHIPPED = {
    "default": "strata-default-qwen3moe-q8_0.gguf",
    "draft": "strata-draft-qwen3-q8_0.gguf",
}
TRAINED_DEFAULT_WEIGHTS = (
    "trained: Strata's default model, a small qwen3moe (5 layers, 32 experts top-4, 21 M "
    "weights, Q8_0) trained on the Python standard library's sources; it completes Python "
    "code, nothing more; held-out perplexity 20 on stdlib modules it never saw (docs/MODELS.md)"
)


def shipped_model_path(kind: str = "default") -> Path:
    """A trained model shipped in the package (`SHIPPED`): no build, no download."""
    if kind not in SHIPPED:
        raise ValueError(f"kind: must be one of {', '.join(SHIPPED)} (got {kind!r})")
    path = Path(__file__).resolve().parent / "models" / SHIPPED[kind]
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: the package was installed without its models")
    return path


# The random-weight model (tests, benchmarks): built on demand into the cache.
DEFAULT_SEED = 0
DEFAULT_DTYPE = "f32"


def user_cache_dir() -> Path:
    """~/.cache/strata, honouring the platform's XDG_CACHE_HOME convention."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "strata"


def default_model_path(cache_dir: str | Path | None = None) -> Path:
    spec = ModelSpec.default()
    d = Path(cache_dir) if cache_dir else user_cache_dir()
    return d / f"default-qwen3moe-{spec.key(DEFAULT_SEED, DEFAULT_DTYPE)}.gguf"


def ensure_default_model(cache_dir: str | Path | None = None) -> Path:
    """Build the embedded default model (`ModelSpec.default()`, random weights) into
    `cache_dir` (default: the user cache, ~/.cache/strata) unless it is there already; return
    its path. Deterministic; written to a temporary file and renamed atomically."""
    path = default_model_path(cache_dir)
    if path.is_file():
        return path
    return build_cached(path, ModelSpec.default(), DEFAULT_SEED, DEFAULT_DTYPE)


def build_cached(path: Path, spec: ModelSpec, seed: int, dtype: str) -> Path:
    """Write the model to a temporary file in `path`'s folder, then rename it to `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".part", dir=path.parent)
    os.close(fd)
    try:
        write_qwen3moe(tmp, spec, seed=seed, dtype=dtype)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path
