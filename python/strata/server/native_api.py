"""llama-server's own API, for the tools written against it (editors' code completion above
all): `POST /completion` (and `/completions`), `POST /infill` (fill-in-the-middle between a
prefix and a suffix, with other files as context), `GET /props`.

Requests are llama-server's fields (`n_predict`, `repeat_penalty`, `n_probs`, `samplers`,
`n_indent`, `t_max_predict_ms`, `return_tokens`, `response_fields`, ...), translated into the
OpenAI completion request the rest of the server runs; answers are llama-server's objects
(`content`, `stop_type`, `stopping_word`, `tokens_predicted`, `timings`, ...), streamed as
`data: {...}` events without a `[DONE]`.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import AsyncIterator
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from strata import __version__
from strata.engine.client import DeadlineExceeded, EngineError, Unavailable
from strata.sampling import SamplingParams
from strata.sampling_chain import ORDER, sampler_names
from strata.server import sse
from strata.server.chat import openai_chat
from strata.server.generate import Delta, SeqRun, TokenInfo, merge
from strata.server.openai_types import (
    MAX_LIST,
    APIError,
    ChatRequest,
    CompletionRequest,
    Plan,
    SamplingRequest,
    _Strict,
    check_off,
    convert,
    plan_common,
)
from strata.server.routes import (
    _state,
    bias,
    encode,
    engine_error,
    fim_prompt,
    outcome_of,
    read_json,
    submit,
    until_done_or_gone,
)
from strata.server.state import ServerState
from strata.server.structured import answer_grammar, checked
from strata.server.tokenizing import ServerTokenizer

# accepted and without effect, as in llama-server (which reads it and does nothing with it)
_IGNORED = frozenset({"t_max_prompt_ms"})
MAX_EXTRA = 256  # input_extra chunks of one infill request


class InfillChunk(_Strict, kw_only=True):
    text: str
    filename: str = "tmp"  # llama-server's name for a chunk without one


class NativeRequest(SamplingRequest, kw_only=True):
    prompt: Any = None  # a string, token ids, or ids and strings mixed
    input_prefix: str | None = None  # /infill only
    input_suffix: str | None = None
    input_extra: list[InfillChunk] | None = None
    n_probs: int | None = None
    return_tokens: bool | None = None
    response_fields: list[str] | None = None
    n_indent: int | None = None
    t_max_predict_ms: int | None = None
    n_cmpl: int | None = None


# the shared fields the OpenAI request takes as they are (the limit is worked out here;
# timings_per_token is answered here)
_PASSED = tuple(
    f
    for f in SamplingRequest.__struct_fields__
    if f not in ("model", "max_tokens", "n_predict", "timings_per_token")
)


def native_plan(
    req: NativeRequest,
    tok: ServerTokenizer,
    max_top: int,
    defaults: SamplingParams,
    chain: list[str] | str | None = None,
) -> tuple[Plan, bool]:
    """The request's plan (sampling, limits, stops) and whether it asks for the prompt only
    (`n_predict` 0: the prompt is read, cached, and nothing is generated)."""
    check_off(req, frozenset({"timings_per_token"}))
    if req.n_cmpl not in (None, 1):
        raise APIError(400, "n_cmpl: only 1 is supported", param="n_cmpl")
    if req.response_fields is not None and len(req.response_fields) > MAX_LIST:
        raise APIError(400, f"response_fields: at most {MAX_LIST}", param="response_fields")
    n_predict = req.n_predict if req.n_predict is not None else req.max_tokens
    if n_predict is not None and n_predict < -1:
        name = "n_predict" if req.n_predict is not None else "max_tokens"
        raise APIError(400, f"{name}: must be -1 (to the context's end), 0 or more", param=name)
    prompt_only = n_predict == 0
    n_probs = req.n_probs or 0
    if n_probs < 0:
        raise APIError(400, "n_probs: must be at least 0", param="n_probs")
    for name in ("n_indent", "t_max_predict_ms"):
        v = getattr(req, name)
        if v is not None and not 0 <= v < 1 << 31:
            raise APIError(400, f"{name}: must be in 0..2^31-1", param=name)
    oai = CompletionRequest(
        prompt=None,
        max_tokens=1 if prompt_only else (n_predict if n_predict and n_predict > 0 else None),
        **{f: getattr(req, f) for f in _PASSED},
    )
    plan = plan_common(oai, n_probs > 0, n_probs, max_top, defaults, chain)
    bias(plan, oai, tok)
    plan.n_indent = req.n_indent or 0
    plan.t_max_predict_ms = req.t_max_predict_ms or 0
    return plan, prompt_only


async def _grammar(plan: Plan, req: NativeRequest) -> None:
    grammar, param = answer_grammar(
        CompletionRequest(prompt=None, json_schema=req.json_schema, grammar=req.grammar)
    )
    if grammar is not None:  # compiled on a worker thread, as the other routes do
        grammar = await asyncio.to_thread(checked, grammar, param)
        plan.params = msgspec.structs.replace(plan.params, grammar=grammar)


async def prompts_of(tok: ServerTokenizer, prompt: Any, param: str = "prompt") -> list[list[int]]:
    """llama-server's prompts: one (a string, or an array of token ids and strings), or an
    array of such, each its own prompt (answered as an array, in order)."""
    if isinstance(prompt, list) and prompt and all(isinstance(x, (str, list)) for x in prompt):
        if len(prompt) > MAX_LIST:
            raise APIError(400, f"{param}: at most {MAX_LIST} prompts", param=param)
        return [await mixed_prompt(tok, x, f"{param}[{i}]") for i, x in enumerate(prompt)]
    return [await mixed_prompt(tok, prompt, param)]


async def mixed_prompt(tok: ServerTokenizer, prompt: Any, param: str = "prompt") -> list[int]:
    """llama-server's single prompt: a string, or an array of token ids and strings (each
    string tokenized with special tokens parsed, the ids kept)."""
    if isinstance(prompt, str):
        return tok.with_bos(await encode(tok, prompt, True))
    if isinstance(prompt, list):
        ids: list[int] = []
        for j, x in enumerate(prompt):
            if isinstance(x, str):
                part = await encode(tok, x, True)
                ids += tok.with_bos(part) if j == 0 else part  # llama-server: BOS before text
            elif isinstance(x, int) and not isinstance(x, bool) and 0 <= x < tok.n_vocab:
                ids.append(x)
            else:
                raise APIError(
                    400,
                    f"{param}: a prompt is a string, or token ids (0..{tok.n_vocab - 1}) and "
                    "strings",
                    param=param,
                )
        return ids
    raise APIError(400, f"{param}: must be a string or an array of ids and strings", param=param)


async def _received(request: Request) -> tuple[ServerState, NativeRequest, float]:
    """The server's state and the request's body, checked against the served model."""
    t0 = time.monotonic()
    st = _state(request)
    req: NativeRequest = convert(await read_json(request), NativeRequest, _IGNORED, {})
    st.check_model(req.model)
    return st, req, t0


async def completion(request: Request) -> Response | sse.SSEResponse:
    st, req, t0 = await _received(request)
    _, tok = st.ready()
    for name in ("input_prefix", "input_suffix", "input_extra"):
        if getattr(req, name) is not None:
            raise APIError(400, f"{name}: only for /infill", param=name)
    if req.prompt is None:
        raise APIError(400, "prompt: required", param="prompt")
    plan, prompt_only = native_plan(req, tok, st.config.max_top_logprobs, st.defaults, st.chain)
    await _grammar(plan, req)
    prompts = await prompts_of(tok, req.prompt)
    return await _run(request, st, tok, "completion", req, plan, prompt_only, prompts, t0)


async def infill(request: Request) -> Response | sse.SSEResponse:
    st, req, t0 = await _received(request)
    client, tok = st.ready()
    if req.input_prefix is None or req.input_suffix is None:
        param = "input_prefix" if req.input_prefix is None else "input_suffix"
        raise APIError(400, f"{param}: required", param=param)
    extra = req.input_extra or []
    if len(extra) > MAX_EXTRA:
        raise APIError(400, f"input_extra: at most {MAX_EXTRA} chunks", param="input_extra")
    if req.prompt is not None and not isinstance(req.prompt, str):
        raise APIError(400, "prompt: must be a string", param="prompt")
    plan, prompt_only = native_plan(req, tok, st.config.max_top_logprobs, st.defaults, st.chain)
    await _grammar(plan, req)
    prefix = await encode(tok, req.input_prefix or "", False)
    suffix = await encode(tok, req.input_suffix or "", False)
    typed = await encode(tok, req.prompt or "", True)
    chunks = [(c.filename, c.text) for c in extra]
    ids = await fim_prompt(st, client, tok, prefix, suffix, chunks, typed, "input_prefix")
    return await _run(request, st, tok, "infill", req, plan, prompt_only, [ids], t0)


class _Native:
    """Builds llama-server's answer objects for one request (one per prompt: a delta's
    `index` is its prompt's)."""

    def __init__(
        self,
        st: ServerState,
        tok: ServerTokenizer,
        req: NativeRequest,
        plan: Plan,
        prompts: list[list[int]],
        t0: float,
        prompt_only: bool,
    ) -> None:
        self.st, self.tok, self.req, self.plan = st, tok, req, plan
        self.prompts, self.t0, self.prompt_only = prompts, t0, prompt_only
        # per prompt: every generated id (return_tokens, the count), text (has_new_line)
        self.tokens: list[list[int]] = [[] for _ in prompts]
        self.text = ["" for _ in prompts]

    def take(self, d: Delta) -> Delta:
        """Books a delta of the answer (a prompt-only request's one token is not part of it)."""
        if self.prompt_only:
            d.text, d.tokens, d.ids = "", [], []
        self.tokens[d.index] += d.ids
        self.text[d.index] += d.text
        return d

    def probs(self, toks: list[TokenInfo]) -> list[dict[str, Any]]:
        return [
            {
                "id": t.id,
                "token": t.text,
                "bytes": t.bytes,
                "logprob": t.logprob,
                "top_logprobs": [
                    {"id": i, "token": s, "bytes": b, "logprob": lp}
                    for i, (s, b, lp) in zip(t.top_ids, t.top, strict=True)
                ],
            }
            for t in toks
        ]

    def timings(self, d: Delta, n_out: int, final: bool) -> dict[str, Any]:
        cached = d.cached_tokens if final else 0
        pn = len(self.prompts[d.index]) - cached
        pms = (d.prompt_s if final else 0.0) * 1000
        gms = (d.decode_s if final else time.monotonic() - self.t0) * 1000
        out = {
            "cache_n": cached,
            "prompt_n": pn,
            "prompt_ms": pms,
            "prompt_per_token_ms": pms / pn if pn else 0.0,
            "prompt_per_second": 1000 * pn / pms if pms else 0.0,
            "predicted_n": n_out,
            "predicted_ms": gms,
            "predicted_per_token_ms": gms / n_out if n_out else 0.0,
            "predicted_per_second": 1000 * n_out / gms if gms else 0.0,
        }
        if final and d.drafts is not None:
            out["draft_n"], out["draft_n_accepted"] = d.drafts
        return out

    def settings(self) -> dict[str, Any]:
        p = self.plan.params
        return {
            "n_predict": (
                0
                if self.prompt_only
                else self.plan.max_tokens
                if self.plan.max_tokens is not None
                else self.st.config.n_predict
            ),
            "seed": p.seed if p.seed is not None else -1,
            "temperature": p.temperature,
            "top_k": p.top_k,
            "top_p": p.top_p,
            "min_p": p.min_p,
            "repeat_last_n": p.repeat_last_n,
            "repeat_penalty": p.repetition_penalty,
            "presence_penalty": p.presence_penalty,
            "frequency_penalty": p.frequency_penalty,
            "n_probs": self.plan.top_logprobs if self.plan.logprobs else 0,
            "ignore_eos": self.plan.ignore_eos,
            "stop": self.plan.stops,
            "stream": self.plan.stream,
            "n_indent": self.plan.n_indent,
            "t_max_predict_ms": self.plan.t_max_predict_ms,
            "samplers": [n for n in ORDER if n != "infill" or p.infill]
            + (["adaptive_p"] if p.adaptive_p else []),
            "typical_p": p.typical_p,
            "xtc_probability": p.xtc_probability,
            "xtc_threshold": p.xtc_threshold,
            "top_n_sigma": p.top_n_sigma,
            "dry_multiplier": p.dry_multiplier,
            "dry_base": p.dry_base,
            "dry_allowed_length": p.dry_allowed_length,
            "dry_penalty_last_n": p.dry_penalty_last_n,
            "mirostat": p.mirostat,
            "mirostat_tau": p.mirostat_tau,
            "mirostat_eta": p.mirostat_eta,
            "adaptive_target": p.adaptive_target,
            "adaptive_decay": p.adaptive_decay,
            "grammar": p.grammar or "",
        }

    def partial(self, d: Delta) -> dict[str, Any]:
        n_out = len(self.tokens[d.index])
        out: dict[str, Any] = {
            "index": d.index,
            "content": d.text,
            "tokens": d.ids if self.req.return_tokens else [],
            "stop": False,
            "id_slot": -1,
            "tokens_predicted": n_out,
            "tokens_evaluated": len(self.prompts[d.index]),
        }
        if self.plan.logprobs and d.tokens:
            out["completion_probabilities"] = self.probs(d.tokens)
        if self.req.timings_per_token:
            out["timings"] = self.timings(d, n_out, False)
        return out

    def final(self, d: Delta, content: str, toks: list[TokenInfo]) -> dict[str, Any]:
        i, n_out = d.index, 0 if self.prompt_only else d.output_tokens
        prompt = self.prompts[i]
        if d.finish == "length" or self.prompt_only:
            stop_type = "limit"
        elif d.stop is not None:
            stop_type = "word"
        else:
            stop_type = "eos"
        out: dict[str, Any] = {
            "index": i,
            "content": content,
            # streamed: the tokens went with the partial events, as llama-server does
            "tokens": self.tokens[i] if self.req.return_tokens and not self.plan.stream else [],
            "id_slot": d.slot,
            "stop": True,
            "model": self.st.model_id,
            "tokens_predicted": n_out,
            "tokens_evaluated": len(prompt),
            "generation_settings": self.settings(),
            "prompt": self.tok.decode_special(prompt),
            "has_new_line": "\n" in self.text[i],
            "truncated": False,
            "stop_type": stop_type,
            "stopping_word": d.stop or "",
            # what the KV holds: the prompt and every generated token but the last (llama-server's
            # n_past; the last one is sampled, never run)
            "tokens_cached": len(prompt) + max(n_out - 1, 0),
            "timings": self.timings(d, n_out, True),
        }
        if self.plan.logprobs and not self.plan.stream:
            out["completion_probabilities"] = self.probs(toks)
        fields = self.req.response_fields
        return pick(fields, out) if fields else out


