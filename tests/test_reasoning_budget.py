"""The reasoning budget (`strata.reasoning_budget`): the state machine of llama.cpp's
reasoning-budget sampler (common/reasoning-budget.cpp: idle → counting on the open tag, or at
once when the prompt opened the block → forcing the message and close tag when the budget is
spent, after the token that completes a UTF-8 character → done; the model's own close ends it
early; a new open tag re-arms), then the cap through `strata.LLM` (the unbudgeted greedy run
is the oracle for the tokens before the close) and through the server."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from server_harness import Server
from strata import modelgen
from strata.llm import LLM
from strata.reasoning_budget import BudgetProcessor, Chain, utf8_complete
from strata.sampling import ReasoningBudget, Sampler, SamplingParams

V = 16
OPEN, CLOSE, MSG, SPLIT = [1, 2], [3], [4], 9  # SPLIT: a token ending inside a character


def budget(n: int, opened: bool = False, forced: list[int] | None = None) -> BudgetProcessor:
    rb = ReasoningBudget(n, OPEN, CLOSE, forced or CLOSE, opened)
    return BudgetProcessor(rb, lambda t: t != SPLIT)


def allowed(p: Any) -> list[int]:
    row = np.zeros(V, dtype=np.float32)
    p(row)
    return [int(i) for i in np.flatnonzero(np.isfinite(row))]


def test_counting_starts_at_the_open_tag_and_forces_the_close() -> None:
    p = budget(2, forced=MSG + CLOSE)
    for t in (7, 1, 8, 1, 2):  # "1" alone is no open tag; then 1, 2 is
        assert len(allowed(p)) == V
        p.accept(t)
    for t in (5, 6):  # two reasoning tokens spend the budget
        assert len(allowed(p)) == V
        p.accept(t)
    assert allowed(p) == MSG
    p.accept(MSG[0])
    assert allowed(p) == CLOSE
    p.accept(CLOSE[0])
    assert len(allowed(p)) == V  # done
    for t in OPEN:  # a new block gets a fresh budget
        p.accept(t)
    p.accept(5)
    p.accept(5)
    assert allowed(p) == MSG


def test_opened_prompt_counts_from_the_first_token_and_zero_forces_at_once() -> None:
    p = budget(1, opened=True)
    assert len(allowed(p)) == V
    p.accept(5)
    assert allowed(p) == CLOSE
    assert allowed(budget(0, opened=True)) == CLOSE


def test_the_models_own_close_ends_the_count_and_a_split_character_is_finished() -> None:
    p = budget(2, opened=True)
    p.accept(5)
    p.accept(CLOSE[0])
    p.accept(6)
    p.accept(6)
    assert len(allowed(p)) == V  # closed by the model: nothing forced
    p = budget(1, opened=True)
    p.accept(SPLIT)  # the budget is spent on a token that ends inside a character
    assert len(allowed(p)) == V
    p.accept(SPLIT)
    assert len(allowed(p)) == V
    p.accept(5)  # the character is whole: now the close
    assert allowed(p) == CLOSE


def test_utf8_completeness_is_llama_cpps() -> None:
    é, euro = "é".encode(), "€".encode()
    assert utf8_complete(b"") and utf8_complete(b"ab") and utf8_complete(é) and utf8_complete(euro)
    assert not utf8_complete(é[:1]) and not utf8_complete(b"a" + euro[:2])
    assert not utf8_complete(euro[1:])  # continuation bytes alone: not whole


def test_chained_with_a_grammar_mask() -> None:
    class OnlyEven:
        def __call__(self, row: np.ndarray) -> None:
            row[1::2] = -np.inf

        def accept(self, token: int) -> None:
            pass

    c = Chain([budget(0, opened=True, forced=[4]), OnlyEven()])
    s = Sampler(SamplingParams(temperature=0), [], V, c)
    assert s.sample(np.arange(V, dtype=np.float32)).token == 4


def test_llm_generate_caps_the_block() -> None:
    """Greedy from a prompt that opened the block: the first 4 tokens are the unbudgeted run's,
    then the close tag."""
    llm = LLM(modelgen.shipped_model_path("default"))
    tok = llm.tokenizer
    ids = tok.encode("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n")
    close = tok.encode("</think>", parse_special=True)
    plain = [t for t, _ in llm.generate_ids(ids, max_tokens=12, stop_ids=[], temperature=0)]
    assert close[0] not in plain[:5]  # the model would go on thinking
    rb = ReasoningBudget(4, tok.encode("<think>", parse_special=True), close, close, True)
    out = llm.generate_ids(ids, max_tokens=12, stop_ids=[], temperature=0, reasoning_budget=rb)
    got = [t for t, _ in out]
    assert got[:4] == plain[:4] and got[4 : 4 + len(close)] == close


@pytest.fixture(scope="module")
def srv() -> Any:
    s = Server(engine="llm", parallel=1, n_ctx=512)
    yield s
    s.stop()


def test_server_request_and_default_budget(srv: Server) -> None:
    """`logit_bias` makes the model open a block at every step; the budget closes each after
    2 more tokens (re-armed by the next open tag)."""
    think = srv.http.post("/tokenize", json={"content": "<think>", "parse_special": True})
    tid = think.json()["tokens"][0]
    body = {
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 8,
        "temperature": 0,
        "logit_bias": {str(tid): 100},
        "reasoning_format": "none",
        "reasoning_budget_tokens": 2,
    }
    r = srv.http.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    text = r.json()["choices"][0]["message"]["content"]
    assert text == "<think><think><think></think>" * 2
    for n in (-2, 1 << 100):
        bad = srv.http.post("/v1/chat/completions", json={**body, "reasoning_budget_tokens": n})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "reasoning_budget_tokens"
    off = srv.http.post("/v1/chat/completions", json={**body, "reasoning_budget_tokens": -1})
    assert off.json()["choices"][0]["message"]["content"] == "<think>" * 8  # no server budget
    # the server's default (llama-server's --reasoning-budget), with a forced message
    del body["reasoning_budget_tokens"]
    s2 = Server(engine="llm", parallel=1, n_ctx=512, reasoning_budget=1,
                reasoning_budget_message=" ok")  # fmt: skip
    try:
        r = s2.http.post("/v1/chat/completions", json=body)
        assert r.json()["choices"][0]["message"]["content"] == "<think><think> ok</think>" * 2
        # -1 is the server's budget, as llama.cpp's; thinking_budget_tokens is its other name
        r = s2.http.post("/v1/chat/completions", json={**body, "reasoning_budget_tokens": -1})
        assert r.json()["choices"][0]["message"]["content"] == "<think><think> ok</think>" * 2
        r = s2.http.post("/v1/chat/completions", json={**body, "thinking_budget_tokens": 2})
        assert r.json()["choices"][0]["message"]["content"] == (
            "<think><think><think> ok</think>" + "<think>" * 3  # 8 tokens: the cut-off
        )
    finally:
        s2.stop()


def test_anthropic_budget_tokens_becomes_the_cap() -> None:
    import msgspec
    from strata.server.anthropic_types import MessagesRequest, to_chat_body

    req = msgspec.convert(
        {
            "model": "m",
            "max_tokens": 64,
            "messages": [{"role": "user", "content": "Hi"}],
            "thinking": {"type": "enabled", "budget_tokens": 16},
        },
        MessagesRequest,
    )
    body = to_chat_body(req)
    assert body["reasoning_budget_tokens"] == 16
    assert body["chat_template_kwargs"] == {"enable_thinking": True}


class CharTok:
    """A stand-in tokenizer: one token per character; `template` as the model's."""

    def __init__(self, template: str | None) -> None:
        self.chat_template = template

    def encode(self, text: str, special: bool) -> list[int]:
        return [ord(c) for c in text]


