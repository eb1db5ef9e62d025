"""llama-server's own API on the real engine: `/infill` and `/completion` (prompts, answers,
streams, the line limits, `samplers`, `n_predict` 0, `response_fields`, `n_probs`), `/props`,
the unversioned aliases, and OpenAI's completion `suffix`. The model: a one-layer random model
with the real Qwen3 vocabulary (its FIM tokens). The infill prompt's layout is checked against
llama-server's own in tests/test_infill.py; here each answer is checked against the engine run
directly (`LLM`) on the prompt the route built."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from models import TestModels
from server_harness import Server
from strata.config import Config
from strata.errors import ConfigError
from strata.infill import infill_prompt
from strata.llm import LLM
from strata.modelgen import ModelSpec
from strata.server.line_limit import LineLimit

N_CTX = 4096


@pytest.fixture(scope="module")
def fim_model(test_models: TestModels) -> Path:
    spec = ModelSpec.micro(vocab="qwen3", n_embd=64, n_ff_exp=64)
    return TestModels(test_models.root, spec).f32()


@pytest.fixture(scope="module")
def srv(fim_model: Path) -> Iterator[Server]:
    s = Server(engine="llm", model=fim_model, parallel=2, n_ctx=2 * N_CTX)
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture(scope="module")
def llm(fim_model: Path) -> LLM:
    return LLM(fim_model, n_ctx=N_CTX, threads=1)


BODY = {
    "input_prefix": "def area(r):\n    ",
    "input_suffix": "\n\nprint(area(2))\n",
    "input_extra": [{"filename": "math_utils.py", "text": "PI = 3.14159\n"}],
    "prompt": "return",
    "n_predict": 12,
    "temperature": 0,
}


def expected_ids(llm: LLM) -> list[int]:
    tok = llm.tokenizer
    assert tok.fim is not None
    return infill_prompt(
        tok.fim,
        lambda s: tok.encode(s, parse_special=False),
        tok.encode(BODY["input_prefix"], parse_special=False),
        tok.encode(BODY["input_suffix"], parse_special=False),
        [("math_utils.py", "PI = 3.14159\n")],
        tok.encode("return"),
        n_ctx=N_CTX,
    )


def greedy(llm: LLM, ids: list[int], n: int) -> list[int]:
    return [t for t, _ in llm.generate_ids(ids, max_tokens=n, temperature=0)]


def events(r: Any) -> list[dict[str, Any]]:
    lines = [ln for ln in r.text.split("\n") if ln.startswith("data: ")]
    assert "data: [DONE]" not in lines  # llama-server's own stream has none
    return [json.loads(ln[6:]) for ln in lines]


def test_infill_answer_is_the_engines_on_llama_servers_prompt(srv: Server, llm: LLM) -> None:
    ids = expected_ids(llm)
    ref = greedy(llm, ids, 12)
    r = srv.http.post("/infill", json={**BODY, "return_tokens": True})
    assert r.status_code == 200, r.text
    a = r.json()
    assert a["prompt"] == llm.tokenizer.decode(ids, skip_special=False)
    assert a["prompt"].startswith("<|repo_name|>myproject\n<|file_sep|>math_utils.py\n")
    assert a["tokens_evaluated"] == len(ids)
    assert a["tokens"] == ref[: a["tokens_predicted"]]
    assert a["content"] == llm.tokenizer.decode(a["tokens"], skip_special=True)
    assert a["stop"] is True and a["stop_type"] in ("eos", "limit")
    assert (a["stop_type"] == "limit") == (a["tokens_predicted"] == 12)
    t = a["timings"]
    assert t["prompt_n"] + t["cache_n"] == len(ids) and t["predicted_n"] == a["tokens_predicted"]
    assert a["generation_settings"]["temperature"] == 0


def test_infill_stream_is_the_same_answer(srv: Server) -> None:
    whole = srv.http.post("/infill", json=BODY).json()
    r = srv.http.post("/infill", json={**BODY, "stream": True, "return_tokens": True})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    ev = events(r)
    assert [e["stop"] for e in ev] == [False] * (len(ev) - 1) + [True]
    assert "".join(e["content"] for e in ev) == whole["content"]
    assert sum(len(e["tokens"]) for e in ev[:-1]) == whole["tokens_predicted"]
    assert ev[-1]["stop_type"] == whole["stop_type"]
    assert ev[-1]["tokens_predicted"] == whole["tokens_predicted"]


def test_prompt_only_request_warms_the_cache(srv: Server) -> None:
    """`n_predict` 0 (editors send it to read files ahead): nothing generated, and the next
    request with that prompt reads it from the cache."""
    body = {**BODY, "input_prefix": "import os\n# warm " + "x" * 50 + "\n", "n_predict": 0}
    a = srv.http.post("/infill", json=body).json()
    assert a["content"] == "" and a["tokens_predicted"] == 0 and a["stop_type"] == "limit"
    assert a["generation_settings"]["n_predict"] == 0
    b = srv.http.post("/infill", json={**body, "n_predict": 4}).json()
    assert b["timings"]["cache_n"] >= a["tokens_evaluated"] - 1


def test_completion_route_fields(srv: Server, llm: LLM) -> None:
    tok = llm.tokenizer
    head = tok.encode("Once upon")
    ids = [*head, *tok.encode(" a time")]
    ref = greedy(llm, ids, 6)
    r = srv.http.post(
        "/completion",
        json={"prompt": [*head, " a time"], "n_predict": 6, "temperature": 0, "n_probs": 3},
    )
    assert r.status_code == 200, r.text
    a = r.json()
    assert a["tokens_evaluated"] == len(ids)
    assert [p["id"] for p in a["completion_probabilities"]] == ref
    for p in a["completion_probabilities"]:
        top = p["top_logprobs"]
        assert len(top) == 3 and top[0]["id"] == p["id"]  # greedy: the likeliest
        assert top[0]["logprob"] >= top[1]["logprob"] >= top[2]["logprob"]
    # response_fields: just these, nested ones by path
    r = srv.http.post(
        "/completions",
        json={
            "prompt": "Once upon a time",
            "n_predict": 2,
            "temperature": 0,
            "response_fields": ["content", "generation_settings/n_predict", "nope"],
        },
    )
    assert set(r.json()) == {"content", "generation_settings/n_predict"}
    assert r.json()["generation_settings/n_predict"] == 2


def test_several_prompts(srv: Server, llm: LLM) -> None:
    """An array of prompts (strings, or arrays of ids and strings) is several prompts, answered
    as an array in their order, each its `index` (llama-server's); streamed, each event names
    its prompt's index."""
    tok = llm.tokenizer
    texts = ["Once upon a time", "The quick brown fox", "def main():"]
    body = {"prompt": [texts[0], [*tok.encode("The quick"), " brown fox"], [texts[2]]]}
    body |= {"n_predict": 5, "temperature": 0, "return_tokens": True}
    r = srv.http.post("/completion", json=body)
    assert r.status_code == 200, r.text
    got = r.json()
    assert isinstance(got, list) and [a["index"] for a in got] == [0, 1, 2]
    for a, text in zip(got, texts, strict=True):
        ids = tok.encode(text)
        assert a["tokens_evaluated"] == len(ids) and a["tokens"] == greedy(llm, ids, 5)
    r = srv.http.post("/completion", json={**body, "stream": True})
    toks: dict[int, list[int]] = {0: [], 1: [], 2: []}
    ends = []
    for e in events(r):
        toks[e["index"]] += e["tokens"]
        if e["stop"]:
            ends.append(e["index"])
    assert sorted(ends) == [0, 1, 2]
    assert [toks[i] for i in range(3)] == [a["tokens"] for a in got]
    one = srv.http.post("/completion", json={**body, "prompt": [texts[0]]}).json()
    assert isinstance(one, dict) and one["tokens"] == got[0]["tokens"]  # one prompt: its object


def test_stop_word(srv: Server, llm: LLM) -> None:
    ids = llm.tokenizer.encode("Once upon a time")
    text = llm.tokenizer.decode(greedy(llm, ids, 16), skip_special=True)
    word = text[len(text) // 2 :][:3]
    assert word.strip()
    body = {"prompt": "Once upon a time", "n_predict": 16, "temperature": 0, "stop": [word]}
    a = srv.http.post("/completion", json={**body, "return_tokens": True}).json()
    assert a["stop_type"] == "word" and a["stopping_word"] == word
    assert a["content"] == text[: text.index(word)]
    # every generated token, the ones that completed the stop word included
    assert a["tokens"] == greedy(llm, ids, 16)[: a["tokens_predicted"]]
    ev = events(srv.http.post("/completion", json={**body, "stream": True, "return_tokens": True}))
    assert sum(len(e["tokens"]) for e in ev) == a["tokens_predicted"]
    # llama-server takes one stop string as well
    b = srv.http.post("/completion", json={**body, "stop": word}).json()
    assert b["content"] == a["content"]


def test_line_limit_rules() -> None:
    """llama-server's checks token by token (one piece a token): what its final content
    would be."""

    def run(pieces: list[str], n: int, t_max: float = 0.0, times: list[float] | None = None) -> str:
        lim, out = LineLimit(n, t_max), ""
        for i, p in enumerate(pieces):
            out += lim.feed(p, times[i] if times else 0.0)[0]
            if lim.stopped:
                return out
        return out + lim.flush()

    # the first line is never checked; a later line is checked at the token after the one
    # that moved the check onto it (a blank line, no indentation, included)
    assert run(["x = 1\n", "    y\n", "z", "\n"], 4) == "x = 1\n    y\n"
    assert run(["x = 1\n", "    y\n", "z\n"], 4) == "x = 1\n    y\nz\n"  # ended: unchecked
    assert run(["x\n", "  a\n", "\n", "  b"], 2) == "x\n  a\n"
    assert run(["a\n", "b"], 4) == "a\nb"
    assert run(["a\n", "b\n", "c"], 4) == "a\n"
    assert run(["a\n", "\tb\n", "\t"], 1) == "a\n\tb\n\t"
    # past the time limit, the next piece with a line break ends it (that piece kept)
    assert run(["a", "b\n", "c\n", "d"], 0, 1.0, [0.5, 1.5, 2.0, 2.1]) == "ab\n"
    assert run(["a", "b", "c\n", "d"], 0, 1.0, [0.1, 1.5, 2.0, 2.1]) == "abc\n"
    # text a check may still cut is held back until it passes
    lim = LineLimit(2, 0.0)
    assert lim.feed("a\n", 0)[0] == "a\n" and lim.feed("  b", 0)[0] == ""
    assert lim.feed("c", 0)[0] == "  bc" and lim.flush() == ""


def llama_server_cut(tokens: list[str], n_indent: int) -> tuple[str, bool]:
    """llama-server's `process_token` n_indent rule, token by token (its code's steps, with
    its names): the final content and whether the rule stopped it."""
    text, last_nl_pos, has_new_line = "", 0, False
    for piece in tokens:
        text += piece
        if has_new_line:
            if last_nl_pos > 0:
                pos, n = last_nl_pos, 0
                while pos < len(text) and text[pos] in " \t":
                    n, pos = n + 1, pos + 1
                if pos < len(text) and n < n_indent:
                    return text[:pos], True
            j = text.find("\n", last_nl_pos)
            if j >= 0:
                last_nl_pos = j + 1
        if "\n" in piece:
            has_new_line = True
    return text, False


def test_n_indent_through_the_route(srv: Server, llm: LLM) -> None:
    """The random model's answer as llama-server's rule cuts it, token by token; and the same
    streamed."""
    ids = expected_ids(llm)
    toks = greedy(llm, ids, 48)
    det = llm.tokenizer.detokenizer(skip_special=True)
    pieces = [det.feed(t) for t in toks if t not in llm.tokenizer.eog_ids]
    for n in (1, 2, 4, 8):
        want, cut = llama_server_cut(pieces, n)
        body = {**BODY, "n_predict": 48, "n_indent": n}
        a = srv.http.post("/infill", json=body).json()
        assert a["content"] == want, n
        assert (a["stop_type"] == "limit") == (cut or a["tokens_predicted"] == 48)
        ev = events(srv.http.post("/infill", json={**body, "stream": True}))
        assert "".join(e["content"] for e in ev) == want


def test_samplers(srv: Server, llm: LLM) -> None:
    """llama.vscode's chain (top_k, top_p, infill) as the engine runs it with those
    settings, seeded; bad chains are 400s naming `samplers`."""
    ids = expected_ids(llm)
    body = {**BODY, "temperature": 0.1, "top_k": 40, "top_p": 0.99, "seed": 5}
    chain = ["top_k", "top_p", "temperature", "infill"]
    a = srv.http.post("/infill", json={**body, "samplers": chain, "return_tokens": True}).json()
    params = dict(temperature=0.1, top_k=40, top_p=0.99, min_p=0.0, seed=5, infill=True)
    ref = [t for t, _ in llm.generate_ids(ids, max_tokens=12, **params)]
    assert a["tokens"] == [t for t in ref if t not in llm.tokenizer.eog_ids] and a["tokens"]
    assert a["generation_settings"]["samplers"][-1] == "infill"
    # llama.vscode's chain leaves temperature out (1): the random model's flat rows leave no
    # text candidate at p >= 0.2, and the infill stage ends the answer at once
    chain = ["top_k", "top_p", "infill"]
    a = srv.http.post("/infill", json={**body, "samplers": chain}).json()
    assert a["content"] == "" and a["stop_type"] == "eos"
    a = srv.http.post("/infill", json={**body, "samplers": chain[:2]}).json()
    assert a["tokens_predicted"] == 12  # without it: the whole answer
    for bad in (["top_p", "top_k"], ["top_k", "wat"], "kz", ["top_k", "top_k"]):
        r = srv.http.post("/infill", json={**body, "samplers": bad})
        assert r.status_code == 400 and r.json()["error"]["param"] == "samplers", bad
    # adaptive-p (named in the chain) draws as the engine's own sampler with those settings
    adapt = {"samplers": ["top_k", "temperature", "adaptive_p"], "adaptive_target": 0.3}
    a = srv.http.post("/infill", json={**body, **adapt, "return_tokens": True}).json()
    params = dict(
        temperature=0.1, top_k=40, top_p=1.0, min_p=0.0, seed=5, adaptive_p=True,
        adaptive_target=0.3,
    )  # fmt: skip
    ref = [t for t, _ in llm.generate_ids(ids, max_tokens=12, **params)]
    assert a["tokens"] == [t for t in ref if t not in llm.tokenizer.eog_ids]
    plain = {**params, "adaptive_p": False}
    assert ref != [t for t, _ in llm.generate_ids(ids, max_tokens=12, **plain)]  # it acts
    g = a["generation_settings"]
    assert g["samplers"][-1] == "adaptive_p" and g["adaptive_target"] == 0.3
    # llama.cpp's own names and letter codes of the samplers Strata lacks pass as no-ops
    r = srv.http.post("/infill", json={**body, "samplers": "edkypmxt", "typical_p": 1.0})
    assert r.status_code == 200, r.text


@pytest.mark.parametrize(
    "route, extra, param",
    [
        ("/infill", {"dry_multiplier": -1}, "dry_multiplier"),
        ("/infill", {"mirostat": 3}, "mirostat"),
        ("/infill", {"input_extra": [{"filename": "a"}]}, None),
        ("/infill", {"prompt": [1, 2]}, "prompt"),
        ("/infill", {"n_indent": -1}, "n_indent"),
        ("/infill", {"wat": 1}, "wat"),
        ("/infill", {"samplers": "k" * 65}, "samplers"),
        ("/infill", {"response_fields": ["content"] * 65}, "response_fields"),
        ("/completion", {"input_suffix": "x"}, "input_suffix"),
        ("/completion", {"prompt": [["a"], ["b", 10**9]]}, "prompt[1]"),
        ("/completion", {"prompt": [10**9]}, "prompt"),
        ("/completion", {"prompt": ["a", []]}, "prompt[1]"),  # an empty one of several
        ("/completion", {"prompt": ["a"] * 129}, "prompt"),
        ("/completion", {"n_predict": -5}, "n_predict"),
    ],
)
def test_bad_requests(srv: Server, route: str, extra: dict[str, Any], param: str | None) -> None:
    body = {**BODY, **extra} if route == "/infill" else {"prompt": "hi", **extra}
    r = srv.http.post(route, json=body)
    assert r.status_code == 400, r.text
    if param is not None:
        assert r.json()["error"]["param"] == param
    assert srv.http.post("/infill", json={**BODY, "n_predict": 1}).status_code == 200


def test_server_chain_is_a_requests_default(fim_model: Path, llm: LLM) -> None:
    """`--samplers` (the `samplers` setting): a request that names no chain runs the
    server's, the samplers it leaves out off (here top-k 40, top-p, min-p and the
    penalties: the draw is over the whole vocabulary); a request's own chain replaces it;
    /props shows it. A chain Strata cannot run is refused at start."""
    s = Server(engine="llm", model=fim_model, n_ctx=N_CTX, samplers="temperature")
    try:
        ids = expected_ids(llm)
        body = {**BODY, "temperature": 1.0, "seed": 5, "return_tokens": True}

        def want(**kw: Any) -> list[int]:
            out = llm.generate_ids(ids, max_tokens=12, temperature=1.0, seed=5, **kw)
            return [t for t, _ in out if t not in llm.tokenizer.eog_ids]

        whole = want(top_k=0, top_p=1.0, min_p=0.0, repetition_penalty=1.0)
        assert whole != want()  # the chain matters on this model
        a = s.http.post("/infill", json=body).json()
        assert a["tokens"] == whole
        own = ["penalties", "top_k", "top_p", "min_p", "temperature"]
        b = s.http.post("/infill", json={**body, "samplers": own}).json()
        assert b["tokens"] == want()
        props = s.http.get("/props").json()["default_generation_settings"]["params"]
        assert props["samplers"] == ["temperature"]
    finally:
        s.stop()
    with pytest.raises(ConfigError, match="samplers"):
        Config(samplers="top_k;wat")


def test_ignored_field_and_props_and_aliases(srv: Server) -> None:
    assert srv.http.post("/infill", json={**BODY, "t_max_prompt_ms": 500}).status_code == 200
    p = srv.http.get("/props").json()
    assert p["default_generation_settings"]["n_ctx"] == N_CTX
    assert p["total_slots"] == 2 and p["infill"] is True and p["eos_token"] == "<|im_end|>"
    assert srv.http.get("/models").json()["data"][0]["id"]
    assert srv.http.get("/v1/health").status_code == 200
    r = srv.http.post(
        "/chat/completions",
        json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
    )
    assert r.status_code == 200 and r.json()["object"] == "chat.completion"
    # the prompt the chat route runs, as its usage counts it
    msgs = [{"role": "user", "content": "hi"}]
    prompt = srv.http.post("/apply-template", json={"messages": msgs}).json()["prompt"]
    assert prompt.startswith("<|im_start|>user\nhi<|im_end|>")
    n = srv.http.post("/tokenize", json={"prompt": prompt, "parse_special": True}).json()["count"]
    assert r.json()["usage"]["prompt_tokens"] == n


def test_openai_suffix_is_fill_in_the_middle(srv: Server, llm: LLM) -> None:
    tok = llm.tokenizer
    assert tok.fim is not None
    ids = infill_prompt(
        tok.fim,
        lambda s: tok.encode(s, parse_special=False),
        tok.encode("def f(x):\n    ", parse_special=False),
        tok.encode("\n    return y\n", parse_special=False),
        [],
        [],
        n_ctx=N_CTX,
    )
    ref = tok.decode(greedy(llm, ids, 8), skip_special=True)
    r = srv.http.post(
        "/v1/completions",
        json={
            "prompt": "def f(x):\n    ",
            "suffix": "\n    return y\n",
            "max_tokens": 8,
            "temperature": 0,
        },
    )
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"] == ref
    assert r.json()["usage"]["prompt_tokens"] == len(ids)


def test_models_without_fim_tokens_refuse_infill() -> None:
    s = Server(engine="llm", n_ctx=512)  # the embedded default: a small trained vocabulary
    try:
        r = s.http.post("/infill", json=BODY)
        assert r.status_code == 400 and "fill-in-the-middle" in r.json()["error"]["message"]
        r = s.http.post("/v1/completions", json={"prompt": "a", "suffix": "b", "max_tokens": 2})
        assert r.status_code == 400 and r.json()["error"]["param"] == "suffix"
        r = s.http.post("/v1/completions", json={"prompt": "a", "suffix": "", "max_tokens": 2})
        assert r.status_code == 200  # an empty suffix is none
    finally:
        s.stop()


def test_chat_template_file_replaces_the_models(tmp_path: Path) -> None:
    """llama-server's --chat-template-file: chats render with the file's template; a file
    that does not compile keeps the server from loading, saying why."""
    f = tmp_path / "t.jinja"
    f.write_text(
        "{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}\n{% endfor %}[assistant]"
    )
    s = Server(engine="llm", n_ctx=512, chat_template_file=f)
    try:
        msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
        r = s.http.post("/apply-template", json={"messages": msgs})
        assert r.json()["prompt"] == "[system]be brief\n[user]hi\n[assistant]"
    finally:
        s.stop()
    f.write_text("{% for m in messages %}")
    s = Server(wait_ready=False, engine="llm", n_ctx=512, chat_template_file=f)
    try:
        r = s.wait(lambda r: r.status_code == 503 and "failed" in r.text)
        assert "chat_template_file" in r.text
    finally:
        s.stop()
