"""Tool-call parsing and rendering (strata.server.tools), reasoning splitting
(strata.reasoning, strata.server.assistant) and grammar constraints (strata.constraints).

Oracles: the texts below are written in each family's documented format (Qwen's Hermes-style
`<tool_call>` JSON, Qwen3-Coder's XML); constrained outputs are checked with `jsonschema`
(an independent validator), sampled from random logits so every branch of the grammar is hit.
"""

from __future__ import annotations

import json
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import jsonschema
import numpy as np
import pytest
from strata import constraints, toytok
from strata.reasoning import ReasoningParser, prompt_opens_reasoning
from strata.sampling import Sampler, SamplingParams
from strata.server import tools as T
from strata.server.assistant import AssistantParser, split
from strata.tokenizer import Tokenizer

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 12},
                "unit": {"type": "string", "enum": ["c", "f"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
            },
            "required": ["city", "days"],
        },
    },
}
NOTE = {
    "type": "function",
    "function": {
        "name": "note",
        "parameters": {
            "type": "object",
            "properties": {"ok": {"type": "boolean"}},
            "required": ["ok"],
        },
    },
}
SPECS = [T.ToolSpec.from_openai(WEATHER), T.ToolSpec.from_openai(NOTE)]


def stream(parser: AssistantParser, text: str, step: int) -> list[Any]:
    parts = []
    for i in range(0, len(text), step):
        parts += parser.push(text[i : i + step])
    parts += parser.finish()
    return parts


def joined(parts: list[Any]) -> tuple[str, str, list[tuple[str, Any]]]:
    r = "".join(v for k, v in parts if k == "reasoning")
    c = "".join(v for k, v in parts if k == "content")
    calls = [(v.name, json.loads(v.arguments)) for k, v in parts if k == "call"]
    return r, c, calls


HERMES_TEXT = (
    "<think>\nThe user wants weather.\n</think>\n\nLet me check.\n"
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n'
    "</tool_call>\n"
    '<tool_call>\n{"name": "note", "arguments": {"ok": true}}\n</tool_call>'
)
CODER_TEXT = (
    "Let me check.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nNew York\n"
    "</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>"
)


@pytest.mark.parametrize("step", [1, 2, 5, 13, 10_000])
def test_hermes_stream_equals_whole(step: int) -> None:
    p = AssistantParser.make(True, False, T.HERMES, SPECS)
    r, c, calls = joined(stream(p, HERMES_TEXT, step))
    assert r == "The user wants weather.\n"
    assert c == "Let me check."
    assert calls == [("get_weather", {"city": "Paris", "days": 2}), ("note", {"ok": True})]


@pytest.mark.parametrize("step", [1, 3, 10_000])
def test_qwen3_coder_xml(step: int) -> None:
    p = AssistantParser.make(False, False, T.QWEN3_CODER, SPECS)
    r, c, calls = joined(stream(p, CODER_TEXT, step))
    # the string parameter stays text, the integer one is JSON
    assert (r, c, calls) == (
        "",
        "Let me check.",
        [("get_weather", {"city": "New York", "days": 3})],
    )


def incremental(fmt: T.ToolFormat, text: str, step: int, **kw: Any) -> list[Any]:
    p = AssistantParser.make(False, False, fmt, SPECS, incremental=True, **kw)
    return stream(p, text, step)


ARGS_FIRST = '<tool_call>\n{"arguments": {"ok": false}, "name": "note"}\n</tool_call>'


@pytest.mark.parametrize("step", [1, 4, 10_000])
@pytest.mark.parametrize(
    ("fmt", "text"),
    [(T.HERMES, HERMES_TEXT), (T.QWEN3_CODER, CODER_TEXT), (T.HERMES, ARGS_FIRST)],
    ids=["hermes", "qwen3_coder", "hermes-args-first"],
)
def test_incremental_calls(fmt: T.ToolFormat, text: str, step: int) -> None:
    """Streamed calls: start (id, name), argument pieces that join into the final arguments
    (those of the whole-text parse), then the end; for one-character steps the arguments
    begin before the block closes."""
    parts = incremental(fmt, text, step)
    whole = split(AssistantParser.make(False, False, fmt, SPECS), text)
    calls, pieces, current = [], [], None
    for kind, v in parts:
        if kind == "call_start":
            assert current is None and v.arguments == ""
            current, pieces = v, []
        elif kind == "call_args":
            pieces.append(v)
        elif kind == "call":
            assert current is not None and v.id == current.id
            assert "".join(pieces) == v.arguments
            calls.append((v.name, json.loads(v.arguments)))
            current = None
    assert calls == [(c.name, json.loads(c.arguments)) for c in whole.calls]
    if step == 1 and text is not ARGS_FIRST:
        first_args = next(i for i, p in enumerate(parts) if p[0] == "call_args")
        first_end = next(i for i, p in enumerate(parts) if p[0] == "call")
        assert first_end - first_args > 3  # several pieces, not one at the close


