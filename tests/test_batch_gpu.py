"""`Model.forward_batch` and `kv_export`/`kv_import` on the device (pure GPU and hybrid), on the
F32 test model of test_gpu_model.py's shape (3 layers of 8 experts, top-2):

- Each entry of random batch compositions against the same calls run alone: greedy identical
  up to the first near-tie (top-1/top-2 margin < MARGIN) and logits within the CPU/GPU parity
  tests' tolerance (CROSS_TOL of the largest logit: a step's size picks its kernel path);
  whether they are bitwise, and the worst differences, are printed.
- Greedy decode in steps of three one-token entries (the graphs captured for three pieces)
  against each sequence alone: the decode rows within 1e-5 of the largest logit.
- A slot restored from a GPU export continues as the slot that prefilled it (bitwise on the
  GPU); export(import(x)) == x; CPU and GPU exports of one model and KV type are interchangeable
  (the continuation within the CPU/GPU parity protocol: top-1 equal at the sure positions).
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import numpy as np
import pytest
from models import TestModels
from strata._core import Model
from strata.modelgen import ModelSpec
from test_batch import N_SLOTS, Call, alone, random_calls

pytestmark = pytest.mark.gpu

MARGIN = 0.1
# Steps of at most this many rows take the decode kernels (`DECODE_MAX_TOKENS`, the int8 path)
DECODE_ROWS = 8
# A row's logits against its call alone: the CPU/GPU parity tests' tolerance (× max |logit|).
# A step's rows take the kernel path of the step's size, so a call of ≤ DECODE_ROWS tokens that
# shares a larger step runs another float order than alone, and every later row of that
# sequence reads KV written by it (measured on the H200: up to 4.2e-4).
CROSS_TOL = 1e-2
N_CTX = 160
SPEC = ModelSpec.tiny(n_layer=3, n_expert=8, n_expert_used=2)
# where test_gpu_model.py's carried copies are ($STRATA_GPU_MODELS on the device)
CARRY = Path(os.environ.get("STRATA_GPU_MODELS") or Path(__file__).resolve().parent / ".gpu-models")
CARRIED = CARRY / f"{SPEC.key()}-F32.gguf"


@pytest.fixture(scope="module")
def f32_file() -> Path:
    """The F32 file (carried to the device, where gguf-py may be missing)."""
    if CARRIED.is_file():
        return CARRIED
    return TestModels.default_cache(SPEC).f32()


def open_model(path: Path, device: str = "cuda", **kw: object) -> Model:
    return Model.open(
        path, n_ctx=N_CTX, n_slots=N_SLOTS, prefill_chunk=24, device=device, threads=2, **kw
    )  # type: ignore[arg-type]


def agree_greedy(ref: np.ndarray, got: np.ndarray) -> bool:
    """Rows [T, V] (or [V]): argmax equal up to the reference's first near-tie."""
    ref2, got2 = np.atleast_2d(ref), np.atleast_2d(got)
    for r, g in zip(ref2, got2, strict=True):
        top2 = np.sort(r)[-2:]
        if top2[1] - top2[0] < MARGIN:
            return True
        if r.argmax() != g.argmax():
            return False
    return True


def run_steps(
    m: Model, seqs: list[list[Call]], rng: random.Random
) -> list[list[tuple[np.ndarray | None, int]]]:
    """test_batch.run_batched, each result with the token count of the step it ran in."""
    slots = rng.sample(range(N_SLOTS), len(seqs))
    for s in slots:
        m.free(s)
    nxt = [0] * len(seqs)
    got: list[list[tuple[np.ndarray | None, int]]] = [[] for _ in seqs]
    while any(n < len(c) for n, c in zip(nxt, seqs, strict=True)):
        live = [i for i, c in enumerate(seqs) if nxt[i] < len(c)]
        step = rng.sample(live, rng.randint(1, len(live)))
        entries = [(slots[i], seqs[i][nxt[i]][0], seqs[i][nxt[i]][1]) for i in step]
        rows = sum(len(e[1]) for e in entries)
        for i, r in zip(step, m.forward_batch(entries), strict=True):
            got[i].append((r, rows))
            nxt[i] += 1
    return got


