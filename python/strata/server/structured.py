"""Structured output: what a request asks its answer to be, as one grammar for llguidance.

The sources, at most one a request:
- OpenAI's `response_format` (`text`, `json_object`, `json_schema`);
- llama-server's `json_schema` (a JSON schema) and `grammar` (a GBNF grammar; Lark is taken
  too, as llguidance reads both);
- vLLM's `structured_outputs`: exactly one of `json` (a schema, or its JSON text), `regex`,
  `choice` (the answer is one of the strings), `grammar` (GBNF or Lark), `json_object`.
Chat and completions requests take them alike; the chat route lets a thinking block precede
the constrained answer (`constraints.with_reasoning`). A grammar llguidance cannot compile is a
400 naming the field.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from strata import constraints
from strata.server.openai_types import APIError, ChatRequest, CompletionRequest

# vLLM's StructuredOutputsParams: the constraint kinds taken, and options that change nothing
# here when unset or false (llguidance is the one backend; no fallback to turn off)
STRUCTURED_KINDS = ("json", "regex", "choice", "grammar", "json_object")
STRUCTURED_UNSET_OK = ("disable_fallback",)
MAX_CHOICES = 1024  # structured_outputs.choice entries
MAX_GRAMMAR_BYTES = 256 << 10  # of the grammar a request's constraint becomes


def _bad(param: str, why: str) -> APIError:
    return APIError(400, f"{param}: {why}", param=param)


def response_grammar(rf: Mapping[str, Any] | None) -> str | None:
    """OpenAI's `response_format` → a grammar (None for text)."""
    if rf is None:
        return None
    kind = rf.get("type")
    extra = set(rf) - {"type", "json_schema"}
    if extra:
        raise _bad(f"response_format.{sorted(extra)[0]}", "unknown field")
    if kind == "text":
        return None
    if kind == "json_object":
        return constraints.json_object_grammar()
    if kind != "json_schema":
        raise _bad("response_format.type", "must be text, json_object or json_schema")
    js = rf.get("json_schema")
    if not isinstance(js, Mapping):
        raise _bad("response_format.json_schema", "must be an object")
    extra = set(js) - {"name", "description", "schema", "strict"}
    if extra:
        raise _bad(f"response_format.json_schema.{sorted(extra)[0]}", "unknown field")
    if not isinstance(js.get("name"), str):
        raise _bad("response_format.json_schema.name", "required (a string)")
    if not isinstance(js.get("strict", False), bool | None):
        raise _bad("response_format.json_schema.strict", "must be true or false")
    schema = js.get("schema", {})
    if not isinstance(schema, Mapping):
        raise _bad("response_format.json_schema.schema", "must be a JSON schema object")
    return constraints.json_schema_grammar(schema)


def _schema(value: Any, param: str) -> str:
    if isinstance(value, str):  # vLLM takes the schema's JSON text too
        try:
            value = json.loads(value)
        except ValueError as e:
            raise _bad(param, f"not valid JSON: {e}") from None
    if not isinstance(value, Mapping):
        raise _bad(param, "must be a JSON schema object")
    return constraints.json_schema_grammar(value)


def _cfg(value: Any, param: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise _bad(param, "must be a grammar (GBNF or Lark text)")
    try:
        return constraints.cfg_grammar(value)
    except constraints.ConstraintError as e:
        raise _bad(param, str(e)) from None


def structured_outputs_grammar(so: Mapping[str, Any]) -> tuple[str, str]:
    """vLLM's `structured_outputs` → (a grammar, the field that holds it)."""
    unknown = set(so) - set(STRUCTURED_KINDS) - set(STRUCTURED_UNSET_OK)
    if unknown:
        name = sorted(unknown)[0]
        raise _bad(f"structured_outputs.{name}", "not supported")
    for name in STRUCTURED_UNSET_OK:
        if so.get(name) not in (None, False):
            raise _bad(f"structured_outputs.{name}", "not supported")
    kinds = [k for k in STRUCTURED_KINDS if so.get(k) not in (None, False)]
    if len(kinds) != 1:
        raise _bad("structured_outputs", f"exactly one of {', '.join(STRUCTURED_KINDS)}")
    kind = kinds[0]
    value = so[kind]
    param = f"structured_outputs.{kind}"
    if kind == "json":
        return _schema(value, param), param
    if kind == "json_object":
        if value is not True:
            raise _bad(param, "must be true")
        return constraints.json_object_grammar(), param
    if kind == "regex":
        if not isinstance(value, str) or not value:
            raise _bad(param, "must be a regular expression")
        return constraints.regex_grammar(value), param
    if kind == "choice":
        if (
            not isinstance(value, list)
            or not value
            or not all(isinstance(c, str) and c for c in value)
        ):
            raise _bad(param, "must be a non-empty list of non-empty strings")
        if len(value) > MAX_CHOICES:
            raise _bad(param, f"at most {MAX_CHOICES} choices")
        return constraints.choice_grammar(value), param
    return _cfg(value, param), param


def answer_grammar(req: ChatRequest | CompletionRequest) -> tuple[str | None, str]:
    """(the grammar of the request's answer or None, the field that asked for it)."""
    asked = [
        name
        for name in ("response_format", "json_schema", "grammar", "structured_outputs")
        if getattr(req, name) is not None
        and not (name == "response_format" and req.response_format == {"type": "text"})
    ]
    if len(asked) > 1:
        raise _bad(asked[1], f"at most one constraint a request ({' and '.join(asked)} given)")
    if not asked:
        return None, "response_format"
    name = asked[0]
    if name == "response_format":
        return response_grammar(req.response_format), name
    if name == "json_schema":
        return _schema(req.json_schema, name), name
    if name == "grammar":
        return _cfg(req.grammar, name), name
    if not isinstance(req.structured_outputs, Mapping):
        raise _bad(name, "must be an object")
    return structured_outputs_grammar(req.structured_outputs)


def checked(grammar: str, param: str) -> str:
    """`grammar` when llguidance compiles it, else a 400 naming `param` (also for a grammar
    past MAX_GRAMMAR_BYTES: compiling one costs seconds of a core, in the server and again in
    the engine, for any client)."""
    if len(grammar) > MAX_GRAMMAR_BYTES:
        raise _bad(param, f"the constraint's grammar is past {MAX_GRAMMAR_BYTES >> 10} KiB")
    try:
        constraints.check_grammar(grammar)
    except constraints.ConstraintError as e:
        raise _bad(param, f"cannot be used as a constraint: {e}") from None
    return grammar
