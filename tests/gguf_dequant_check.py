"""Whole-file dequantization check: every tensor of a GGUF file dequantized by Strata
(`strata.gguf.GGUFFile.dequantize`) against gguf-py (`GGUFReader` + `gguf.quants.dequantize`),
bit for bit. Types gguf-py cannot dequantize (Q1_0) are checked against ggml's `to_float` on
the bytes gguf-py's reader located. Integer tensor types (I8..I64, F64) are not float weights:
Strata refuses them with QuantError, which is checked too.

Usable on any model file:  python tests/gguf_dequant_check.py MODEL.gguf
(files with types gguf-py 0.19 cannot even read, such as Q2_0, are out of its reach).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

import ggml_oracle
import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import GGUFReader
from gguf.quants import dequantize as gguf_dequantize
from strata.errors import QuantError
from strata.gguf import GGUFFile

INTEGER_TYPES = {T.I8, T.I16, T.I32, T.I64, T.F64}


@dataclass
class Report:
    checked: dict[str, int] = field(default_factory=dict)  # type name -> tensors bit-equal
    refused: list[str] = field(default_factory=list)  # integer tensors refused with QuantError
    problems: list[str] = field(default_factory=list)


def check_file(path: str | Path, ggml: ggml_oracle.Ggml | None = None) -> Report:
    report = Report()
    theirs = GGUFReader(path)
    with GGUFFile(path) as ours:
        for t in theirs.tensors:
            ty = T(t.tensor_type)
            info = ours.tensors.get(t.name)
            if info is None:
                report.problems.append(f"{t.name}: not listed by strata")
                continue
            if info.type != ty.name:
                report.problems.append(f"{t.name}: type {info.type}, gguf-py says {ty.name}")
                continue
            if ty in INTEGER_TYPES:
                try:
                    ours.dequantize(t.name)
                    report.problems.append(f"{t.name}: {ty.name} tensor was not refused")
                except QuantError:
                    report.refused.append(t.name)
                continue
            raw = np.ascontiguousarray(t.data).view(np.uint8)
            try:
                with np.errstate(all="ignore"):
                    want = gguf_dequantize(raw, ty).reshape(-1)
            except NotImplementedError:
                if ggml is None:
                    report.problems.append(f"{t.name}: no oracle for {ty.name}")
                    continue
                want = ggml.dequantize(int(ty), raw)
            got = ours.dequantize(t.name).reshape(-1)
            if got.shape != want.shape:
                report.problems.append(f"{t.name}: {got.shape} elements, expected {want.shape}")
                continue
            bad = np.flatnonzero(got.view(np.uint32) != want.view(np.uint32))
            if bad.size:
                report.problems.append(f"{t.name} ({ty.name}): {bad.size} elements differ")
                continue
            report.checked[ty.name] = report.checked.get(ty.name, 0) + 1
    return report


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    r = check_file(argv[0], ggml_oracle.load())
    for name, n in sorted(r.checked.items()):
        print(f"{name:8s} {n:5d} tensors bit-equal")
    print(f"integer tensors refused: {len(r.refused)}")
    for p in r.problems:
        print("PROBLEM:", p)
    return 1 if r.problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
