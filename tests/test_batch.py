"""`Model.forward_batch` on the CPU: every entry's logits are bitwise the logits of the same calls
run alone, whatever else shares the step (order, sizes, mixes of one-token decodes, windows and
prefill chunks, logits none/last/all); refused batches change nothing; `kv_export`/`kv_import`
restore a slot bitwise."""

from __future__ import annotations

import random
from collections.abc import Sequence

import numpy as np
import pytest
from models import TestModels
from strata._core import Model

N_SLOTS = 4
N_CTX = 160

# Each sequence is a list of calls (tokens, logits); sequences of the test share steps.
Call = tuple[list[int], str]


def model_path(test_models: TestModels, kind: str) -> str:
    if kind == "f32":
        return str(test_models.f32())
    if kind == "f16":
        return str(test_models.f32("f16"))
    return str(test_models.quantized(kind))


def open_model(path: str, chunk: int = 64, kv: str = "f16", threads: int = 1) -> Model:
    return Model.open(
        path, n_ctx=N_CTX, n_slots=N_SLOTS, kv_type=kv, prefill_chunk=chunk, threads=threads
    )


def random_calls(rng: random.Random, vocab: int) -> list[Call]:
    """A prompt chunked at random, then decode steps and short windows, logits at random."""
    calls: list[Call] = []
    for _ in range(rng.randint(1, 3)):
        n = rng.choice([1, 2, 3, 5, 8, 9, 13, 24, 40])
        calls.append(
            ([rng.randrange(vocab) for _ in range(n)], rng.choice(["none", "last", "all"]))
        )
    for _ in range(rng.randint(1, 4)):
        n = rng.choice([1, 1, 1, 2, 4])
        calls.append(([rng.randrange(vocab) for _ in range(n)], rng.choice(["last", "all"])))
    return calls


def alone(m: Model, calls: Sequence[Call]) -> list[np.ndarray | None]:
    """The sequence's calls through `forward` on slot 0 of a model with nothing else running."""
    m.free(0)
    out: list[np.ndarray | None] = []
    for toks, want in calls:
        r = m.forward(0, toks, logits=want)
        out.append(None if want == "none" else r)
    return out


def same(a: np.ndarray | None, b: np.ndarray | None) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


def run_batched(
    m: Model, seqs: list[list[Call]], rng: random.Random
) -> list[list[np.ndarray | None]]:
    """Every sequence's calls in order, in steps of random composition (each step takes the next
    call of a random subset of the unfinished sequences, in random order, on random slots)."""
    slots = rng.sample(range(N_SLOTS), len(seqs))
    for s in slots:
        m.free(s)
    nxt = [0] * len(seqs)
    got: list[list[np.ndarray | None]] = [[] for _ in seqs]
    while any(n < len(c) for n, c in zip(nxt, seqs, strict=True)):
        live = [i for i, c in enumerate(seqs) if nxt[i] < len(c)]
        step = rng.sample(live, rng.randint(1, len(live)))
        entries = [(slots[i], seqs[i][nxt[i]][0], seqs[i][nxt[i]][1]) for i in step]
        res = m.forward_batch(entries)
        assert len(res) == len(step)
        for i, r in zip(step, res, strict=True):
            got[i].append(r)
            nxt[i] += 1
    return got


@pytest.mark.parametrize("kind", ["f32", "f16", "Q8_0", "Q4_K_M", "IQ3_S"])
def test_batch_rows_equal_alone(test_models: TestModels, kind: str) -> None:
    path = model_path(test_models, kind)
    m = open_model(path)
    vocab = m.n_vocab
    for seed in range(3):
        rng = random.Random(1000 * seed + len(kind))
        seqs = [random_calls(rng, vocab) for _ in range(rng.randint(2, N_SLOTS))]
        want = [alone(m, c) for c in seqs]
        got = run_batched(m, seqs, rng)
        for i, (w, g) in enumerate(zip(want, got, strict=True)):
            for j, (a, b) in enumerate(zip(w, g, strict=True)):
                assert same(a, b), (kind, seed, i, j, seqs[i][j][1], len(seqs[i][j][0]))


def test_batch_longer_than_a_chunk(test_models: TestModels) -> None:
    """Entries longer than the prefill chunk run as the chunks `forward` would cut them into."""
    m = open_model(str(test_models.f32()), chunk=8)
    rng = random.Random(7)
    a = [[rng.randrange(m.n_vocab) for _ in range(n)] for n in (19, 1, 3)]
    b = [[rng.randrange(m.n_vocab) for _ in range(n)] for n in (2, 30, 1)]
    ref_a = alone(m, [(t, "all") for t in a])
    ref_b = alone(m, [(t, "last") for t in b])
    for s in (1, 3):
        m.free(s)
    for ta, tb, ra, rb in zip(a, b, ref_a, ref_b, strict=True):
        ga, gb = m.forward_batch([(3, tb, "last"), (1, ta, "all")])[::-1]
        assert same(ga, ra) and same(gb, rb)


