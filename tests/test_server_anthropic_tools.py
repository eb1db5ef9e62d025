"""Anthropic tool use and thinking through the official `anthropic` client, on the same path as
the OpenAI route's tool calls (strata.server.chat).

Two engines, as in test_server_tools.py:
- the embedded default model (random weights): a forced tool (`tool_choice` any / tool) must
  come back as a `tool_use` block whose `input` validates against the tool's `input_schema`
  (checked with `jsonschema`, an independent validator), created and streamed;
- the fake engine, whose greedy answer is the last message's text (its documented rule): a
  message written in the model's tool-call or thinking format comes back as that text and must
  be split into exactly those blocks.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import jsonschema
import pytest
from server_harness import Server
from test_server_tools import PARAMS

# the same bounded schemas as the OpenAI tool tests
WEATHER, ALARM = PARAMS["get_weather"], PARAMS["set_alarm"]
TOOLS: list[Any] = [
    {"name": "get_weather", "description": "Weather forecast for a city", "input_schema": WEATHER},
    {"name": "set_alarm", "input_schema": ALARM},
]
SCHEMAS = {t["name"]: t["input_schema"] for t in TOOLS}
ASK: list[Any] = [{"role": "user", "content": "What is the weather in Paris for 3 days?"}]
MAX = 160  # enough for any call the bounded schemas allow
GREEDY = {"temperature": 0}  # the fake model's echo is its greedy answer


@pytest.fixture(scope="module")
def model_client() -> Iterator[anthropic.Anthropic]:
    s = Server(engine="llm", parallel=2, n_ctx=4096)  # the embedded default model
    try:
        with anthropic.Anthropic(base_url=s.url, api_key="none", max_retries=0) as c:
            yield c
    finally:
        s.stop()


@pytest.fixture(scope="module")
def fake_client() -> Iterator[anthropic.Anthropic]:
    s = Server(parallel=2, n_ctx=8192)  # the tools' system prompt is long in toy tokens
    try:
        with anthropic.Anthropic(base_url=s.url, api_key="none", max_retries=0) as c:
            yield c
    finally:
        s.stop()


def check_calls(msg: Any, names: set[str], n: int | None = 1) -> None:
    calls = [b for b in msg.content if b.type == "tool_use"]
    assert msg.stop_reason == "tool_use", msg
    if n is not None:
        assert len(calls) == n
    for b in calls:
        assert b.name in names and b.id.startswith("toolu_")
        jsonschema.validate(b.input, SCHEMAS[b.name])


@pytest.mark.parametrize("stream", [False, True])
def test_named_tool_is_valid_for_its_schema(
    model_client: anthropic.Anthropic, stream: bool
) -> None:
    kw: dict[str, Any] = {
        "model": "strata-default",
        "max_tokens": MAX,
        "messages": ASK,
        "tools": TOOLS,
        "tool_choice": {"type": "tool", "name": "set_alarm"},
    }
    if stream:
        with model_client.messages.stream(**kw) as s:
            kinds = [e.type for e in s]
            msg = s.get_final_message()
        assert "input_json" in kinds  # the SDK's event for input_json_delta
    else:
        msg = model_client.messages.create(**kw)
    check_calls(msg, {"set_alarm"})


def test_any_tool_without_parallel_calls(model_client: anthropic.Anthropic) -> None:
    msg = model_client.messages.create(
        model="strata-default",
        max_tokens=MAX,
        messages=ASK,
        tools=TOOLS,
        tool_choice={"type": "any", "disable_parallel_tool_use": True},
    )
    check_calls(msg, set(SCHEMAS))


@pytest.mark.parametrize("cut", [4, 14])
def test_a_forced_call_cut_by_max_tokens_leaks_no_call_text(
    model_client: anthropic.Anthropic, cut: int
) -> None:
    """A forced call cut off by max_tokens is a tool_use block with what its input had so far
    (or nothing before the name), never the raw call text as a text block."""
    msg = model_client.messages.create(
        model="strata-default",
        max_tokens=cut,
        messages=ASK,
        tools=TOOLS,
        tool_choice={"type": "tool", "name": "set_alarm"},
        extra_body=GREEDY,
    )
    assert msg.stop_reason == "max_tokens"
    assert [b for b in msg.content if b.type == "text"] == []
    assert all(b.name == "set_alarm" for b in msg.content if b.type == "tool_use")


ARGS = {"city": "Paris", "unit": "celsius", "days": 3}
CALL = (
    '<tool_call>\n{"name": "get_weather", "arguments": '
    '{"city": "Paris", "unit": "celsius", "days": 3}}\n</tool_call>'
)


@pytest.mark.parametrize("stream", [False, True])
def test_tool_use_parsed_from_the_answer(fake_client: anthropic.Anthropic, stream: bool) -> None:
    kw: dict[str, Any] = {
        "model": "strata-fake",
        "max_tokens": 400,
        "messages": [{"role": "user", "content": "Sure. " + CALL}],
        "tools": TOOLS,
        "extra_body": GREEDY,
    }
    if stream:
        with fake_client.messages.stream(**kw) as s:
            msg = s.get_final_message()
    else:
        msg = fake_client.messages.create(**kw)
    assert [b.type for b in msg.content] == ["text", "tool_use"]
    assert msg.content[0].text == "Sure."
    use = msg.content[1]
    assert use.name == "get_weather"
    assert use.input == ARGS
    assert msg.stop_reason == "tool_use"


def test_tool_choice_none_leaves_the_text(fake_client: anthropic.Anthropic) -> None:
    msg = fake_client.messages.create(
        model="strata-fake",
        max_tokens=400,
        messages=[{"role": "user", "content": CALL}],
        tools=TOOLS,
        tool_choice={"type": "none"},
        extra_body=GREEDY,
    )
    assert [b.type for b in msg.content] == ["text"] and msg.content[0].text == CALL
    assert msg.stop_reason == "end_turn"


def test_tool_round_trip_reaches_the_prompt(fake_client: anthropic.Anthropic) -> None:
    convo: list[Any] = [
        *ASK,
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Let me look."},
                {
                    "type": "tool_use",
                    "id": "toolu_1",
                    "name": "get_weather",
                    "input": {"city": "Paris", "unit": "celsius", "days": 3},
                },
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny, 22 C"}
            ],
        },
    ]
    n = fake_client.messages.count_tokens(model="strata-fake", messages=convo, tools=TOOLS)
    n_plain = fake_client.messages.count_tokens(model="strata-fake", messages=ASK)
    assert n.input_tokens > n_plain.input_tokens + len("sunny, 22 C")
    msg = fake_client.messages.create(
        model="strata-fake", max_tokens=400, messages=convo, tools=TOOLS
    )
    # the fake model echoes the last message: the tool result as the template renders it
    assert "sunny, 22 C" in msg.content[0].text


@pytest.mark.parametrize("stream", [False, True])
def test_thinking_block(fake_client: anthropic.Anthropic, stream: bool) -> None:
    kw: dict[str, Any] = {
        "model": "strata-fake",
        "max_tokens": 200,
        "messages": [{"role": "user", "content": "<think>plan it</think>The answer."}],
        "thinking": {"type": "enabled", "budget_tokens": 100},
        "extra_body": GREEDY,
    }
    if stream:
        with fake_client.messages.stream(**kw) as s:
            kinds = [e.type for e in s]
            msg = s.get_final_message()
        assert "thinking" in kinds and "text" in kinds
    else:
        msg = fake_client.messages.create(**kw)
    assert [b.type for b in msg.content] == ["thinking", "text"]
    assert msg.content[0].thinking == "plan it"
    assert msg.content[1].text == "The answer."
    # a thinking block sent back in the history is accepted
    again = fake_client.messages.create(
        model="strata-fake",
        max_tokens=50,
        messages=[
            *kw["messages"],
            {"role": "assistant", "content": [b.model_dump() for b in msg.content]},
            {"role": "user", "content": "ok"},
        ],
        extra_body=GREEDY,
    )
    assert again.content[-1].text == "ok"


def test_tool_choice_errors(fake_client: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.BadRequestError, match="tool_choice"):
        fake_client.messages.create(
            model="strata-fake",
            max_tokens=8,
            messages=ASK,
            tools=TOOLS,
            tool_choice={"type": "tool", "name": "missing"},
        )
    with pytest.raises(anthropic.BadRequestError, match="tool_choice"):
        fake_client.messages.create(
            model="strata-fake", max_tokens=8, messages=ASK, tool_choice={"type": "any"}
        )


def test_tool_use_stream_events(fake_client: anthropic.Anthropic) -> None:
    body = {
        "model": "strata-fake",
        "max_tokens": 400,
        "messages": [{"role": "user", "content": "Sure. " + CALL}],
        "tools": TOOLS,
        "stream": True,
        **GREEDY,
    }
    events = []
    with httpx.stream("POST", str(fake_client.base_url) + "/v1/messages", json=body) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line[len("data: ") :]))
    kinds = [e["type"] for e in events]
    assert kinds[:2] == ["message_start", "ping"] and kinds[-2:] == [
        "message_delta",
        "message_stop",
    ]
    starts = [e for e in events if e["type"] == "content_block_start"]
    assert [s["content_block"]["type"] for s in starts] == ["text", "tool_use"]
    use = starts[1]["content_block"]
    assert use["name"] == "get_weather" and use["input"] == {} and use["id"].startswith("toolu_")
    pieces = [
        e["delta"]["partial_json"]
        for e in events
        if e["type"] == "content_block_delta" and e["index"] == 1
    ]
    assert all(
        e["delta"]["type"] == "input_json_delta"
        for e in events
        if e["type"] == "content_block_delta" and e["index"] == 1
    )
    assert json.loads("".join(pieces)) == ARGS
    stops = [e["index"] for e in events if e["type"] == "content_block_stop"]
    assert stops == [0, 1]
    assert events[-2]["delta"]["stop_reason"] == "tool_use"


def test_output_format_json_schema(model_client: anthropic.Anthropic) -> None:
    msg = model_client.messages.create(
        model="strata-default",
        max_tokens=MAX,
        messages=ASK,
        output_config={"format": {"type": "json_schema", "schema": WEATHER}},
    )
    assert [b.type for b in msg.content] == ["text"] and msg.stop_reason == "end_turn"
    jsonschema.validate(json.loads(msg.content[0].text), WEATHER)
    with pytest.raises(anthropic.BadRequestError, match="effort"):
        model_client.messages.create(
            model="strata-default",
            max_tokens=8,
            messages=ASK,
            output_config={"effort": "extreme"},  # type: ignore[typeddict-item]
        )
