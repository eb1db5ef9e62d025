"""The hybrid step's host-side control flow on a machine without a GPU: the mock driver
(tests/cuda_mock/libcuda_mock.c) with STRATA_MOCK_NOOP_KERNELS=1 runs every kernel as a no-op
on zeroed memory, so a real test model runs end to end with every token routed to expert 0;
tests/hybrid_mock_child.py checks the start fill along a profile, the adaptive swaps (sync and
async), streamed prefill chunks and the counters. Values are not checked (no kernel runs): the
device suite does that (tests/test_gpu_hybrid.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from models import TestModels
from strata import _core
from strata.modelgen import ModelSpec
from test_gpu_mock import ROOT, cuda_include


def family_model(fam: str, root: Path) -> Path:
    """A test model of 3 layers of 8 experts, top-2: the qwen3moe test model, or another
    family's F32 file in the converter's layout (test_model_families.py's `family_file`
    shapes: qwen2moe with Q/K/V biases and a gated shared expert, the Mixtral-style llama,
    glm4moe with a leading dense layer, sigmoid routing and an ungated shared expert)."""
    if fam == "qwen3moe":
        spec = ModelSpec.tiny(n_layer=3, n_expert=8, n_expert_used=2)
        return TestModels.default_cache(spec).quantized("Q8_0")
    if fam == "gpt-oss":  # test_gpu_gptoss.py's file: MXFP4 experts, sinks, windows, biases
        from test_gpu_gptoss import gptoss_file

        return gptoss_file("MXFP4_MOE")
    import dataclasses

    import qwen3moe_file as qf

    s = qf.Shape(n_layer=3, n_expert=8, n_expert_used=2, arch=fam, n_ff_shexp=256)
    if fam == "llama":
        s = dataclasses.replace(s, n_ff_shexp=0)
    if fam == "glm4moe":
        s = dataclasses.replace(s, n_dense_lead=1, n_ff_dense=512, n_rot=32, weights_scale=2.5)
    if fam in qf.HYBRIDS:  # test_model_families.py's family_file shape: 4 layers, 2 recurrent
        s = dataclasses.replace(
            s, n_layer=4, n_rot=16, ssm_state=64, n_ff=512, attn_every=2, ssm_conv=4,
            ssm_groups=2, ssm_v_heads=4,
        )  # fmt: skip
    return qf.write(root / f"{fam}.gguf", s, qf.random_tensors(s, 3))


def mock_env(tmp_path: Path) -> dict[str, str]:
    """The environment of a child whose libcuda.so.1 is the mock driver with no-op kernels
    (skips, or fails where STRATA_REQUIRE_KERNELS=1, without the tools or the kernels)."""
    inc = cuda_include()
    # where the kernels are required (CI: scripts/test), a missing tool is a failure
    required = os.environ.get("STRATA_REQUIRE_KERNELS") == "1"
    if inc is None or shutil.which("gcc") is None:
        if required:
            pytest.fail("STRATA_REQUIRE_KERNELS=1 but cuda.h (next to nvcc) or gcc is missing")
        pytest.skip("needs cuda.h from the CUDA toolkit and gcc")
    if not _core.gpu_info()["kernels_built"]:
        if required:
            pytest.fail("STRATA_REQUIRE_KERNELS=1 but this build has no kernels")
        pytest.skip("this build has no kernels: " + str(_core.gpu_info()["kernels"]))
    lib = tmp_path / "libcuda.so.1"
    src = ROOT / "tests" / "cuda_mock" / "libcuda_mock.c"
    cmd = ["gcc", "-O1", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC", f"-I{inc}"]
    subprocess.run([*cmd, "-o", str(lib), str(src)], check=True, capture_output=True, text=True)
    return dict(
        os.environ,
        LD_LIBRARY_PATH=f"{tmp_path}:{os.environ.get('LD_LIBRARY_PATH', '')}",
        STRATA_MOCK_NOOP_KERNELS="1",
    )


def run_child(args: list[str], env: dict[str, str]) -> str:
    """Runs Python with `args` in `env`; its output, asserting it exited 0."""
    res = subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    return out


@pytest.mark.parametrize("fam", ["qwen3moe", "qwen2moe"])
def test_hybrid_control_flow_on_the_mock_driver(tmp_path: Path, fam: str) -> None:
    env = mock_env(tmp_path)
    child = ROOT / "tests" / "hybrid_mock_child.py"
    out = run_child([str(child), str(family_model(fam, tmp_path))], env)
    assert "vram: ok" in out and "hybrid mock: all passed" in out, out
    assert "defer: ok" in out, out
    assert "batch hybrid=False: ok" in out and "batch hybrid=True: ok" in out, out


# A prefill of 39 tokens (a chunk of 24, then 15), four decode steps; all in VRAM, then 4 of
# the 16 routed experts in slots (swaps after every step): the GPU families' host side (the
# per-layer decode graphs skip a layer without routed experts).
FAMILY_CHILD = """
import sys
from strata._core import Model
for kw in ({}, dict(vram_slots=4, pcie_frac=0.0, adapt_every=1, threads=2)):
    m = Model.open(sys.argv[1], n_ctx=128, prefill_chunk=24, device="cuda", **kw)
    assert m.forward(0, list(range(1, 40)), logits="all").shape == (39, m.n_vocab)
    for t in range(4):
        m.forward(0, [t + 1])
    info = m.hybrid_info()
    n = None if info is None else (info["n_experts"], info["n_slots"])
    print(m.hparams["architecture"], m.cuda_graph_state, n, m.slot_len(0))
