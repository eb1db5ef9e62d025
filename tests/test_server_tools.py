"""Tool calls, structured output, reasoning and strict request fields, through the official
`openai` client against a real server.

Two engines:
- the embedded default model (random weights, or trained ones later): whatever it would say,
  a forced tool call or a `json_schema` answer must come back parseable and valid for the
  schema (checked with `jsonschema`, an independent validator). The schemas are bounded
  (maxLength, enum, minimum/maximum) so any model finishes them within max_tokens;
- the fake engine, whose greedy answer is the last message's text (its documented rule), so
  a message written in a model's tool-call or thinking format comes back as that text and
  must be parsed exactly.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import jsonschema
import openai
import pytest
from server_harness import Server

WEATHER_PARAMS = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 16},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 14},
    },
    "required": ["city", "unit", "days"],
    "additionalProperties": False,
}
TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather forecast for a city",
            "parameters": WEATHER_PARAMS,
            "strict": True,
        },
    },
    {
        "type": "function",
        "function": {
            "name": "set_alarm",
            "parameters": {
                "type": "object",
                "properties": {
                    "hour": {"type": "integer", "minimum": 0, "maximum": 23},
                    "loud": {"type": "boolean"},
                },
                "required": ["hour", "loud"],
                "additionalProperties": False,
            },
            "strict": True,
        },
    },
]
PARAMS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
ASK = [{"role": "user", "content": "What is the weather in Paris for 3 days?"}]
MAX = 160  # enough for any answer the bounded schemas allow


@pytest.fixture(scope="module")
def model_server() -> Iterator[Server]:
    s = Server(engine="llm", parallel=2, n_ctx=4096)  # the embedded default model
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(model_server: Server) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=model_server.url + "/v1", api_key="x", max_retries=0) as c:
        yield c


def model_id(c: openai.OpenAI) -> str:
    return c.models.list().data[0].id


def check_call(call: Any, name: str | None = None) -> None:
    assert call.type == "function" and call.id
    if name is not None:
        assert call.function.name == name
    args = json.loads(call.function.arguments)
    jsonschema.validate(args, PARAMS[call.function.name])


@pytest.mark.parametrize("seed", [0, 1])
def test_named_tool_choice(client: openai.OpenAI, seed: int) -> None:
    r = client.chat.completions.create(
        model=model_id(client),
        messages=ASK,  # type: ignore[arg-type]
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        max_tokens=MAX,
        seed=seed,
    )
    c = r.choices[0]
    assert c.finish_reason == "tool_calls", c
    assert c.message.content is None and len(c.message.tool_calls or []) == 1
    check_call(c.message.tool_calls[0], "get_weather")  # type: ignore[index]


def test_named_tool_choice_stream_assembled_by_client(client: openai.OpenAI) -> None:
    with client.chat.completions.stream(
        model=model_id(client),
        messages=ASK,  # type: ignore[arg-type]
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "set_alarm"}},
        max_tokens=MAX,
        seed=3,
    ) as stream:
        kinds = [ev.type for ev in stream]
        final = stream.get_final_completion()
    assert "tool_calls.function.arguments.done" in kinds
    c = final.choices[0]
    assert c.finish_reason == "tool_calls"
    (call,) = c.message.tool_calls or []
    check_call(call, "set_alarm")
    assert call.function.parsed_arguments == json.loads(call.function.arguments)  # type: ignore[union-attr]


def streamed_calls(stream: Any) -> tuple[str | None, dict[int, dict[str, str]]]:
    """A streamed answer's finish reason and tool calls (index → name, arguments), as a
    client accumulates them from the deltas."""
    calls: dict[int, dict[str, str]] = {}
    finish = None
    for chunk in stream:
        for ch in chunk.choices:
            finish = ch.finish_reason or finish
            for tc in ch.delta.tool_calls or []:
                slot = calls.setdefault(tc.index, {"name": "", "arguments": ""})
                slot["name"] += (tc.function and tc.function.name) or ""
                slot["arguments"] += (tc.function and tc.function.arguments) or ""
    return finish, calls


def test_required_one_call(client: openai.OpenAI) -> None:
    for stream in (False, True):
        r = client.chat.completions.create(
            model=model_id(client),
            messages=ASK,  # type: ignore[arg-type]
            tools=TOOLS,
            tool_choice="required",
            parallel_tool_calls=False,
            max_tokens=MAX,
            seed=7,
            stream=stream,
        )
        if stream:
            finish, calls = streamed_calls(r)
            assert finish == "tool_calls" and len(calls) == 1
            jsonschema.validate(json.loads(calls[0]["arguments"]), PARAMS[calls[0]["name"]])
        else:
            c = r.choices[0]  # type: ignore[union-attr]
            assert c.finish_reason == "tool_calls"
            assert len(c.message.tool_calls) == 1
            check_call(c.message.tool_calls[0])


SCHEMA = {
    "type": "object",
    "properties": {
        "answer": {"type": "string", "maxLength": 20},
        "confidence": {"type": "integer", "minimum": 0, "maximum": 100},
        "tags": {
            "type": "array",
            "items": {"type": "string", "enum": ["a", "b", "c"]},
            "maxItems": 3,
        },
    },
    "required": ["answer", "confidence", "tags"],
    "additionalProperties": False,
}


def test_json_schema_response(client: openai.OpenAI) -> None:
    fmt: Any = {
        "type": "json_schema",
        "json_schema": {"name": "a", "schema": SCHEMA, "strict": True},
    }
    r = client.chat.completions.create(
        model=model_id(client),
        messages=ASK,
        response_format=fmt,
        max_tokens=MAX,
        seed=1,  # type: ignore[arg-type]
    )
    assert r.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(r.choices[0].message.content or ""), SCHEMA)
    chunks = client.chat.completions.create(
        model=model_id(client),
        messages=ASK,  # type: ignore[arg-type]
        response_format=fmt,
        max_tokens=MAX,
        seed=2,
        stream=True,
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    jsonschema.validate(json.loads(text), SCHEMA)


def test_parse_with_pydantic_model(client: openai.OpenAI) -> None:
    """The client's own structured-output helper: a pydantic model as `response_format`."""
    from typing import Literal

    from pydantic import BaseModel, Field

    class Forecast(BaseModel):
        city: str = Field(max_length=12)
        unit: Literal["celsius", "fahrenheit"]
        days: int = Field(ge=1, le=7)

    r = client.chat.completions.parse(
        model=model_id(client),
        messages=ASK,  # type: ignore[arg-type]
        response_format=Forecast,
        max_tokens=MAX,
        seed=4,
    )
    parsed = r.choices[0].message.parsed
    assert isinstance(parsed, Forecast) and 1 <= parsed.days <= 7