def test_malformed_block_is_content_and_parallel_off() -> None:
    bad = '<tool_call>\n{"name": broken}\n</tool_call>'
    assert split(AssistantParser.make(False, False, T.HERMES, SPECS), bad).content == bad
    m = split(AssistantParser.make(True, False, T.HERMES, SPECS, parallel=False), HERMES_TEXT)
    assert [c.name for c in m.calls] == ["get_weather"]


@pytest.mark.parametrize("incremental", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize(
    ("fmt", "cut", "name", "args"),
    [
        (
            T.HERMES,
            '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par',
            "get_weather",
            '{"city": "Par',
        ),
        (T.QWEN3_CODER, "<tool_call>\n<function=note>\n<parameter=ok>\ntr", "note", None),
        (T.HERMES, '<tool_call>\n{"na', None, None),
    ],
)
def test_a_forced_call_cut_off_is_never_content(
    fmt: T.ToolFormat, cut: str, name: str | None, args: str | None, incremental: bool
) -> None:
    """tool_choice required or named: a call cut off (max_tokens) where it does not parse
    ends as a call with the arguments written so far once its name is known, else nothing;
    with tool_choice auto the cut text stays content (llama-server's rule)."""
    forced = AssistantParser.make(False, False, fmt, SPECS, True, incremental, forced=True)
    parts = stream(forced, cut, 3)
    assert [v for k, v in parts if k == "content"] == []
    calls = [v for k, v in parts if k == "call"]
    assert [c.name for c in calls] == ([name] if name else [])
    scanned = fmt.scan(cut, {s.name: s for s in SPECS})
    if name:
        assert scanned is not None and calls[0].arguments == scanned[1]
        if args is not None:
            assert calls[0].arguments == args
    free = AssistantParser.make(False, False, fmt, SPECS, True, incremental)
    free_parts = stream(free, cut, 3)
    if not incremental:
        assert "".join(v for k, v in free_parts if k == "content") == cut


def test_no_tool_parsing_and_no_reasoning_parsing() -> None:
    m = split(AssistantParser.make(False, False, None, []), HERMES_TEXT)
    assert (m.reasoning, m.content, m.calls) == ("", HERMES_TEXT, [])


def test_reasoning_opened_by_prompt_and_not_at_start() -> None:
    assert prompt_opens_reasoning("<|im_start|>assistant\n<think>\n")
    assert not prompt_opens_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    p = ReasoningParser(opened=True)
    assert p.push("plan</think>\n\nanswer") + p.finish() == [
        ("reasoning", "plan"),
        ("content", "answer"),
    ]
    p = ReasoningParser()
    text = "answer <think>not reasoning</think>"
    assert "".join(v for _, v in p.push(text) + p.finish()) == text


def test_tool_spec_errors_name_the_field() -> None:
    with pytest.raises(ValueError, match=r"^tools\[0\]\.function\.name"):
        T.ToolSpec.from_openai({"type": "function", "function": {"name": "bad name"}}, "tools[0]")
    with pytest.raises(ValueError, match=r"^tools\.type"):
        T.ToolSpec.from_openai({"type": "retrieval"})
    with pytest.raises(ValueError, match=r"^tools\.function\.strictly"):
        T.ToolSpec.from_openai({"type": "function", "function": {"name": "a", "strictly": 1}})


def test_template_polyfill_and_native() -> None:
    msgs = [
        {"role": "user", "content": "weather?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": "c1", "name": "note", "arguments": '{"ok": true}'}],
        },
        {"role": "tool", "content": "done", "tool_call_id": "c1"},
    ]
    # a template that never reads `tools`: tools go to a system message, calls into content
    out = T.template_messages(msgs, SPECS, "{{ messages }}", T.HERMES)
    assert out[0]["role"] == "system" and '"name": "get_weather"' in out[0]["content"]
    assert out[2]["content"] == T.HERMES.render("note", {"ok": True})
    assert out[3] == {"role": "user", "content": "<tool_response>\ndone\n</tool_response>"}
    # a template that reads them gets HF's shapes (arguments as an object)
    out = T.template_messages(msgs, SPECS, "{{ tools }}", T.HERMES)
    assert out[1]["tool_calls"][0]["function"] == {"name": "note", "arguments": {"ok": True}}
    assert out[2]["tool_call_id"] == "c1"
    with pytest.raises(ValueError, match=r"messages\[0\]\.tool_calls\[0\]"):
        bad = [{**msgs[1], "tool_calls": [{"id": "x", "name": "n", "arguments": "[1]"}]}]
        T.template_messages(bad, SPECS, "", T.HERMES)
    assert T.format_for("...<function=...") is T.QWEN3_CODER
    assert T.format_for("<tool_call>") is T.HERMES


