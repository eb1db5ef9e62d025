"""Structured output beyond `response_format`, on the real engine (the embedded default model,
whose own choices would not follow any of these): vLLM's `structured_outputs` (choice, regex,
json, json_object, grammar), llama-server's `json_schema` and GBNF `grammar`, and
`response_format` on completions. Oracles, independent of llguidance: Python's `re` (the
regexes, and the GBNF grammar's equivalent one), `jsonschema` (the schemas), set membership
(the choices). Bad constraints are 400s naming the field."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import jsonschema
import pytest
from server_harness import Server
from strata import constraints

SCHEMA = {
    "type": "object",
    "properties": {
        "n": {"type": "integer", "minimum": 0, "maximum": 99},
        "ok": {"type": "boolean"},
    },
    "required": ["n", "ok"],
    "additionalProperties": False,
}
ARRAY = {"type": "array", "items": {"type": "boolean"}, "minItems": 2, "maxItems": 3}
CHOICES = ["yes", "no", "maybe so"]
REGEX = r"[0-9]{3}/[a-z]{2}"
GBNF = 'root ::= "A" digit digit? "!"\ndigit ::= [0-9]'
GBNF_RE = r"A[0-9][0-9]?!"


@pytest.fixture(scope="module")
def srv() -> Iterator[Server]:
    s = Server(engine="llm", parallel=2, n_ctx=1024)
    try:
        yield s
    finally:
        s.stop()


def answer(srv: Server, route: str, **extra: Any) -> str:
    body: dict[str, Any] = {"max_tokens": 48, "temperature": 0, **extra}
    if route == "chat":
        body["messages"] = [{"role": "user", "content": "The answer is"}]
    else:
        body["prompt"] = "The answer is"
    r = srv.http.post(f"/v1/{'chat/' if route == 'chat' else ''}completions", json=body)
    assert r.status_code == 200, r.text
    ch = r.json()["choices"][0]
    assert ch["finish_reason"] == "stop", ch  # the grammar ended the answer
    return str(ch["text"] if route == "completions" else ch["message"]["content"])


@pytest.mark.parametrize("route", ["completions", "chat"])
def test_each_source_constrains_the_answer(srv: Server, route: str) -> None:
    assert answer(srv, route, structured_outputs={"choice": CHOICES}) in CHOICES
    assert re.fullmatch(REGEX, answer(srv, route, structured_outputs={"regex": REGEX}))
    for so in ({"json": SCHEMA}, {"json": json.dumps(SCHEMA)}):
        jsonschema.validate(json.loads(answer(srv, route, structured_outputs=so)), SCHEMA)
    assert isinstance(
        json.loads(answer(srv, route, structured_outputs={"json_object": True})), dict
    )
    assert re.fullmatch(GBNF_RE, answer(srv, route, structured_outputs={"grammar": GBNF}))
    assert re.fullmatch(GBNF_RE, answer(srv, route, grammar=GBNF))  # llama-server's
    jsonschema.validate(json.loads(answer(srv, route, json_schema=ARRAY)), ARRAY)
    rf = {"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA}}
    jsonschema.validate(json.loads(answer(srv, route, response_format=rf)), SCHEMA)


@pytest.mark.parametrize(
    "extra, param",
    [
        ({"structured_outputs": {"regex": "(ab"}}, "structured_outputs.regex"),
        ({"structured_outputs": {"choice": []}}, "structured_outputs.choice"),
        ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs"),
        (
            {"structured_outputs": {"whitespace_pattern": " "}},
            "structured_outputs.whitespace_pattern",
        ),
        ({"structured_outputs": {"json": "{not json"}}, "structured_outputs.json"),
        ({"structured_outputs": "regex"}, "structured_outputs"),
        ({"grammar": "root ::= ("}, "grammar"),
        ({"grammar": "x", "json_schema": {}}, "grammar"),
        ({"json_schema": {"type": "bogus"}}, "json_schema"),
        ({"response_format": {"type": "xml"}}, "response_format.type"),
        # sizes that would cost seconds of compiling (a core, the event loop's before)
        (
            {"structured_outputs": {"choice": [f"c{i}" for i in range(1025)]}},
            "structured_outputs.choice",
        ),
        ({"grammar": "root ::= " + " | ".join(f'"w{i}"' for i in range(40000))}, "grammar"),
    ],
)
def test_bad_constraints_are_400s_naming_the_field(
    srv: Server, extra: dict[str, Any], param: str
) -> None:
    for route in ("completions", "chat/completions"):
        body: dict[str, Any] = {"max_tokens": 4, **extra}
        body |= (
            {"prompt": "x"}
            if route == "completions"
            else {"messages": [{"role": "user", "content": "x"}]}
        )
        r = srv.http.post(f"/v1/{route}", json=body)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, (route, r.text)


def test_regex_slashes_and_choices_are_quoted_for_lark() -> None:
    """The Lark text of a regex with "/" (escaped or not) and of choices with quotes."""
    assert constraints.regex_grammar(r"a/b\/c\\/d") == "start: /a\\/b\\/c\\\\\\/d/\n"
    g = constraints.choice_grammar(['say "hi"', "a\\b"])
    assert g == 'start: "say \\"hi\\"" | "a\\\\b"\n'
    for grammar in (constraints.regex_grammar(r"a/b\/c\\/d"), g):
        constraints.check_grammar(grammar)
    # the thinking wrapper renames the start rule wherever a converted grammar has it
    w = constraints.with_reasoning(constraints.cfg_grammar(GBNF), "optional")
    constraints.check_grammar(w)
    assert w.count("start:") == 1 and "answer__:" in w
