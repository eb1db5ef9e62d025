"""The OpenAI Responses API (`POST /v1/responses`) on the real engine (the embedded default
model), through the official `openai` client, its stream helper included (it checks the event
sequence: items announced before their deltas, ids kept, a completed response). The oracle
for what the model answers is the chat route: the same conversation asked there, greedy,
gives the same text and the same prompt tokens. Translation details (reasoning items, merged
calls, field names in errors) are checked on the translation itself."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import jsonschema
import msgspec
import openai
import pytest
from server_harness import Server
from strata.server.openai_types import APIError
from strata.server.responses_api import Items
from strata.server.responses_types import ResponsesRequest, responses_names, to_chat_body
from strata.server.tools import ToolCall

MODEL = "strata-default"
CITY = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 12}},
    "required": ["city"],
    "additionalProperties": False,
}
TOOLS: list[Any] = [
    {"type": "function", "name": "get_weather", "description": "weather", "parameters": CITY}
]


@pytest.fixture(scope="module")
def client() -> Iterator[openai.OpenAI]:
    srv = Server(engine="llm", parallel=2, n_ctx=2048)
    try:
        yield openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0)
    finally:
        srv.stop()


def chat(client: openai.OpenAI, messages: list[Any], **kw: Any) -> Any:
    return client.chat.completions.create(model=MODEL, messages=messages, temperature=0, **kw)


def test_text_answer_equals_the_chat_routes(client: openai.OpenAI) -> None:
    r = client.responses.create(
        model=MODEL, instructions="Be brief.", input="Name a fruit.", max_output_tokens=24,
        temperature=0,
    )  # fmt: skip
    c = chat(client, [{"role": "system", "content": "Be brief."},
                      {"role": "user", "content": "Name a fruit."}], max_tokens=24)  # fmt: skip
    assert r.output_text == c.choices[0].message.content
    assert r.usage is not None and c.usage is not None
    assert (r.usage.input_tokens, r.usage.output_tokens) == (
        c.usage.prompt_tokens,
        c.usage.completion_tokens,
    )
    want = "incomplete" if c.choices[0].finish_reason == "length" else "completed"
    assert r.status == want and r.store is False
    if want == "incomplete":
        assert r.incomplete_details is not None
        assert r.incomplete_details.reason == "max_output_tokens"


def test_stream_builds_the_same_response(client: openai.OpenAI) -> None:
    fmt = {"type": "json_schema", "name": "n", "schema": {
        "type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}},
        "required": ["n"], "additionalProperties": False}}  # fmt: skip
    kw: dict[str, Any] = dict(model=MODEL, input="A number?", temperature=0, text={"format": fmt})
    whole = client.responses.create(**kw)
    with client.responses.stream(**kw) as s:
        seqs = [e.sequence_number for e in s]
        final = s.get_final_response()
    assert seqs == list(range(len(seqs)))
    assert final.output_text == whole.output_text
    jsonschema.validate(json.loads(final.output_text), fmt["schema"])
    # cut off: the stream ends with response.incomplete
    with client.responses.stream(model=MODEL, input="Count:", max_output_tokens=2) as s:
        events = list(s)
    assert events[0].type == "response.created" and events[-1].type == "response.incomplete"
    done = [e.item for e in events if e.type == "response.output_item.done"]
    assert done and done[-1].status == "incomplete"  # the item the limit cut off
    cut = client.responses.create(model=MODEL, input="Count:", max_output_tokens=2)
    assert cut.status == "incomplete" and cut.output[-1].status == "incomplete"
    # output items sent back as they came (the SDK's model_dump: ids, status, phase)
    back = [{"role": "user", "content": "Count:"},
            *[o.model_dump(exclude_none=True) | {"phase": "final_answer"} for o in cut.output],
            {"role": "user", "content": "Go on."}]  # fmt: skip
    assert client.responses.create(model=MODEL, input=back, max_output_tokens=2).output


def test_tool_call_round_trip(client: openai.OpenAI) -> None:
    ask = {"role": "user", "content": "Weather in Paris?"}
    r = client.responses.create(
        model=MODEL, input=[ask], tools=TOOLS, tool_choice="required",
        parallel_tool_calls=False, temperature=0, max_output_tokens=60,
    )  # fmt: skip
    calls = [o for o in r.output if o.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather"
    jsonschema.validate(json.loads(calls[0].arguments), CITY)
    with client.responses.stream(
        model=MODEL, input=[ask], tools=TOOLS, tool_choice="required",
        parallel_tool_calls=False, temperature=0, max_output_tokens=60,
    ) as s:  # fmt: skip
        streamed = [o for o in s.get_final_response().output if o.type == "function_call"]
    assert [(c.name, c.arguments) for c in streamed] == [(c.name, c.arguments) for c in calls]
    # the call and its output sent back: the chat route's prompt for the same turns
    call = calls[0]
    items = [
        ask,
        {"type": "function_call", "call_id": call.call_id, "name": call.name,
         "arguments": call.arguments},
        {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"},
    ]  # fmt: skip
    r2 = client.responses.create(model=MODEL, input=items, tools=TOOLS, max_output_tokens=8)
    tc = {"id": call.call_id, "type": "function",
          "function": {"name": call.name, "arguments": call.arguments}}  # fmt: skip
    msgs = [ask, {"role": "assistant", "content": None, "tool_calls": [tc]},
            {"role": "tool", "tool_call_id": call.call_id, "content": "sunny"}]  # fmt: skip
    chat_tools: list[Any] = [{"type": "function", "function": {k: v for k, v in TOOLS[0].items()
                                                               if k != "type"}}]  # fmt: skip
    c = chat(client, msgs, tools=chat_tools, max_tokens=8)
    assert r2.usage is not None and c.usage is not None
    assert r2.usage.input_tokens == c.usage.prompt_tokens


@pytest.mark.parametrize(
    "kw, param",
    [
        ({"previous_response_id": "resp_1"}, "previous_response_id"),
        ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"text": {"format": {"type": "xml"}}}, "text.format.type"),
        ({"include": ["message.output_text.logprobs"]}, "include"),
        ({"input": [{"role": "user", "content": [{"type": "input_image"}]}]},
         "input[0].content[0]"),
        ({"max_output_tokens": 0}, "max_output_tokens"),
        ({"input": [{"type": "function_call", "name": "f"}]}, "input[0].call_id"),
        ({"tools": TOOLS, "tool_choice": {"type": "function", "name": "x"}}, "tool_choice"),
        ({"extra_body": {"frobnicate": 1}}, "frobnicate"),
        ({"input": [{"role": "user", "content": "x", "bogus": 1}]}, "input[0].bogus"),
        ({"reasoning": {"effort": "max"}}, "reasoning.effort"),
        ({"truncation": "auto"}, "truncation"),
        ({"input": [{"type": ["message"], "role": "user", "content": "x"}]}, "input[0].type"),
        ({"text": {"format": {"type": "text", "foo": 1}}}, "text.format.foo"),
        ({"tools": TOOLS, "tool_choice": {"type": "function"}}, "tool_choice.name"),
    ],
)  # fmt: skip
def test_bad_requests_are_400s_naming_the_responses_field(
    client: openai.OpenAI, kw: dict[str, Any], param: str
) -> None:
    args: dict[str, Any] = {"model": MODEL, "input": "hi", "max_output_tokens": 4, **kw}
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(**args)
    body: Any = e.value.body
    assert body["param"] == param, body


def test_translation_of_items() -> None:
    """Reasoning goes to the next assistant turn; a message and the calls after it are one
    turn; errors on the chat body are renamed to the Responses fields."""
    req = msgspec.convert(dict(
        instructions="sys",
        input=[
            {"role": "user", "content": [{"type": "input_text", "text": "q"}]},
            {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text",
                                                              "text": "hmm"}]},
            {"role": "assistant", "content": [{"type": "output_text", "text": "a"}]},
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
            {"type": "function_call", "call_id": "c2", "name": "g", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "r1"},
        ],
        max_output_tokens=5,
        text={"format": {"type": "json_object"}},
    ), ResponsesRequest)  # fmt: skip
    origins: list[str] = []
    body = to_chat_body(req, origins)
    roles = [m["role"] for m in body["messages"]]
    assert roles == ["system", "user", "assistant", "tool"]
    assistant = body["messages"][2]
    assert assistant["reasoning_content"] == "hmm" and assistant["content"] == "a"
    assert [c["id"] for c in assistant["tool_calls"]] == ["c1", "c2"]
    assert origins == ["instructions", "input[0]", "input[2]", "input[5]"]
    assert body["max_tokens"] == 5 and body["response_format"] == {"type": "json_object"}
    e = responses_names(APIError(400, "messages[3].content: bad", "messages[3].content"), origins)
    assert e.param == "input[5].content" and e.message == "input[5].content: bad"
    e = responses_names(APIError(400, "max_tokens: low", "max_tokens"), origins)
    assert e.param == "max_output_tokens"


def test_items_make_output_and_events_in_generation_order() -> None:
    items = Items()
    events: list[bytes] = []
    for part in [("reasoning", "think"), ("content", "hi"), ("content", "!"),
                 ("call", ToolCall("f", '{"a": 1}', "call_1"))]:  # fmt: skip
        events += items.feed(part)
    events += items.close()
    assert [o["type"] for o in items.output] == ["reasoning", "message", "function_call"]
    assert items.output[1]["content"][0]["text"] == "hi!"
    assert items.output[2]["arguments"] == '{"a": 1}' and items.called
    kinds = [e.split(b"\n")[0].removeprefix(b"event: ").decode() for e in events]
    assert kinds.count("response.output_item.added") == 3
    assert kinds.count("response.output_item.done") == 3
    assert kinds.index("response.reasoning_text.done") < kinds.index("response.output_text.delta")
    seqs = [json.loads(e.split(b"data: ")[1])["sequence_number"] for e in events]
    assert seqs == list(range(len(events)))
