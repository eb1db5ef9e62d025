"""The server on the real engine with no model given (it serves the embedded default model, the
trained one shipped in the package): the official client's greedy completions equal
`strata.LLM`'s single-slot greedy loop on that file, token for token, over repeated requests,
with one slot and with two; /v1/status says what the model is."""

from __future__ import annotations

import openai
import pytest
from server_harness import Server
from strata import modelgen
from strata.llm import LLM

PROMPTS = ["The cat sat on", "def main():\n    print("]


def reference(llm: LLM, prompt: str, n: int) -> tuple[str, str]:
    """Greedy text and finish reason from the single-slot loop (stops at end-of-generation)."""
    ids = llm.tokenizer.encode(prompt)
    out: list[int] = []
    finish = "length"
    for t, reason in llm.generate_ids(ids, max_tokens=n, temperature=0.0):
        if reason == "stop":
            finish = "stop"
            break
        out.append(t)
    return llm.tokenizer.decode(out), finish


@pytest.mark.parametrize("parallel", [1, 2])
def test_greedy_matches_llm(parallel: int) -> None:
    llm = LLM(modelgen.shipped_model_path("default"))
    n = 12
    srv = Server(engine="llm", parallel=parallel, n_ctx=512)
    try:
        model_id = srv.http.get("/v1/models").json()["data"][0]["id"]
        status = srv.http.get("/v1/status").json()["model"]
        assert status["weights"] == modelgen.TRAINED_DEFAULT_WEIGHTS
        # n_ctx as llama.cpp's -c with -np: the context of every sequence together
        assert (status["n_ctx"], status["n_ctx_seq"]) == (512, 512 // parallel)
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0)
        for prompt in PROMPTS * 2:
            r = client.completions.create(
                model=model_id, prompt=prompt, max_tokens=n, temperature=0
            )
            text, finish = reference(llm, prompt, n)
            assert (r.choices[0].text, r.choices[0].finish_reason) == (text, finish)
    finally:
        srv.stop()


def test_n_ctx_0_is_the_training_context_shared_by_the_slots() -> None:
    """llama-server's `-c 0 -np 2`: the model's training context (its GGUF's context_length)
    for both slots together; /v1/status and /tokenize say what each sequence holds."""
    from strata.gguf import GGUFFile

    with GGUFFile(modelgen.shipped_model_path("default")) as g:
        train = int(g.metadata[f"{g.architecture}.context_length"])
    srv = Server(engine="llm", parallel=2, n_ctx=0)
    try:
        status = srv.http.get("/v1/status").json()["model"]
        assert (status["n_ctx"], status["n_ctx_seq"]) == (train, train // 2)
        tok = srv.http.post("/tokenize", json={"prompt": "hi"}).json()
        assert tok["max_model_len"] == train // 2
    finally:
        srv.stop()


def test_logit_bias_reaches_the_sampler() -> None:
    """OpenAI's `logit_bias` (the official client's dict) and llama-server's list form (a text,
    `false` to ban) give what `strata.LLM` gives with the same bias; bad ones are 400s."""
    llm = LLM(modelgen.shipped_model_path("default"))
    prompt, n = PROMPTS[1], 8
    ids = llm.tokenizer.encode(prompt)
    plain = [t for t, _ in llm.generate_ids(ids, max_tokens=n, stop_ids=[], temperature=0)]
    nl = llm.tokenizer.encode("\n")
    bias = {plain[0]: -100.0, nl[0]: float("-inf")}

    def ref(b: dict[int, float]) -> str:
        out = llm.generate_ids(ids, max_tokens=n, stop_ids=[], temperature=0, logit_bias=b)
        return llm.tokenizer.decode([t for t, _ in out])

    srv = Server(engine="llm", parallel=1, n_ctx=512)
    try:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0)
        want = ref(bias)
        assert want != llm.tokenizer.decode(plain)
        r = client.completions.create(
            model="strata-default",
            prompt=prompt,
            max_tokens=n,
            temperature=0,
            logit_bias={str(plain[0]): -100},
            extra_body={"ignore_eos": True},
        )
        assert r.choices[0].text == ref({plain[0]: -100.0})
        body = {"prompt": prompt, "max_tokens": n, "temperature": 0, "ignore_eos": True}
        r2 = srv.http.post(
            "/v1/completions", json={**body, "logit_bias": [[plain[0], -100], ["\n", False]]}
        )
        assert r2.status_code == 200 and r2.json()["choices"][0]["text"] == want
        for bad in ({"99999": 1}, {"1": 101}, {"1": "x"}, [1, 2], {"": 5}, {"-1": 5}):
            e = srv.http.post("/v1/completions", json={**body, "logit_bias": bad})
            assert e.status_code == 400 and e.json()["error"]["param"] == "logit_bias", bad
    finally:
        srv.stop()
