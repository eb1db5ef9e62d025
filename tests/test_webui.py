"""The web page at `/` in a real headless Chromium (Debian's package; scripts/test installs
it), on the embedded default model (random weights: the answer is noise, but greedy and so
reproducible): load the page, type a message, see the answer stream in, see the monitor
update (request counters, the recent-requests table, the hit-rate series and the per-layer
heat map), with screenshots kept under $STRATA_TEST_ARTIFACTS (default
target/test-artifacts/webui). `STRATA_README_SHOT=1` also writes docs/img/webui.png, the
README's screenshot.

Oracles: the streamed answer the page shows equals the server's own non-streamed greedy
answer to the same conversation over the API; the monitor's numbers equal /metrics' JSON view.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from cdp import Browser, find_browser
from server_harness import Server

ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = Path(os.environ.get("STRATA_TEST_ARTIFACTS", ROOT / "target" / "test-artifacts"))
MESSAGE = "Tell me about experts"
MAX_TOKENS = 24


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    exe = find_browser()
    if exe is None:
        pytest.skip(
            "no chromium on PATH: scripts/test installs Debian's `chromium` with apt-get; "
            "that failed or this machine has no apt"
        )
    b = Browser(exe)
    yield b
    b.close()


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    s = Server(engine="llm", parallel=2, n_ctx=1024)  # the embedded default model
    yield s
    s.stop()


def test_static_page_is_self_contained(server: Server) -> None:
    r = server.http.get("/")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert "connect-src 'self'" in r.headers["content-security-policy"]
    page = r.text
    for ref in ("http://", "https://", "//cdn", "<script src", "<link "):
        assert ref not in page, ref


def test_chat_streams_and_monitor_updates(browser: Browser, server: Server) -> None:
    out = ARTIFACTS / "webui"
    browser.goto(server.url + "/")
    browser.wait("document.getElementById('state').textContent === 'ready'")
    browser.wait("document.getElementById('model').textContent.startsWith('strata-default')")
    browser.wait("document.getElementById('m_req').textContent === '0 (0)'")
    browser.screenshot(out / "01-loaded.png")

    # type the message like a user: focus, insert text, press Enter
    browser.eval(
        f"document.getElementById('max_tokens').value = '{MAX_TOKENS}';"
        "document.getElementById('temperature').value = '0';"
        "document.getElementById('input').focus()"
    )
    browser.call("Input.insertText", text=MESSAGE)
    for kind in ("keyDown", "keyUp"):
        browser.call(
            "Input.dispatchKeyEvent",
            type=kind,
            key="Enter",
            code="Enter",
            windowsVirtualKeyCode=13,
            **({"text": "\r"} if kind == "keyDown" else {}),
        )
    done = "document.querySelector('.msg.assistant[data-state=done]')"
    browser.wait(done + " !== null", timeout=60)
    shown = browser.eval(done + ".querySelector('.content').textContent")
    pieces = int(browser.eval(done + ".dataset.pieces || 0"))
    meta = browser.eval(done + ".querySelector('.meta').textContent")
    assert browser.eval("document.querySelector('.msg.user .content').textContent") == MESSAGE
    assert browser.eval("document.querySelector('.msg.error')") is None

    # the monitor: one request, its tokens, a recent-requests row, a hit-rate series point,
    # and a heat map drawn from routing counts that moved
    browser.wait("document.getElementById('m_req').textContent === '1 (0)'", timeout=15)
    browser.wait("document.getElementById('recent').tBodies[0].rows.length === 1")
    m = server.http.get("/metrics", headers={"accept": "application/json"}).json()
    assert m["totals"]["requests"] == 1
    tok = browser.wait(
        f"(t => t.startsWith('{m['totals']['output_tokens']} ') && t)"
        "(document.getElementById('m_tok').textContent)"
    )
    assert tok == f"{m['totals']['output_tokens']} ({m['totals']['prompt_tokens']})"
    assert browser.eval("hist.ram.some(v => v !== null)")  # the RAM tier's series has points
    status = server.status()
    routed = [v for row in status["tiers"]["heat"]["routing"] for v in row]
    assert max(routed) == 255  # every layer's hottest expert
    # the page draws a layer's hottest expert (255) with red 255; nothing else is that red here
    # (RAM-resident dots are white, but the default ram_mode mmap keeps no expert resident)
    browser.wait(
        "(() => { const c = document.getElementById('c_heat');"
        " const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;"
        " let hot = 0; for (let i = 0; i < d.length; i += 4) if (d[i] === 255) hot++;"
        " return hot > 0; })()",
        timeout=15,
    )
    shot = browser.screenshot(out / "02-answered.png")
    if os.environ.get("STRATA_README_SHOT") == "1":
        shutil.copyfile(shot, ROOT / "docs" / "img" / "webui.png")
    assert browser.console_errors() == []

    # oracle: the same conversation, greedy, over the API (not streamed)
    r = httpx.post(
        server.url + "/v1/chat/completions",
        json={
            "model": "strata-default",
            "messages": [{"role": "user", "content": MESSAGE}],
            "max_tokens": MAX_TOKENS,
            "temperature": 0,
        },
        timeout=60,
    )
    want = r.json()["choices"][0]
    assert shown == want["message"]["content"]
    n = r.json()["usage"]["completion_tokens"]
    assert f"{n} tokens" in meta and f"finish: {want['finish_reason']}" in meta
    # streamed: the text came in pieces (about one per token), not in one
    assert n > 1 and pieces > 1


@pytest.fixture(scope="module")
def fake_server() -> Iterator[Server]:
    s = Server(parallel=1, n_ctx=4096)  # the fake engine echoes the last message
    yield s
    s.stop()


def test_reasoning_folded_and_tool_calls_shown(browser: Browser, fake_server: Server) -> None:
    """The fake model's greedy answer is the message itself (its documented rule), so a
    message in the model's thinking and tool-call formats comes back as those parts."""
    args = {"city": "Paris", "days": 3}
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "parameters": {
                    "type": "object",
                    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                },
            },
        }
    ]
    call = json.dumps({"name": "get_weather", "arguments": args})
    message = f"<think>weigh it</think>Checking. <tool_call>\n{call}\n</tool_call>"
    browser.goto(fake_server.url + "/")
    browser.wait("document.getElementById('state').textContent === 'ready'")
    browser.eval(
        "document.getElementById('max_tokens').value = '400';"
        "document.getElementById('temperature').value = '0';"
        "document.getElementById('usetools').click();"
        f"document.getElementById('tools').value = {json.dumps(json.dumps(tools))};"
        f"document.getElementById('input').value = {json.dumps(message)};"
        "document.getElementById('send').click()"
    )
    done = "document.querySelector('.msg.assistant[data-state=done]')"
    browser.wait(done + " !== null", timeout=30)
    folded = browser.eval(done + ".querySelector('details.reasoning')")
    assert folded is not None
    assert browser.eval(done + ".querySelector('details.reasoning').open") is False
    assert browser.eval(done + ".querySelector('details.reasoning .text').textContent") == (
        "weigh it"
    )
    assert browser.eval(done + ".querySelector('.content').textContent") == "Checking."
    tool = browser.eval(done + ".querySelector('.tool').textContent")
    head, _, shown_args = tool.partition("\n")
    assert head == "tool call get_weather" and json.loads(shown_args) == args
    assert "finish: tool_calls" in browser.eval(done + ".querySelector('.meta').textContent")
    browser.eval(done + ".querySelector('details.reasoning').open = true")
    browser.screenshot(ARTIFACTS / "webui" / "03-reasoning-and-tool-call.png")
    assert browser.console_errors() == []
