"""The Anthropic Messages API against a real uvicorn serving the fake engine, through the
official `anthropic` client (and raw HTTP for the exact event sequence and error bodies).

Oracle: the fake model's documented rule (strata.engine.backend.FakeBackend): greedy decoding
echoes the last run of plain text of the prompt (for a chat, the last message's content), one
toy token per byte, then ends with EOS. The toy chat template is `<|role|>content<|end|>` per
message, then `<|assistant|>` (strata.server.tokenizing.ToyTokenizer).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from server_harness import Server

MODEL = "strata-fake"


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    s = Server(parallel=2, n_ctx=1024)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(server: Server) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(base_url=server.url, api_key="none", max_retries=0) as c:
        yield c


def user(text: str) -> list[Any]:
    return [{"role": "user", "content": text}]


GREEDY = {"temperature": 0}  # Anthropic's default is 1.0; the echo is the greedy answer


def test_create_echo_usage_and_stop_reason(client: anthropic.Anthropic) -> None:
    r = client.messages.create(
        model=MODEL, max_tokens=64, messages=user("hello world"), extra_body=GREEDY
    )
    assert r.type == "message" and r.role == "assistant" and r.model == MODEL
    assert r.id.startswith("msg_")
    assert [(b.type, b.text) for b in r.content] == [("text", "hello world")]  # type: ignore[union-attr]
    assert r.stop_reason == "end_turn" and r.stop_sequence is None
    # <|user|> + 11 bytes + <|end|> + <|assistant|>; 11 bytes and the EOS out (counted, as
    # llama-server counts it)
    u = r.usage  # the prompt's tokens read anew and from the prefix cache (llama-server's)
    assert (u.input_tokens + (u.cache_read_input_tokens or 0), u.output_tokens) == (14, 12)


def test_max_tokens_and_stop_sequences(client: anthropic.Anthropic) -> None:
    r = client.messages.create(
        model=MODEL, max_tokens=3, messages=user("hello world"), extra_body=GREEDY
    )
    assert r.content[0].text == "hel" and r.stop_reason == "max_tokens"  # type: ignore[union-attr]
    assert r.usage.output_tokens == 3
    r = client.messages.create(
        model=MODEL,
        max_tokens=64,
        messages=user("hello world"),
        stop_sequences=["xyz", "wor"],
        extra_body=GREEDY,
    )
    assert r.content[0].text == "hello " and r.stop_reason == "stop_sequence"  # type: ignore[union-attr]
    assert r.stop_sequence == "wor"


def test_system_and_conversation_reach_the_template(client: anthropic.Anthropic) -> None:
    sys_text = "be brief"
    msgs = [
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": [{"type": "text", "text": "ok"}]},
        {
            "role": "user",
            "content": [{"type": "text", "text": "sec"}, {"type": "text", "text": "ond"}],
        },
    ]
    n = client.messages.count_tokens(model=MODEL, messages=msgs, system=sys_text).input_tokens  # type: ignore[arg-type]
    # three toy markers + content per message (system included), then <|assistant|>
    assert n == (2 + len(sys_text)) + (2 + 5) + (2 + 2) + (2 + 6) + 1
    r = client.messages.create(
        model=MODEL,
        max_tokens=32,
        messages=msgs,
        system=[{"type": "text", "text": sys_text}],
        extra_body=GREEDY,
    )  # type: ignore[arg-type]
    assert r.content[0].text == "second"  # type: ignore[union-attr]
    assert r.usage.input_tokens + (r.usage.cache_read_input_tokens or 0) == n


def test_stream_with_the_client(client: anthropic.Anthropic) -> None:
    with client.messages.stream(
        model=MODEL, max_tokens=64, messages=user("streamed text"), extra_body=GREEDY
    ) as s:
        pieces = list(s.text_stream)
        final = s.get_final_message()
    assert "".join(pieces) == "streamed text" and len(pieces) > 1
    assert final.content[0].text == "streamed text"  # type: ignore[union-attr]
    assert final.stop_reason == "end_turn" and final.usage.output_tokens == 14


def raw_events(server: Server, body: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    out = []
    with server.http.stream("POST", "/v1/messages", json=body) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        name = None
        for line in r.iter_lines():
            if line.startswith("event: "):
                name = line[len("event: ") :]
            elif line.startswith("data: "):
                data = json.loads(line[len("data: ") :])
                assert data["type"] == name
                out.append((name, data))
    return out


def test_stream_event_sequence(server: Server) -> None:
    ev = raw_events(
        server, {"max_tokens": 5, "messages": user("hello world"), "stream": True, **GREEDY}
    )
    names = [n for n, _ in ev]
    assert names[:3] == ["message_start", "ping", "content_block_start"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(names[3:-3]) == {"content_block_delta"}
    start = ev[0][1]["message"]
    assert start["content"] == [] and start["stop_reason"] is None
    assert start["usage"] == {"input_tokens": 14, "output_tokens": 0}
    assert ev[2][1] == {
        "type": "content_block_start",
        "index": 0,
        "content_block": {"type": "text", "text": ""},
    }
    text = "".join(d["delta"]["text"] for n, d in ev if n == "content_block_delta")
    assert text == "hello"
    assert all(d["delta"]["type"] == "text_delta" for n, d in ev if n == "content_block_delta")
    assert ev[-2][1]["delta"] == {"stop_reason": "max_tokens", "stop_sequence": None}
    u = ev[-2][1]["usage"]  # cumulative: the prompt as read anew and from the prefix cache
    assert u["output_tokens"] == 5 and u["input_tokens"] + u["cache_read_input_tokens"] == 14


def error_of(r: httpx.Response) -> dict[str, Any]:
    body = r.json()
    assert body["type"] == "error" and set(body["error"]) == {"type", "message"}
    out: dict[str, Any] = body["error"]
    return out


@pytest.mark.parametrize(
    ("body", "status", "kind", "names"),
    [
        (
            {"max_tokens": 8, "messages": user("x"), "frobnicate": 1},
            400,
            "invalid_request_error",
            "frobnicate",
        ),
        ({"messages": user("x")}, 400, "invalid_request_error", "max_tokens"),
        ({"max_tokens": 0, "messages": user("x")}, 400, "invalid_request_error", "max_tokens"),
        ({"max_tokens": 8, "messages": []}, 400, "invalid_request_error", "messages"),
        (
            {
                "max_tokens": 8,
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {
                                "type": "image",
                                "source": {"type": "base64", "media_type": "image/png", "data": ""},
                            }
                        ],
                    }
                ],
            },
            400,
            "invalid_request_error",
            "image",
        ),
        (
            {"max_tokens": 8, "messages": [{"role": "system", "content": "x"}]},
            400,
            "invalid_request_error",
            "role",
        ),
        # a system block names its type, and only text is one
        (
            {"max_tokens": 8, "messages": user("x"), "system": [{"text": "be nice"}]},
            400,
            "invalid_request_error",
            "type",
        ),
        (
            {
                "max_tokens": 8,
                "messages": user("x"),
                "system": [{"type": "thinking", "thinking": "x", "signature": "s"}],
            },
            400,
            "invalid_request_error",
            "system[0]: thinking blocks are not supported",
        ),
        (
            {"max_tokens": 8, "messages": user("x"), "model": "other"},
            404,
            "not_found_error",
            "other",
        ),
        (
            {
                "max_tokens": 8,
                "messages": user("x"),
                "tools": [{"type": "bash_20250124", "name": "bash"}],
            },
            400,
            "invalid_request_error",
            "server tools",
        ),
        (
            {"max_tokens": 8, "messages": user("x"), "thinking": {"type": "enabled"}},
            400,
            "invalid_request_error",
            "budget_tokens",
        ),
        (
            {"max_tokens": 8, "messages": [*user("x"), {"role": "assistant", "content": "pre"}]},
            400,
            "invalid_request_error",
            "prefill",
        ),
        # errors found on the translated request name this request's fields: the message's
        # own index (a system message came first), a tool's name, the output format
        (
            {"system": "be nice", "messages": user(""), "max_tokens": 5},
            400,
            "invalid_request_error",
            "messages[0].content: must not be empty",
        ),
        (
            {"messages": user("hi"), "max_tokens": 5, "tools": [{"name": "", "input_schema": {}}]},
            400,
            "invalid_request_error",
            "tools[0].name:",
        ),
        (
            {
                "messages": user("hi"),
                "max_tokens": 5,
                "output_config": {"format": {"type": "json_schema", "schema": {"type": 5}}},
            },
            400,
            "invalid_request_error",
            "output_config.format:",
        ),
        # OpenAI's fields are not this API's: unknown, not ignored or refused in its words
        (
            {"max_tokens": 8, "messages": user("x"), "store": True},
            400,
            "invalid_request_error",
            "store: unknown field",
        ),
        (
            {"max_tokens": 8, "messages": user("x"), "functions": []},
            400,
            "invalid_request_error",
            "functions: unknown field",
        ),
    ],
)
def test_errors_in_anthropic_shape(
    server: Server, body: dict[str, Any], status: int, kind: str, names: str
) -> None:
    r = server.http.post("/v1/messages", json=body)
    assert r.status_code == status
    e = error_of(r)
    assert e["type"] == kind and names in e["message"]


def test_client_raises_typed_errors(client: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.BadRequestError) as bad:
        client.messages.create(
            model=MODEL, max_tokens=8, messages=user("x"), extra_body={"nope": 1}
        )
    assert "nope" in bad.value.message
    with pytest.raises(anthropic.NotFoundError):
        client.messages.create(
            model="elsewhere", max_tokens=8, messages=user("x"), extra_body=GREEDY
        )


def test_other_errors_keep_openai_shape(server: Server) -> None:
    r = server.http.post("/v1/messages/nothing", json={})
    assert r.status_code == 404 and error_of(r)["type"] == "not_found_error"
    r = server.http.post("/v1/chat/completions", json={"messages": 3})
    assert r.status_code == 400 and "type" not in r.json()  # OpenAI's {"error": {...}}


def test_metrics_count_messages(server: Server, client: anthropic.Anthropic) -> None:
    def ok() -> float:
        text = server.http.get("/metrics").text
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                if s.name == "strata_requests_total" and s.labels == {
                    "endpoint": "messages",
                    "outcome": "ok",
                }:
                    return s.value
        return 0.0

    before = ok()
    client.messages.create(model=MODEL, max_tokens=4, messages=user("abc"), extra_body=GREEDY)
    with client.messages.stream(
        model=MODEL, max_tokens=4, messages=user("abc"), extra_body=GREEDY
    ) as s:
        s.until_done()
    assert ok() == before + 2


def test_api_key_bearer_and_x_api_key() -> None:
    s = Server(api_key="sekrit")
    try:
        body = {"max_tokens": 4, "messages": user("hi"), **GREEDY}
        r = s.http.post("/v1/messages", json=body)
        assert r.status_code == 401 and error_of(r)["type"] == "authentication_error"
        r = s.http.post("/v1/messages", json=body, headers={"x-api-key": "wrong"})
        assert r.status_code == 401
        r = s.http.post("/v1/messages", json=body, headers={"x-api-key": "sekrit"})
        assert r.status_code == 200 and r.json()["content"][0]["text"] == "hi"
        with anthropic.Anthropic(base_url=s.url, api_key="sekrit", max_retries=0) as c:
            assert c.messages.create(model=MODEL, max_tokens=4, messages=user("hi")).content
        with (
            anthropic.Anthropic(base_url=s.url, api_key="bad", max_retries=0) as c,
            pytest.raises(anthropic.AuthenticationError),
        ):
            c.messages.create(model=MODEL, max_tokens=4, messages=user("hi"))
        # the web page is served without the key (it holds no data); its API calls need it
        assert s.http.get("/").status_code == 200
        assert s.http.get("/v1/status").status_code == 401
    finally:
        s.stop()


def test_engine_crash_mid_stream_is_an_error_event() -> None:
    s = Server(test_faults=1, fake_step_ms=10)
    try:
        body = {"max_tokens": 64, "messages": user("boom #crash# boom"), "stream": True, **GREEDY}
        names, last = [], None
        with s.http.stream("POST", "/v1/messages", json=body) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if line.startswith("event: "):
                    names.append(line[len("event: ") :])
                elif line.startswith("data: "):
                    last = json.loads(line[len("data: ") :])
        assert names[0] == "message_start" and names[-1] == "error"
        assert "message_stop" not in names
        assert last is not None and last["type"] == "error"
        assert last["error"]["type"] == "api_error" and last["error"]["message"]
        # the server keeps serving (the engine restarts)
        s.wait(lambda r: r.status_code == 200)
        r2 = s.http.post("/v1/messages", json={"max_tokens": 8, "messages": user("ok"), **GREEDY})
        assert r2.status_code == 200 and r2.json()["content"][0]["text"] == "ok"
    finally:
        s.stop()


def test_stop_reason_of_a_choice_cut_off_is_max_tokens_calls_or_not() -> None:
    """A choice the token limit cut off stops for `max_tokens`, even after a tool call (it
    said `tool_use`; the OpenAI route says `length` for the same output)."""
    from strata.server.anthropic_api import _stop
    from strata.server.generate import Delta

    cut = Delta(0, "", finish="length")
    assert _stop(cut, called=True)["stop_reason"] == "max_tokens"
    assert _stop(Delta(0, "", finish="stop"), called=True)["stop_reason"] == "tool_use"
    done = Delta(0, "", finish="stop", stop="END")
    assert _stop(done, called=False) == {"stop_reason": "stop_sequence", "stop_sequence": "END"}
    assert _stop(Delta(0, "", finish="stop"), called=False)["stop_reason"] == "end_turn"


def test_omitted_thinking_display_and_timeout_type() -> None:
    """`thinking.display: "omitted"`: thinking blocks keep their place with an empty text (no
    deltas); a deadline (504) is Anthropic's timeout_error."""
    from strata.server.anthropic_api import Blocks
    from strata.server.openai_types import APIError

    for omit, want in ((False, "plan"), (True, "")):
        b = Blocks(omit_thinking=omit)
        events = b.feed(("reasoning", "plan")) + b.feed(("content", "hi")) + b.close()
        assert [c["type"] for c in b.content] == ["thinking", "text"]
        assert b.content[0]["thinking"] == want and b.content[1]["text"] == "hi"
        assert (b"thinking_delta" in b"".join(events)) is not omit
    assert APIError(504, "late").anthropic_body()["error"]["type"] == "timeout_error"


def test_prefix_cache_reads_are_reported(client: anthropic.Anthropic) -> None:
    """A repeated conversation reads its prompt from the prefix cache: Anthropic's
    `cache_read_input_tokens` says how much, `input_tokens` the rest (as llama-server)."""
    msgs = user("a conversation worth caching, long enough to reuse")
    n = client.messages.count_tokens(model=MODEL, messages=msgs).input_tokens  # type: ignore[arg-type]
    for _ in range(2):
        r = client.messages.create(model=MODEL, max_tokens=4, messages=msgs, extra_body=GREEDY)
    assert r.usage.cache_read_input_tokens and r.usage.cache_read_input_tokens >= n // 2
    assert r.usage.input_tokens + r.usage.cache_read_input_tokens == n
    with client.messages.stream(model=MODEL, max_tokens=4, messages=msgs, extra_body=GREEDY) as st:
        final = st.get_final_message()
    assert final.usage.input_tokens + (final.usage.cache_read_input_tokens or 0) == n
