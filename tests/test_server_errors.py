"""Bad input: each is a 4xx with a clear message and the right `param`, and the server keeps
serving. Also access control (API key, loopback Host/Origin), body limit, and 429."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from server_harness import Server

MODEL = "strata-fake"
USER = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    s = Server(parallel=2, n_ctx=512, max_body_bytes=4096, max_top_logprobs=5)
    yield s
    s.stop()


def chat(**kw: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": USER, **kw}


def comp(**kw: Any) -> dict[str, Any]:
    return {"model": MODEL, "prompt": "hi", **kw}


CHAT, COMP = "/v1/chat/completions", "/v1/completions"

# (path, body, status, param, words in the message)
JSON_CASES: list[tuple[str, Any, int, str | None, str]] = [
    (CHAT, [1, 2], 400, None, "JSON object"),
    (CHAT, "text", 400, None, "JSON object"),
    (CHAT, {"model": MODEL}, 400, None, "messages"),
    (CHAT, chat(messages=[]), 400, "messages", "non-empty"),
    (CHAT, chat(messages="hi"), 400, "messages", "array"),
    (CHAT, chat(messages=[{"content": "x"}]), 400, "messages[0]", "role"),
    (CHAT, chat(messages=[{"role": "wizard", "content": "x"}]), 400, "messages[0].role", "one of"),
    (CHAT, chat(messages=[{"role": 3, "content": "x"}]), 400, "messages[0].role", "str"),
    (CHAT, chat(messages=[{"role": "user"}]), 400, "messages[0].content", "required"),
    (CHAT, chat(messages=[{"role": "user", "content": ""}]), 400, "messages[0].content", "empty"),
    (CHAT, chat(messages=[{"role": "user", "content": 5}]), 400, "messages[0].content", "Expected"),
    (
        CHAT,
        chat(messages=[{"role": "user", "content": [{"type": "image_url"}]}]),
        400,
        "messages[0].content",
        "text",
    ),
    (CHAT, chat(model="gpt-9"), 404, "model", "not found"),
    (COMP, comp(model="gpt-9"), 404, "model", "not found"),
    (CHAT, chat(messages=[{"role": "user", "content": "x" * 300}]), 400, "messages", "context"),
    (
        CHAT,
        chat(messages=[{"role": "user", "content": "x" * 300}], stream=True),
        400,
        "messages",
        "context",
    ),
    (COMP, comp(prompt="y" * 256, stream=True), 400, "prompt", "context"),
    (COMP, comp(prompt=""), 400, "prompt", "empty"),
    (COMP, comp(prompt=[]), 400, "prompt", "empty"),
    (COMP, comp(prompt=[1, 2, 100000]), 400, "prompt", "vocabulary"),
    (COMP, comp(prompt=[-1]), 400, "prompt", "vocabulary"),
    (COMP, comp(prompt=[[1], [2, 70000]]), 400, "prompt", "vocabulary"),
    (COMP, comp(prompt=None), 400, "prompt", "required"),
    (COMP, comp(prompt=[1.5]), 400, "prompt", "token ids"),
    (COMP, comp(prompt={"a": 1}), 400, "prompt", "token ids"),
    (COMP, comp(prompt=5), 400, "prompt", "token ids"),
    # more sequences than the slots and the queue hold: a 429 could never be retried past
    (COMP, comp(prompt=["a"] * 16, n=5), 400, "n", "at most 66"),
    (COMP, {"model": MODEL}, 400, None, "prompt"),
    (CHAT, chat(max_tokens=0), 400, "max_tokens", "at least 1"),
    (CHAT, chat(max_tokens=-5), 400, "max_tokens", "at least 1"),
    (CHAT, chat(max_completion_tokens=0), 400, "max_completion_tokens", "at least 1"),
    (COMP, comp(max_tokens="ten"), 400, "max_tokens", "int"),
    (CHAT, chat(temperature=-0.1), 400, "temperature", "[0, 100]"),
    (CHAT, chat(temperature="hot"), 400, "temperature", "float"),
    (CHAT, chat(top_p=0), 400, "top_p", "(0, 1]"),
    (CHAT, chat(top_p=1.5), 400, "top_p", "(0, 1]"),
    (CHAT, chat(top_k=-2), 400, "top_k", "in -1.."),
    # past 32 bits: it leaked an engine slot (the frame could not be encoded) or crashed the
    # engine (a deque's maxlen)
    (CHAT, chat(top_k=2**70), 400, "top_k", "in -1..2147483647"),
    (CHAT, chat(repeat_last_n=2**63), 400, "repeat_last_n", "in -1..2147483647"),
    (CHAT, chat(min_p=-0.1), 400, "min_p", "[0, 1]"),
    (CHAT, chat(min_p=2), 400, "min_p", "[0, 1]"),
    (CHAT, chat(presence_penalty=3), 400, "presence_penalty", "[-2, 2]"),
    (CHAT, chat(frequency_penalty=-2.5), 400, "frequency_penalty", "[-2, 2]"),
    (CHAT, chat(repetition_penalty=0), 400, "repetition_penalty", "(0, 100]"),
    (CHAT, chat(n=0), 400, "n", "1.."),
    (CHAT, chat(n=1000), 400, "n", "1.."),
    (CHAT, chat(logprobs=True, top_logprobs=6), 400, "top_logprobs", "0..5"),
    (CHAT, chat(top_logprobs=2), 400, "top_logprobs", "requires logprobs"),
    (COMP, comp(logprobs=6), 400, "logprobs", "0..5"),
    (CHAT, chat(stop=[f"s{i}" for i in range(33)]), 400, "stop", "at most 32"),
    (CHAT, chat(stop=["x" * 257]), 400, "stop", "at most 256 characters"),
    (CHAT, chat(stop=[""]), 400, "stop", "non-empty"),
    (CHAT, chat(seed="x"), 400, "seed", "int"),
    (CHAT, chat(stream_options={"include_usage": True}), 400, "stream_options", "stream"),
    (COMP, comp(echo=True), 400, "echo", "not supported"),
    # inner objects are as strict as the top level
    (
        CHAT,
        chat(
            tools=[{"type": "function", "function": {"name": "f", "parameters": {}}}],
            tool_choice={"type": "function", "function": {"name": "f"}, "foo": 1},
        ),
        400,
        "tool_choice.foo",
        "unknown field",
    ),
    (
        CHAT,
        chat(
            response_format={"type": "json_schema", "json_schema": {"name": "x", "strict": "yes"}}
        ),
        400,
        "response_format.json_schema.strict",
        "true or false",
    ),
    (
        CHAT,
        chat(
            messages=[
                *USER,
                {
                    "role": "assistant",
                    "tool_calls": [
                        {"type": "banana", "function": {"name": "f", "arguments": "{}"}}
                    ],
                },
                {"role": "user", "content": "ok"},
            ]
        ),
        400,
        "messages[1].tool_calls[0].type",
        "banana",
    ),
    ("/tokenize", {}, 400, "prompt", "required"),
]


@pytest.mark.parametrize(("path", "body", "status", "param", "words"), JSON_CASES)
def test_bad_json_input(
    server: Server, path: str, body: Any, status: int, param: str | None, words: str
) -> None:
    r = server.http.post(path, json=body)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert words in err["message"], err
    if param is not None:
        assert err["param"] == param, err
    assert err["type"] == ("not_found_error" if status == 404 else "invalid_request_error")


def raw(server: Server, body: bytes, ctype: str = "application/json") -> httpx.Response:
    return server.http.post(CHAT, content=body, headers={"content-type": ctype})


def test_malformed_json(server: Server) -> None:
    r = raw(server, b'{"model": "strata-fake", "messages": [')
    assert r.status_code == 400 and "malformed JSON" in r.json()["error"]["message"]


def test_invalid_utf8(server: Server) -> None:
    r = raw(
        server, b'{"model": "strata-fake", "messages": [{"role": "user", "content": "\xff\xfe"}]}'
    )
    assert r.status_code == 400 and "UTF-8" in r.json()["error"]["message"]


def test_huge_integer_and_lone_surrogate(server: Server) -> None:
    """Both were 500s: an integer past Python's digit limit, a "\\ud800" escape alone."""
    from strata.server.openai_types import APIError, parse_json_object

    with pytest.raises(APIError, match="malformed JSON"):  # past this fixture's body limit
        parse_json_object(b'{"max_tokens": ' + b"1" * 5000 + b"}", "application/json")
    body = b'{"model": "strata-fake", "messages": [{"role": "user", "content": "abc\\ud800"}]}'
    r = raw(server, body)
    assert r.status_code == 400 and "surrogate" in r.json()["error"]["message"], r.text
    assert server.http.post(CHAT, json=chat(max_tokens=2)).status_code == 200