def pick(paths: list[str], obj: dict[str, Any]) -> dict[str, Any]:
    """llama-server's `response_fields`: each path ("a/b" for nested keys) that exists, under
    the path as its key."""
    out: dict[str, Any] = {}
    for path in paths:
        cur: Any = obj
        for k in path.split("/"):
            if not isinstance(cur, dict) or k not in cur:
                break
            cur = cur[k]
        else:
            out[path] = cur
    return out


async def _run(
    request: Request,
    st: ServerState,
    tok: ServerTokenizer,
    endpoint: str,
    req: NativeRequest,
    plan: Plan,
    prompt_only: bool,
    prompts: list[list[int]],
    t0: float,
) -> Response | sse.SSEResponse:
    client = st.client
    assert client is not None
    rid = "cmpl-" + secrets.token_hex(12)
    sub = submit(st, client, tok, endpoint, prompts, plan, t0, rid)
    shape = _Native(st, tok, req, plan, prompts, t0, prompt_only)
    if plan.stream:
        return sse.SSEResponse(_stream(shape, sub.runs, endpoint), sub.cancel_all)
    return await _complete(request, shape, sub.runs, endpoint, sub.cancel_all)


async def _stream(shape: _Native, runs: list[SeqRun], endpoint: str) -> AsyncIterator[bytes]:
    outcome = "cancelled"
    try:
        async for d in merge(runs):
            d = shape.take(d)
            if d.finish is None:
                if d.text or d.ids:
                    yield sse.event(shape.partial(d))
                continue
            if d.text or d.ids:  # the last piece, then the final object (without them)
                yield sse.event(shape.partial(d))
            yield sse.event(shape.final(d, "", []))
        outcome = "ok"
    except (EngineError, DeadlineExceeded, Unavailable) as e:
        outcome = outcome_of(e)
        yield sse.event(engine_error(e).body())
    finally:
        shape.st.metrics.request_done(endpoint, outcome, shape.t0)


