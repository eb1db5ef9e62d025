#!/usr/bin/env python3
"""Make a random-weight qwen3moe GGUF and its llama.cpp-quantized variants in a folder.

    python scripts/make_test_model.py OUT_DIR                       # tiny model, all types
    python scripts/make_test_model.py OUT_DIR --preset micro --types Q8_0,IQ2_XXS
    python scripts/make_test_model.py OUT_DIR --preset qwen3-30b-a3b --layers 2 --dtype f16 \\
        --types Q4_K_M,IQ3_S

Types that llama.cpp only makes with an importance matrix (IQ1_*, IQ2_*, IQ3_XXS, IQ3_XS,
Q2_K_S) get one computed from the model by llama.cpp (strata.imatrix) unless --no-imatrix is
given, in which case they are listed as skipped with the reason. Every type's outcome is
printed in a table at the end; the exit status is 1 if any type failed.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from strata import modelgen
from strata.modelgen import ModelSpec

DEFAULT_TYPES = (
    "Q8_0",
    "Q6_K",
    "Q5_K_M",
    "Q5_0",
    "Q5_1",
    "Q4_K_M",
    "Q4_K_S",
    "Q4_0",
    "Q4_1",
    "Q3_K_M",
    "Q3_K_S",
    "Q2_K",
    "Q2_K_S",
    "IQ4_XS",
    "IQ4_NL",
    "IQ3_M",
    "IQ3_S",
    "IQ3_XS",
    "IQ3_XXS",
    "IQ2_M",
    "IQ2_S",
    "IQ2_XS",
    "IQ2_XXS",
    "IQ1_M",
    "IQ1_S",
    "TQ2_0",
    "TQ1_0",
    "MXFP4_MOE",
    "BF16",
    "F16",
)

PRESETS = {
    "tiny": ModelSpec.tiny,
    "micro": ModelSpec.micro,
    "default": ModelSpec.default,
    "qwen3-30b-a3b": ModelSpec.qwen3_30b_a3b,
}

SHAPE_FLAGS = {
    "hidden": "n_embd",
    "layers": "n_layer",
    "experts": "n_expert",
    "top_k": "n_expert_used",
    "expert_ff": "n_ff_exp",
    "heads": "n_head",
    "kv_heads": "n_head_kv",
    "head_dim": "head_dim",
    "vocab_size": "n_vocab",
    "ctx": "n_ctx_train",
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    for flag in SHAPE_FLAGS:
        ap.add_argument("--" + flag.replace("_", "-"), dest=flag, type=int, default=None)
    ap.add_argument("--vocab", choices=("small", "qwen3"), default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dtype", choices=("f32", "f16", "bf16"), default="f32")
    ap.add_argument("--name", default=None, help="file name stem (default: the preset's name)")
    ap.add_argument(
        "--types",
        default=",".join(DEFAULT_TYPES),
        help="comma-separated llama-quantize type names, or 'none' (default: all listed above)",
    )
    ap.add_argument("--no-imatrix", action="store_true", help="skip types that need an imatrix")
    ap.add_argument("--pure", action="store_true", help="quantize every matrix to the type")
    ap.add_argument("--threads", type=int, default=0, help="quantizer threads (0: all cores)")
    return ap.parse_args(argv)


def make_spec(a: argparse.Namespace) -> ModelSpec:
    overrides: dict[str, Any] = {
        field: getattr(a, flag) for flag, field in SHAPE_FLAGS.items() if getattr(a, flag)
    }
    if a.vocab:
        overrides["vocab"] = a.vocab
    if a.preset == "qwen3-30b-a3b":
        layers = overrides.pop("n_layer", 8)
        return ModelSpec.qwen3_30b_a3b(layers=layers, **overrides)
    return PRESETS[a.preset](**overrides)


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    try:
        spec = make_spec(a)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    types = (
        [] if a.types.strip().lower() == "none" else [t.strip().upper() for t in a.types.split(",")]
    )
    unknown = [t for t in types if t not in modelgen.FTYPES]
    if unknown:
        print(
            f"error: unknown types {unknown}; known: {', '.join(modelgen.FTYPES)}", file=sys.stderr
        )
        return 2
    a.out_dir.mkdir(parents=True, exist_ok=True)
    stem = a.name or spec.name
    base = a.out_dir / f"{stem}-{a.dtype.upper()}.gguf"
    t0 = time.monotonic()
    modelgen.build_cached(base, spec, a.seed, a.dtype)
    print(f"wrote {base} ({base.stat().st_size / 2**20:.1f} MiB, {time.monotonic() - t0:.1f} s)")

    rows: list[tuple[str, str, str]] = []
    imatrix: dict[str, Any] | None = None
    failed = False
    for t in types:
        out = a.out_dir / f"{stem}-{t}.gguf"
        if t in modelgen.NEEDS_IMATRIX and a.no_imatrix:
            rows.append((t, "skipped", "llama.cpp needs an importance matrix (--no-imatrix)"))
            continue
        t1 = time.monotonic()
        try:
            im = None
            if t in modelgen.NEEDS_IMATRIX:
                if imatrix is None:
                    from strata.imatrix import compute_imatrix

                    imatrix = compute_imatrix(base)
                im = imatrix
            modelgen.quantize(base, out, t, imatrix=im, nthread=a.threads, pure=a.pure)
        except Exception as e:  # report every type, keep going
            failed = True
            rows.append((t, "FAILED", str(e)))
            continue
        note = "with imatrix" if im is not None else ""
        size = f"{out.stat().st_size / 2**20:.1f} MiB, {time.monotonic() - t1:.1f} s"
        rows.append((t, "ok", f"{out.name} ({size}) {note}".strip()))
    if rows:
        print(f"\n{'type':<10} {'status':<8} detail")
        for t, status, detail in rows:
            print(f"{t:<10} {status:<8} {detail}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