def _sample_constrained(grammar: str, seed: int, n: int = 400, lead: bytes = b"") -> str:
    """Random logits (temperature 1) through the grammar's mask on the toy vocabulary; the
    first tokens strongly prefer the bytes of `lead`."""
    vocab = toytok.Vocabulary()
    c = constraints.Constraints(lambda: vocab, toytok.N_VOCAB, overlap=seed % 2 == 0)
    proc = c.processor(grammar)
    s = Sampler(SamplingParams(seed=seed), [1], toytok.N_VOCAB, proc)
    rng = np.random.default_rng(seed)
    out: list[int] = []
    for _ in range(n):
        x = rng.standard_normal(toytok.N_VOCAB).astype(np.float32)
        if len(out) < len(lead):
            x[lead[len(out)]] += 30.0
        t = s.sample(x).token
        if t in toytok.EOG_IDS:
            break
        out.append(t)
    else:
        raise AssertionError("the grammar never ended")
    assert proc.error is None
    return bytes(out).decode()


@pytest.mark.parametrize("bad", ["abc", [1], 1.7, -1, True])
def test_xml_string_lengths_must_be_integers(bad: object) -> None:
    """A string parameter's bounds become the XML grammar's repetition counts: anything but a
    non-negative integer is a ValueError (the chat route's 400), never cast or a crash."""
    for key in ("minLength", "maxLength"):
        spec = {"type": "function", "function": {"name": "f", "parameters": {
            "type": "object", "properties": {"s": {"type": "string", key: bad}}}}}  # fmt: skip
        with pytest.raises(ValueError, match=key):
            T.call_grammar(T.QWEN3_CODER, [T.ToolSpec.from_openai(spec)], "f", parallel=False)


@pytest.mark.parametrize("fmt", [T.HERMES, T.QWEN3_CODER, T.GLM45], ids=lambda f: f.name)
@pytest.mark.parametrize("seed", range(4))
def test_forced_calls_are_schema_valid(fmt: T.ToolFormat, seed: int) -> None:
    choice = "required" if seed % 2 else "get_weather"
    g = T.call_grammar(fmt, SPECS, choice, parallel=False)
    constraints.check_grammar(g)
    text = _sample_constrained(g, seed)
    m = split(AssistantParser.make(False, False, fmt, SPECS), text)
    assert m.content == "" and len(m.calls) == 1, text
    call = m.calls[0]
    spec = {s.name: s for s in SPECS}[call.name]
    jsonschema.validate(json.loads(call.arguments), spec.parameters)
    if choice != "required":
        assert call.name == choice


@pytest.mark.parametrize("seed", range(3))
def test_json_schema_and_reasoning_prefix(seed: int) -> None:
    schema = {
        "type": "object",
        "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99}},
        "required": ["n"],
        "additionalProperties": False,
    }
    g = constraints.with_reasoning(constraints.json_schema_grammar(schema), "open")
    constraints.check_grammar(g)
    text = _sample_constrained(g, seed, lead=b"hmm</think>\n")
    m = split(AssistantParser.make(True, True, None, []), text)
    assert m.reasoning == "hmm"
    jsonschema.validate(json.loads(m.content), schema)


def test_bad_grammar_is_a_constraint_error() -> None:
    with pytest.raises(constraints.ConstraintError):
        constraints.check_grammar(constraints.json_schema_grammar({"type": "no-such-type"}))


GOLDENS = Path(__file__).parent / "data" / "chat_templates.json"  # HF transformers renders


