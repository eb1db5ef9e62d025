"""llama-server's `--cache-reuse` (KV shifting): after the prefix a prompt shares with a
slot's sequence, chunks the slot holds further on move down to where the prompt has them,
their keys rotated by the move.

Oracles: llama-server's walk over the cached and the new prompt (server.cpp, `n_cache_reuse`:
a run of at least N equal tokens is taken, else the cache skips a token), written out by hand
for small cases; the same model prefilling the moved prompt from scratch (logits equal to the
cache type's rounding: a key rotated twice against once); the server's answer without reuse."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import test_model_families as fam
from strata import LLM
from strata.engine.prefix import reuse_chunks
from test_prompt_cache_model import toks, write_model


@pytest.fixture(scope="module")
def path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_model(tmp_path_factory.mktemp("cr"))


def test_chunks_follow_llama_servers_walk() -> None:
    a, b, c, d = [1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11, 12], [13, 14]
    # a span dropped from the middle: the rest moves down
    assert reuse_chunks(a + b + c, a + c, 3, 4) == [(7, 5)]
    # below the minimum: nothing moves
    assert reuse_chunks(a + b + c, a + c, 3, 6) == []
    # two spans dropped, two chunks; the prompt's new tail is not in the cache
    assert reuse_chunks(a + d + b + d + c, a + b + c + [99], 3, 4) == [(5, 4), (11, 5)]
    # a chunk the prompt has out of order is skipped over, as the walk only goes forward
    assert reuse_chunks(a + c + b, a + b + c, 3, 4) == [(8, 4)]
    # the prompt's own prefix is not walked again; an empty tail has nothing to move
    assert reuse_chunks(a + b, a + b, 7, 2) == [] and reuse_chunks(a, a + b, 3, 1) == []


def kv_rows(llm: LLM, slot: int, n: int, layers: int) -> tuple[np.ndarray, np.ndarray]:
    """The slot's f32 K and V: [L, n, Nkv·D] each."""
    raw = np.frombuffer(llm.kv_export(slot, n)[40:], dtype=np.float32)
    k, v = raw.reshape(2, layers, n, -1)
    return k, v