def test_wrong_content_type(server: Server) -> None:
    r = raw(server, json.dumps(chat()).encode(), "text/plain")
    assert r.status_code == 415 and "application/json" in r.json()["error"]["message"]


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity"])
def test_non_finite_temperature(server: Server, value: str) -> None:
    body = json.dumps(chat()).replace('"messages"', f'"temperature": {value}, "messages"')
    r = raw(server, body.encode())
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "temperature"
    assert "finite" in r.json()["error"]["message"]


def test_body_over_limit(server: Server) -> None:
    big = chat(messages=[{"role": "user", "content": "x" * 5000}])
    r = server.http.post(CHAT, json=big)
    assert r.status_code == 413 and "limit" in r.json()["error"]["message"]

    def gen() -> Iterator[bytes]:  # chunked: no Content-Length to check up front
        yield json.dumps(big).encode()

    r = server.http.post(CHAT, content=gen(), headers={"content-type": "application/json"})
    assert r.status_code == 413


def test_openai_client_raises_typed_errors(server: Server) -> None:
    c = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
    with pytest.raises(openai.NotFoundError) as nf:
        c.chat.completions.create(model="nope", messages=USER)  # type: ignore[list-item]
    assert nf.value.body["param"] == "model"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError):
        c.chat.completions.create(model=MODEL, messages=USER, temperature=-1, stream=True)  # type: ignore[list-item]
    # and the server still serves
    r = c.completions.create(model=MODEL, prompt="still here", temperature=0)
    assert r.choices[0].text == "still here"