def _as_api(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Golden messages in the shape the routes hand over (`chat_messages`): calls with their
    arguments as JSON text, as the OpenAI API sends them."""
    out = []
    for i, m in enumerate(messages):
        d = dict(m)
        if "tool_calls" in m:
            d["tool_calls"] = [
                {
                    "id": f"call_{i}_{j}",
                    "name": c["function"]["name"],
                    "arguments": c["function"]["arguments"]
                    if isinstance(c["function"]["arguments"], str)
                    else json.dumps(c["function"]["arguments"], ensure_ascii=False),
                }
                for j, c in enumerate(m["tool_calls"])
            ]
        out.append(d)
    return out


@pytest.mark.parametrize(
    "case",
    [c for c in json.loads(GOLDENS.read_text())["cases"] if c["template"] == "qwen3"],
    ids=lambda c: "+".join(m["role"] for m in c["messages"]),
)
def test_native_template_matches_transformers(case: dict[str, Any]) -> None:
    """Qwen3's own template (it reads `tools`): what the server renders from API-shaped
    messages equals HF transformers' rendering of the same conversation."""
    from strata.vocabgen import qwen3_tokenizer_dir

    cfg = json.loads((qwen3_tokenizer_dir() / "tokenizer_config.json").read_text())
    template = cfg["chat_template"]
    tok = Tokenizer(["a"], [1], [], bos_id=None, eos_id=None, chat_template=template)
    specs = [T.ToolSpec.from_openai(t) for t in case.get("tools") or []]
    msgs = T.template_messages(_as_api(case["messages"]), specs, template, T.HERMES)
    kw = dict(case.get("kwargs") or {})
    if specs:
        kw["tools"] = [s.openai() for s in specs]
    got = tok.apply_chat_template(msgs, add_generation_prompt=case["add_generation_prompt"], **kw)
    assert got == case["expected"]


def test_mask_application_matches_the_allowed_set() -> None:
    """The processor's in-place masking (the compiled `apply_token_bitmask`) equals masking
    by `allowed()`, the bits unpacked by numpy, at every step: forced tokens and open text."""
    vocab = toytok.Vocabulary()
    c = constraints.Constraints(lambda: vocab, toytok.N_VOCAB, overlap=False)
    proc = c.processor(T.call_grammar(T.HERMES, SPECS, "note", parallel=False))
    rng = np.random.default_rng(0)
    singles = 0
    for _ in range(200):
        x = rng.standard_normal(toytok.N_VOCAB).astype(np.float32)
        ok = proc.allowed()
        singles += int(ok.sum() == 1)
        want = np.where(ok, x, -np.inf)
        proc(x)
        assert np.array_equal(x, want)
        t = int(np.argmax(x))
        if t in toytok.EOG_IDS:
            break
        proc.accept(t)
    assert singles > 5  # masks that allow a single token were among them


STREAM_EQ_CASES = [
    # two functions in one block: two calls, each with its own parameters
    (T.QWEN3_CODER, "<tool_call>\n<function=note>\n<parameter=ok>\ntrue\n</parameter>\n"
     "</function>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
     "</function>\n</tool_call>"),
    # arguments written as a JSON string, or followed by another key
    (T.HERMES, '<tool_call>\n{"name": "note", "arguments": "{\\"ok\\": true}"}\n</tool_call>'),
    (T.HERMES, '<tool_call>\n{"name": "note", "arguments": {"ok": true}, "id": "x"}\n</tool_call>'),
    # a bare tag naming no offered tool is prose
    (T.QWEN3_CODER, "In XML mode write <function=NAME> followed by parameters."),
    # the close tag quoted inside a JSON string does not end the block
    (T.HERMES, '<tool_call>\n{"name": "get_weather", "arguments": {"city": "a</tool_call>b"}}'
     "\n</tool_call>"),
    # GLM-4.5's calls (its template's format), two in a row after some text
    (T.GLM45, "Let me check.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n"
     "<arg_value>New York</arg_value>\n<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n"
     "</tool_call>\n<tool_call>note\n<arg_key>ok</arg_key>\n<arg_value>true</arg_value>\n"
     "</tool_call>"),
]  # fmt: skip


@pytest.mark.parametrize(("fmt", "text"), STREAM_EQ_CASES)
def test_streamed_calls_are_the_whole_texts(fmt: T.ToolFormat, text: str) -> None:
    """Fed one character at a time, the calls (names, arguments joined from their pieces) and
    the content are the whole text's; every call's arguments are a JSON object."""
    whole = split(AssistantParser.make(False, False, fmt, SPECS), text)
    parts = stream(AssistantParser.make(False, False, fmt, SPECS, True, True), text, 1)
    _, content, calls = joined(parts)  # the arguments parsed: each must be JSON
    assert calls == [(c.name, json.loads(c.arguments)) for c in whole.calls]
    assert content == whole.content
    assert all(isinstance(a, dict) for _, a in calls)


def test_xml_parameters_typed_as_the_schema_says() -> None:
    """Optional[str] (a union with string) stays text; a boolean written True is true."""
    props = {
        "s": {"anyOf": [{"type": "string"}, {"type": "null"}]},
        "t": {"type": ["string", "null"]},
        "b": {"type": "boolean"},
        "n": {"type": "integer"},
    }
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in
                   (("s", "12345"), ("t", "true"), ("b", "True"), ("n", "7")))  # fmt: skip
    assert json.loads(T._xml_args(body, props) + "}") == {"s": "12345", "t": "true", "b": True,
                                                          "n": 7}  # fmt: skip
    assert "%json" not in T._xml_value_rule(props["s"], "X")[0]  # the grammar writes it raw


