#!/usr/bin/env python3
"""Float-oracle goldens: HF transformers' Qwen3MoeForCausalLM (float32, eager attention) with the
weights of the test models, converted by `strata.hfconvert.gguf_to_hf`.

    python scripts/make_hf_goldens.py [--which tiny,test] [--seqs 3] [--len 64]

Two goldens, one model builder:
- `tiny` → tests/data/hf_tiny_logits.npz: `ModelSpec.tiny()` with `modelgen.random_weights(spec,
  0)` (the exact values `write_qwen3moe` puts in the tiny F32 GGUF); logits of seeded random token
  sequences with the ids and the spec key (a changed generator makes the goldens stale, and the
  test says so).
- `test` → tests/golden/hf_qwen3moe_logits.npz: the model tests' shape (tests/qwen3moe_file.py,
  vocabulary 512) with `random_tensors(shape, SEED)`; 4 prompts of 80 positions, saved with the
  shape and seed the test rebuilds the GGUF from (keys: shape_json, seed, prompts [P, L], logits
  [P, L, V] float32, transformers_version).
Needs torch and transformers (the GPU machine has them); strata's compiled core is not needed:
only its pure-Python modules are loaded.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import types
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent

try:
    import strata  # noqa: F401
except ImportError:  # no compiled core here: load the pure-Python modules only
    pkg = types.ModuleType("strata")
    pkg.__path__ = [str(ROOT / "python" / "strata")]
    sys.modules["strata"] = pkg

sys.path.insert(0, str(ROOT / "tests"))
import qwen3moe_file as qf  # noqa: E402
from strata.hfconvert import gguf_to_hf, hf_config  # noqa: E402
from strata.modelgen import ModelSpec, random_weights  # noqa: E402

TEST_SEED = 20261129


def hf_model(spec: ModelSpec, weights: dict[str, np.ndarray]) -> Any:
    """transformers' Qwen3MoeForCausalLM of `spec` holding the GGUF-named `weights`."""
    import torch
    import transformers

    cfg = transformers.Qwen3MoeConfig(**hf_config(spec))
    rp = getattr(cfg, "rope_parameters", None)  # transformers ≥ 5 keeps the RoPE base here
    if isinstance(rp, dict):
        rp["rope_theta"] = spec.rope_freq_base
        rp.setdefault("rope_type", "default")
    cfg._attn_implementation = "eager"
    model = transformers.Qwen3MoeForCausalLM(cfg).float().eval()
    keys = set(model.state_dict())
    hf = gguf_to_hf(weights, spec, fused=any("gate_up_proj" in k for k in keys))
    if keys != set(hf):
        raise SystemExit(f"state dict mismatch: {sorted(keys ^ set(hf))[:8]}")
    model.load_state_dict({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in hf.items()})
    return model


def logits_of(model: Any, ids: np.ndarray) -> np.ndarray:
    import torch

    with torch.no_grad():
        return model(torch.from_numpy(ids[None].astype(np.int64))).logits[0].float().numpy()


def tiny(seqs: int, length: int) -> Path:
    import transformers

    spec = ModelSpec.tiny()
    model = hf_model(spec, random_weights(spec, 0))
    rng = np.random.default_rng(1)
    out: dict[str, np.ndarray] = {"spec_key": np.array(spec.key(0, "f32"))}
    for i in range(seqs):
        ids = rng.integers(0, spec.n_vocab - 8, length)  # ordinary tokens, no pads
        out[f"ids{i}"] = ids
        out[f"logits{i}"] = logits_of(model, ids)
    path = ROOT / "tests/data/hf_tiny_logits.npz"
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(path, transformers=np.array(transformers.__version__), **out)
    return path


def test_shape() -> Path:
    import transformers

    s = qf.Shape()  # hidden 256, 4 layers, 16 experts top-4, head_dim 64, vocab 512
    model = hf_model(s.spec(), qf.random_tensors(s, TEST_SEED))
    rng = np.random.default_rng(TEST_SEED + 1)
    prompts = rng.integers(0, s.n_vocab - 3, (4, 80)).astype(np.int64)
    logits = np.stack([logits_of(model, p) for p in prompts]).astype(np.float32)
    path = ROOT / "tests/golden/hf_qwen3moe_logits.npz"
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(
        path,
        shape_json=json.dumps(dataclasses.asdict(s)),
        seed=TEST_SEED,
        prompts=prompts,
        logits=logits,
        transformers_version=transformers.__version__,
    )
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--which", default="tiny,test")
    ap.add_argument("--seqs", type=int, default=3, help="tiny: sequences")
    ap.add_argument("--len", type=int, default=64, help="tiny: tokens per sequence")
    a = ap.parse_args()
    for w in a.which.split(","):
        path = tiny(a.seqs, a.len) if w == "tiny" else test_shape() if w == "test" else None
        if path is None:
            raise SystemExit(f"--which: unknown golden {w!r} (tiny, test)")
        print(f"wrote {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
