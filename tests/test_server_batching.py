"""The server on the real engine (the embedded default model: the trained one shipped in the
package) with continuous batching and prefix reuse. Oracles: each request run alone (through
the same server, and through `strata.LLM`'s single-slot loop); the token ids of the prompts
(from /tokenize) for the reused prefix."""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from server_harness import Server
from strata import modelgen
from strata.llm import LLM

PROMPTS = [
    "The cat sat on",
    "def main():\n    print(",
    "Once upon a time",
    "1, 2, 3, 4,",
    "Hello, my name is",
    "The capital of France",
    "import numpy as np\n",
    "Q: What is 2 + 2?\nA:",
]


def complete(srv: Server, prompt: str, n: int, **kw: Any) -> dict[str, Any]:
    model = srv.http.get("/v1/models").json()["data"][0]["id"]
    body = {"model": model, "prompt": prompt, "max_tokens": n, **kw}
    r = srv.http.post("/v1/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


def test_eight_concurrent_greedy_requests_each_return_what_they_return_alone() -> None:
    # one chunk per prompt and no reuse: alone and together differ only in what shares a step
    srv = Server(
        engine="llm",
        parallel=8,
        n_ctx=2048,  # 256 to each of the 8 sequences
        max_batch_tokens=256,
        cache_prompt=False,
    )
    try:
        alone = [complete(srv, p, 16, temperature=0)["choices"][0]["text"] for p in PROMPTS]
        with ThreadPoolExecutor(8) as ex:
            together = list(ex.map(lambda p: complete(srv, p, 16, temperature=0), PROMPTS))
        assert [r["choices"][0]["text"] for r in together] == alone
        # and the single-slot loop of strata.LLM agrees
        llm = LLM(modelgen.shipped_model_path())  # the model the server serves
        ids = [llm.generate_ids(llm.tokenizer.encode(p), 16, temperature=0) for p in PROMPTS]
        texts = [llm.tokenizer.decode([t for t, why in g if why != "stop"]) for g in ids]
        assert texts == alone
        # the steps really were shared: fewer steps than tokens
        m = srv.http.get("/metrics").text
        steps = float(re.search(r"^strata_engine_steps_total (\S+)$", m, re.M).group(1))  # type: ignore[union-attr]
        assert steps < 2 * 8 * 16
    finally:
        srv.stop()


def test_sampled_server_output_equals_llm_generate() -> None:
    settings = {"temperature": 0.9, "top_k": 20, "top_p": 0.9, "min_p": 0.02, "seed": 1234}
    srv = Server(engine="llm", parallel=2, n_ctx=512)
    try:
        got = [complete(srv, p, 12, **settings)["choices"][0]["text"] for p in PROMPTS[:3]]
    finally:
        srv.stop()
    llm = LLM(modelgen.shipped_model_path())  # the model the server serves
    want = ["".join(ev.text for ev in llm.generate(p, 12, **settings)) for p in PROMPTS[:3]]
    assert got == want


def test_prefix_reuse_reports_cached_tokens() -> None:
    srv = Server(engine="llm", parallel=1, n_ctx=256)
    try:
        a = "The history of the city goes back to the first settlers, who"
        b = a + " built a bridge over the river"

        def ids(text: str) -> list[int]:
            out: list[int] = srv.http.post("/tokenize", json={"prompt": text}).json()["tokens"]
            return out

        first = complete(srv, a, 1, temperature=0)["usage"]
        assert first["prompt_tokens_details"] == {"cached_tokens": 0}
        # the slot holds a's tokens (its one output was never fed)
        ia, ib = ids(a), ids(b)
        want = next(
            (i for i, (x, y) in enumerate(zip(ia, ib[:-1], strict=False)) if x != y), len(ia)
        )
        assert want > 5
        # llama-server's per-request cache_prompt false: the prompt runs from the start
        fresh = complete(srv, b, 1, temperature=0, cache_prompt=False)["usage"]
        assert fresh["prompt_tokens_details"] == {"cached_tokens": 0}
        again = complete(srv, a, 1, temperature=0)["usage"]  # reuses b's run: a ⊂ b
        assert again["prompt_tokens_details"] == {"cached_tokens": min(want, len(ia) - 1)}
        second = complete(srv, b, 4, temperature=0)["usage"]  # the slot holds a again
        assert second["prompt_tokens_details"] == {"cached_tokens": want}
        m = srv.http.get("/metrics").text
        cached = min(want, len(ia) - 1) + want
        assert f"strata_prompt_tokens_cached_total {float(cached)}" in m
        bad = srv.http.post("/v1/completions", json={"prompt": a, "cache_prompt": "no"})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "cache_prompt"
        # a choice the server ends at a stop string reports its cached tokens too (they come
        # with the engine's acknowledgement of the abort): the same request without the stop
        # string, run just before from the same slot state, is the oracle
        plain = complete(srv, b, 8, temperature=0)
        text = plain["choices"][0]["text"]
        assert len(text) >= 4 and plain["choices"][0]["finish_reason"] == "length"
        stop = text[1:3]  # met within the first tokens, well before the last
        cut = complete(srv, b, 8, temperature=0, stop=[stop])
        assert cut["choices"][0]["finish_reason"] == "stop"
        assert cut["choices"][0]["text"] == text[: text.index(stop)]
        # a stop string met wherever, the last token included, ends the choice as "stop"
        late = complete(srv, b, 8, temperature=0, stop=[text[-2:]])["choices"][0]
        assert late["finish_reason"] == "stop" and late["text"] == text[: text.index(text[-2:])]
        cached = plain["usage"]["prompt_tokens_details"]["cached_tokens"]
        assert cached > 5
        assert cut["usage"]["prompt_tokens_details"] == {"cached_tokens": cached}
        # several prompts: cached tokens add up over the prompts, as prompt_tokens does
        two = complete(srv, [b, b], 1, temperature=0)["usage"]
        assert two["prompt_tokens"] == 2 * len(ib)
        # one slot: each b in turn finds the b before it there, as `plain` did
        assert two["prompt_tokens_details"] == {"cached_tokens": 2 * cached}
        # off: every prompt from position 0
    finally:
        srv.stop()
    srv = Server(engine="llm", parallel=1, n_ctx=256, cache_prompt=False)
    try:
        complete(srv, a, 1, temperature=0)
        assert complete(srv, b, 1, temperature=0)["usage"]["prompt_tokens_details"] == {
            "cached_tokens": 0
        }
    finally:
        srv.stop()
