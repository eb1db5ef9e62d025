"""The harmony format of gpt-oss: channels parsed from the answer (`analysis` → reasoning,
the others → content), whole and streamed; the tokenizer's end-of-generation tokens and the
structure tokens it renders as text, against llama.cpp (llama-cpp-python, vocab_only) on a
vocabulary holding the o200k_harmony specials; the chat setup choosing the harmony parser."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import qwen3moe_file as qf
from strata import modelgen
from strata.modelgen import ModelSpec
from strata.server.assistant import split
from strata.server.chat import prepare_chat
from strata.server.harmony import HarmonyParser, is_harmony, open_channel
from strata.server.tokenizing import RealTokenizer
from strata.server.tools import ToolSpec
from strata.vocabgen import GGUFVocab

ANSWER = (
    "<|channel|>analysis<|message|>The user greets; answer briefly.<|end|>"
    "<|start|>assistant<|channel|>final<|message|>Hello! How can I help?"
)
HARMONY = ("<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|return|>",
           "<|call|>")  # fmt: skip
# A harmony template written for these tests (system/user turns, an assistant turn's final
# channel, the generation prompt `<|start|>assistant`).
TEMPLATE = (
    "{%- for m in messages %}"
    "{%- if m['role'] == 'assistant' %}"
    "{{- '<|start|>assistant<|channel|>final<|message|>' + m['content'] + '<|end|>' }}"
    "{%- else %}{{- '<|start|>' + m['role'] + '<|message|>' + m['content'] + '<|end|>' }}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start|>assistant' }}{%- endif %}"
)


def parse(text: str, step: int, opened: str | None = None) -> tuple[str, str]:
    p = HarmonyParser(opened)
    parts = []
    for i in range(0, len(text), step):
        parts += p.push(text[i : i + step])
    parts += p.finish()
    reasoning = "".join(v for k, v in parts if k == "reasoning")
    return reasoning, "".join(v for k, v in parts if k == "content")


@pytest.mark.parametrize("step", [1, 2, 3, 7, 1000])
def test_channels_split_whole_and_streamed(step: int) -> None:
    assert parse(ANSWER, step) == ("The user greets; answer briefly.", "Hello! How can I help?")
    tool = '<|channel|>commentary to=functions.f <|constrain|>json<|message|>{"a": 1}'
    assert parse(tool, step) == ("", '{"a": 1}')
    assert parse("plain text, no channels", step) == ("", "plain text, no channels")
    assert parse("<|channel|>analysis<|message|>unfinished", step) == ("unfinished", "")
    assert parse("<|channel|>final<|mess", step) == ("", "")  # an unfinished header
    # text after a message that is not one is content
    assert parse("more <|end|> after", step, opened="final") == ("", "more  after")


def test_open_channel_and_template_detection() -> None:
    assert open_channel("<|start|>assistant<|channel|>final<|message|>") == "final"
    assert open_channel("<|start|>assistant<|channel|>analysis<|message|>") == "analysis"
    assert open_channel("<|start|>assistant") is None
    assert is_harmony(TEMPLATE) and not is_harmony(qf.CHAT_TEMPLATE) and not is_harmony(None)


def harmony_vocab() -> GGUFVocab:
    """The tests' toy vocabulary with the o200k_harmony specials (CONTROL, as the converter
    writes them) in place of padding entries, and `TEMPLATE`."""
    v = qf.vocab_of(512)
    toks, types = list(v.tokens), list(v.token_types)
    pads = [i for i, t in enumerate(toks) if t.startswith("[PAD")]
    for i, s in zip(pads, HARMONY, strict=False):
        toks[i], types[i] = s, 3
    return dataclasses.replace(v, tokens=toks, token_types=types, chat_template=TEMPLATE)


@pytest.fixture(scope="module")
def vocab_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    v = harmony_vocab()
    spec = dataclasses.replace(ModelSpec.tiny(), n_vocab=len(v))
    return modelgen.write_vocab_only(tmp_path_factory.mktemp("harmony") / "v.gguf", v, spec)


def test_eog_and_rendered_tokens_as_llama_cpp(vocab_path: Path) -> None:
    """<|return|> and <|call|> end the generation and <|end|> does not (llama.cpp's
    o200k_harmony rule); the structure tokens are rendered as text where llama.cpp renders
    them without `special`."""
    import llama_cpp
    from test_tokenizer import llama_eog

    tok = RealTokenizer(harmony_vocab().metadata())
    ids = {s: tok.tok.token_id(s) for s in HARMONY}
    assert tok.eog_ids == llama_eog(vocab_path)
    assert {ids["<|return|>"], ids["<|call|>"]} <= tok.eog_ids
    assert ids["<|end|>"] not in tok.eog_ids
    m = llama_cpp.Llama(model_path=str(vocab_path), vocab_only=True, verbose=False)
    v = llama_cpp.llama_model_get_vocab(m._model.model)
    buf = (llama_cpp.ctypes.c_char * 64)()
    for s, i in ids.items():
        n = llama_cpp.llama_token_to_piece(v, i, buf, len(buf), 0, False)
        assert tok.decode([i]) == buf.raw[: max(n, 0)].decode(), s


def test_chat_setup_parses_harmony_channels() -> None:
    tok = RealTokenizer(harmony_vocab().metadata())
    msgs: list[dict[str, Any]] = [{"role": "user", "content": "hi"}]
    setup = prepare_chat(tok, msgs, [], "none", True, None, None, "parsed")
    assert setup.prompt == "<|start|>user<|message|>hi<|end|><|start|>assistant"
    assert setup.harmony == (True, None)
    m = split(setup.parser(), ANSWER)
    assert (m.reasoning, m.content) == (
        "The user greets; answer briefly.",
        "Hello! How can I help?",
    )
    raw = prepare_chat(tok, msgs, [], "none", True, None, None, "none")
    assert split(raw.parser(), ANSWER).content == ANSWER  # reasoning_format "none": as is


CALL = (
    "<|channel|>analysis<|message|>Need the weather.<|end|>"
    "<|start|>assistant<|channel|>commentary to=functions.weather <|constrain|>json"
    '<|message|>{"city": "Oslo"}'
)
TOOLS = {"weather": ToolSpec("weather", "", {"type": "object"})}


@pytest.mark.parametrize("step", [1, 5, 1000])
def test_calls_to_offered_tools(step: int) -> None:
    def run(text: str, tools: Any, incremental: bool = False) -> list[tuple[str, Any]]:
        p = HarmonyParser(None, tools, incremental)
        parts = [x for i in range(0, len(text), step) for x in p.push(text[i : i + step])]
        return parts + p.finish()

    parts = run(CALL, TOOLS)
    assert "".join(v for k, v in parts if k == "reasoning") == "Need the weather."
    calls = [v for k, v in parts if k == "call"]
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("weather", {"city": "Oslo"})]
    streamed = [k for k, _ in run(CALL, TOOLS, incremental=True) if k.startswith("call")]
    assert streamed == ["call_start", "call_args", "call"]
    body = '{"city": "Oslo"}'
    assert "".join(v for k, v in run(CALL, None) if k == "content") == body  # no tools offered
    other = CALL.replace("functions.weather", "functions.other")
    assert [k for k, _ in run(other, TOOLS)].count("call") == 0
    assert run(CALL.replace(body, "not json"), TOOLS)[-1] == ("content", "not json")
    # the recipient right after the prompt's `<|start|>assistant` (the template's own form)
    after_role = ' to=functions.weather<|channel|>commentary json<|message|>{"city": "Oslo"}'
    assert [k for k, _ in run(after_role, TOOLS)] == ["call"]


def test_chat_setup_with_tools_and_constraints() -> None:
    from strata.server.openai_types import APIError

    tok = RealTokenizer(harmony_vocab().metadata())
    msgs: list[dict[str, Any]] = [{"role": "user", "content": "weather in Oslo?"}]
    tools = list(TOOLS.values())
    setup = prepare_chat(tok, msgs, tools, "auto", True, None, None, "parsed")
    m = split(setup.parser(), CALL)
    assert [(c.name, c.arguments) for c in m.calls] == [("weather", '{"city": "Oslo"}')]
    assert m.content == ""
    city = {"type": "object", "properties": {"city": {"type": "string"}}}
    tools = [ToolSpec("weather", "", city)]
    forced = prepare_chat(tok, msgs, tools, "required", True, None, None, "parsed")
    assert forced.forced and forced.grammar is not None and _accepts(tok, forced.grammar, CALL)
    m = split(forced.parser(), CALL)
    assert [(c.name, c.arguments) for c in m.calls] == [("weather", '{"city": "Oslo"}')]
    answer = prepare_chat(tok, msgs, [], "none", True, "start: /x/", None, "parsed")
    assert answer.grammar is not None
    assert _accepts(tok, answer.grammar, "<|channel|>final<|message|>x")
    assert split(answer.parser(), "<|channel|>final<|message|>x").content == "x"
    with pytest.raises(APIError, match="response_format"):  # not both
        prepare_chat(tok, msgs, tools, "required", True, "start: /x/", None, "parsed")
    with pytest.raises(APIError, match="response_format"):  # a grammar that does not compile
        prepare_chat(tok, msgs, [], "none", True, "start: /x", None, "parsed")
    with pytest.raises(APIError, match="response_format: grammar has no start rule"):
        prepare_chat(tok, msgs, [], "none", True, 'answer: "x"', None, "parsed")


def _accepts(tok: RealTokenizer, grammar: str, text: str) -> bool:
    """Whether llguidance's matcher of `grammar` takes `text` (special-token text as the
    token) whole and then ends it at an end-of-generation token."""
    from strata import constraints

    m = constraints.compile_matcher(constraints.vocabulary_tokenizer(tok.tok), grammar)
    for t in tok.encode(text, special=True):
        if not m.consume_token(t):
            return False
    return bool(m.is_accepting()) and bool(m.consume_token(min(tok.eog_ids)))


SCHEMA = {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}
FINAL = '<|channel|>final<|message|>{"x": 7}'


def test_constrained_answer_grammar_follows_harmony_messages() -> None:
    """response_format: the final message's text is the schema's JSON; analysis messages
    before it are free; nothing else is."""
    from strata import constraints
    from strata.server.harmony import answer_grammar

    tok = RealTokenizer(harmony_vocab().metadata())
    g = answer_grammar(constraints.json_schema_grammar(SCHEMA), None)
    think = "<|channel|>analysis<|message|>a <| b {x}<|end|><|start|>assistant"
    assert _accepts(tok, g, FINAL)
    assert _accepts(tok, g, think + think + FINAL)
    assert _accepts(tok, g, '<|channel|>final <|constrain|>json<|message|>{"x": 7}')
    assert not _accepts(tok, g, '<|channel|>final<|message|>{"x": "7"}')  # the schema
    assert not _accepts(tok, g, "<|channel|>final<|message|>hello")
    assert not _accepts(tok, g, FINAL + "<|end|>")
    commentary = "<|channel|>commentary<|message|>x<|end|><|start|>assistant"
    assert not _accepts(tok, g, commentary + FINAL)
    assert not _accepts(tok, g, "<|channel|>analysis<|message|>thinking")  # no answer yet
    # the prompt left a channel open: its text first, or the answer itself
    opened = answer_grammar(constraints.json_schema_grammar(SCHEMA), "analysis")
    assert _accepts(tok, opened, "still thinking<|end|><|start|>assistant" + FINAL)
    assert not _accepts(tok, opened, FINAL)
    assert _accepts(
        tok, answer_grammar(constraints.json_schema_grammar(SCHEMA), "final"), '{"x": 1}'
    )
    # a request's own rules keep their names, `start` referenced inside it included
    for user, text in (
        ('start: answer\nanswer: "yes" | "no"', "yes"),
        ('start: "(" start? ")"', "(())"),
        ("start: TEXT\nTEXT: /[a-z]+/  // start", "start"),
        ('start: marks\nmarks: "start"', "start"),
    ):
        g = answer_grammar(user, None)
        assert _accepts(tok, g, "<|channel|>final<|message|>" + text), user
        assert not _accepts(tok, g, "<|channel|>final<|message|>" + text + ")"), user
    with pytest.raises(ValueError, match="no start rule"):
        answer_grammar('answer: "x"', None)


def test_forced_call_grammar_follows_harmony_messages() -> None:
    from strata.server.harmony import call_grammar

    tok = RealTokenizer(harmony_vocab().metadata())
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    tools = [ToolSpec("weather", "", schema), ToolSpec("time", "", {"type": "object"})]
    required, named = call_grammar(tools, "required"), call_grammar(tools, "time")
    after_role = ' to=functions.weather<|channel|>commentary json<|message|>{"city": "Oslo"}'
    for text in (CALL, after_role):
        assert _accepts(tok, required, text)
        assert not _accepts(tok, named, text)
    assert _accepts(tok, named, "<|channel|>commentary to=functions.time<|message|>{}")
    assert not _accepts(tok, required, CALL.replace('"Oslo"', "7"))  # the parameters' schema
    assert not _accepts(tok, required, CALL.replace('"city"', '"town"'))
    # a structure token is no text: a JSON string cannot end the message early
    assert not _accepts(tok, required, CALL.replace("Oslo", "Os<|end|>lo"))
    assert _accepts(tok, required, CALL.replace("Oslo", "Os<|lo"))
    assert not _accepts(tok, required, CALL.replace("weather", "other"))
    assert not _accepts(tok, required, "<|channel|>final<|message|>hello")  # no call
    preamble = "<|channel|>commentary<|message|>Checking.<|end|><|start|>assistant"
    assert _accepts(tok, required, preamble + CALL)
    with pytest.raises(ValueError, match="no tool named"):
        call_grammar(tools, "other")
    # the prompt left the analysis channel open: its text and end come first
    opened = call_grammar(tools, "required", opened="analysis")
    assert _accepts(tok, opened, "still thinking<|end|><|start|>assistant" + CALL)
    assert not _accepts(tok, opened, CALL)


def test_auto_calls_are_constrained_from_their_header() -> None:
    """tool_choice auto: free text until a header names `functions.…` (llama.cpp's gpt-oss
    triggers), then the call: its header replayed into the grammar from the anchor token on;
    `to=functions` inside a message's text triggers nothing."""
    from types import SimpleNamespace

    import msgspec
    from strata import constraints
    from strata.sampling import SamplingParams

    tok = RealTokenizer(harmony_vocab().metadata())
    msgs: list[dict[str, Any]] = [{"role": "user", "content": "weather in Oslo?"}]
    city = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    setup = prepare_chat(tok, msgs, [ToolSpec("weather", "", city)], "auto", True, None, None,
                         "parsed")  # fmt: skip
    assert setup.grammar is not None and setup.trigger is not None
    # as the engine gets it: the parameters through msgpack, the processor from the factory
    params = SamplingParams(grammar=setup.grammar, grammar_trigger=setup.trigger)
    params.validate()
    params = msgspec.msgpack.decode(msgspec.msgpack.encode(params), type=SamplingParams)
    factory = constraints.Constraints(lambda: tok.tok, tok.n_vocab, overlap=False)

    def run(text: str) -> tuple[bool, list[bool]]:
        """(engaged, whether each token was allowed by the mask before it)"""
        g = factory.for_request(SimpleNamespace(params=params))
        assert isinstance(g, constraints.HeaderGrammar)
        ok = []
        for t in tok.encode(text, special=True):
            logits = np.zeros(tok.n_vocab, dtype=np.float32)
            g(logits)
            ok.append(bool(np.isfinite(logits[t])))
            g.accept(t)
        return g.inner is not None, ok

    chatter = "<|channel|>analysis<|message|>I could say to=functions.x here<|end|>"
    engaged, ok = run(chatter + "<|start|>assistant<|channel|>final<|message|>Hi to=functions")
    assert not engaged and all(ok)
    for head in (
        '<|start|>assistant<|channel|>commentary to=functions.weather<|message|>{"city": "x"}',
        '<|start|>assistant to=functions.weather<|channel|>commentary<|message|>{"city": "x"}',
    ):
        engaged, ok = run(chatter + head)
        assert engaged and all(ok)
        bad = head.replace('"city"', '"town"')
        engaged, ok = run(chatter + bad)
        assert engaged and not all(ok)  # the mask refused the wrong key
    # right after the prompt's `<|start|>assistant` (armed from the start)
    assert run(' to=functions.weather<|channel|>commentary<|message|>{"city": "x"}')[0]
    # a function not offered: the call is held to the offered ones (as llama.cpp's grammar)
    engaged, ok = run("<|channel|>commentary to=functions.other<|message|>{}")
    assert engaged and not all(ok)
    # a header the grammar does not take (two blanks before the recipient): left free, and
    # the grammar untouched for the next header
    odd = "<|channel|>commentary  to=functions.other<|message|>{}"
    engaged, ok = run(odd)
    assert not engaged and all(ok)
    head = '<|start|>assistant<|channel|>commentary to=functions.weather<|message|>{"town": "x"}'
    engaged, ok = run(odd + "<|end|>" + head)
    assert engaged and not all(ok)
    # an answer without harmony messages: past a header's length nothing is held or searched
    g = factory.for_request(SimpleNamespace(params=params))
    assert isinstance(g, constraints.HeaderGrammar)
    for t in tok.encode("plain words " * 40, special=True):
        g.accept(t)
    assert g.held is None and g.inner is None
    # not a header that calls (the final channel)
    engaged, ok = run("<|channel|>final to=functions.other<|message|>{}")
    assert not engaged and all(ok)
