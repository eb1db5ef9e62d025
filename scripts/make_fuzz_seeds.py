#!/usr/bin/env python3
"""Writes the seed corpus and the dictionary for the GGUF parser's fuzz target.

Seeds (into `fuzz/corpus/gguf_parse/`, not committed; CI remakes them): small valid GGUFs
written by gguf-py (every value type, a qwen3moe-like model with F32/F16/BF16/Q8_0 tensors
and 3-D expert tensors, a non-default alignment, a split model joined by the target's shard
separator, a big-endian file), and crafted variants of them (truncations, huge counts and
lengths, bad dims, types, offsets), each a case the parser must refuse, and every input a
fuzz run found (`fuzz/regressions/`, committed, also replayed by the Rust tests).

Dictionary (`fuzz/gguf.dict`, committed): every key name in gguf-py's `gguf.Keys` (with
`{arch}` = qwen3moe), each also with its u64 length prefix, plus the magic, versions, value
and tensor type ids, and the shard separator.

Usage: python scripts/make_fuzz_seeds.py [--out DIR] [--dict PATH]
"""

from __future__ import annotations

import argparse
import struct
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import gguf
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
SEP = b"#GGUF-SHARD#"  # fuzz/fuzz_targets/gguf_parse.rs
ARCH = "qwen3moe"


def _write(path: Path, fill: Callable[[gguf.GGUFWriter], None], **kw: object) -> None:
    w = gguf.GGUFWriter(str(path), ARCH, **kw)  # type: ignore[arg-type]
    fill(w)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _every_value_type(w: gguf.GGUFWriter) -> None:
    w.add_uint8("t.u8", 200)
    w.add_int8("t.i8", -5)
    w.add_uint16("t.u16", 60000)
    w.add_int16("t.i16", -300)
    w.add_uint32("t.u32", 4_000_000_000)
    w.add_int32("t.i32", -70000)
    w.add_float32("t.f32", 1.5)
    w.add_bool("t.bool", True)
    w.add_string("t.str", "héllo")
    w.add_uint64("t.u64", 2**63 + 1)
    w.add_int64("t.i64", -(2**40))
    w.add_float64("t.f64", -0.25)
    w.add_array("t.arr_i", [1, -2, 3])
    w.add_array("t.arr_f", [0.5, 1.5])
    w.add_array("t.arr_s", ["a", "", "ĠĊ"])
    w.add_array("t.arr_b", [True, False])
    w.add_tensor("x.weight", np.arange(8, dtype=np.float32))


def _qwen3moe_like(w: gguf.GGUFWriter) -> None:
    rng = np.random.default_rng(0)
    w.add_block_count(1)
    w.add_context_length(64)
    w.add_embedding_length(32)
    w.add_expert_count(2)
    w.add_expert_used_count(1)
    w.add_head_count(2)
    w.add_rope_freq_base(1e6)
    w.add_tokenizer_model("gpt2")
    w.add_token_list(["a", "b", "ab", "<|im_start|>"])
    w.add_token_types([1, 1, 1, 3])
    w.add_token_merges(["a b"])
    w.add_eos_token_id(3)
    w.add_chat_template("{{ messages }}")
    f32 = rng.standard_normal((4, 32)).astype(np.float32)
    w.add_tensor("token_embd.weight", f32)
    w.add_tensor("blk.0.attn_norm.weight", np.ones(32, dtype=np.float32))
    w.add_tensor("blk.0.ffn_gate_inp.weight", rng.standard_normal((2, 32)).astype(np.float16))
    q8 = gguf.quants.quantize(f32, gguf.GGMLQuantizationType.Q8_0)
    w.add_tensor(
        "blk.0.ffn_gate_exps.weight",
        np.stack([q8, q8]),
        raw_dtype=gguf.GGMLQuantizationType.Q8_0,
    )
    bf = gguf.quants.quantize(f32[:2], gguf.GGMLQuantizationType.BF16)
    w.add_tensor("output.weight", bf, raw_dtype=gguf.GGMLQuantizationType.BF16)


def _aligned(w: gguf.GGUFWriter) -> None:
    w.data_alignment = 64
    w.add_custom_alignment(64)
    w.add_tensor("a.weight", np.arange(3, dtype=np.float32))
    w.add_tensor("b.weight", np.arange(5, dtype=np.float16))


def _minimal(w: gguf.GGUFWriter) -> None:
    pass


def _split_model(tmp: Path) -> bytes:
    """A 3-shard model (one tensor a shard), its shards joined by SEP."""

    def fill(w: gguf.GGUFWriter) -> None:
        w.add_block_count(1)
        for i in range(3):
            w.add_tensor(f"t{i}.weight", np.full(4 + 4 * i, i, dtype=np.float32))

    _write(tmp / "split.gguf", fill, split_max_tensors=1)
    shards = sorted(tmp.glob("split-*-of-*.gguf"))
    assert len(shards) == 3, shards
    return SEP.join(p.read_bytes() for p in shards)


