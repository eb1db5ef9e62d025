"""Speculation through the server: the drafts a request was offered and kept come back in its
usage, in the /metrics totals (Prometheus and JSON), in the acceptance histogram, and the current
window per slot in /v1/status; `"speculative": false` turns it off per request, with the same
greedy text. On the fake engine (its greedy output echoes the prompt: the n-gram drafter's case)
and on the shipped trained default with its draft model."""

from __future__ import annotations

import time
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from server_harness import Server

PROMPT = "say: the quick brown fox jumps over the lazy dog, the quick brown fox jumps"


def complete(srv: Server, prompt: str, n: int, **kw: Any) -> dict[str, Any]:
    model = srv.http.get("/v1/models").json()["data"][0]["id"]
    body = {"model": model, "prompt": prompt, "max_tokens": n, "temperature": 0, **kw}
    r = srv.http.post("/v1/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


def samples(srv: Server) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for fam in text_string_to_metric_families(srv.http.get("/metrics").text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def stats_settled(
    srv: Server, offered: int
) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """/metrics once the engine's counters have caught up with the finished requests."""
    deadline = time.monotonic() + 10
    while True:
        m = samples(srv)
        if m.get(("strata_spec_drafts_offered_total", ()), -1) == offered:
            return m
        assert time.monotonic() < deadline, m
        time.sleep(0.05)


def check_reported(srv: Server, usage: dict[str, Any]) -> None:
    off, acc = usage["drafts_offered"], usage["drafts_accepted"]
    assert 0 < acc <= off
    m = stats_settled(srv, off)
    assert m[("strata_spec_drafts_accepted_total", ())] == acc
    windows = {
        int(dict(lab)["accepted"]): v
        for (name, lab), v in m.items()
        if name == "strata_spec_windows_total"
    }
    assert sum(windows.values()) > 0 and sum(a * n for a, n in windows.items()) == acc
    j = srv.http.get("/metrics", headers={"accept": "application/json"}).json()
    assert j["totals"]["drafts_offered"] == off and j["totals"]["drafts_accepted"] == acc
    assert j["requests"][-1]["drafts_accepted"] == acc
    spec = srv.status()["speculation"]
    assert spec["drafts_accepted"] == acc and sum(spec["acceptance_histogram"]) > 0
    # the window each slot chose last
    assert spec["k"] and all(0 <= k <= spec["k_max"] for k in spec["k"].values())


def test_fake_engine_ngram_drafts_are_reported() -> None:
    srv = Server(spec="ngram", parallel=2, n_ctx=1024, spec_adaptive=False)
    try:
        plain = complete(srv, PROMPT, 60, speculative=False)
        assert "drafts_offered" not in plain["usage"]
        got = complete(srv, PROMPT, 60)
        assert got["choices"][0]["text"] == plain["choices"][0]["text"]
        check_reported(srv, got["usage"])
    finally:
        srv.stop()


def test_bad_spec_settings_fail_the_load_with_the_reason() -> None:
    srv = Server(wait_ready=False, spec="mtp")
    try:
        r = srv.wait(lambda r: r.status_code == 503 and "MTP" in r.text, timeout=30)
        assert "this model carries no MTP layer" in r.text
    finally:
        srv.stop()


@pytest.mark.parametrize("kind", ["draft", "ngram"])
def test_trained_default_with_speculation_matches_without(kind: str) -> None:
    srv = Server(engine="llm", spec=kind, parallel=1, n_ctx=512, threads=1, spec_adaptive=False)
    try:
        src = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n\n\n"
        plain = complete(srv, src, 48, speculative=False)
        got = complete(srv, src, 48)
        assert got["choices"][0]["text"] == plain["choices"][0]["text"]
        check_reported(srv, got["usage"])
    finally:
        srv.stop()