async def _complete(
    request: Request, shape: _Native, runs: list[SeqRun], endpoint: str, cancel_all: Any
) -> Response:
    last: dict[int, Delta] = {}
    toks: list[list[TokenInfo]] = [[] for _ in shape.prompts]

    async def collect() -> None:
        async for d in merge(runs):
            d = shape.take(d)
            toks[d.index].extend(d.tokens)
            if d.finish is not None:
                last[d.index] = d

    work = asyncio.create_task(collect())
    if not await until_done_or_gone(request, work, cancel_all):
        shape.st.metrics.request_done(endpoint, "cancelled", shape.t0)
        return Response(status_code=499)
    err = work.exception()
    if err is not None:
        cancel_all()
        shape.st.metrics.request_done(endpoint, outcome_of(err), shape.t0)
        if isinstance(err, (EngineError, DeadlineExceeded, Unavailable)):
            raise engine_error(err)
        raise err
    shape.st.metrics.request_done(endpoint, "ok", shape.t0)
    answers = [shape.final(last[i], shape.text[i], toks[i]) for i in sorted(last)]
    # one prompt: its object; several: an array of them in the prompts' order (llama-server)
    return JSONResponse(answers[0] if len(answers) == 1 else answers)


async def props(request: Request) -> Response:
    """llama-server's `GET /props`: the defaults a request starts from, the context, the
    slots, the chat template and the model."""
    st = _state(request)
    client = st.client
    tok = st.tokenizer
    n_ctx = client.loaded.n_ctx_seq if client and client.loaded else st.config.n_ctx_seq
    d = st.defaults
    return JSONResponse(
        {
            "default_generation_settings": {
                "n_ctx": n_ctx,
                "params": {
                    "n_predict": st.config.n_predict,
                    "seed": d.seed if d.seed is not None else -1,
                    "temperature": d.temperature,
                    "top_k": d.top_k,
                    "top_p": d.top_p,
                    "min_p": d.min_p,
                    "repeat_last_n": d.repeat_last_n,
                    "repeat_penalty": d.repetition_penalty,
                    "presence_penalty": d.presence_penalty,
                    "frequency_penalty": d.frequency_penalty,
                    "samplers": list(ORDER[:-1]) if st.chain is None else sampler_names(st.chain),
                    "typical_p": d.typical_p,
                    "xtc_probability": d.xtc_probability,
                    "xtc_threshold": d.xtc_threshold,
                    "top_n_sigma": d.top_n_sigma,
                    "dry_multiplier": d.dry_multiplier,
                    "dry_base": d.dry_base,
                    "dry_allowed_length": d.dry_allowed_length,
                    "dry_penalty_last_n": d.dry_penalty_last_n,
                },
            },
            "total_slots": client.slots if client else st.config.parallel,
            "model_alias": st.model_id,
            "model_path": st.model_id,
            "chat_template": (tok.chat_template or "") if tok else "",
            "bos_token": _text(tok, getattr(tok, "bos_id", None)),
            "eos_token": _text(tok, tok.eos_id if tok else None),
            "modalities": {"vision": False, "audio": False},
            "infill": tok is not None and tok.fim is not None,
            "build_info": f"strata {__version__}",
            "is_sleeping": False,
        }
    )


def _text(tok: ServerTokenizer | None, token: int | None) -> str:
    if tok is None or token is None or not 0 <= token < tok.n_vocab:
        return ""
    return tok.token_bytes(token).decode("utf-8", errors="replace")


async def apply_template(request: Request) -> Response:
    """llama-server's `POST /apply-template`: a chat request's prompt as the model's template
    renders it (tools, template kwargs and all), without running it."""
    st = _state(request)
    req: ChatRequest = convert(await read_json(request), ChatRequest)
    st.check_model(req.model)
    _, tok = st.ready()
    c = st.config  # (no lazy tool grammar: nothing runs)
    setup = await asyncio.to_thread(
        openai_chat, req, tok, c.reasoning_format, c.tool_call_format, False
    )
    return JSONResponse({"prompt": setup.prompt})


routes = [
    Route("/apply-template", apply_template, methods=["POST"]),
    Route("/completion", completion, methods=["POST"]),
    Route("/completions", completion, methods=["POST"]),
    Route("/infill", infill, methods=["POST"]),
    Route("/props", props, methods=["GET"]),
]