def budget_of(template: str | None, prompt: str, harmony: tuple[bool, str | None], **req: Any):  # type: ignore[no-untyped-def]
    from strata.config import Config
    from strata.reasoning import prompt_opens_reasoning
    from strata.server.chat import ChatSetup, reasoning_budget
    from strata.server.openai_types import ChatRequest

    setup = ChatSetup(prompt=prompt, grammar=None, reasoning_opened=prompt_opens_reasoning(prompt),
                      harmony=harmony)  # fmt: skip
    creq = ChatRequest(messages=[], **req)
    return reasoning_budget(creq, setup, CharTok(template), Config())  # type: ignore[arg-type]


def test_the_tags_are_the_templates_and_an_opened_prompt_spends_its_tail() -> None:
    """llama.cpp switches the budget on where the template thinks, with its tags: <think> in a
    Qwen3-like template, the analysis channel in harmony's (gpt-oss), none without; a prompt
    that opened the block spends the budget on its tokens after the open tag."""
    assert budget_of(None, "x", (False, None), reasoning_budget_tokens=5) is None
    assert budget_of("{{ x }}", "x", (False, None), reasoning_budget_tokens=5) is None
    rb = budget_of("...<think>...", "<|im_start|>assistant\n<think>\n", (False, None),
                   reasoning_budget_tokens=5)  # fmt: skip
    assert rb is not None and rb.opened and rb.budget == 4  # the "\n" after the tag: one
    assert rb.start == [ord(c) for c in "<think>"] and rb.forced == rb.end
    h = "<|start|>assistant<|channel|>analysis<|message|>"
    rb = budget_of("<|channel|> <|message|>", h, (True, "analysis"), thinking_budget_tokens=3)
    assert rb is not None and rb.opened and rb.budget == 3
    assert rb.start == [ord(c) for c in "<|channel|>analysis<|message|>"]
    assert rb.end == [ord(c) for c in "<|end|>"]
    assert budget_of("<|channel|> <|message|>", "<|start|>assistant", (True, None),
                     reasoning_budget_tokens=3).opened is False  # fmt: skip
