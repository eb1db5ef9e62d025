"""llama-server's slot actions (`--slot-save-path`, `POST /slots/{id}?action=save|restore|erase`):
in the engine on the fake backend (its "KV" is the token ids, so a restore is checked exactly),
its files (another model's, truncated, foreign: refused, the slot left empty), an action
deferred while a request holds the slot, and the HTTP route on the fake engine's server (the
answers' fields as llama-server's, the errors, the server serving on after them)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from models import TestModels
from server_harness import Server
from strata import toytok
from strata.engine.backend import FakeBackend
from strata.engine.protocol import SlotAction, SlotDone, Submit, Tokens
from strata.engine.scheduler import Scheduler
from strata.engine.slot_files import MAGIC, read_slot, valid_filename, write_slot
from strata.modelgen import ModelSpec
from strata.sampling import SamplingParams

GREEDY = SamplingParams(temperature=0)
EOG = sorted(toytok.EOG_IDS)
PROMPT = list(b"the same long system prompt, then a question")


def drain(sched: Scheduler) -> list[object]:
    out: list[object] = []
    for _ in range(1000):
        out += sched.run_slot_actions()
        if not sched.has_work():
            return out
        out += sched.step()
    raise AssertionError("scheduler did not finish")


def cached(events: list[object], rid: int) -> int:
    return next(
        e.cached_tokens for e in events if isinstance(e, Tokens) and e.rid == rid and e.finish
    )


def sched_of(model: str = "m1") -> Scheduler:
    return Scheduler(FakeBackend(n_ctx_seq=256, max_slots=2), 16, 2, model=lambda: model)


def test_save_erase_restore_then_the_prompt_reuses_it(tmp_path: Path) -> None:
    s = sched_of()
    s.add(Submit(1, PROMPT, GREEDY, 5, EOG))
    drain(s)
    held = list(s.slots.tokens[0])
    assert len(held) >= len(PROMPT)
    f = str(tmp_path / "a.bin")
    (saved,) = s.slot_action(SlotAction(10, 0, "save", f))
    assert saved.error == "" and saved.result["n_saved"] == len(held)
    assert saved.result["n_written"] == Path(f).stat().st_size
    assert {"id_slot", "filename", "timings"} <= saved.result.keys()
    (erased,) = s.slot_action(SlotAction(11, 0, "erase"))
    assert erased.result == {"id_slot": 0, "n_erased": len(held)} and s.slots.tokens[0] == []
    (restored,) = s.slot_action(SlotAction(12, 1, "restore", f))
    assert restored.result["n_restored"] == len(held)
    assert restored.result["n_read"] == Path(f).stat().st_size
    assert s.slots.tokens[1] == held and s.backend._tokens[1] == held  # type: ignore[attr-defined]
    # the same prompt again: placed on slot 1, only its last token runs
    s.add(Submit(2, PROMPT, GREEDY, 5, EOG))
    assert cached(drain(s), 2) == len(PROMPT) - 1


def test_an_action_on_a_busy_slot_waits_for_it(tmp_path: Path) -> None:
    s = Scheduler(FakeBackend(n_ctx_seq=256, max_slots=1), 4, 1, model=lambda: "m1")
    s.add(Submit(1, PROMPT, GREEDY, 8, EOG))
    s.step()
    assert 0 in s.running
    assert s.slot_action(SlotAction(5, 0, "save", str(tmp_path / "b.bin"))) == []
    s.add(Submit(2, list(b"another prompt"), GREEDY, 4, EOG))  # must not take the slot first
    events = drain(s)
    done = [e for e in events if isinstance(e, SlotDone)]
    assert len(done) == 1 and done[0].error == ""
    toks, _, _ = read_slot(tmp_path / "b.bin", "m1")
    assert toks[: len(PROMPT)] == PROMPT  # request 1's sequence, not request 2's
    assert done[0].result["n_saved"] == len(toks)


def test_bad_files_are_refused_and_leave_the_slot_empty(tmp_path: Path) -> None:
    s = sched_of("m1")
    s.add(Submit(1, PROMPT, GREEDY, 3, EOG))
    drain(s)
    good = tmp_path / "good.bin"
    assert s.slot_action(SlotAction(2, 0, "save", str(good)))[0].error == ""
    other = tmp_path / "other.bin"
    write_slot(other, "m2", PROMPT, b"x" * 16)
    short = tmp_path / "short.bin"
    short.write_bytes(good.read_bytes()[:-3])
    foreign = tmp_path / "foreign.bin"
    foreign.write_bytes(b"GGUF" + bytes(64))
    for path, why in (
        (other, "another model"),
        (short, "not what its header says"),
        (foreign, "not a slot file"),
        (tmp_path / "none.bin", "No such file"),
    ):
        (d,) = s.slot_action(SlotAction(3, 0, "restore", str(path)))
        assert d.result == {} and why in d.error, (path.name, d.error)
    # a file of this model whose KV the backend refuses (a token past its context)
    write_slot(tmp_path / "big.bin", "m1", list(range(300)), bytes(4 * 300))
    (d,) = s.slot_action(SlotAction(4, 0, "restore", str(tmp_path / "big.bin")))
    assert "does not fit" in d.error and s.slots.tokens[0] == []
    (d,) = s.slot_action(SlotAction(5, 7, "erase"))
    assert "no slot 7" in d.error
    # the engine goes on
    s.add(Submit(6, PROMPT, GREEDY, 3, EOG))
    ends = [e.finish for e in drain(s) if isinstance(e, Tokens) and e.rid == 6 and e.finish]
    assert ends in (["stop"], ["length"])


def test_file_names() -> None:
    assert valid_filename("slot-0.bin") and valid_filename("a_b.c")
    for bad in ("", ".", "..", ".hidden", "../x", "a/b", "a b", "x" * 256, "é.bin"):
        assert not valid_filename(bad), bad


def test_route(tmp_path: Path) -> None:
    off = Server()
    try:
        r = off.http.post("/slots/0?action=save", json={"filename": "a.bin"})
        assert r.status_code == 501 and "slot-save-path" in r.json()["error"]["message"]
    finally:
        off.stop()
    srv = Server(slot_save_path=str(tmp_path), parallel=1)
    try:
        http = srv.http
        r = http.post("/completion", json={"prompt": "hello there, a prompt", "n_predict": 4})
        assert r.status_code == 200
        r = http.post("/slots/0?action=save", json={"filename": "s.bin"})
        assert r.status_code == 200, r.text
        saved = r.json()
        assert saved["id_slot"] == 0 and saved["filename"] == "s.bin" and saved["n_saved"] > 0
        assert saved["n_written"] == (tmp_path / "s.bin").stat().st_size
        assert (tmp_path / "s.bin").read_bytes().startswith(MAGIC)
        listed = srv.wait(lambda r: r.json()[0]["n_past"] == saved["n_saved"], "/slots").json()
        assert listed[0]["id"] == 0 and listed[0]["id_task"] == -1
        assert listed[0]["is_processing"] is False and listed[0]["n_ctx"] > 0
        r = http.post("/slots/0?action=erase")
        assert r.json() == {"id_slot": 0, "n_erased": saved["n_saved"]}
        # the engine's counters go out with the action's answer: /slots shows it at once
        assert srv.wait(lambda r: r.json()[0]["n_past"] == 0, "/slots", timeout=0.5)
        r = http.post("/slots/0?action=restore", json={"filename": "s.bin"})
        assert r.status_code == 200 and r.json()["n_restored"] == saved["n_saved"]
        r = http.post("/completion", json={"prompt": "hello there, a prompt", "n_predict": 4})
        assert r.json()["tokens_cached"] >= saved["n_saved"] - 1
        for path, body, status in (
            ("/slots/0?action=save", {"filename": "../x.bin"}, 400),
            ("/slots/0?action=save", {}, 400),
            ("/slots/0?action=fly", {"filename": "a.bin"}, 400),
            ("/slots/0?action=restore", {"filename": "missing.bin"}, 404),
            ("/slots/9?action=save", {"filename": "n.bin"}, 400),
        ):
            r = http.post(path, json=body)
            assert r.status_code == status, (path, body, r.text)
            assert r.json()["error"]["message"]
        (tmp_path / "junk.bin").write_bytes(b"junk")
        r = http.post("/slots/0?action=restore", json={"filename": "junk.bin"})
        assert r.status_code == 400 and "not a slot file" in r.json()["error"]["message"]
        r = http.post("/completion", json={"prompt": "still serving", "n_predict": 2})
        assert r.status_code == 200
    finally:
        srv.stop()


@pytest.mark.parametrize("bad", ["/no/such/folder"])
def test_a_missing_folder_is_a_config_error(bad: str) -> None:
    from strata.config import Config
    from strata.config_checks import check_config
    from strata.errors import ConfigError

    with pytest.raises(ConfigError, match="slot_save_path"):
        check_config(Config(slot_save_path=bad))


def test_real_engine_restores_the_kv_exactly(test_models: TestModels, tmp_path: Path) -> None:
    """The real engine (a one-layer random model, CPU): a slot saved after a prompt, erased,
    restored; the same prompt then reads only its last token and answers exactly as it did
    when run whole (the KV came back bitwise); a file of another model is refused."""
    spec = ModelSpec.micro(vocab="qwen3", n_embd=64, n_ff_exp=64)
    model = TestModels(test_models.root, spec).f32()
    srv = Server(engine="llm", model=model, slot_save_path=str(tmp_path), n_ctx=2048)
    body = {"prompt": "a prompt long enough to matter " * 8, "n_predict": 8, "temperature": 0}
    try:
        http = srv.http
        first = http.post("/completion", json=body).json()
        assert http.post("/slots/0?action=save", json={"filename": "r.bin"}).status_code == 200
        assert http.post("/slots/0?action=erase").status_code == 200
        r = http.post("/slots/0?action=restore", json={"filename": "r.bin"})
        assert r.status_code == 200, r.text
        again = http.post("/completion", json=body).json()
        assert again["tokens_cached"] >= first["tokens_evaluated"] - 1
        assert again["content"] == first["content"]
        # a file whose fingerprint is another model's
        data = bytearray((tmp_path / "r.bin").read_bytes())
        at = data.index(b'"model": "') + len(b'"model": "')
        data[at] = ord("x") if data[at] != ord("x") else ord("y")  # same length
        (tmp_path / "o.bin").write_bytes(bytes(data))
        r = http.post("/slots/0?action=restore", json={"filename": "o.bin"})
        assert r.status_code == 400 and "another model" in r.json()["error"]["message"]
    finally:
        srv.stop()


def test_the_answer_names_its_slot_and_id_slot_is_refused(tmp_path: Path) -> None:
    """`/completion`'s `id_slot` is the slot the request ran in (for a save after it);
    pinning a request to a slot (`id_slot` >= 0) is refused: the server's queue sends at most
    one request per slot to the engine."""
    srv = Server(slot_save_path=str(tmp_path), parallel=2)
    try:
        r = srv.http.post("/completion", json={"prompt": "which slot", "n_predict": 3})
        slot = r.json()["id_slot"]
        assert slot in (0, 1)
        r = srv.http.post(f"/slots/{slot}?action=save", json={"filename": "w.bin"})
        assert r.status_code == 200 and r.json()["n_saved"] > 0
        r = srv.http.post("/completion", json={"prompt": "x", "n_predict": 2, "id_slot": 1})
        assert r.status_code == 400 and r.json()["error"]["param"] == "id_slot"
    finally:
        srv.stop()


def test_malformed_headers_and_names(tmp_path: Path) -> None:
    """A header with non-numbers is a refused file, never an engine error; a save goes
    through a hidden temporary name, so it never touches another slot file (`x.part`
    beside `x`), and the longest valid name saves."""
    s = sched_of("m1")
    s.add(Submit(1, PROMPT, GREEDY, 3, EOG))
    drain(s)
    for head in (
        b'{"version": 1, "model": "m1", "n_tokens": Infinity, "n_bytes": 0}',
        b'{"version": 1, "model": "m1", "n_tokens": 1.5, "n_bytes": 0}',
        b'{"version": 1, "model": "m1", "n_tokens": NaN, "n_bytes": 0}',
    ):
        bad = tmp_path / "bad.bin"
        bad.write_bytes(MAGIC + len(head).to_bytes(4, "little") + head)
        (d,) = s.slot_action(SlotAction(2, 0, "restore", str(bad)))
        assert "bad header" in d.error, d.error
    for name in ("x.part", "x", "y" * 255):
        (d,) = s.slot_action(SlotAction(3, 0, "save", str(tmp_path / name)))
        assert d.error == "", d.error
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["bad.bin", "x", "x.part", "y" * 255]


def test_an_action_waits_for_a_window_in_flight(tmp_path: Path) -> None:
    """A slot whose (aborted) request's pipelined window is still on the device is busy:
    its action runs once the window has been settled."""
    s = sched_of("m1")
    s.add(Submit(1, PROMPT, GREEDY, 3, EOG))
    drain(s)

    s._inflight = SimpleNamespace(seqs=[SimpleNamespace(slot=0)])  # type: ignore[assignment]
    assert s.slot_action(SlotAction(4, 0, "erase")) == []
    s._inflight = None
    (d,) = s.run_slot_actions()
    assert d.error == "" and d.result["n_erased"] > 0