@pytest.mark.parametrize("hybrid", [False, True], ids=["gpu", "hybrid"])
def test_gpu_batch_rows_match_alone(f32_file: Path, hybrid: bool) -> None:
    """Random batch compositions against the same calls alone: greedy identical up to the first
    near-tie and logits within CROSS_TOL on every row; the worst difference is printed for rows
    of sequences whose steps so far all took the kernel path of their calls alone ("clean")
    and for the others ("mixed")."""
    kw = {"vram_slots": 6, "adapt_every": 0} if hybrid else {}
    m = open_model(f32_file, **kw)
    assert (m.hybrid_info() is not None) == hybrid
    bitwise = True
    worst = {"clean": 0.0, "mixed": 0.0}
    for seed in range(3):
        rng = random.Random(50 + seed)
        seqs = [random_calls(rng, m.n_vocab) for _ in range(rng.randint(2, N_SLOTS))]
        want = [alone(m, c) for c in seqs]
        got = run_steps(m, seqs, rng)
        for calls, w, g in zip(seqs, want, got, strict=True):
            mixed = False
            for (toks, _), a, (b, rows) in zip(calls, w, g, strict=True):
                mixed |= len(toks) <= DECODE_ROWS < rows
                if a is None or b is None:
                    assert a is None and b is None
                    continue
                assert a.shape == b.shape
                rel = float(np.abs(b - a).max() / np.abs(a).max())
                kind = "mixed" if mixed else "clean"
                worst[kind] = max(worst[kind], rel)
                assert agree_greedy(a, b), (kind, rel)
                assert rel <= CROSS_TOL, (kind, rel)
                bitwise &= bool(np.array_equal(a.view(np.uint32), b.view(np.uint32)))
    print(
        f"{'hybrid' if hybrid else 'gpu'}: batched rows bitwise equal to alone: {bitwise}; "
        f"max |Δ| / max |logit|: clean {worst['clean']:.2e}, mixed {worst['mixed']:.2e}"
    )


@pytest.mark.parametrize("hybrid", [False, True], ids=["gpu", "hybrid"])
def test_gpu_batch_decode_graphs(f32_file: Path, hybrid: bool) -> None:
    """Greedy decode of three sequences in steps of three one-token entries (the first step
    eager, then the graph(s) captured for three pieces, replayed) against each sequence
    decoded alone (the one-sequence graph): greedy identical up to the first near-tie, logits
    within the parity tolerance."""
    kw = {"vram_slots": 6, "adapt_every": 0} if hybrid else {}
    m = open_model(f32_file, **kw)
    rng = random.Random(9)
    prompts = [[rng.randrange(m.n_vocab) for _ in range(n)] for n in (5, 17, 30)]
    steps = 8
    alone_rows = []
    for p in prompts:
        m.free(0)
        row = [m.forward(0, p, logits="last")]
        for _ in range(steps):
            row.append(m.forward(0, [int(row[-1].argmax())], logits="last"))
        alone_rows.append(row)
    slots = [3, 1, 2]
    for s in slots:
        m.free(s)
    got = [
        [r] for r in m.forward_batch([(s, p, "last") for s, p in zip(slots, prompts, strict=True)])
    ]
    for _ in range(steps):
        toks = [int(g[-1].argmax()) for g in got]
        out = m.forward_batch([(s, [t], "last") for s, t in zip(slots, toks, strict=True)])
        for g, o in zip(got, out, strict=True):
            g.append(o)
    assert m.cuda_graph_state.startswith("captured"), m.cuda_graph_state
    for ref, ours in zip(alone_rows, got, strict=True):
        for i, (a, b) in enumerate(zip(ref, ours, strict=True)):
            assert agree_greedy(a, b), i
            # row 0: the prompts shared steps of more than DECODE_ROWS rows (another path
            # than a prompt of ≤ 8 tokens alone); the decode steps: 3 rows, the int8 path as
            # alone (measured within 1e-5 on the H200)
            tol = CROSS_TOL if i == 0 else 1e-5
            assert np.abs(b - a).max() <= tol * np.abs(a).max(), i
            if np.sort(a)[-1] - np.sort(a)[-2] < MARGIN:
                break  # past a near-tie the two paths may feed different tokens


def test_gpu_kv_export_import(f32_file: Path) -> None:
    gpu = open_model(f32_file)
    rng = random.Random(5)
    prompt = [rng.randrange(gpu.n_vocab) for _ in range(37)]
    tail = [*prompt[30:], 3, 4]
    gpu.forward(0, prompt, "none")
    blob = gpu.kv_export(0, 30)
    assert gpu.kv_import(2, blob) == 30 and gpu.kv_export(2, 30) == blob
    gpu.truncate(0, 30)
    want = gpu.forward(0, tail, "all")
    got = gpu.forward(2, tail, "all")
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    # CPU ↔ GPU: one model and KV type, one blob layout
    cpu = open_model(f32_file, device="cpu")
    cpu.forward(0, prompt[:30], "none")
    ref = cpu.forward(0, tail, "all")
    assert cpu.kv_import(1, blob) == 30
    from_gpu = cpu.forward(1, tail, "all")
    assert gpu.kv_import(3, cpu.kv_export(0, 30)) == 30
    from_cpu = gpu.forward(3, tail, "all")
    for ours, base in [(from_gpu, ref), (from_cpu, want)]:
        sure = (np.sort(base, axis=1)[:, -1] - np.sort(base, axis=1)[:, -2]) >= MARGIN
        assert (ours.argmax(1) == base.argmax(1))[sure].all()
        assert np.abs(ours - base).max() <= 1e-2 * np.abs(base).max()
    with pytest.raises(ValueError, match="KV type"):
        open_model(f32_file, kv_type="q8_0").kv_import(0, blob)