def test_harmony_calls_are_parsed_with_reasoning_format_none() -> None:
    text = ("<|channel|>analysis<|message|>think<|end|><|start|>assistant<|channel|>commentary "
            'to=functions.note <|constrain|>json<|message|>{"ok": true}')  # fmt: skip
    m = split(AssistantParser.make(False, False, T.HERMES, SPECS, harmony=(True, None)), text)
    assert [(c.name, json.loads(c.arguments)) for c in m.calls] == [("note", {"ok": True})]
    assert "think" in m.content and m.reasoning == ""


def test_glm_calls_parse_as_its_template_writes_them() -> None:
    """GLM-4.5's template teaches `<tool_call>name` + `<arg_key>`/`<arg_value>` pairs (string
    values raw, others JSON): `format_for` picks the format from it; a call parses to typed
    arguments and renders back to the same text."""
    template = "{{ tc.name }}<arg_key>{{ k }}</arg_key><arg_value>{{ v }}</arg_value>"
    assert T.format_for(template) is T.GLM45
    text = T.GLM45.render("get_weather", {"city": "New York", "days": 3})
    m = split(AssistantParser.make(False, False, T.GLM45, SPECS), text)
    assert [(c.name, json.loads(c.arguments)) for c in m.calls] == [
        ("get_weather", {"city": "New York", "days": 3})
    ]
    assert m.content == ""


def test_a_quoted_close_tag_stays_in_the_value() -> None:
    args = '{"city": "a</tool_call>b"}'
    text = f'<tool_call>\n{{"name": "get_weather", "arguments": {args}}}\n</tool_call>'
    m = split(AssistantParser.make(False, False, T.HERMES, SPECS), text)
    assert [json.loads(c.arguments) for c in m.calls] == [{"city": "a</tool_call>b"}]
    assert m.content == ""


@pytest.mark.parametrize("opened", [False, True])
def test_lazy_grammar_waits_for_its_trigger_outside_thinking(opened: bool) -> None:
    """tool_choice auto's constraint (llama.cpp's lazy grammar): no mask until the trigger
    token is sampled outside a thinking block, then the grammar's, which starts with it."""
    from strata.sampling import GrammarTrigger

    vocab = toytok.Vocabulary()
    c = constraints.Constraints(lambda: vocab, toytok.N_VOCAB, overlap=False)

    def lazy_of(trigger: GrammarTrigger) -> constraints.LazyGrammar:
        inner: Future[constraints.GrammarProcessor] = Future()
        inner.set_result(c.processor('start: "@" /[0-9]{3}/ "!"'))
        return constraints.LazyGrammar(inner, trigger, c.blank)

    lazy = lazy_of(GrammarTrigger([ord("@")], [ord("[")], [ord("]")], opened))

    def allowed() -> set[int]:
        return allowed_of(lazy)

    every = set(range(toytok.N_VOCAB))
    # each '@' here is inside a thinking block: one the prompt opened, or one the answer
    # opens before anything but blanks (as the answer's parser takes them)
    lead = b"a@b]c" if opened else b" [@b]c"
    for t in lead:
        assert allowed() == every
        lazy.accept(t)
    assert allowed() == every
    lazy.accept(ord("@"))
    assert allowed() == set(b"0123456789")
    for t in b"123":
        lazy.accept(t)
    assert allowed() == {ord("!")}
    # a '[' after the answer began opens no thinking block: the '@' after it is a call
    lazy = lazy_of(GrammarTrigger([ord("@")], [ord("[")], [ord("]")], False))
    for t in b"x [":
        lazy.accept(t)
    lazy.accept(ord("@"))
    assert allowed_of(lazy) == set(b"0123456789")
    # with no thinking tokens (reasoning_format none) a '@' anywhere is a call
    lazy = lazy_of(GrammarTrigger([ord("@")]))
    for t in b"[":
        lazy.accept(t)
    lazy.accept(ord("@"))
    assert allowed_of(lazy) == set(b"0123456789")
    # a grammar that fails to compile leaves the call free, the request running
    failed: Future[constraints.GrammarProcessor] = Future()
    failed.set_exception(constraints.ConstraintError("too big"))
    lazy = constraints.LazyGrammar(failed, GrammarTrigger([ord("@")]), c.blank)
    lazy.accept(ord("@"))
    assert allowed_of(lazy) == every