def _crafted(good: bytes) -> Iterator[tuple[str, bytes]]:
    """Byte patches of a good file at the header and the first key and tensor info."""

    def patch(at: int, fmt: str, v: int) -> bytes:
        b = bytearray(good)
        struct.pack_into(fmt, b, at, v)
        return bytes(b)

    yield "version0", patch(4, "<I", 0)
    yield "version4", patch(4, "<I", 4)
    yield "version2", patch(4, "<I", 2)
    yield "tensors_huge", patch(8, "<Q", 2**63)
    yield "kv_huge", patch(16, "<Q", 2**40)
    yield "key_len_huge", patch(24, "<Q", 2**62)
    for cut in (3, 23, 40, len(good) // 2, len(good) - 1):
        yield f"cut{cut}", good[:cut]
    name = b"token_embd.weight"
    i = good.index(name) + len(name)  # n_dims, dims, type, offset follow
    yield "ndims5", patch(i, "<I", 5)
    yield "ndims0", patch(i, "<I", 0)
    yield "dim_huge", patch(i + 4, "<Q", 2**62)
    yield "type_bad", patch(i + 20, "<I", 99)
    yield "offset_unaligned", patch(i + 24, "<Q", 1)
    yield "offset_huge", patch(i + 24, "<Q", 2**64 - 32)
    arr = good.index(b"tokenizer.ggml.tokens") + len(b"tokenizer.ggml.tokens")
    yield "array_len_huge", patch(arr + 8, "<Q", 2**61)
    yield "array_nested", patch(arr + 4, "<I", 9)
    yield "value_type_bad", patch(arr, "<I", 13)


def make_seeds(out: Path) -> int:
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        seeds: dict[str, bytes] = {}
        for name, fill in [
            ("minimal", _minimal),
            ("value_types", _every_value_type),
            ("qwen3moe", _qwen3moe_like),
            ("aligned64", _aligned),
        ]:
            _write(tmp / f"{name}.gguf", fill)
            seeds[name] = (tmp / f"{name}.gguf").read_bytes()
        _write(tmp / "be.gguf", _minimal, endianess=gguf.GGUFEndian.BIG)
        seeds["big_endian"] = (tmp / "be.gguf").read_bytes()
        seeds["split3"] = _split_model(tmp)
        for name, b in _crafted(seeds["qwen3moe"]):
            seeds[f"crafted_{name}"] = b
    for p in sorted((ROOT / "fuzz" / "regressions").glob("*")):
        seeds[f"regression_{p.stem}"] = p.read_bytes()
    for name, b in seeds.items():
        (out / f"seed_{name}.gguf").write_bytes(b)
    return len(seeds)


def _all_keys() -> list[str]:
    keys: set[str] = set()
    for group in vars(gguf.Keys).values():
        for v in vars(group).values() if isinstance(group, type) else ():
            if isinstance(v, str) and "." in v:
                keys.add(v.replace("{arch}", ARCH))
    return sorted(keys)


def _esc(b: bytes) -> str:
    return "".join(chr(c) if 32 <= c < 127 and c not in b'"\\' else f"\\x{c:02x}" for c in b)


def make_dict(path: Path) -> int:
    lines = ["# Generated by scripts/make_fuzz_seeds.py from gguf-py's gguf.Keys; do not edit."]
    tokens: list[bytes] = [b"GGUF", SEP]
    tokens += [struct.pack("<I", v) for v in (2, 3, 0x03000000)]
    tokens += [struct.pack("<I", int(t)) for t in gguf.GGUFValueType]
    tokens += [struct.pack("<I", int(t)) for t in gguf.GGMLQuantizationType]
    tokens += [struct.pack("<Q", v) for v in (0, 1, 32, 2**63, 2**64 - 1)]
    for k in _all_keys():
        kb = k.encode()
        tokens += [kb, struct.pack("<Q", len(kb)) + kb]
    seen: set[bytes] = set()
    for t in tokens:
        if t not in seen:
            seen.add(t)
            lines.append(f'"{_esc(t)}"')
    path.write_text("\n".join(lines) + "\n")
    return len(seen)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "fuzz" / "corpus" / "gguf_parse")
    ap.add_argument("--dict", type=Path, default=ROOT / "fuzz" / "gguf.dict")
    a = ap.parse_args()
    n = make_seeds(a.out)
    m = make_dict(a.dict)
    print(f"{n} seeds in {a.out}, {m} dictionary entries in {a.dict}")


if __name__ == "__main__":
    main()