def test_json_object_response(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model=model_id(client),
        messages=ASK,  # type: ignore[arg-type]
        response_format={"type": "json_object"},
        max_tokens=400,
        seed=0,
    )
    c = r.choices[0]
    if c.finish_reason == "stop":  # an open object may run past max_tokens: then it is cut
        assert isinstance(json.loads(c.message.content or ""), dict)
    else:
        assert c.finish_reason == "length" and (c.message.content or "").startswith("{")


def test_tool_history_renders(client: openai.OpenAI) -> None:
    msgs: Any = [
        *ASK,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"},
    ]
    r = client.chat.completions.create(
        model=model_id(client), messages=msgs, tools=TOOLS, max_tokens=4, temperature=0
    )
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")
    with pytest.raises(openai.BadRequestError) as e:
        bad = [*msgs[:1], {**msgs[1], "tool_calls": [{**msgs[1]["tool_calls"][0]}]}]
        bad[1]["tool_calls"][0]["function"] = {"name": "get_weather", "arguments": "not json"}
        client.chat.completions.create(model=model_id(client), messages=bad, max_tokens=4)
    assert e.value.body["param"] == "messages[1].tool_calls[0].function.arguments"  # type: ignore[index]


def bad_request(c: openai.OpenAI, **kw: Any) -> dict[str, Any]:
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model=model_id(c), messages=ASK, max_tokens=4, **kw)  # type: ignore[arg-type]
    body: dict[str, Any] = e.value.body  # type: ignore[assignment]
    return body


