"""The OpenAI surface against a real uvicorn serving the fake engine, through the official client.

The oracle is the fake model's documented rule (strata.engine.backend.FakeBackend): greedy
decoding echoes the last run of plain text of the prompt (for a chat, the last message's
content) and then ends with EOS, so `finish_reason` is "stop"; fewer max_tokens cut it with
"length".
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterator

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from server_harness import Server

MODEL = "strata-fake"


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    s = Server(parallel=4, n_ctx=2048, max_top_logprobs=5)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(server: Server) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0) as c:
        yield c


def chat(client: openai.OpenAI, text: str, **kw: object) -> object:
    return client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": text}],
        temperature=0,
        **kw,  # type: ignore[arg-type]
    )


def test_models_and_health(server: Server, client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list().data] == [MODEL]
    assert client.models.retrieve(MODEL).id == MODEL
    assert server.http.get("/health").json() == {"status": "ok"}


def test_chat_non_stream_echo_and_usage(client: openai.OpenAI) -> None:
    r = chat(client, "hello world")
    c = r.choices[0]  # type: ignore[attr-defined]
    assert c.message.role == "assistant"
    assert c.message.content == "hello world"
    assert c.finish_reason == "stop"
    assert r.object == "chat.completion"  # type: ignore[attr-defined]
    u = r.usage  # type: ignore[attr-defined]
    # toy template: <|user|> hello world <|end|> <|assistant|> = 1 + 11 + 1 + 1 tokens; the
    # answer: 11 tokens, then the end-of-generation token, counted (llama-server, vLLM)
    assert (u.prompt_tokens, u.completion_tokens, u.total_tokens) == (14, 12, 26)
    # the answer sent back as the SDK dumps it (refusal, annotations, audio, function_call) is
    # a turn like any other; a refusal's text stands for what the assistant said
    back = c.message.model_dump()
    assert {"refusal", "annotations", "audio", "function_call"} <= set(back)
    msgs = [{"role": "user", "content": "hello world"}, back, {"role": "user", "content": "x"}]
    assert client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=2).choices
    refused = {"role": "assistant", "content": None, "refusal": "no"}
    plain = {"role": "assistant", "content": "no"}
    a, b = (
        client.chat.completions.create(model=MODEL, messages=[msgs[0], m, msgs[2]], max_tokens=1)
        for m in (refused, plain)
    )
    assert a.usage is not None and b.usage is not None
    assert a.usage.prompt_tokens == b.usage.prompt_tokens


def test_ignore_eos_runs_to_max_tokens(client: openai.OpenAI) -> None:
    # vLLM's / llama-server's extension: the fake model's EOS after the echo does not stop it
    r = chat(client, "hello world", max_tokens=20, extra_body={"ignore_eos": True})
    c = r.choices[0]  # type: ignore[attr-defined]
    assert (c.finish_reason, r.usage.completion_tokens) == ("length", 20)  # type: ignore[attr-defined]
    assert c.message.content.startswith("hello world")
    r = chat(client, "hello world", max_tokens=20)  # without it: stops at the EOS
    assert r.choices[0].finish_reason == "stop"  # type: ignore[attr-defined]


OPTS = {"include_usage": True, "include_obfuscation": False}  # the second: accepted, no effect


def test_chat_stream_shapes_utf8_and_include_usage(client: openai.OpenAI) -> None:
    text = "naïve café → 東京 🎉"  # 1- to 4-byte characters: no chunk may split one
    chunks = list(
        chat(client, text, stream=True, stream_options=OPTS)  # type: ignore[call-overload]
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    body = [c for c in chunks if c.choices]
    assert "".join(c.choices[0].delta.content or "" for c in body) == text
    assert all("\ufffd" not in (c.choices[0].delta.content or "") for c in body)
    assert body[-1].choices[0].finish_reason == "stop"
    assert [c.usage for c in chunks[:-1]] == [None] * (len(chunks) - 1)
    last = chunks[-1]
    assert last.choices == []
    assert last.usage.completion_tokens == len(text.encode()) + 1  # and the EOS
    assert last.object == "chat.completion.chunk"


def test_stream_ends_with_done(server: Server) -> None:
    body = {"model": MODEL, "prompt": "abc", "stream": True, "temperature": 0}
    with server.http.stream("POST", "/v1/completions", json=body) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        raw = b"".join(r.iter_bytes())
    events = raw.split(b"\n\n")
    assert events[-2] == b"data: [DONE]" and events[-1] == b""
    assert all(e.startswith(b"data: ") for e in events[:-1])


def test_max_tokens_length_and_max_completion_tokens(client: openai.OpenAI) -> None:
    r = chat(client, "abcdefgh", max_tokens=3)
    assert (r.choices[0].message.content, r.choices[0].finish_reason) == ("abc", "length")  # type: ignore[attr-defined]
    r = chat(client, "abcdefgh", max_tokens=2, max_completion_tokens=5)
    assert r.choices[0].message.content == "abcde"  # type: ignore[attr-defined]
    # absurdly large: clamped to what the context leaves; the echo still ends with "stop"
    r = chat(client, "xyz", max_tokens=10**12)
    assert (r.choices[0].message.content, r.choices[0].finish_reason) == ("xyz", "stop")  # type: ignore[attr-defined]


def test_completion_clamped_at_context_end(client: openai.OpenAI) -> None:
    prompt = "q" * 508  # 512 a sequence (n_ctx 2048 / 4): room for 4 output tokens
    r = client.completions.create(model=MODEL, prompt=prompt, temperature=0, max_tokens=100)
    assert (r.choices[0].text, r.choices[0].finish_reason) == ("qqqq", "length")


def test_stop_strings(client: openai.OpenAI) -> None:
    r = chat(client, "one, two, three", stop=[", t", "zzz"])
    assert (r.choices[0].message.content, r.choices[0].finish_reason) == ("one", "stop")  # type: ignore[attr-defined]
    chunks = list(chat(client, "alpha beta gamma", stop="a g", stream=True))  # type: ignore[call-overload]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "alpha bet"
    assert chunks[-1].choices[0].finish_reason == "stop"
    # more than OpenAI's 4, as llama-server and vLLM take (an editor's completion request)
    many = ["<fim_prefix>", "<fim_suffix>", "<fim_middle>", "\n\n", "```", "zzz", ", t"]
    r = chat(client, "one, two, three", stop=many)
    assert (r.choices[0].message.content, r.choices[0].finish_reason) == ("one", "stop")  # type: ignore[attr-defined]


def test_completions_batch_n_and_token_prompt(client: openai.OpenAI) -> None:
    r = client.completions.create(model=MODEL, prompt=["ab", "cde"], n=2, temperature=0)
    assert [(c.index, c.text) for c in r.choices] == [(0, "ab"), (1, "ab"), (2, "cde"), (3, "cde")]
    assert r.usage is not None and r.usage.prompt_tokens == 5
    r = client.completions.create(model=MODEL, prompt=[104, 105], temperature=0)
    assert r.choices[0].text == "hi"


def test_seed_reproducible_and_n_distinct(client: openai.OpenAI) -> None:
    def sample(seed: int, n: int = 1) -> list[str]:
        r = client.completions.create(
            model=MODEL,
            prompt="z" * 60,
            temperature=3.0,
            seed=seed,
            n=n,
            max_tokens=40,
            top_p=1.0,
            extra_body={"top_k": 0, "min_p": 0.0},  # no cuts: the echo target is not sure
        )
        return [c.text for c in r.choices]

    a, b = sample(7), sample(7)
    assert a == b
    assert sample(8) != a
    several = sample(7, n=3)
    assert several[0] == a[0]  # choice i uses seed + i
    assert len(set(several)) == 3


def test_chat_logprobs(client: openai.OpenAI) -> None:
    r = chat(client, "ok", logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content  # type: ignore[attr-defined]
    assert [t.token for t in content] == ["o", "k"]
    for t in content:
        assert t.bytes == list(t.token.encode())
        assert len(t.top_logprobs) == 3
        assert t.top_logprobs[0].token == t.token  # greedy picked the most likely
        assert t.top_logprobs[0].logprob == pytest.approx(t.logprob)
        lps = [x.logprob for x in t.top_logprobs]
        assert lps == sorted(lps, reverse=True)
        assert sum(math.exp(x) for x in lps) <= 1.0 + 1e-6


def test_completion_logprobs_stream(client: openai.OpenAI) -> None:
    chunks = list(
        client.completions.create(model=MODEL, prompt="xy", logprobs=2, temperature=0, stream=True)
    )
    toks = [t for c in chunks if c.choices[0].logprobs for t in c.choices[0].logprobs.tokens]
    assert toks == ["x", "y"]
    tops = [t for c in chunks if c.choices[0].logprobs for t in c.choices[0].logprobs.top_logprobs]
    assert all(len(t) == 2 for t in tops)


def test_async_client_stream_and_not(server: Server) -> None:
    async def go() -> None:
        async with openai.AsyncOpenAI(
            base_url=server.url + "/v1", api_key="none", max_retries=0
        ) as ac:
            r = await ac.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "async"}], temperature=0
            )
            assert r.choices[0].message.content == "async"
            streams = [
                await ac.completions.create(model=MODEL, prompt=f"p{i}", temperature=0, stream=True)
                for i in range(6)  # more than the 4 slots: some queue
            ]

            async def text(s: openai.AsyncStream) -> str:  # type: ignore[type-arg]
                return "".join([c.choices[0].text async for c in s])

            assert await asyncio.gather(*map(text, streams)) == [f"p{i}" for i in range(6)]

    asyncio.run(go())


def test_tokenize_detokenize(server: Server) -> None:
    r = server.http.post("/tokenize", json={"prompt": "hé"}).json()
    assert r["tokens"] == list("hé".encode()) and r["count"] == 3 and r["max_model_len"] == 512
    m = server.http.post("/tokenize", json={"messages": [{"role": "user", "content": "a"}]})
    assert m.json()["tokens"] == [258, 97, 260, 259]  # <|user|> a <|end|> <|assistant|>
    # llama-server's with_pieces: each token's text, or its bytes where not whole UTF-8
    p = server.http.post("/tokenize", json={"content": "hé", "with_pieces": True}).json()
    assert p["tokens"] == [
        {"id": 104, "piece": "h"},
        {"id": 195, "piece": [195]},
        {"id": 169, "piece": [169]},
    ]
    # parse_special (llama-server's, default true): special-token text becomes the special
    # token; off: plain text
    sp = server.http.post("/tokenize", json={"prompt": "<|user|>a"}).json()
    assert sp["tokens"] == [258, 97]
    plain = server.http.post("/tokenize", json={"prompt": "<|user|>a", "parse_special": False})
    assert plain.json()["tokens"] == list(b"<|user|>a")
    # a completion's prompt is read the same way (as llama-server and vLLM read it)
    c = server.http.post("/v1/completions", json={"prompt": "<|user|>a", "max_tokens": 1})
    assert c.json()["usage"]["prompt_tokens"] == 2
    d = server.http.post("/detokenize", json={"tokens": r["tokens"]}).json()
    assert d["prompt"] == "hé"
    bad = server.http.post("/detokenize", json={"tokens": [1, 99999]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tokens"


def test_status(server: Server) -> None:
    s = server.status()
    assert s["status"] == "ready"
    assert s["model"]["id"] == MODEL and (s["model"]["n_ctx"], s["model"]["n_ctx_seq"]) == (
        2048,
        512,
    )
    assert s["slots"]["parallel"] == 4
    assert s["engine"]["state"] == "ready" and s["engine"]["pid"] > 0
    assert s["settings"]["engine"] == "fake" and s["settings"]["api_key"] == ""
    assert "weights" in s["model"]


def test_metrics_prometheus_and_json(server: Server, client: openai.OpenAI) -> None:
    chat(client, "count me")
    text = server.http.get("/metrics").text
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    for name in (
        "strata_requests",
        "strata_prompt_tokens",
        "strata_generation_tokens",
        "strata_engine_restarts",
    ):
        assert fams[name].type == "counter", name
    assert fams["strata_time_to_first_token_seconds"].type == "histogram"
    assert fams["strata_inter_token_latency_seconds"].type == "histogram"
    assert fams["strata_requests_running"].type == "gauge"
    samples = {s.name: s.value for f in fams.values() for s in f.samples if not s.labels}
    assert samples["strata_generation_tokens_total"] >= len("count me")
    assert samples["strata_time_to_first_token_seconds_count"] >= 1
    assert samples["strata_engine_decode_steps_total"] >= 1  # the engine's own counters
    j = server.http.get("/metrics", headers={"accept": "application/json"}).json()
    assert set(j) >= {"live", "totals", "requests"}
    assert j["totals"]["drafts_offered"] == 0 and "drafts_accepted" in j["totals"]
    last = j["requests"][-1]
    assert last["drafts_offered"] is None and last["drafts_accepted"] is None
    assert last["output_tokens"] == len("count me") + 1 and last["finish_reason"] == "stop"
    # a request's time to first token is one sample, however many choices it has
    before = samples["strata_time_to_first_token_seconds_count"]
    r = client.completions.create(model=MODEL, prompt="three of us", n=3, max_tokens=4)
    assert len(r.choices) == 3
    fams = {f.name: f for f in text_string_to_metric_families(server.http.get("/metrics").text)}
    ttft = fams["strata_time_to_first_token_seconds"]
    count = next(s.value for s in ttft.samples if s.name.endswith("_count"))
    assert count == before + 1


def test_unknown_route_is_json(server: Server) -> None:
    r = server.http.get("/v1/nothing")
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
    r = server.http.get("/v1/chat/completions")
    assert r.status_code == 405


def test_health_503_while_loading() -> None:
    s = Server(wait_ready=False, fake_load_s=1.5)
    try:
        r = s.wait(lambda r: r.status_code == 503)
        assert r.json()["error"]["type"] == "unavailable_error"
        busy = s.http.post("/v1/completions", json={"model": MODEL, "prompt": "a"})
        assert busy.status_code == 503
        s.wait(lambda r: r.status_code == 200)
    finally:
        s.stop()


def test_raw_httpx_error_before_stream_is_plain(server: Server) -> None:
    body = {"model": MODEL, "prompt": "x" * 600, "stream": True}  # over n_ctx 512
    r = httpx.post(server.url + "/v1/completions", json=body)
    assert r.status_code == 400
    assert r.headers["content-type"].startswith("application/json")
    assert r.json()["error"]["code"] == "context_length_exceeded"


# llama.vscode's chat-edit request as it sends it to /v1/chat/completions (llama-server's
# sampling fields beside OpenAI's: every sampler Strata lacks at its "off" value)
LLAMA_VSCODE_CHAT = {
    "stream": False,
    "cache_prompt": True,
    "samplers": "edkypmxt",
    "temperature": 0.8,
    "dynatemp_range": 0,
    "dynatemp_exponent": 1,
    "top_k": 40,
    "top_p": 0.95,
    "min_p": 0.05,
    "typical_p": 1,
    "xtc_probability": 0,
    "xtc_threshold": 0.1,
    "repeat_last_n": 64,
    "repeat_penalty": 1,
    "presence_penalty": 0,
    "frequency_penalty": 0,
    "dry_multiplier": 0,
    "dry_base": 1.75,
    "dry_allowed_length": 2,
    "dry_penalty_last_n": -1,
    "max_tokens": -1,
    "timings_per_token": False,
}


def test_llama_server_sampling_fields_on_the_openai_routes(server: Server) -> None:
    msgs = [{"role": "user", "content": "hello"}]
    r = server.http.post("/v1/chat/completions", json={"messages": msgs, **LLAMA_VSCODE_CHAT})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["finish_reason"] in ("stop", "length")
    # the chain is honoured: temperature alone, at 0, is greedy whatever top_k says
    greedy = {"messages": msgs, "temperature": 0, "samplers": ["temperature"], "n_predict": 3}
    a = server.http.post("/v1/chat/completions", json={**greedy, "top_k": 1}).json()
    b = server.http.post("/v1/chat/completions", json=greedy).json()
    assert a["choices"][0]["message"] == b["choices"][0]["message"]
    assert b["usage"]["completion_tokens"] == 3  # n_predict: llama-server's max_tokens
    # a sampler that is off may stand anywhere in the chain (llama-server takes any order);
    # XTC's limits are soft there: clamped
    for ok in (
        {"samplers": "kpmst"},
        {"samplers": ["temperature", "xtc"]},
        {"samplers": ["top_k", "top_p", "typ_p", "temperature"]},
        {"xtc_threshold": 1.5, "xtc_probability": 2},
        {"typical_p": 0},
        {"dry_multiplier": 0.8, "dry_base": 0.9},  # llama-server takes its default base then
        {"mirostat": 2, "mirostat_tau": 4.0, "mirostat_eta": 0.2, "temperature": 0.7},
        {"mirostat": 1},
        {"samplers": ["top_k", "temperature", "adaptive_p"], "adaptive_target": 0.4},
        {"samplers": "kta", "adaptive_decay": 0.5},
    ):
        r = server.http.post("/v1/chat/completions", json={"messages": msgs, **ok})
        assert r.status_code == 200, (ok, r.text)
    for bad, param in (
        ({"typical_p": "x"}, "typical_p"),
        ({"xtc_threshold": "high"}, "xtc_threshold"),
        ({"mirostat": 3}, "mirostat"),  # 0, 1 or 2
        ({"adaptive_target": "near"}, "adaptive_target"),
        ({"samplers": ["top_p", "top_k"]}, "samplers"),
        ({"repeat_penalty": 1.1, "repetition_penalty": 1.1}, "repeat_penalty"),
        ({"max_tokens": -2}, "max_tokens"),
        ({"timings_per_token": True}, "timings_per_token"),
    ):
        r = server.http.post("/v1/chat/completions", json={"messages": msgs, **bad})
        assert r.status_code == 400 and r.json()["error"]["param"] == param, bad
