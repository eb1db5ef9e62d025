"""GGUFFile against gguf-py's own writer and reader (an independent implementation)."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
from strata.errors import GGUFError, StrataError
from strata.gguf import GGUFFile


def write_sample(path: Path) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(str(path), "qwen3moe")
    w.add_uint32("qwen3moe.block_count", 2)
    w.add_float32("qwen3moe.rope.freq_base", 1e6)
    w.add_string("general.name", "tiny ✓")
    w.add_array("tokenizer.ggml.tokens", ["a", "b", "ĠĊ"])
    w.add_array("some.ints", [1, -2, 3])
    w.add_bool("some.flag", True)
    tensors = {
        "a.weight": rng.standard_normal((3, 64)).astype(np.float32),
        "b.weight": rng.standard_normal((2, 4, 32)).astype(np.float16),
    }
    for k, v in tensors.items():
        w.add_tensor(k, v)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return tensors


def test_reads_what_gguf_py_writes(tmp_path: Path) -> None:
    p = tmp_path / "m.gguf"
    tensors = write_sample(p)
    ref = gguf.GGUFReader(str(p))
    with GGUFFile(p) as f:
        assert f.architecture == "qwen3moe"
        assert f.metadata["qwen3moe.block_count"] == 2
        assert f.metadata["general.name"] == "tiny ✓"
        assert f.metadata["tokenizer.ggml.tokens"] == ["a", "b", "ĠĊ"]
        assert f.metadata["some.ints"] == [1, -2, 3]
        assert f.metadata["some.flag"] is True
        assert set(f.tensors) == set(tensors)
        for t in ref.tensors:
            info = f.tensors[t.name]
            assert info.shape == tensors[t.name].shape
            assert info.nbytes == t.n_bytes
            assert info.type == t.tensor_type.name
            raw = f.raw(t.name)
            assert raw.dtype == np.uint8 and not raw.flags.writeable
            np.testing.assert_array_equal(raw, np.asarray(t.data).view(np.uint8).reshape(-1))
            np.testing.assert_array_equal(f.dequantize(t.name), tensors[t.name].astype(np.float32))


def test_views_outlive_close(tmp_path: Path) -> None:
    p = tmp_path / "m.gguf"
    tensors = write_sample(p)
    f = GGUFFile(p)
    raw = f.raw("a.weight")
    f.close()
    assert raw.view(np.float32).reshape(3, 64)[1, 5] == tensors["a.weight"][1, 5]
    with pytest.raises(ValueError, match="closed"):
        f.raw("a.weight")


def test_every_truncation_raises_gguf_error(tmp_path: Path) -> None:
    p = tmp_path / "m.gguf"
    write_sample(p)
    full = p.read_bytes()
    q = tmp_path / "t.gguf"
    for n in range(len(full)):
        q.write_bytes(full[:n])
        with pytest.raises(GGUFError) as ei:
            GGUFFile(q)
        assert "t.gguf" in str(ei.value)
        assert issubclass(ei.type, StrataError)


def test_missing_file_is_os_error(tmp_path: Path) -> None:
    with pytest.raises(OSError):
        GGUFFile(tmp_path / "nope.gguf")