def test_unknown_and_unsupported_fields_are_400(client: openai.OpenAI) -> None:
    b = bad_request(client, extra_body={"frobnicate": 1})
    assert b["param"] == "frobnicate" and "unknown field" in b["message"]
    assert bad_request(client, functions=[{"name": "f"}])["param"] == "functions"
    assert bad_request(client, logit_bias={"99999999": 5})["param"] == "logit_bias"
    b = bad_request(client, extra_body={"messages": [{"role": "user", "content": "x", "bogus": 1}]})
    assert b["param"] == "messages[0].bogus"
    b = bad_request(client, tools=[{"type": "function", "function": {"name": "a b"}}])
    assert b["param"] == "tools[0].function.name"
    assert bad_request(client, tool_choice="required")["param"] == "tool_choice"
    b = bad_request(
        client, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "x"}}
    )
    assert b["param"] == "tool_choice"
    b = bad_request(
        client,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "x", "schema": {"type": "nope"}},
        },
    )
    assert b["param"] == "response_format"
    assert (
        bad_request(client, extra_body={"reasoning_format": "raw"})["param"] == "reasoning_format"
    )
    assert (
        bad_request(client, extra_body={"reasoning_effort": "max"})["param"] == "reasoning_effort"
    )
    b = bad_request(client, extra_body={"chat_template_kwargs": {"messages": []}})
    assert b["param"] == "chat_template_kwargs.messages"


def test_model_optional_and_ignored_fields(model_server: Server) -> None:
    r = httpx.post(
        model_server.url + "/v1/chat/completions",
        json={
            "messages": ASK,
            "max_tokens": 2,
            "metadata": {"k": "v"},
            "store": False,
            "user": "u",
            "reasoning_effort": "low",  # passed to the template, which may ignore it
        },
        timeout=30,
    )
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["role"] == "assistant"


# -- the fake engine: exact parsing of what the model wrote -----------------------------------


@pytest.fixture(scope="module")
def fake() -> Iterator[openai.OpenAI]:
    s = Server(parallel=2, n_ctx=4096)
    with openai.OpenAI(base_url=s.url + "/v1", api_key="x", max_retries=0) as c:
        yield c
    s.stop()


CALL_TEXT = (
    'Checking.\n<tool_call>\n{"name": "get_weather", "arguments": '
    '{"city": "Oslo", "unit": "celsius", "days": 2}}\n</tool_call>\n'
    '<tool_call>\n{"name": "set_alarm", "arguments": {"hour": 7, "loud": true}}\n</tool_call>'
)


def say(c: openai.OpenAI, text: str, **kw: Any) -> Any:
    return c.chat.completions.create(
        model="strata-fake", messages=[{"role": "user", "content": text}], temperature=0, **kw
    )


def test_fake_auto_tool_calls_stream_and_not(fake: openai.OpenAI) -> None:
    r = say(fake, CALL_TEXT, tools=TOOLS)
    m = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls"
    assert m.content == "Checking."
    got = [(t.function.name, json.loads(t.function.arguments)) for t in m.tool_calls]
    want = [
        ("get_weather", {"city": "Oslo", "unit": "celsius", "days": 2}),
        ("set_alarm", {"hour": 7, "loud": True}),
    ]
    assert got == want
    with fake.chat.completions.stream(
        model="strata-fake",
        messages=[{"role": "user", "content": CALL_TEXT}],
        tools=TOOLS,
        temperature=0,
    ) as s:
        final = s.get_final_completion()
    fm = final.choices[0].message
    assert final.choices[0].finish_reason == "tool_calls" and fm.content == "Checking."
    assert [(t.function.name, t.function.parsed_arguments) for t in fm.tool_calls or []] == want
    # the arguments stream in pieces (the fake model writes a byte per token)
    pieces = [
        tc.function.arguments
        for ch in say(fake, CALL_TEXT, tools=TOOLS, stream=True)
        for c in ch.choices
        for tc in c.delta.tool_calls or []
        if tc.index == 0 and tc.function and tc.function.arguments
    ]
    assert len(pieces) > 10 and json.loads("".join(pieces)) == want[0][1]
    # parallel_tool_calls false keeps the first; tool_choice none parses nothing
    r = say(fake, CALL_TEXT, tools=TOOLS, parallel_tool_calls=False)
    assert [t.function.name for t in r.choices[0].message.tool_calls] == ["get_weather"]
    r = say(fake, CALL_TEXT, tools=TOOLS, tool_choice="none")
    assert r.choices[0].message.content == CALL_TEXT and r.choices[0].finish_reason == "stop"
    r = say(fake, CALL_TEXT)  # no tools: plain text
    assert r.choices[0].message.content == CALL_TEXT and not r.choices[0].message.tool_calls