def allowed_of(proc: Any) -> set[int]:
    x = np.zeros(toytok.N_VOCAB, dtype=np.float32)
    proc(x)
    return {i for i in range(toytok.N_VOCAB) if np.isfinite(x[i])}


def nested_schema(depth: int, i: int) -> dict[str, Any]:
    if depth == 0:
        leaf = {"type": "string", "maxLength": 32}
        return {"type": "object", "properties": {f"leaf{i}": leaf}, "required": [f"leaf{i}"]}
    return {
        "type": "object",
        "properties": {
            f"child_{depth}_{i}": nested_schema(depth - 1, i),
            "items": {"type": "array", "items": nested_schema(depth - 1, i + 1), "maxItems": 4},
            "opt": {"anyOf": [{"type": "number"}, {"type": "null"}, nested_schema(depth - 1, i)]},
        },
        "required": [f"child_{depth}_{i}"],
    }


def test_lazy_calls_past_the_grammar_cap_stay_unconstrained() -> None:
    """tool_choice auto with tools whose call grammar is past the cap a forced choice is
    refused at (its compile would cost the engine seconds, or fail there): no lazy grammar,
    the calls left to the model; a small set gets one, waiting for the `<tool_call>` token."""
    from strata.gguf import GGUFFile
    from strata.modelgen import shipped_model_path
    from strata.server.chat import lazy_calls
    from strata.server.structured import MAX_GRAMMAR_BYTES
    from strata.server.tokenizing import RealTokenizer

    with GGUFFile(shipped_model_path("default")) as f:
        tok = RealTokenizer(dict(f.metadata))
    many = [
        T.ToolSpec.from_openai(
            {"type": "function", "function": {"name": f"t{k}", "parameters": nested_schema(3, k)}}
        )
        for k in range(100)
    ]
    assert len(T.call_grammar(T.HERMES, many, "required", True)) > MAX_GRAMMAR_BYTES
    assert lazy_calls(tok, T.HERMES, many, True, False) == (None, None)
    grammar, trigger = lazy_calls(tok, T.HERMES, SPECS, True, False)
    assert grammar is not None and trigger is not None
    assert trigger.tokens == tok.encode("<tool_call>", True) and len(trigger.tokens) == 1
    # reasoning_format none: the parser takes no thinking apart, so none waits the trigger
    assert lazy_calls(tok, T.HERMES, SPECS, True, False, thinking=False)[1].think == []  # type: ignore[union-attr]


@pytest.mark.parametrize("parallel", [False, True])
def test_a_line_break_after_the_calls_may_end_the_answer(parallel: bool) -> None:
    """The lazy grammar's calls (tool_choice auto) may be followed by a line break and the
    end: a model that ends its answer so is not pushed into another call."""
    vocab = toytok.Vocabulary()
    c = constraints.Constraints(lambda: vocab, toytok.N_VOCAB, overlap=False)
    for trailing in (False, True):
        g = T.call_grammar(T.HERMES, SPECS, "required", parallel, trailing_break=trailing)
        proc = c.processor(g)
        call = '<tool_call>\n{"name": "note", "arguments": {"ok": true}}\n</tool_call>'
        for t in call.encode():
            proc.accept(t)
        assert allowed_of(proc) & toytok.EOG_IDS  # the end, right after the call
        if not (parallel or trailing):
            assert ord("\n") not in allowed_of(proc)
            continue
        proc.accept(ord("\n"))
        assert proc.error is None
        assert bool(allowed_of(proc) & toytok.EOG_IDS) == trailing  # else: another call
