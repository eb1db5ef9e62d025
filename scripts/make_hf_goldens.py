#!/usr/bin/env python3
"""Float-oracle goldens: HF transformers' Qwen3MoeForCausalLM with the test model's weights.

    python scripts/make_hf_goldens.py [--out tests/data/hf_tiny_logits.npz] [--seqs 3] [--len 64]

Builds `Qwen3MoeForCausalLM(Qwen3MoeConfig(**hf_config(ModelSpec.tiny())))` in float32, loads
`gguf_to_hf(random_weights(ModelSpec.tiny(), seed=0))` into it (the exact values
`write_qwen3moe` puts in the tiny F32 GGUF), and saves its logits for seeded random token
sequences, with the ids and the spec key (a changed generator makes the goldens stale, and
the test says so). Needs torch and transformers (the GPU machine has them); strata's compiled
core is not needed: only its pure-Python modules are loaded.
"""

from __future__ import annotations

import argparse
import sys
import types
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent

try:
    import strata  # noqa: F401
except ImportError:  # no compiled core here: load the pure-Python modules only
    pkg = types.ModuleType("strata")
    pkg.__path__ = [str(ROOT / "python" / "strata")]
    sys.modules["strata"] = pkg

from strata.hfconvert import gguf_to_hf, hf_config  # noqa: E402
from strata.modelgen import ModelSpec, random_weights  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", type=Path, default=ROOT / "tests/data/hf_tiny_logits.npz")
    ap.add_argument("--seqs", type=int, default=3)
    ap.add_argument("--len", type=int, default=64)
    a = ap.parse_args()
    import torch
    import transformers

    spec = ModelSpec.tiny()
    cfg = transformers.Qwen3MoeConfig(**hf_config(spec))
    model = transformers.Qwen3MoeForCausalLM(cfg).float().eval()
    keys = set(model.state_dict())
    fused = any("gate_up_proj" in k for k in keys)
    hf = gguf_to_hf(random_weights(spec, 0), spec, fused=fused)
    if keys != set(hf):
        raise SystemExit(f"state dict mismatch: {sorted(keys ^ set(hf))[:8]}")
    model.load_state_dict({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in hf.items()})
    rng = np.random.default_rng(1)
    out: dict[str, np.ndarray] = {"spec_key": np.array(spec.key(0, "f32"))}
    with torch.no_grad():
        for i in range(a.seqs):
            ids = rng.integers(0, spec.n_vocab - 8, a.len)  # ordinary tokens, no pads
            out[f"ids{i}"] = ids
            out[f"logits{i}"] = model(torch.tensor(ids[None])).logits[0].float().numpy()
    a.out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(a.out, transformers=np.array(transformers.__version__), **out)
    print(f"wrote {a.out}: transformers {transformers.__version__}, fused experts {fused}")


if __name__ == "__main__":
    main()
