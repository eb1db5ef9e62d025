"""The layer split's host-side control flow on a machine without a GPU (the mock driver with
no-op kernels, as tests/test_gpu_hybrid_mock.py): one device as two or three stages for each
GPU family, pure and hybrid (sync and async tier, a choice after every step). Values are not
checked (no kernel runs; tests/test_gpu_split.py does that on the device): every step is a
window through every stage that ends at a gap on each (either hop: device to device, or
through host memory), the stages cover the layers in order, their slot shares add up to the
slots asked for (also with streamed prefill chunks), and the decode graphs are captured per
stage.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from test_gpu_hybrid_mock import family_model, mock_env, run_child

# A prefill of 39 tokens (a chunk of 24, then 15) and five decode steps (the first eager, then
# the captured graphs), per split, pure and hybrid; prints one line per model.
CHILD = """
import sys
from strata._core import Model
n_layer = int(sys.argv[2])
steps = 2 + 5
for kw in ({}, dict(vram_slots=6, pcie_frac=0.0, adapt_every=1, threads=2),
           dict(vram_slots=6, pcie_frac=0.0, adapt_every=1, threads=2, tier_async=True),
           dict(vram_slots=6, pcie_frac=0.0, adapt_every=1, threads=2, stream_min_tokens=16,
                stream_chunk=24)):
    for gpus, split, hop in (("0,0", "auto", "auto"), ("0,0", "1", "host"),
                             ("0,0,0", "auto", "auto")):
        m = Model.open(sys.argv[1], n_ctx=128, prefill_chunk=24, device="cuda", gpus=gpus,
                       layer_split=split, split_hop=hop, **kw)
        assert m.forward(0, list(range(1, 40)), logits="all").shape == (39, m.n_vocab)
        for t in range(5):
            m.forward(0, [t + 1])
        st = m.stages()
        assert len(st) == len(gpus.split(",")), st
        assert st[0]["layers"][0] == 0 and st[-1]["layers"][1] == n_layer, st
        assert all(a["layers"][1] == b["layers"][0] for a, b in zip(st, st[1:])), st
        if split != "auto":
            assert st[0]["layers"] == (0, int(split)), st
        for s in st:
            assert s["device"] == 0 and s["windows"] == s["gaps"] == steps, st
            assert not s["busy"] and s["windows_in_flight"] == 0, st
        assert st[0]["copying_s"] == 0 and all(s["copying_s"] > 0 for s in st[1:]), st
        info = m.hybrid_info()
        if kw:
            assert info is not None and info["n_slots"] == sum(s["n_slots"] for s in st)
            assert info["n_slots"] == 6 and info["stages"] == st
        else:
            assert info is None
        assert m.cuda_graph_state.startswith("captured"), m.cuda_graph_state
        m.free(0)
        print("ok", gpus, split, bool(kw), [s["layers"] for s in st])
print("split mock: all passed")
"""


@pytest.mark.parametrize("fam", ["qwen2moe", "llama", "glm4moe", "qwen3next"])
def test_stages_on_the_mock_driver(tmp_path: Path, fam: str) -> None:
    env = mock_env(tmp_path)
    n_layer = 4 if fam == "qwen3next" else 3
    out = run_child(["-c", CHILD, str(family_model(fam, tmp_path)), str(n_layer)], env)
    assert "split mock: all passed" in out, out
