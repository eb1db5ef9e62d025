"""The float forward pass against HF transformers' Qwen3MoeForCausalLM (random weights,
norm_topk_prob=True). scripts/make_hf_goldens.py made the golden logits; the F32 GGUF is
rebuilt here with gguf-py from the same numpy seed. KV cache in f32, so the only differences
are f32 rounding: max |Δ| / max |ref| ≤ 1e-4."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import qwen3moe_file as qf
from strata._core import Model

GOLDEN = Path(__file__).parent / "golden" / "hf_qwen3moe_logits.npz"


def test_logits_match_transformers(tmp_path: Path) -> None:
    assert GOLDEN.exists(), (
        f"{GOLDEN.name} is absent: run `python scripts/make_hf_goldens.py --which test` "
        "where torch and transformers are installed"
    )
    g = np.load(GOLDEN)
    fields = {f.name for f in dataclasses.fields(qf.Shape)}
    s = qf.Shape(**{k: v for k, v in json.loads(str(g["shape_json"])).items() if k in fields})
    path = qf.write(tmp_path / "hf.gguf", s, qf.random_tensors(s, int(g["seed"])))
    prompts, ref_all = g["prompts"], g["logits"]
    assert prompts.shape[1] >= 64 and len(prompts) >= 3
    m = Model.open(path, n_ctx=prompts.shape[1], kv_type="f32", prefill_chunk=32)
    worst = 0.0
    for p, ref in zip(prompts, ref_all, strict=True):
        m.free(0)
        ours = m.forward(0, [int(x) for x in p], logits="all")
        rel = float(np.abs(ours - ref).max() / np.abs(ref).max())
        worst = max(worst, rel)
        assert (ours.argmax(1) == ref.argmax(1)).mean() >= 0.99
    print(
        f"max |Δ| / max |ref| = {worst:.2e} over {prompts.size} positions "
        f"(transformers {g['transformers_version']})"
    )
    assert worst <= 1e-4