def test_batch_shapes_and_single_entry(test_models: TestModels) -> None:
    m = open_model(str(test_models.f32()))
    v = m.n_vocab
    res = m.forward_batch([(0, [1, 2, 3], "all"), (1, [4], "last"), (2, [5, 6], "none")])
    assert res[0] is not None and res[0].shape == (3, v) and res[0].dtype == np.float32
    assert res[1] is not None and res[1].shape == (v,)
    assert res[2] is None
    assert [m.slot_len(s) for s in range(3)] == [3, 1, 2]
    assert m.forward_batch([]) == []
    # One entry is `forward` itself.
    m2 = open_model(str(test_models.f32()))
    m2.forward(0, [1, 2, 3], "none")
    assert same(m.forward_batch([(0, [9, 8], "all")])[0], m2.forward(0, [9, 8], "all"))


@pytest.mark.parametrize(
    "entries, what",
    [
        ([(0, [1], "last"), (0, [2], "last")], "more than one entry"),
        ([(0, [1], "last"), (N_SLOTS, [2], "last")], "does not exist"),
        ([(1, [1], "last"), (0, [1] * (N_CTX + 1), "none")], "context overflow"),
        ([(1, [1], "last"), (0, [10**6], "last")], "outside the vocabulary"),
        ([(1, [1], "last"), (0, [], "last")], "no tokens"),
        ([(1, [1], "last"), (0, [1], "first")], "logits must be"),
    ],
)
def test_batch_refused_changes_nothing(
    test_models: TestModels, entries: list[tuple[int, list[int], str]], what: str
) -> None:
    m = open_model(str(test_models.f32()))
    m.forward(0, [1, 2, 3], "none")
    m.forward(1, [4, 5], "none")
    before = [m.kv_export(s, m.slot_len(s)) for s in range(N_SLOTS)]
    with pytest.raises(ValueError, match=what):
        m.forward_batch(entries)
    assert [m.kv_export(s, m.slot_len(s)) for s in range(N_SLOTS)] == before


@pytest.mark.parametrize("kv", ["f32", "f16", "q8_0"])
def test_kv_import_equals_prefill(test_models: TestModels, kv: str) -> None:
    """A slot restored from an export continues bitwise as the slot that prefilled it."""
    m = open_model(str(test_models.f32()), kv=kv)
    rng = random.Random(3)
    prompt = [rng.randrange(m.n_vocab) for _ in range(37)]
    m.forward(0, prompt, "none")
    blob = m.kv_export(0, 30)
    assert isinstance(blob, bytes)
    assert m.kv_import(2, blob) == 30 and m.slot_len(2) == 30
    tail = [*prompt[30:], 5, 6]
    m.truncate(0, 30)
    want = m.forward(0, tail, "all")
    got = m.forward(2, tail, "all")
    assert same(got, want)
    # Zero positions: an empty slot.
    assert m.kv_import(3, m.kv_export(0, 0)) == 0 and m.slot_len(3) == 0


def test_kv_import_refuses_foreign_data(test_models: TestModels) -> None:
    path = str(test_models.f32())
    m = open_model(path, kv="f16")
    m.forward(0, [1, 2, 3, 4], "none")
    m.forward(1, [7, 7], "none")
    blob = m.kv_export(0, 4)
    other_kv = open_model(path, kv="q8_0")
    other_kv.forward(0, [1, 2, 3, 4], "none")
    other_model = open_model(str(TestModels.default_cache(seed=1).f32()), kv="f16")
    other_model.forward(0, [1, 2, 3, 4], "none")
    cases = [
        (other_kv.kv_export(0, 4), "KV type"),
        (other_model.kv_export(0, 4), "another model"),
        (blob[:-1], "bytes, expected"),
        (b"nonsense" * 8, "not a Strata KV export"),
    ]
    before = m.kv_export(1, 2)
    for data, what in cases:
        with pytest.raises(ValueError, match=what):
            m.kv_import(1, data)
        assert m.slot_len(1) == 2 and m.kv_export(1, 2) == before
    with pytest.raises(ValueError, match="holds 4"):
        m.kv_export(0, 5)
    with pytest.raises(ValueError, match="does not exist"):
        m.kv_import(N_SLOTS, blob)
