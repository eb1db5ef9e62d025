"""`cpu_repack`: the Q6_K output head repacked at load (rust/src/quant/dot/q6k_repack.rs) gives
the logits of the original layout bit for bit, prefill (ggml's tiled order for >= 8 rows) and
decode (`vec_dot`'s order); so do the Q4_K attention projections repacked sixteen rows at a
time (rust/src/quant/dot/q4k_r16.rs: its VNNI kernel on AVX-512 VNNI, its AVX2 one on AVX2)
in steps of two to four one-token rows; and their RAM is reported."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
from models import TestModels
from repack_steps import PROMPT, projection_steps
from strata import _core
from strata._core import Model
from strata.config import Config
from strata.gguf import GGUFFile


def run(path: str, **kw: object) -> tuple[np.ndarray, int]:
    m = Model.open(path, n_ctx=64, n_slots=1, **kw)  # type: ignore[arg-type]
    prefill = m.forward(0, PROMPT, logits="all")  # [T, V]: the tiled order
    steps = [m.forward(0, [t], logits="last") for t in (12, 400, 3)]  # [V] each
    return np.concatenate([prefill, np.stack(steps)]), int(m.hparams["repack_bytes"])


def proj_bytes(path: str) -> int:
    """What the projections' copies take here: Q4_K q/k/v/o matrices of whole 16-row groups,
    2,560 bytes per group and 256 columns, where the dot kernels run AVX2 or AVX-512 (the
    VNNI kernel or the AVX2 one: `q4k_r16::kernel`); none where they run scalar (no AVX2, or
    `STRATA_ISA=scalar`)."""
    if os.environ.get("STRATA_ISA", "auto") == "scalar" or "avx2" not in _core.dot_isas():
        return 0
    total = 0
    with GGUFFile(path) as g:
        for name, t in g.tensors.items():
            proj = name.rsplit(".", 2)[-2] in ("attn_q", "attn_k", "attn_v", "attn_output")
            if proj and t.type == "Q4_K":
                rows, cols = t.shape[0], t.shape[1]  # numpy order: (rows, cols)
                if rows % 16 == 0 and cols % 256 == 0:
                    total += rows // 16 * cols // 256 * 2560
    return total


def test_repacked_head_is_bitwise_the_original(test_models: TestModels) -> None:
    path = str(test_models.quantized("Q4_K_M"))
    with GGUFFile(path) as g:
        head = g.tensors.get("output.weight") or g.tensors["token_embd.weight"]
        assert head.type == "Q6_K", head.type  # llama.cpp's Q4_K_M keeps the head at Q6_K
        head_bytes = head.nbytes
    ref, none = run(path, cpu_repack=False)
    assert none == 0
    for threads in (-1, 1):
        got, used = run(path, cpu_repack=True, threads=threads)
        assert used == head_bytes + proj_bytes(path)
        assert np.array_equal(got.view(np.uint32), ref.view(np.uint32)), threads


def test_repacked_projections_are_bitwise_the_original(test_models: TestModels) -> None:
    """Decode steps of two and four one-token rows (the repacked projections' calls), and one
    row and a window beside them (the original's), bitwise with and without the copies."""
    path = str(test_models.quantized("Q4_K_M"))
    ref, none = projection_steps(path, cpu_repack=False)
    got, used = projection_steps(path, cpu_repack=True)
    assert none == 0 and used == proj_bytes(path)
    for a, b in zip(got, ref, strict=True):
        assert np.array_equal(a.view(np.uint32), b.view(np.uint32))


TUNE_SCRIPT = """
import json, sys, numpy as np
from strata import _core
from strata._core import Model
def steps():
    m = Model.open(sys.argv[1], n_ctx=64, n_slots=1, cpu_repack=True)
    m.forward(0, [1, 17, 300], logits="none")
    return np.stack([m.forward(0, [(7 * i) % 500 + 1], logits="last") for i in range(24)])
start = _core.head_prefetch()
tuned = steps()  # the tuning's 20 timed head products happen in these steps
after = _core.head_prefetch()
_core.set_head_prefetch(128)
pinned = steps()
same = bool(np.array_equal(tuned.view(np.uint32), pinned.view(np.uint32)))
print(json.dumps({"start": start, "after": after, "same": same}))
"""


def test_head_prefetch_tunes_itself_and_changes_no_logit(test_models: TestModels) -> None:
    """A fresh process: the head's prefetch distance (a process-wide knob) starts unsettled,
    is settled on one of the candidates after the first decode steps on a repacked head
    (rust/src/quant/dot/pf_tune.rs), and the logits of those steps are bitwise those with
    the distance pinned."""
    path = str(test_models.quantized("Q4_K_M"))
    out = json.loads(
        subprocess.run(
            [sys.executable, "-c", TUNE_SCRIPT, path], capture_output=True, text=True, check=True
        ).stdout
    )
    assert out["start"][1] is False, out
    if os.environ.get("STRATA_ISA", "auto") != "scalar" and "avx2" in _core.dot_isas():
        assert out["after"] in [[d, True] for d in (128, 512, 2048, 8192)], out
    assert out["same"] is True


def test_cpu_repack_is_a_config_field() -> None:
    assert Config().cpu_repack is True
    assert Config.load({"cpu_repack": False}).cpu_repack is False
