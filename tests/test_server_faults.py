"""Lifecycle under trouble: disconnects, a killed / crashing / stalled engine, a full queue,
client timeouts, deadlines, and the graceful drain at shutdown. Real uvicorn, fake engine
(10 ms per step, so a prompt of N plain bytes streams for about N × 10 ms)."""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from collections.abc import Iterator

import httpx
import openai
import pytest
from server_harness import Server, pid_alive, wait_until

MODEL = "strata-fake"


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    s = Server(parallel=2, max_queue=2, fake_step_ms=10, test_faults=1, engine_silence_s=1.0)
    yield s
    s.stop()


def oai(s: Server, **kw: object) -> openai.OpenAI:
    return openai.OpenAI(base_url=s.url + "/v1", api_key="none", max_retries=0, **kw)  # type: ignore[arg-type]


def long_stream(s: Server, prompt: str = "x" * 2000) -> object:
    return oai(s).completions.create(model=MODEL, prompt=prompt, temperature=0, stream=True)


def idle(s: Server) -> bool:
    st = s.status()
    return bool(st["slots"]["running"] == 0 and st["slots"]["waiting"] == 0)


def steps(s: Server) -> float:
    return float(
        s.http.get("/metrics", headers={"accept": "application/json"}).json()["engine"][
            "engine_decode_steps_total"
        ]
    )


def generated(s: Server) -> float:
    m = re.search(r"^strata_generation_tokens_total (\S+)$", s.http.get("/metrics").text, re.M)
    return float(m.group(1)) if m else 0.0


def test_disconnect_mid_stream_frees_the_slot(server: Server) -> None:
    body = {"model": MODEL, "prompt": "x" * 2000, "stream": True, "temperature": 0}
    before = generated(server)
    with (
        httpx.Client(base_url=server.url, timeout=10) as h,
        h.stream("POST", "/v1/completions", json=body) as r,
    ):
        it = r.iter_lines()
        got = [next(it) for _ in range(6)]
        chunks = sum(line.startswith("data: {") for line in got)
        assert chunks > 0
        assert server.status()["slots"]["running"] == 1
    # the cancelled sequence's tokens are counted (they were generated)
    assert generated(server) - before >= chunks
    t = time.monotonic()
    assert wait_until(lambda: idle(server), timeout=3)
    freed_in = time.monotonic() - t
    assert freed_in < 2.0, freed_in  # within a few 10 ms steps, not the 20 s the echo takes
    a = steps(server)
    time.sleep(0.3)
    assert steps(server) - a < 3  # the engine stopped stepping that sequence


def test_engine_killed_mid_request(server: Server) -> None:
    before = server.status()["engine"]
    stream = iter(long_stream(server))  # type: ignore[call-overload]
    next(stream)
    os.kill(before["pid"], signal.SIGKILL)
    with pytest.raises(openai.APIError) as e:
        for _ in stream:
            pass
    assert "engine" in str(e.value.message)
    assert wait_until(lambda: server.status()["engine"]["state"] == "ready", timeout=15)
    after = server.status()["engine"]
    assert after["pid"] != before["pid"] and after["restarts"] == before["restarts"] + 1
    assert not pid_alive(before["pid"])
    r = oai(server).completions.create(model=MODEL, prompt="alive", temperature=0)
    assert r.choices[0].text == "alive"
    text = server.http.get("/metrics").text
    assert f"strata_engine_restarts_total {after['restarts']:.1f}" in text


def test_engine_crash_non_stream_is_500(server: Server) -> None:
    before = server.status()["engine"]["restarts"]
    with pytest.raises(openai.InternalServerError) as e:
        oai(server).completions.create(model=MODEL, prompt="boom #crash# boom", temperature=0)
    assert "exited" in str(e.value)
    assert wait_until(lambda: server.status()["engine"]["state"] == "ready", timeout=15)
    assert server.status()["engine"]["restarts"] == before + 1
    r = oai(server).completions.create(model=MODEL, prompt="fine", temperature=0)
    assert r.choices[0].text == "fine"


def test_engine_stalled_watchdog(server: Server) -> None:
    before = server.status()["engine"]
    t = time.monotonic()
    chunks = []
    with pytest.raises(openai.APIError) as e:
        for c in long_stream(server, "slow #stall# slow"):  # type: ignore[attr-defined]
            chunks.append(c)
    took = time.monotonic() - t
    assert chunks and "silent" in str(e.value.message)
    assert took < 8, took  # engine_silence_s is 1
    assert wait_until(lambda: server.status()["engine"]["state"] == "ready", timeout=15)
    assert server.status()["engine"]["restarts"] == before["restarts"] + 1
    assert not pid_alive(before["pid"])
    r = oai(server).completions.create(model=MODEL, prompt="next", temperature=0)
    assert r.choices[0].text == "next"