def test_loopback_only_without_key(server: Server) -> None:
    r = server.http.get("/v1/models", headers={"host": "evil.example:80"})
    assert r.status_code == 403 and r.json()["error"]["type"] == "permission_error"
    r = server.http.get("/v1/models", headers={"origin": "http://evil.example"})
    assert r.status_code == 403
    for host in ("localhost:1234", "127.0.0.1", "[::1]:9"):
        assert server.http.get("/v1/models", headers={"host": host}).status_code == 200
    ok = server.http.get("/v1/models", headers={"origin": "http://localhost:3000"})
    assert ok.status_code == 200


def test_api_key() -> None:
    s = Server(api_key="s3cret")
    try:
        assert s.http.get("/health").status_code == 200  # open
        assert s.http.get("/v1/health").status_code == 200  # llama-server's other name
        r = s.http.get("/v1/models")
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
        for path, body in (("/infill", {}), ("/completion", {}), ("/apply-template", {})):
            assert s.http.post(path, json=body).status_code == 401, path
        assert s.http.get("/props").status_code == 401
        bad = s.http.get("/v1/models", headers={"authorization": "Bearer s3cre"})
        assert bad.status_code == 401
        c = openai.OpenAI(base_url=s.url + "/v1", api_key="s3cret", max_retries=0)
        assert c.models.list().data[0].id == MODEL
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=s.url + "/v1", api_key="wrong", max_retries=0).models.list()
        # with a key, a foreign Host is fine (the key is the protection)
        r = s.http.get("/v1/models", headers={"host": "box.lan", "authorization": "Bearer s3cret"})
        assert r.status_code == 200
    finally:
        s.stop()


def test_health_keeps_a_load_failures_details_behind_the_key(tmp_path: Path) -> None:
    """/health answers without the key: with one set, a failed load says so, not its file's
    path (the details are on /v1/status, which needs the key)."""
    bad = tmp_path / "secret_dir" / "m.gguf"
    bad.parent.mkdir()
    bad.write_bytes(b"GGUF" + b"\0" * 40)
    for key in ("s3cret", ""):
        s = Server(wait_ready=False, engine="llm", model=str(bad), api_key=key)
        try:
            r = s.wait(lambda r: "failed" in r.text)
            assert r.status_code == 503
            assert ("secret_dir" in r.text) is (not key), r.text
            if key:
                st = s.http.get("/v1/status", headers={"authorization": "Bearer s3cret"})
                assert "secret_dir" in st.text
        finally:
            s.stop()


def test_a_whole_answers_logprobs_are_bounded() -> None:
    s = Server(parallel=1, n_ctx=1 << 16)
    try:
        # 4 prompts × 8 choices × 32768 tokens (max_tokens_limit) × 21 entries: past 2^21
        body = comp(prompt=["hi"] * 4, logprobs=20, n=8)
        r = s.http.post(COMP, json=body)
        assert r.status_code == 400 and r.json()["error"]["param"] == "logprobs"
        assert s.http.post(COMP, json={**body, "max_tokens": 8}).status_code == 200
    finally:
        s.stop()


def test_security_refuses_foreign_client_without_key() -> None:
    import asyncio

    from strata.server.security import SecurityMiddleware

    sent: list[dict[str, Any]] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        sent.append({"type": "app"})

    async def send(msg: dict[str, Any]) -> None:
        sent.append(msg)

    def call(mw: SecurityMiddleware, client: str, path: str = "/v1/models") -> Any:
        sent.clear()
        scope = {
            "type": "http",
            "path": path,
            "client": (client, 5000),
            "headers": [(b"host", b"127.0.0.1:8000")],
        }
        asyncio.run(mw(scope, None, send))
        return sent[0].get("status", "app")

    open_mw = SecurityMiddleware(app, api_key="")
    assert call(open_mw, "127.0.0.1") == "app"
    assert call(open_mw, "::1") == "app"
    assert call(open_mw, "10.0.0.5") == 403
    keyed = SecurityMiddleware(app, api_key="k")
    assert call(keyed, "10.0.0.5") == 401  # a key is needed, from anywhere
    assert call(keyed, "10.0.0.5", "/health") == "app"


def test_null_stream_and_ignore_eos_are_their_defaults(server: Server) -> None:
    """OpenAI's schema allows `"stream": null` (a 400 before): not streamed; likewise
    `ignore_eos`."""
    for path, body in ((CHAT, chat(stream=None, ignore_eos=None)), (COMP, comp(stream=None))):
        r = server.http.post(path, json={**body, "max_tokens": 2})
        assert r.status_code == 200 and r.headers["content-type"].startswith("application/json")
