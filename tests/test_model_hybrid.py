"""The hybrid families (qwen3next, qwen35moe: Gated DeltaNet layers beside gated attention) on
the CPU path: what their per-slot recurrent state changes beyond the oracle tests of
tests/test_model_families.py.

- The state carries across calls and steps: a prompt run in chunks of any size (rows in the
  one-row attention order, logits "window"), in batched steps beside another slot, and the
  same tokens run one at a time give bitwise the same logits (Q8_0 files, whose matmuls keep
  one float order per row whatever the rows beside it).
- A recurrent state cannot be cut back, only restored: `truncate` to a position a window
  checkpointed restores it (bitwise as if the window had stopped there, so speculation's
  rollback works: greedy output with speculation equals the output without); to any
  other position but 0 or the slot's length it is refused (ValueError) and changes nothing;
  `free` starts over (bitwise the first run again); KV export / import are refused
  (ModelError).
- The engine's placement keeps a slot's whole sequence when a prompt extends it, else its
  marked prompt end (`checkpoint`, set by the scheduler) when the prompt shares it, else
  starts the slot over.
A batched call that fails while running (after its checks) empties a hybrid slot instead of
leaving a state that ran ahead of its KV (`Model::forward_batch`); no test reaches that path.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import qwen3moe_file as qf
from strata._core import Model
from strata.errors import ModelError
from test_model_families import GOLDEN_SHAPES

HYBRIDS = list(qf.HYBRIDS)


@pytest.fixture(scope="module")
def q8(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hybrid")
    out = {}
    for fam in HYBRIDS:
        s = GOLDEN_SHAPES[fam]
        f32 = qf.write(root / f"{fam}-F32.gguf", s, qf.random_tensors(s, 3))
        out[fam] = qf.quantize(f32, root / f"{fam}-Q8_0.gguf", "Q8_0")
    return out


def bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).view(np.uint32)


@pytest.mark.parametrize("fam", HYBRIDS)
def test_state_carries_across_chunks_windows_and_steps(fam: str, q8: dict[str, Path]) -> None:
    m = Model.open(q8[fam], n_ctx=128, n_slots=3, kv_type="f16", prefill_chunk=16)
    assert m.hparams["recurrent"] is True
    # conv [Kc − 1, C] + delta rule [Nv, S, S] per recurrent layer, f32 (C = 2·2·16 + 4·16)
    assert m.hparams["recurrent_state_bytes"] == 2 * 4 * (3 * 128 + 4 * 16 * 16)
    toks = [int(t) for t in np.random.default_rng(0).integers(0, m.n_vocab - 3, 60)]
    one = np.stack([m.forward(0, [t]) for t in toks])  # token by token
    # "window": each row in the one-row attention order (the attention's, not the state's)
    whole = m.forward(1, toks[:50], logits="window")  # chunks of 16 inside one call
    window = m.forward(1, toks[50:], logits="window")
    assert np.array_equal(bits(whole), bits(one[:50]))
    assert np.array_equal(bits(window), bits(one[50:]))
    # calls of uneven sizes, in a batched step beside another slot's decode
    m.free(2)
    got = [m.forward(2, toks[:7], logits="window")]
    for a, b in ((7, 20), (20, 21), (21, 60)):
        got += [m.forward_batch([(2, toks[a:b], "window"), (0, toks[:1], "none")])[0]]
    assert np.array_equal(bits(np.concatenate(got)), bits(one))


@pytest.mark.parametrize("fam", HYBRIDS)
def test_recurrence_split_over_threads_equals_the_serial_loop(
    fam: str, q8: dict[str, Path]
) -> None:
    # Prefill and decode pieces run the recurrence split by key head on the pool's threads
    # (rust/src/model/deltanet_par.rs); the serial compute (threads=-1) runs one loop. Batched
    # prefills of three slots, then decode steps: every row bitwise the same.
    toks = [int(t) for t in np.random.default_rng(5).integers(0, 200, 90)]
    outs = []
    for threads in (-1, 2):
        m = Model.open(q8[fam], n_ctx=64, n_slots=3, kv_type="f16", threads=threads)
        got = m.forward_batch([(s, toks[30 * s : 30 * s + 23], "all") for s in range(3)])
        for i in range(5):
            got += m.forward_batch([(s, [toks[30 * s + 23 + i]], "last") for s in range(3)])
        outs.append(np.concatenate([np.atleast_2d(g) for g in got]))
    assert outs[0].shape == (3 * 23 + 15, outs[0].shape[1])
    assert np.array_equal(bits(outs[0]), bits(outs[1]))


@pytest.mark.parametrize("fam", HYBRIDS)
def test_truncation_only_starts_over(fam: str, q8: dict[str, Path]) -> None:
    m = Model.open(q8[fam], n_ctx=64, n_slots=2, kv_type="f16")
    toks = list(range(5, 25))
    first = m.forward(0, toks, logits="all")
    with pytest.raises(ValueError, match=r"recurrent state.*truncate to 0"):
        m.truncate(0, 10)
    assert m.slot_len(0) == 20
    m.truncate(0, 20)  # its length: nothing to do
    nxt = m.forward(0, [7])
    m.truncate(0, 0)
    assert np.array_equal(bits(m.forward(0, toks, logits="all")), bits(first))
    assert np.array_equal(bits(m.forward(0, [7])), bits(nxt))
    m.free(0)
    assert np.array_equal(bits(m.forward(0, toks, logits="all")), bits(first))
    with pytest.raises(ModelError, match="recurrent state"):
        m.kv_export(0, 5)
    with pytest.raises(ModelError, match="recurrent state"):
        m.kv_import(1, b"\0" * 64)


@pytest.mark.parametrize("fam", HYBRIDS)
def test_truncation_restores_a_window_checkpoint(fam: str, q8: dict[str, Path]) -> None:
    """A window checkpoints the state after each of its tokens: cutting back to any of them
    (a rejected draft's rollback) continues bitwise as if the window had stopped there."""
    m = Model.open(q8[fam], n_ctx=64, n_slots=2, kv_type="f16")
    toks = list(range(5, 25))
    m.forward(0, toks[:12], logits="none")
    m.forward(0, toks[12:18], logits="window")  # checkpoints at 13..18
    m.truncate(0, 14)
    with pytest.raises(ValueError, match=r"checkpoint"):
        m.truncate(0, 13 - 1)  # before the window: no checkpoint
    got = m.forward(0, [99, 100], logits="window")
    m.free(1)
    m.forward(1, toks[:14], logits="none")
    want = m.forward(1, [99, 100], logits="window")
    assert np.array_equal(bits(got), bits(want))


class HalfRightDrafter:
    """Proposes the true greedy continuation (known from a run without speculation) with its
    last token wrong, so every window of 2+ drafts is cut back inside itself."""

    name = "test"

    def __init__(self, runs: list[tuple[list[int], list[int]]]) -> None:
        self.runs = runs  # (prompt, greedy output)

    def propose_many(self, reqs: list[Any]) -> list[Any]:
        from strata.spec import Draft

        out = []
        for r in reqs:
            h = list(r.history)
            prompt, cont = next((p, c) for p, c in self.runs if h[: len(p)] == p)
            n = len(h) - len(prompt)  # tokens of the output so far (the last not yet run)
            toks = cont[n : n + r.k]
            if len(toks) >= 2:
                toks[-1] = (toks[-1] + 1) % 500
            out.append(Draft(toks))
        return out

    def rollback(self, slot: int, n: int) -> None:
        pass

    def release(self, slot: int) -> None:
        pass

    def pause(self, paused: bool) -> None:
        pass


@pytest.mark.parametrize("fam", HYBRIDS)
def test_greedy_with_speculation_equals_without(fam: str, q8: dict[str, Path]) -> None:
    """Speculation on a hybrid: every window is cut back inside itself (a drafter whose last
    proposed token is wrong), each time to a checkpoint; the greedy output equals the run
    without speculation."""
    from strata.config import Config
    from strata.engine.backend import LLMBackend
    from strata.spec import Speculator
    from test_spec import GREEDY, llm_run

    be = LLMBackend(Config(model=str(q8[fam]), n_ctx=768, parallel=3, kv_type="f16"))
    rng = np.random.default_rng(1)
    prompts = [[int(t) for t in rng.integers(0, 500, n)] for n in (5, 17, 40)]
    params = [GREEDY] * 3
    want, _ = llm_run(be, None, prompts, params, max_tokens=40)
    runs = [(p, list(o)) for p, (o, _) in zip(prompts, want, strict=True)]
    spec = Speculator(HalfRightDrafter(runs), 1, 5, adaptive=False)
    got, _ = llm_run(be, spec, prompts, params, max_tokens=40)
    assert got == want
    assert spec.accepted > 0 and spec.offered > spec.accepted, (spec.offered, spec.accepted)


@pytest.mark.parametrize("fam", HYBRIDS)
def test_placement_reuses_whole_sequences_or_checkpoints(fam: str, q8: dict[str, Path]) -> None:
    """The engine's slot placement on a hybrid file: a prompt that extends what a slot holds
    keeps it all; one that shares the slot's marked prompt (`checkpoint`, as the scheduler
    marks each prompt's end) but not what followed keeps that prompt; one that diverges
    before it starts the slot over. The logits equal a fresh slot's bitwise each time."""
    from strata.config import Config
    from strata.engine.backend import LLMBackend
    from strata.engine.prefix import SlotCache

    be = LLMBackend(Config(model=str(q8[fam]), n_ctx=256, parallel=2, kv_type="f16"))
    assert be.recurrent and not hasattr(be, "kv_export")
    sc = SlotCache(be, 1, None)

    def run(prompt: list[int], reused_want: int) -> None:
        slot, reused = sc.place(prompt, [0])
        assert reused == reused_want
        got = be.forward_batch([(slot, prompt[reused:], "last")])[0]
        sc.fed(slot, prompt[reused:])
        be.free(1)
        want = be.forward_batch([(1, prompt, "last")])[0]
        assert got is not None and want is not None
        assert np.array_equal(bits(got), bits(want))

    a = list(range(10, 30))
    run(a, 0)
    be.checkpoint(0)  # the prompt's end
    be.forward_batch([(0, [3, 4, 5], "none")])  # "generated"
    sc.fed(0, [3, 4, 5])
    assert be.checkpoints(0) == [len(a)]
    run([*a, 3, 4, 5, 6, 7], len(a) + 3)  # extends the slot: all of it kept
    run([*a, 7, 8, 9], len(a))  # back to the marked prompt
    run([*a[:5], 9, 9, 9], 0)  # diverges before it
    # the scheduler marks each prompt's end
    from test_spec import GREEDY, llm_run

    llm_run(be, None, [a], [GREEDY], max_tokens=4)
    assert any(be.checkpoints(s) == [len(a)] for s in range(be.max_slots))


@pytest.mark.parametrize("fam", HYBRIDS)
def test_checkpoint_marks_a_prompt_end(fam: str, q8: dict[str, Path]) -> None:
    m = Model.open(q8[fam], n_ctx=64, n_slots=2, kv_type="f16")
    toks = list(range(5, 30))
    m.forward(0, toks[:12], logits="none")
    m.checkpoint(0)
    m.forward(0, [1, 2, 3], logits="none")
    m.forward(0, toks[12:15], logits="window")  # window checkpoints 16..18 beside the mark
    assert m.checkpoints(0) == [12, 16, 17, 18]
    m.truncate(0, 12)
    assert m.checkpoints(0) == [12]
    got = m.forward(0, toks[12:], logits="window")
    m.free(1)
    m.forward(1, toks[:12], logits="none")
    assert np.array_equal(bits(got), bits(m.forward(1, toks[12:], logits="window")))
    plain = Model.open(Path(__file__).parent / "golden" / "qwen2moe_f32.gguf", n_ctx=16)
    with pytest.raises(ModelError, match="no recurrent state"):
        plain.checkpoint(0)
    assert plain.checkpoints(0) == []


@pytest.mark.parametrize("fam", HYBRIDS)
def test_mtp_layers_are_not_run(fam: str, tmp_path: Path) -> None:
    """A file with an MTP layer after the trunk (block_count counts it, nextn_predict_layers
    names it, recurrent_layers marks it attention) runs the trunk alone: logits bitwise those
    of the same file without it, with the RAM tier attached too (the MTP layer runs only as
    a drafter, `spec=mtp`: tests/test_mtp.py)."""
    import dataclasses

    from strata.llm import LLM

    s = GOLDEN_SHAPES[fam]
    mtp = dataclasses.replace(s, n_nextn=1)
    trunk = qf.write(tmp_path / "trunk.gguf", s, qf.random_tensors(s, 7))
    both = qf.write(tmp_path / "mtp.gguf", mtp, qf.random_tensors(mtp, 7))
    toks = list(range(1, 41))
    want = Model.open(trunk, n_ctx=64).forward(0, toks, logits="all")
    m = Model.open(both, n_ctx=64)
    assert m.hparams["n_layer"] == s.n_layer
    assert np.array_equal(m.forward(0, toks, logits="all"), want)
    llm = LLM(str(both), ram_mode="resident")
    got = [t for t, _ in llm.generate_ids(toks, max_tokens=4, temperature=0.0)]
    ref = LLM(str(trunk), ram_mode="resident")
    assert got == [t for t, _ in ref.generate_ids(toks, max_tokens=4, temperature=0.0)]


@pytest.mark.parametrize("ftype", ["Q8_0", "F32", "Q4_K_M"])
@pytest.mark.parametrize("fam", [*HYBRIDS, "qwen3moe"])
def test_window_rows_are_one_token_steps_at_hidden_256(
    fam: str, ftype: str, tmp_path: Path
) -> None:
    """Each row of a window (a k-token entry of the batched step) is bitwise the one-token
    step at its position, F16 KV, whatever the weights' type: the window's rows take every
    matmul in the one-row order (F32 weights, such as the routers and the shared expert's
    gate, have a multi-row order of their own, as do Q4_K and Q6_K; one such row once made
    a qwen35moe Q8_0 file's window differ from its steps)."""
    hybrid = dict(
        n_ff_shexp=64, n_rot=16, ssm_state=16, attn_every=2, ssm_conv=4, ssm_groups=2,
        ssm_v_heads=4,
    )  # fmt: skip
    s = qf.Shape(
        n_layer=2, n_embd=256, n_head=4, n_head_kv=2, head_dim=64, n_expert=8, n_expert_used=2,
        n_ff_exp=64, n_vocab=512, rope_base=1e6, arch=fam,
        **(hybrid if fam in HYBRIDS else {}),  # type: ignore[arg-type]
    )  # fmt: skip
    f32 = qf.write(tmp_path / "h256-F32.gguf", s, qf.random_tensors(s, 3))
    path = f32 if ftype == "F32" else qf.quantize(f32, tmp_path / f"h256-{ftype}.gguf", ftype)
    m = Model.open(path, n_ctx=256, n_slots=2, kv_type="f16")
    rng = np.random.default_rng(0)
    differ = []
    n = 8 if ftype == "Q8_0" else 2
    for _ in range(n):
        p = [int(t) for t in rng.integers(0, 500, 32)]
        w = [int(t) for t in rng.integers(0, 500, 9)]
        for slot in (0, 1):
            m.free(slot)
            m.forward(slot, p, logits="none")
        a = m.forward_batch([(0, w, "window")])[0]
        b = np.stack([m.forward(1, [t]) for t in w])
        assert a is not None
        differ.append(np.nonzero((bits(a) != bits(b)).any(1))[0].tolist())
    assert differ == [[]] * n, differ