"""


@pytest.mark.parametrize(
    "fam", ["qwen2moe", "llama", "glm4moe", "qwen3next", "qwen35moe", "gpt-oss"]
)
def test_families_run_on_the_mock_driver(tmp_path: Path, fam: str) -> None:
    env = mock_env(tmp_path)
    out = run_child(["-c", FAMILY_CHILD, str(family_model(fam, tmp_path))], env)
    # glm4moe's first layer is dense; the hybrids have 4 layers
    n_routed = {"glm4moe": 16, "qwen3next": 32, "qwen35moe": 32}.get(fam, 24)
    want = [f"{fam} captured None 43", f"{fam} captured (per layer) ({n_routed}, 4) 43"]
    assert out.split("\n")[:2] == want, out


# The hybrid families' recurrent state on the GPU path (host side): a speculative window's
# checkpoints, a marked prompt end, rollback, refusals, a batched step of two slots with a
# window beside a decode, the per-layer graphs of the hybrid placement.
RECURRENT_CHILD = """
import sys
from strata._core import Model
for kw in ({}, dict(vram_slots=8, pcie_frac=0.0, adapt_every=1, threads=2)):
    m = Model.open(sys.argv[1], n_ctx=128, n_slots=2, prefill_chunk=16, device="cuda", **kw)
    # conv [Kc − 1, C] + delta rule [Nv, S, S] per recurrent layer, f32
    assert m.hparams["recurrent_state_bytes"] == 2 * 4 * (3 * 512 + 4 * 64 * 64)
    m.forward(1, list(range(1, 21)), logits="none")
    m.checkpoint(1)
    assert m.forward(1, list(range(21, 27)), logits="window").shape == (6, m.n_vocab)
    assert m.checkpoints(1) == [20, 21, 22, 23, 24, 25, 26], m.checkpoints(1)
    try:
        m.truncate(1, 10)
        raise SystemExit("truncate to 10 was not refused")
    except ValueError as e:
        assert "recurrent state" in str(e), e
    m.truncate(1, 23)
    assert m.slot_len(1) == 23 and m.checkpoints(1) == [20, 21, 22, 23]
    out = m.forward_batch([(1, list(range(23, 43)), "window"), (0, [5], "last")])
    assert [o.shape for o in out] == [(20, m.n_vocab), (m.n_vocab,)], [o.shape for o in out]
    assert m.checkpoints(1) == [20] + list(range(28, 44)), m.checkpoints(1)  # the last 16
    m.truncate(1, 20)
    for t in range(4):
        m.forward(0, [t + 1])
    m.free(1)
    assert m.checkpoints(1) == [] and m.slot_len(1) == 0
    try:
        m.kv_export(0, 1)
        raise SystemExit("kv_export was not refused")
    except Exception as e:
        assert "recurrent state" in str(e), e
    print(m.hparams["architecture"], m.cuda_graph_state, m.slot_len(0))
"""


@pytest.mark.parametrize("fam", ["qwen3next", "qwen35moe"])
def test_recurrent_state_on_the_mock_driver(tmp_path: Path, fam: str) -> None:
    env = mock_env(tmp_path)
    out = run_child(["-c", RECURRENT_CHILD, str(family_model(fam, tmp_path))], env)
    want = [f"{fam} captured 5", f"{fam} captured (per layer) 5"]
    assert out.split("\n")[:2] == want, out
