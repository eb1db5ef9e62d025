"""Copies of a GGUF with its metadata or tensors edited (gguf-py's reader and writer), for
tests of what the loader does with them."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import gguf
import numpy as np


def rewrite(
    src: Path,
    dst: Path,
    drop: str = "",
    skip_tensor: str = "",
    vocab: Any = None,
    extra: Mapping[str, int | float] | None = None,
) -> Path:
    """A copy of a GGUF without the metadata key `drop` and the tensor `skip_tensor`, with the
    tokenizer of `vocab` (a `vocabgen.GGUFVocab`) when given, and the int32 / float32 keys of
    `extra` added."""
    r = gguf.GGUFReader(src)
    w = gguf.GGUFWriter(dst, r.fields["general.architecture"].contents())
    if vocab is not None:
        vocab.add_to_writer(w)
    for k, f in r.fields.items():
        if k == drop or k.startswith("GGUF.") or k == "general.architecture":
            continue
        if vocab is not None and k.startswith("tokenizer."):
            continue
        v, ty = f.contents(), f.types[0]
        if ty == gguf.GGUFValueType.ARRAY:
            w.add_key_value(k, v, ty, sub_type=f.types[-1])
        else:
            w.add_key_value(k, v, ty)
    for k, x in (extra or {}).items():
        if isinstance(x, int):
            w.add_int32(k, x)
        else:
            w.add_float32(k, x)
    for t in r.tensors:
        if t.name != skip_tensor:
            w.add_tensor(t.name, np.array(t.data), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst
