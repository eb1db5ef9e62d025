"""GGUFFile on damaged copies of small real GGUFs written by gguf-py: a qwen3moe-like model
(tokenizer arrays, F32/F16/BF16/Q8_0 tensors, 3-D expert tensors) and the same model split
into shards by gguf-py's writer. Every truncation, and every byte of the header overwritten,
must give the model back or raise GGUFError, never anything else."""

from __future__ import annotations

import re
from pathlib import Path

import gguf
import numpy as np
import pytest
from strata.errors import GGUFError
from strata.gguf import GGUFFile

Q8_0 = gguf.GGMLQuantizationType.Q8_0
BF16 = gguf.GGMLQuantizationType.BF16


def write_qwen3moe_like(path: Path, split_max_tensors: int = 0) -> None:
    rng = np.random.default_rng(1)
    w = gguf.GGUFWriter(str(path), "qwen3moe", split_max_tensors=split_max_tensors)
    w.add_block_count(1)
    w.add_context_length(128)
    w.add_embedding_length(32)
    w.add_feed_forward_length(16)
    w.add_expert_feed_forward_length(4)
    w.add_expert_count(4)
    w.add_expert_used_count(2)
    w.add_head_count(2)
    w.add_head_count_kv(1)
    w.add_rope_freq_base(1e6)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(["a", "b", "ab", "Ġ", "<|im_start|>", "<|im_end|>"])
    w.add_token_types([1, 1, 1, 1, 3, 3])
    w.add_token_merges(["a b"])
    w.add_eos_token_id(5)
    w.add_chat_template("{% for m in messages %}{{ m.content }}{% endfor %}")
    emb = rng.standard_normal((6, 32)).astype(np.float32)  # [vocab, embd]
    w.add_tensor("token_embd.weight", emb.astype(np.float16))
    w.add_tensor("blk.0.attn_norm.weight", np.ones(32, dtype=np.float32))
    # router [n_expert, embd]
    w.add_tensor("blk.0.ffn_gate_inp.weight", rng.standard_normal((4, 32)).astype(np.float16))
    # experts [n_expert, n_ff_exp, embd], Q8_0 rows of 32
    exps = rng.standard_normal((4, 4, 32)).astype(np.float32)
    w.add_tensor("blk.0.ffn_gate_exps.weight", gguf.quants.quantize(exps, Q8_0), raw_dtype=Q8_0)
    w.add_tensor("output.weight", gguf.quants.quantize(emb, BF16), raw_dtype=BF16)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    p = tmp_path_factory.mktemp("hostile") / "m.gguf"
    write_qwen3moe_like(p)
    return p


def assert_same_as_gguf_py(f: GGUFFile, ref: gguf.GGUFReader) -> None:
    assert f.architecture == "qwen3moe"
    assert len(f.tensors) == len(ref.tensors)
    for t in ref.tensors:
        info = f.tensors[t.name]
        assert info.type == t.tensor_type.name
        assert info.nbytes == t.n_bytes
        assert info.shape == tuple(int(d) for d in reversed(t.shape))
        np.testing.assert_array_equal(f.raw(t.name), np.asarray(t.data).view(np.uint8).ravel())


def test_model_reads_like_gguf_py(model: Path) -> None:
    with GGUFFile(model) as f:
        assert_same_as_gguf_py(f, gguf.GGUFReader(str(model)))
        assert f.metadata["qwen3moe.expert_count"] == 4
        assert f.metadata["tokenizer.ggml.tokens"][4] == "<|im_start|>"
        assert f.tensors["blk.0.ffn_gate_exps.weight"].shape == (4, 4, 32)


def test_every_truncation_raises_gguf_error(model: Path, tmp_path: Path) -> None:
    full = model.read_bytes()
    q = tmp_path / "cut.gguf"
    for n in range(len(full)):
        q.write_bytes(full[:n])
        with pytest.raises(GGUFError, match=re.escape("cut.gguf")):
            GGUFFile(q)


def test_every_header_byte_overwritten(model: Path, tmp_path: Path) -> None:
    """Each byte before the tensor data set to 0xFF (and to 0x00): read or GGUFError."""
    full = model.read_bytes()
    with GGUFFile(model) as f:
        header_end = min(t.offset for t in f.tensors.values())
    q = tmp_path / "flip.gguf"
    refused = 0
    for i in range(header_end):
        for v in (0xFF, 0x00):
            if full[i] == v:
                continue
            b = bytearray(full)
            b[i] = v
            q.write_bytes(bytes(b))
            try:
                GGUFFile(q).close()
            except GGUFError:
                refused += 1
    assert refused > header_end // 4  # the check reached the parser's refusals


def test_split_model(tmp_path: Path) -> None:
    write_qwen3moe_like(tmp_path / "s.gguf", split_max_tensors=2)
    shards = sorted(tmp_path.glob("s-*-of-*.gguf"))
    assert [p.name for p in shards] == [f"s-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    one = tmp_path / "one.gguf"
    write_qwen3moe_like(one)
    ref = gguf.GGUFReader(str(one))
    for p in shards:
        with GGUFFile(p) as f:
            assert f.shard_paths == shards
            assert_same_as_gguf_py(f, ref)
            assert f.metadata["split.count"] == 3
    # Every truncation of every shard, opened from the first shard.
    for p in shards:
        full = p.read_bytes()
        for n in range(len(full)):
            p.write_bytes(full[:n])
            with pytest.raises(GGUFError, match=re.escape(p.name)):
                GGUFFile(shards[0])
        p.write_bytes(full)
    shards[1].unlink()
    with pytest.raises(GGUFError, match="missing shard 2 of 3"):
        GGUFFile(shards[2])


def test_fuzz_regressions(tmp_path: Path) -> None:
    """Inputs a fuzz run found (docs/FUZZING.md): each raises GGUFError."""
    found = sorted((Path(__file__).parents[1] / "fuzz" / "regressions").iterdir())
    assert found
    for p in found:
        with pytest.raises(GGUFError):
            GGUFFile(p)
