"""The NextN / MTP layer as a drafter (`spec = mtp`, rust/src/model/mtp.rs,
strata.spec.drafters.MtpDrafter), on the CPU path.

- Oracle: llama.cpp's own MTP graph (scripts/mtp_oracle.py, through llama-cpp-python) over a
  random qwen35moe, qwen3next and glm4moe with one MTP / NextN layer written by llama.cpp's
  converter (scripts/make_hf_goldens.py --which qwen35moe_mtp,qwen3next_mtp,glm4moe_mtp →
  tests/golden/<family>_mtp_f32.gguf, mtp_<family>.npz; the glm4moe one with its own NextN
  embedding and head): the MTP logits after a prompt of n tokens (the layer caught up on the
  target's hidden states, then the draft step of x_n) and a chained second draft step (on the
  layer's own hidden state), F32 KV: max |Δ| / max |ref| ≤ 1e-4.
- Rollback: after a window the target rejected in part, the layer's next drafts are those of
  a slot that only ever ran the accepted tokens (the hybrid's recurrent state restored from
  its window checkpoint, the layer's KV and hidden state cut back with it).
- Greedy output with spec=mtp equals the output without (bitwise, Q8_0 copies: one float order
  per row), the drafts counted (offered, accepted): on the random file (its MTP layer knows
  nothing of its trunk: drafts rejected) and on a "bigram" copy of it where every draft is
  right by construction (`bigram_copy`: the trunk's mixers and FFNs output 0, so it predicts
  from the last token alone, and the MTP layer passes x_{p+1}'s embedding to the same head).
- A file without an MTP layer: ModelError from the model, ConfigError from spec=mtp; spec=auto
  picks the MTP layer when the file has one.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import qwen3moe_file as qf
from strata._core import Model
from strata.config import Config
from strata.errors import ConfigError, ModelError

GOLDEN = Path(__file__).parent / "golden"
MTP_FILE = GOLDEN / "qwen35moe_mtp_f32.gguf"
TRUNK_FILE = GOLDEN / "qwen35moe_f32.gguf"  # the same family without an MTP layer


def rel(a: np.ndarray, ref: np.ndarray) -> float:
    return float(np.abs(a - ref).max() / np.abs(ref).max())


@pytest.mark.parametrize("fam", ["qwen35moe", "qwen3next", "glm4moe"])
def test_mtp_logits_match_llama_cpp(fam: str) -> None:
    z = np.load(GOLDEN / f"mtp_{fam}.npz")
    prompts, logits, chain_at = z["prompts"], z["logits"], int(z["chain_at"])
    path = GOLDEN / f"{fam}_mtp_f32.gguf"
    m = Model.open(path, n_ctx=128, n_slots=1, threads=1, kv_type="f32", prefill_chunk=16)
    assert m.has_mtp
    m.set_mtp(True)
    worst = 0.0
    for i, p in enumerate(prompts):
        for n in (0, 1, 2, 7, 16, 33, len(p) - 1):  # prefill in chunks of 16 rows
            m.free(0)
            if n:
                m.forward(0, [int(t) for t in p[:n]], logits="none")
            assert m.mtp_ready(0)
            worst = max(worst, rel(m.mtp_draft(0, int(p[n]), True), logits[i, n]))
        m.free(0)
        m.forward(0, [int(t) for t in p[:chain_at]], logits="none")
        m.mtp_draft(0, int(p[chain_at]), True)
        chained = m.mtp_draft(0, int(p[chain_at + 1]), False)
        worst = max(worst, rel(chained, z["chained"][i]))
    assert worst <= 1e-4, worst


def test_window_rollback_restores_the_mtp_state() -> None:
    m = Model.open(MTP_FILE, n_ctx=128, n_slots=2, threads=1, kv_type="f32")
    m.set_mtp(True)
    rng = np.random.default_rng(7)
    prompt = [int(t) for t in rng.integers(0, 500, 20)]
    window = [int(t) for t in rng.integers(0, 500, 5)]  # t0 and 4 drafts
    m.forward(0, prompt, logits="none")
    # a draft chain runs ahead of the slot and is dropped by the window's catch-up
    for i, t in enumerate(window[:3]):
        m.mtp_draft(0, t, i == 0)
    m.forward_batch([(0, window, "window")])
    assert m.checkpoints(0) == list(range(21, 26))  # the window's positions
    for keep in (3, 1):  # accepted 2 drafts, then (cut back further) none
        m.truncate(0, len(prompt) + keep)
        m.free(1)
        m.forward(1, [*prompt, *window[:keep]], logits="none")
        assert m.mtp_ready(0) and m.mtp_ready(1)
        nxt = 11 * keep
        a = [m.mtp_draft(0, nxt, True), m.mtp_draft(0, nxt + 1, False)]
        b = [m.mtp_draft(1, nxt, True), m.mtp_draft(1, nxt + 1, False)]
        for x, y in zip(a, b, strict=True):
            assert rel(x, y) <= 1e-5
        # the target itself continues as the fresh slot does
        la = m.forward(0, [5], logits="last")
        lb = m.forward(1, [5], logits="last")
        assert rel(la, lb) <= 1e-5
        m.truncate(0, len(prompt) + keep)  # back to the window's checkpoint


def test_a_slot_behind_its_target_drafts_nothing_until_it_starts_over() -> None:
    m = Model.open(MTP_FILE, n_ctx=64, n_slots=1, threads=1)
    m.forward(0, [1, 2, 3], logits="none")  # before the layer runs
    m.set_mtp(True)
    assert not m.mtp_ready(0)
    with pytest.raises(ValueError, match="not in step"):
        m.mtp_draft(0, 4, True)
    m.free(0)
    m.forward(0, [1, 2, 3], logits="none")
    assert m.mtp_ready(0) and m.mtp_draft(0, 4, True).shape == (m.n_vocab,)


def test_a_paused_layer_stops_its_upkeep_and_new_sequences_draft_again() -> None:
    from strata.spec.drafters import MtpDrafter

    m = Model.open(MTP_FILE, n_ctx=64, n_slots=1, threads=1)
    d = MtpDrafter(m, 0.0)
    m.forward(0, [1, 2, 3], logits="none")
    assert m.mtp_ready(0)
    d.pause(True)  # the adaptive window found that no sequence's drafts can pay
    assert not m.mtp_ready(0) and d.paused
    m.forward(0, [4, 5], logits="none")  # the trunk alone
    d.pause(False)
    assert not m.mtp_ready(0)  # the positions run while it was off are not in its KV
    m.free(0)
    m.forward(0, [1, 2, 3], logits="none")
    assert m.mtp_ready(0) and m.mtp_draft(0, 4, True).shape == (m.n_vocab,)


def test_files_without_an_mtp_layer_are_refused() -> None:
    from strata.engine.backend import LLMBackend
    from strata.spec import make_speculator

    m = Model.open(TRUNK_FILE, n_ctx=64, n_slots=1, threads=1)
    assert not m.has_mtp
    with pytest.raises(ModelError, match="no MTP / NextN layer"):
        m.set_mtp(True)
    be = LLMBackend(Config(model=str(TRUNK_FILE), n_ctx=64, parallel=1, threads=1))
    with pytest.raises(ConfigError, match="carries no MTP layer"):
        make_speculator(Config(spec="mtp"), be)
    sp = make_speculator(Config(spec="auto"), be)
    assert sp is not None and sp.drafter.name == "ngram"


def bigram_copy(dst: Path, src: Path = MTP_FILE) -> Path:
    """`src` (a qwen35moe / qwen3next file with one MTP layer) with every trunk layer's output
    projections (attention, DeltaNet, routed and shared experts) zeroed: the residual stream
    stays x_p's embedding e_p and the logits are output·(rms(e_p)·w_out), a function of x_p
    alone (x_{p+1} = f(x_p)); and an MTP layer that predicts f(x_{p+1}) = x_{p+2}:
    eh_proj = [I 0] (enorm 1) passes rms(e_{p+1}), its block
    outputs 0, its head norm is output_norm."""
    import gguf

    shutil.copyfile(src, dst)
    r = gguf.GGUFReader(dst, "r+")
    t = {x.name: x.data for x in r.tensors}
    n = next(int(k.split(".")[1]) for k in t if k.endswith("nextn.eh_proj.weight"))
    h = t["output_norm.weight"].shape[0]
    for name, a in t.items():
        if name.split(".")[-2] in ("attn_output", "ssm_out", "ffn_down_exps", "ffn_down_shexp"):
            a[...] = 0
    eh = np.zeros((h, 2 * h), np.float32)
    eh[:, :h] = np.eye(h)
    t[f"blk.{n}.nextn.eh_proj.weight"][...] = eh
    t[f"blk.{n}.nextn.enorm.weight"][...] = 1
    t[f"blk.{n}.nextn.shared_head_norm.weight"][...] = t["output_norm.weight"]
    r.data.flush()
    return dst


@pytest.fixture(scope="module")
def q8(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("mtp")
    bigram = bigram_copy(d / "bigram-F32.gguf")
    return {
        "random": qf.quantize(MTP_FILE, d / "mtp-Q8_0.gguf", "Q8_0"),
        "bigram": qf.quantize(bigram, d / "bigram-Q8_0.gguf", "Q8_0"),
    }


@pytest.mark.parametrize("which", ["random", "bigram"])
def test_greedy_with_mtp_equals_without(q8: dict[str, Path], which: str) -> None:
    from strata.engine.backend import LLMBackend
    from strata.spec import make_speculator
    from test_spec import GREEDY, llm_run

    be = LLMBackend(Config(model=str(q8[which]), n_ctx=768, parallel=3, threads=1, kv_type="f16"))
    assert be.llm.model.has_mtp
    rng = np.random.default_rng(3)
    prompts = [[int(t) for t in rng.integers(0, 500, n)] for n in (5, 17, 40)]
    params = [GREEDY] * 3
    want, _ = llm_run(be, None, prompts, params, max_tokens=32)
    cfg = Config(spec="auto", parallel=3, n_ctx=768, spec_max=4, spec_adaptive=False)
    spec = make_speculator(cfg, be)
    assert spec is not None and spec.drafter.name == "mtp"
    got, sched = llm_run(be, spec, prompts, params, max_tokens=32)
    assert got == want
    assert spec.offered > 0, spec.offered
    if which == "random":  # its drafts are as good as a guess among 512 tokens
        assert spec.accepted <= spec.offered // 20, (spec.offered, spec.accepted)
    else:  # right by construction (up to the Q8_0 rounding of near-ties)
        assert spec.accepted >= 0.9 * spec.offered, (spec.offered, spec.accepted)
    info = sched.info()["spec"]
    assert info["drafter"] == "mtp" and info["drafts_offered"] == spec.offered