def test_queue_full_429_with_retry_after(server: Server) -> None:
    body = {"model": MODEL, "prompt": "x" * 2000, "stream": True, "temperature": 0}
    with httpx.Client(base_url=server.url, timeout=10) as h:
        opened = [h.stream("POST", "/v1/completions", json=body) for _ in range(4)]
        responses = [cm.__enter__() for cm in opened]  # 2 running + 2 waiting
        try:
            assert all(r.status_code == 200 for r in responses)
            assert wait_until(lambda: server.status()["slots"]["waiting"] == 2)
            r = h.post("/v1/completions", json=body)
            assert r.status_code == 429
            assert r.json()["error"]["type"] == "rate_limit_error"
            assert int(r.headers["retry-after"]) >= 1
            # the Anthropic route shares the queue; its 429 has Anthropic's shape
            m = h.post(
                "/v1/messages",
                json={"max_tokens": 8, "messages": [{"role": "user", "content": "x"}]},
            )
            assert m.status_code == 429 and int(m.headers["retry-after"]) >= 1
            assert m.json()["type"] == "error"
            assert m.json()["error"]["type"] == "rate_limit_error"
        finally:
            for cm in opened:
                cm.__exit__(None, None, None)
    assert wait_until(lambda: idle(server), timeout=3)


@pytest.fixture(scope="module")
def one_slot() -> Iterator[Server]:
    s = Server(parallel=1, max_queue=64, fake_step_ms=10, request_timeout_s=1.5)
    yield s
    s.stop()


def test_200_client_timeouts_then_prompt_answer(one_slot: Server) -> None:
    c = oai(one_slot, timeout=0.01)
    for _ in range(200):
        with pytest.raises(openai.APITimeoutError):
            c.completions.create(model=MODEL, prompt="y" * 500, temperature=0)
    t = time.monotonic()
    r = oai(one_slot, timeout=10).completions.create(model=MODEL, prompt="quick", temperature=0)
    assert r.choices[0].text == "quick"
    assert time.monotonic() - t < 5.0
    assert wait_until(lambda: idle(one_slot), timeout=3)


def test_deadline(one_slot: Server) -> None:
    with pytest.raises(openai.APIStatusError) as e:
        oai(one_slot).completions.create(model=MODEL, prompt="z" * 1000, temperature=0)
    assert e.value.status_code == 504
    with pytest.raises(openai.APIError) as e2:
        for _ in long_stream(one_slot, "z" * 1000):  # type: ignore[attr-defined]
            pass
    assert "deadline" in str(e2.value.message)
    assert wait_until(lambda: idle(one_slot), timeout=3)
    # both count as timeouts, streamed or not
    m = one_slot.http.get("/metrics").text
    assert 'strata_requests_total{endpoint="completions",outcome="timeout"} 2.0' in m, m


def test_shutdown_drains() -> None:
    s = Server(parallel=1, fake_step_ms=10, drain_timeout_s=20)
    engine_pid = s.status()["engine"]["pid"]
    text: list[str] = []

    def consume() -> None:
        stream = oai(s).completions.create(
            model=MODEL, prompt="d" * 150, temperature=0, stream=True
        )
        text.extend(c.choices[0].text for c in stream)

    t = threading.Thread(target=consume)
    t.start()
    assert wait_until(lambda: s.status()["slots"]["running"] == 1)
    s.proc.send_signal(signal.SIGTERM)
    r = s.wait(lambda r: r.status_code == 503)  # draining: health says so
    assert "shutting down" in r.json()["error"]["message"]
    refused = s.http.post("/v1/completions", json={"model": MODEL, "prompt": "new"})
    assert refused.status_code == 503
    t.join(20)
    assert "".join(text) == "d" * 150  # the running request finished
    s.proc.wait(20)
    assert wait_until(lambda: not pid_alive(engine_pid), timeout=5)
    s.stop()


def test_shutdown_drain_timeout_ends_streams() -> None:
    s = Server(parallel=1, fake_step_ms=10, drain_timeout_s=0.5)
    stream = iter(long_stream(s))  # type: ignore[call-overload]
    next(stream)
    t = time.monotonic()
    s.proc.send_signal(signal.SIGTERM)
    with pytest.raises(openai.APIError) as e:
        for _ in stream:
            pass
    assert "shutting down" in str(e.value.message)
    s.proc.wait(15)
    assert time.monotonic() - t < 10
    s.stop()


def test_prompt_chunks_extend_the_silence_allowance() -> None:
    # 6 chunks of 4 tokens at 0.3 s each: 1.8 s of prefill, longer than engine_silence_s,
    # yet each chunk's progress report keeps the watchdog quiet
    s = Server(parallel=1, fake_step_ms=300, prefill_chunk=4, engine_silence_s=1.0)
    try:
        r = oai(s).completions.create(model=MODEL, prompt="a" * 24, temperature=0, max_tokens=2)
        assert r.choices[0].text == "aa"
        assert s.status()["engine"]["restarts"] == 0
    finally:
        s.stop()


def test_stream_n_choices_interleave(server: Server) -> None:
    stream = oai(server).completions.create(
        model=MODEL, prompt="abcdef", n=2, temperature=0, stream=True
    )
    texts = {0: "", 1: ""}
    finishes = {}
    for c in stream:
        for ch in c.choices:
            texts[ch.index] += ch.text
            if ch.finish_reason:
                finishes[ch.index] = ch.finish_reason
    assert texts == {0: "abcdef", 1: "abcdef"} and finishes == {0: "stop", 1: "stop"}