THINK_TEXT = "<think>\nFirst, the forecast.\n</think>\n\nIt will rain."


def test_fake_reasoning_split(fake: openai.OpenAI) -> None:
    r = say(fake, THINK_TEXT)
    m = r.choices[0].message
    assert (m.reasoning_content, m.content) == ("First, the forecast.\n", "It will rain.")  # type: ignore[attr-defined]
    # the reasoning's tokens (the toy tokenizer: a token a byte), as OpenAI reports them
    thought = len(b"First, the forecast.\n")
    assert r.usage.completion_tokens_details.reasoning_tokens == thought
    opts = {"include_usage": True}
    chunks = list(say(fake, THINK_TEXT, stream=True, stream_options=opts))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    reasoning = "".join(getattr(d, "reasoning_content", None) or "" for d in deltas)
    content = "".join(d.content or "" for d in deltas)
    assert (reasoning, content) == ("First, the forecast.\n", "It will rain.")
    assert chunks[-1].usage.completion_tokens_details.reasoning_tokens == thought
    r = say(fake, THINK_TEXT, extra_body={"reasoning_format": "none"})
    m = r.choices[0].message
    assert m.content == THINK_TEXT and getattr(m, "reasoning_content", None) is None
    assert r.usage.completion_tokens_details is None  # no reasoning told apart


def test_fake_forced_call_constrains_even_the_echo(fake: openai.OpenAI) -> None:
    """The fake model wants to echo plain text; the constraint makes it call the tool."""
    r = say(
        fake,
        "no tools here",
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "set_alarm"}},
        max_tokens=MAX,
    )
    assert r.choices[0].finish_reason == "tool_calls"
    check_call(r.choices[0].message.tool_calls[0], "set_alarm")


def tool_call_id(srv: Server) -> int:
    r = srv.http.post("/tokenize", json={"prompt": "<tool_call>", "parse_special": True})
    (tid,) = r.json()["tokens"]
    return int(tid)


def pushed(client: openai.OpenAI, seed: int, bias: dict[str, int]) -> dict[str, Any]:
    """A tool_choice auto request whose logit bias pushes the model into a call."""
    return dict(
        model=model_id(client),
        messages=ASK,
        tools=TOOLS,
        tool_choice="auto",
        parallel_tool_calls=False,
        max_tokens=MAX,
        seed=seed,
        logit_bias=bias,
    )


@pytest.mark.parametrize("stream", [False, True])
def test_a_call_the_model_starts_follows_the_schemas(
    model_server: Server, client: openai.OpenAI, stream: bool
) -> None:
    """tool_choice auto (llama.cpp's lazy grammar): the model is pushed to open a call (a
    logit bias on `<tool_call>`); from its opening on the call is a valid call of an offered
    tool whatever the weights say. The same request with `constrain_tool_calls` off gives no
    valid call (test_unconstrained_calls_are_the_models_own_text)."""
    bias = {str(tool_call_id(model_server)): 30}
    for seed in range(3):
        kw = pushed(client, seed, bias)
        if not stream:
            c = client.chat.completions.create(**kw).choices[0]
            assert c.finish_reason == "tool_calls", c
            (call,) = c.message.tool_calls or []
            check_call(call)
            continue
        finish, calls = streamed_calls(client.chat.completions.create(**kw, stream=True))
        assert finish == "tool_calls" and len(calls) == 1
        jsonschema.validate(json.loads(calls[0]["arguments"]), PARAMS[calls[0]["name"]])


def test_unconstrained_calls_are_the_models_own_text() -> None:
    s = Server(engine="llm", n_ctx=4096, constrain_tool_calls=False)
    try:
        with openai.OpenAI(base_url=s.url + "/v1", api_key="x", max_retries=0) as c:
            bias = {str(tool_call_id(s)): 30}
            answers = [c.chat.completions.create(**pushed(c, seed, bias)) for seed in range(3)]
            assert not any(r.choices[0].message.tool_calls for r in answers)
    finally:
        s.stop()