def rotate_neox(k: np.ndarray, delta: int, base: float, d: int) -> np.ndarray:
    """RoPE's NEOX rotation (pairs i, i + d/2, angle delta·base^(−2i/d)) of rows [.., Nkv·D],
    in float64: the oracle of a move."""
    x = k.reshape(*k.shape[:-1], -1, d).astype(np.float64)
    th = delta * base ** (-2.0 * np.arange(d // 2) / d)
    c, s = np.cos(th), np.sin(th)
    a, b = x[..., : d // 2], x[..., d // 2 :]
    out = np.concatenate([a * c - b * s, a * s + b * c], axis=-1)
    return out.reshape(k.shape)


def test_moved_keys_are_the_cached_keys_rotated_by_the_move(path: Path) -> None:
    """Every layer: a moved key is the cached one rotated by the move (numpy's rotation), a
    moved value the cached one, bitwise; the kept prefix untouched. Layer 0's keys and values
    depend on the token and its position only: there the moved rows equal a fresh prefill of
    the moved prompt. (Deeper layers keep what they computed beside the dropped tokens: KV
    shifting reuses that state, as llama.cpp's does; it is not the moved prompt's own.)"""
    llm = LLM(path, n_ctx=256, parallel=2, kv_type="f32", prefill_chunk=16)
    a, b, c = toks(20, 1), toks(15, 2), toks(40, 3)
    llm.forward_batch([(0, a + b + c, "none")])
    k0, v0 = kv_rows(llm, 0, 75, 2)
    assert llm.kv_shift(0, len(a), [(35, 25), (62, 8)]) == 53 == llm.slot_len(0)
    k1, v1 = kv_rows(llm, 0, 53, 2)
    assert np.array_equal(k1[:, :20], k0[:, :20]) and np.array_equal(v1[:, :20], v0[:, :20])
    assert np.array_equal(v1[:, 20:45], v0[:, 35:60]) and np.array_equal(v1[:, 45:], v0[:, 62:70])
    for (lo, hi), frm in (((20, 45), 35), ((45, 53), 62)):
        want = rotate_neox(k0[:, frm : frm + hi - lo], lo - frm, 1e6, 64)
        assert np.max(np.abs(k1[:, lo:hi] - want)) <= 1e-5 * np.max(np.abs(want))
    moved = a + c[:25] + c[27:35]
    llm.forward_batch([(1, moved, "none")])
    kf, vf = kv_rows(llm, 1, 53, 2)
    assert np.max(np.abs(k1[0] - kf[0])) <= 1e-5 * np.max(np.abs(kf[0]))
    assert np.array_equal(v1[0], vf[0])
    # and the slot goes on from there: its next positions are the moved prompt's
    assert llm.forward_batch([(0, toks(4, 4), "last")])[0] is not None and llm.slot_len(0) == 57


@pytest.mark.parametrize("kv_type, tol", [("f16", 2e-3), ("q8_0", 3e-2)])
def test_quantized_caches_move_within_their_rounding(path: Path, kv_type: str, tol: float) -> None:
    """The cache types that store rounded keys: layer 0's moved keys against a fresh prefill's,
    within one more rounding (llama.cpp's KV shift rounds the same way)."""
    llm = LLM(path, n_ctx=256, parallel=2, kv_type=kv_type, prefill_chunk=16)
    a, b, c = toks(20, 1), toks(15, 2), toks(40, 3)
    llm.forward_batch([(0, a + b + c, "none")])
    llm.kv_shift(0, len(a), [(35, 40)])
    llm.forward_batch([(1, a + c, "none")])
    f32 = LLM(path, n_ctx=256, parallel=1, kv_type="f32", prefill_chunk=16)
    f32.forward_batch([(0, a + c, "none")])
    k_ref = kv_rows(f32, 0, 60, 2)[0][0]
    moved, fresh = (llm.kv_export(s, 60) for s in (0, 1))
    assert moved != fresh  # moved keys are rounded twice
    top = float(np.max(np.abs(k_ref)))
    for blob in (moved, fresh):
        k = kv_as_f32(blob, kv_type, 2, 60, 64)[0]
        assert float(np.max(np.abs(k - k_ref))) <= tol * top


def kv_as_f32(blob: bytes, kv_type: str, layers: int, n: int, row: int) -> np.ndarray:
    """The K section of an export in another cache type, as f32 [L, n, row] (gguf-py's
    dequantizer)."""
    from gguf import GGMLQuantizationType, quants

    ty = {"f16": GGMLQuantizationType.F16, "q8_0": GGMLQuantizationType.Q8_0}[kv_type]
    size = len(quants.quantize(np.zeros((1, row), dtype=np.float32), ty).tobytes())
    raw = np.frombuffer(blob[40 : 40 + layers * n * size], dtype=np.uint8).reshape(-1, size)
    return quants.dequantize(raw, ty).reshape(layers, n, row)


def test_moved_keys_with_yarn_and_sliding_windows() -> None:
    """gpt-oss (YaRN with its attention scale, sinks, windowed layers): layer 0's moved keys
    equal a fresh prefill's, so the move does not apply YaRN's scale a second time."""
    llm = LLM(fam.GOLDEN / "gptoss_f32.gguf", n_ctx=128, parallel=2, kv_type="f32")
    a, b, c = toks(6, 5), toks(10, 6), toks(20, 7)
    llm.forward_batch([(0, a + b + c, "none")])
    assert llm.kv_shift(0, len(a), [(len(a) + len(b), len(c))]) == len(a) + len(c)
    llm.forward_batch([(1, a + c, "none")])
    n = len(a) + len(c)
    k0, kf = (np.frombuffer(llm.kv_export(s, n)[40:], dtype=np.float32) for s in (0, 1))
    layers = 2
    k0, kf = (x.reshape(2, layers, n, -1)[0, 0] for x in (k0, kf))
    assert float(np.max(np.abs(k0 - kf))) <= 1e-5 * float(np.max(np.abs(kf)))


def test_bad_chunks_leave_the_slot_as_it_was(path: Path) -> None:
    llm = LLM(path, n_ctx=128, parallel=1, kv_type="f16")
    p = toks(30, 9)
    llm.forward_batch([(0, p, "none")])
    before = llm.kv_export(0, 30)
    huge = 2**64 - 1  # sums past the address range: refused, no panic
    for keep, chunks in (
        (5, [(20, 20)]),
        (10, [(5, 3)]),
        (40, []),
        (5, [(10, 4), (12, 4)]),
        (1, [(huge, 2)]),
        (1, [(2, huge)]),
    ):
        with pytest.raises(ValueError, match="KV shift"):
            llm.kv_shift(0, keep, chunks)
        assert llm.kv_export(0, 30) == before


def test_moved_or_restored_slots_give_no_stale_mtp_drafts() -> None:
    """A slot's KV replaced (imported, moved): the MTP layer's own KV is of the old sequence,
    so it does not draft for the slot again until the slot starts afresh."""
    from strata._core import Model

    m = Model.open(fam.GOLDEN / "glm4moe_mtp_f32.gguf", n_ctx=128, kv_type="f32")
    m.set_mtp(True)
    a, b, c = toks(10, 13), toks(15, 14), toks(35, 15)
    m.forward(0, a + b + c, logits="none")
    assert m.mtp_ready(0)
    m.kv_shift(0, len(a), [(len(a) + len(b), len(c))])
    m.truncate(0, 40)
    assert not m.mtp_ready(0)
    m.forward(0, toks(3, 16), logits="none")
    assert not m.mtp_ready(0)
    m.truncate(0, 0)
    m.forward(0, a + c, logits="none")
    assert m.mtp_ready(0)


def test_server_reuses_moved_chunks(path: Path) -> None:
    """Editors' sliding prompt: the second prompt drops a span after the shared start; with
    --cache-reuse its rest comes from the cache (cached_tokens, the metric) and the answer is
    the one the model gives after the same move (the engine's calls made by hand); without
    it, only the shared start is reused."""
    from server_harness import Server

    a, b, c = toks(24, 10), toks(16, 11), toks(48, 12)
    llm = LLM(path, n_ctx=512, parallel=1, kv_type="f32")
    llm.forward_batch([(0, a + b + c, "none")])
    llm.kv_shift(0, len(a), [(len(a) + len(b), len(c) - 1)])
    want = []
    nxt = c[-1]
    for _ in range(8):
        row = llm.forward_batch([(0, [nxt], "last")])[0]
        assert row is not None
        nxt = int(np.argmax(row))
        want.append(nxt)
    for reuse in (0, 8):
        srv = Server(engine="llm", model=path, n_ctx=512, cache_reuse=reuse, kv_type="f32")
        try:
            body = {"n_predict": 1, "temperature": 0, "return_tokens": True}
            assert srv.http.post("/completion", json={**body, "prompt": a + b + c}).is_success
            r = srv.http.post("/completion", json={**body, "prompt": a + c, "n_predict": 8})
            assert r.status_code == 200, r.text
            got = r.json()
            cached = got["timings"]["cache_n"]
            # the prompt's last token always runs
            assert cached == (len(a) + len(c) - 1 if reuse else len(a)), (reuse, cached)
            if reuse:
                assert got["tokens"] == want
                m = srv.http.get("/metrics").text
                assert f"strata_kv_shifted_tokens_total {float(len(c) - 1)}" in m
        finally:
            srv.stop()


def test_slot_cache_moves_chunks_after_a_restore_and_when_refused_runs_on() -> None:
    """The slot placement (fake backend): a sequence restored from the host-RAM prompt cache
    is walked too (llama-server loads its cached prompt before the walk); a move the backend
    refuses leaves the common prefix, the slot's tokens and KV in step."""
    from strata.engine.backend import FakeBackend
    from strata.engine.prefix import PromptCache, SlotCache

    a, b, c, z = (list(range(s, s + n)) for s, n in ((10, 20), (40, 16), (60, 40), (110, 40)))

    def fill(sc: SlotCache, be: FakeBackend, p: list[int]) -> int:
        """Place a prompt and run it (the fake's KV is its token ids)."""
        slot, reused = sc.place(p, [0])
        assert be.kv_export(slot, reused) == np.asarray(p[:reused], np.int32).tobytes()
        be.kv_import(slot, np.asarray(p, np.int32).tobytes())
        sc.fed(slot, p[reused:])
        return reused

    be = FakeBackend(n_ctx_seq=256, max_slots=1)
    sc = SlotCache(be, 1, PromptCache(1 << 20), chunk_reuse=4)
    assert fill(sc, be, a + b + c) == 0
    assert fill(sc, be, z) == 0  # a + b + c goes to the prompt cache
    assert fill(sc, be, a + c) == len(a) + len(c) - 1  # restored, then moved
    assert sc.shifted_tokens == len(c) - 1

    be = FakeBackend(n_ctx_seq=256, max_slots=1)
    sc = SlotCache(be, 1, None, chunk_reuse=4)
    fill(sc, be, a + b + c)

    def refuse(slot: int, keep: int, chunks: list[tuple[int, int]]) -> int:
        raise ValueError("KV shift: refused")

    be.kv_shift = refuse  # type: ignore[method-assign]
    assert fill(sc, be, a + c) == len(a) and sc.shifted_tokens == 0
    with pytest.raises(ValueError, match="KV shift"):
        FakeBackend(n_ctx_seq=64, max_slots=1).kv_shift(0, 0, [(0, 5)])  # past its length
