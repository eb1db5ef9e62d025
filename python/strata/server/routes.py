"""HTTP endpoints: / (the web page), /v1/chat/completions, /v1/completions, /v1/models,
/health, /tokenize, /detokenize, /v1/status, /metrics (the Anthropic ones: `anthropic_api`).

Every check that can fail runs before a stream starts (so it is a plain HTTP error); once the
200 head of a stream is out, an engine failure is a `data: {"error": …}` event.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from strata.engine.client import (
    DeadlineExceeded,
    EngineClient,
    EngineError,
    QueueFull,
    SeqStream,
    Unavailable,
)
from strata.infill import infill_prompt
from strata.modelgen import TRAINED_DEFAULT_WEIGHTS
from strata.sampling import MAX_SEED, SamplingParams
from strata.server import sse
from strata.server.chat import ChatSetup, openai_chat, prepare_chat, reasoning_budget
from strata.server.generate import (
    FirstToken,
    SeqRun,
    TokenInfo,
    merge,
)
from strata.server.line_limit import LineLimit
from strata.server.openai_shape import FINGERPRINT, OpenAIShape
from strata.server.openai_types import (
    APIError,
    ChatRequest,
    CompletionRequest,
    DetokenizeRequest,
    Plan,
    TokenizeRequest,
    chat_messages,
    completion_prompts,
    convert,
    logit_bias_ids,
    parse_json_object,
    plan_common,
)
from strata.server.state import ServerState
from strata.server.structured import answer_grammar, checked
from strata.server.tokenizing import ServerTokenizer
from strata.server.webui import index

log = logging.getLogger("strata.server")
ENCODE_INLINE_CHARS = 8192
MAX_LOGPROB_ENTRIES = 1 << 21  # log-probability entries of one non-streamed answer
MAX_PIECES = 1 << 18  # tokens /tokenize gives with their pieces


def _state(request: Request) -> ServerState:
    st: ServerState = request.app.state.strata
    return st


async def read_json(request: Request) -> dict[str, Any]:
    limit = _state(request).config.max_body_bytes
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise APIError(413, f"request body of {declared} bytes exceeds the limit of {limit}")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise APIError(413, f"request body exceeds the limit of {limit} bytes")
    return parse_json_object(bytes(body), request.headers.get("content-type", ""))


# -- simple endpoints -------------------------------------------------------------------------


async def health(request: Request) -> Response:
    st = _state(request)
    if st.status == "ready" and st.client is not None and st.client.state == "ready":
        return JSONResponse({"status": "ok"})
    # /health answers without the API key: with one set, the load error's details (paths)
    # are for /v1/status, which asks for the key
    detail = f": {st.error}" if not st.config.api_key else " (details on /v1/status)"
    why = {
        "loading": "model is loading",
        "draining": "server is shutting down",
        "failed": f"model failed to load{detail}",
    }.get(st.status, "engine is restarting")
    err = APIError(503, why, code=st.status)
    return JSONResponse(err.body(), status_code=503, headers={"Retry-After": "2"})


def _model_card(st: ServerState) -> dict[str, Any]:
    return {"id": st.model_id, "object": "model", "created": st.created, "owned_by": "strata"}


async def models(request: Request) -> Response:
    return JSONResponse({"object": "list", "data": [_model_card(_state(request))]})


async def model(request: Request) -> Response:
    st = _state(request)
    st.check_model(request.path_params["model"])
    return JSONResponse(_model_card(st))


async def status(request: Request) -> Response:
    st = _state(request)
    c = st.client
    info = dict(c.loaded.info) if c and c.loaded else {}
    if c and c.stats:
        info.update(c.stats.info)
    body = {
        "status": st.status,
        "error": st.error,
        "model": {
            "id": st.model_id,
            "path": st.config.model,
            "engine": st.config.engine,
            "n_vocab": c.loaded.n_vocab if c and c.loaded else None,
            # all sequences together, as llama.cpp's (0 in the settings: the training context)
            "n_ctx": c.loaded.n_ctx if c and c.loaded else st.config.n_ctx,
            "n_ctx_seq": c.loaded.n_ctx_seq if c and c.loaded else st.config.n_ctx_seq,
            "weights": (
                TRAINED_DEFAULT_WEIGHTS
                if st.default_model
                else info.get("weights", "from the file")
            ),
        },
        "engine": c.describe() if c else {"state": "stopped"},
        "slots": {
            "parallel": c.slots if c else st.config.parallel,
            "running": len(c.running) if c else 0,
            "waiting": len(c.waiting) if c else 0,
        },
        "tiers": info.get("tiers", {}),
        # drafter, current window k per slot, drafts, acceptance histogram, cost curve
        "speculation": info.get("spec"),
        "backend": info,
        "settings": st.config.public_dict(),
    }
    return JSONResponse(body)


async def metrics(request: Request) -> Response:
    m = _state(request).metrics
    if "application/json" in request.headers.get("accept", ""):
        return JSONResponse(m.json_view())
    return Response(m.text(), media_type="text/plain; version=0.0.4; charset=utf-8")


async def tokenize(request: Request) -> Response:
    st = _state(request)
    req = convert(await read_json(request), TokenizeRequest)
    st.check_model(req.model)
    client, tok = st.ready()
    text = req.prompt if req.prompt is not None else req.content
    if req.messages is not None:
        if text is not None:
            raise APIError(400, "give either prompt or messages, not both", param="messages")
        setup = prepare_chat(
            tok, chat_messages(_as_chat(req)), [], "none", True, None, None, "none"
        )
        ids = tok.with_bos(await encode(tok, setup.prompt, True))  # as the chat route runs it
    elif text is not None:
        # llama-server's default: special-token text is the special token
        ids = await encode(tok, text, req.parse_special is not False)
        if req.add_special:  # llama-server's: BOS where the model asks for one
            ids = tok.with_bos(ids)
    else:
        raise APIError(400, "prompt: required (or messages)", param="prompt")
    n_ctx = client.loaded.n_ctx_seq if client.loaded else st.config.n_ctx_seq
    if req.with_pieces and len(ids) > MAX_PIECES:
        raise APIError(400, f"with_pieces: at most {MAX_PIECES} tokens", param="with_pieces")
    tokens: list[Any] = [_piece(tok, i) for i in ids] if req.with_pieces else ids
    return JSONResponse({"tokens": tokens, "count": len(ids), "max_model_len": n_ctx})


def _piece(tok: ServerTokenizer, token: int) -> dict[str, Any]:
    """llama-server's `with_pieces` entry: the token's text, or its bytes where they are not
    whole UTF-8."""
    raw = tok.token_bytes(token)
    try:
        return {"id": token, "piece": raw.decode("utf-8")}
    except UnicodeDecodeError:
        return {"id": token, "piece": list(raw)}


def _as_chat(req: TokenizeRequest) -> ChatRequest:
    return ChatRequest(model="", messages=req.messages or [])


async def detokenize(request: Request) -> Response:
    st = _state(request)
    req = convert(await read_json(request), DetokenizeRequest)
    st.check_model(req.model)
    _, tok = st.ready()
    if any(not (0 <= t < tok.n_vocab) for t in req.tokens):
        raise APIError(400, f"tokens: ids must be in 0..{tok.n_vocab - 1}", param="tokens")
    text = tok.decode(req.tokens)
    return JSONResponse({"prompt": text, "content": text})


# -- generation -------------------------------------------------------------------------------


async def chat_completions(request: Request) -> Response | sse.SSEResponse:
    t0 = time.monotonic()
    st = _state(request)
    req: ChatRequest = convert(await read_json(request), ChatRequest)
    st.check_model(req.model)
    client, tok = st.ready()
    ids, plan, setup = await chat_prompt(st, tok, req)
    return await _generate(request, st, client, tok, "chat", [ids], plan, t0, setup)


async def chat_prompt(
    st: ServerState, tok: ServerTokenizer, req: ChatRequest
) -> tuple[list[int], Plan, ChatSetup]:
    """A chat request's prompt ids, plan (with its constraint) and answer parsing; shared with
    the Anthropic route, which translates its requests into `ChatRequest`s."""
    if req.top_logprobs is not None and not req.logprobs:
        raise APIError(400, "top_logprobs: requires logprobs: true", param="top_logprobs")
    top = req.top_logprobs or 0
    plan = plan_common(
        req, bool(req.logprobs), top, st.config.max_top_logprobs, st.defaults, st.chain
    )
    bias(plan, req, tok)
    # on a worker thread: the template and the grammar's compile check take a while for a
    # large schema or many tools, and the event loop serves every other request meanwhile
    c = st.config
    setup = await asyncio.to_thread(
        openai_chat, req, tok, c.reasoning_format, c.tool_call_format, c.constrain_tool_calls
    )
    if setup.grammar is not None:
        plan.params = msgspec.structs.replace(
            plan.params, grammar=setup.grammar, grammar_trigger=setup.trigger
        )
    rb = reasoning_budget(req, setup, tok, st.config)
    if rb is not None:
        plan.params = msgspec.structs.replace(plan.params, reasoning_budget=rb)
    ids = tok.with_bos(await encode(tok, setup.prompt, True))
    return ids, plan, setup


def bias(plan: Plan, req: ChatRequest | CompletionRequest, tok: ServerTokenizer) -> None:
    """The request's `logit_bias` into the plan's sampling parameters (a 400 when bad)."""
    if req.logit_bias:
        ids = logit_bias_ids(req.logit_bias, tok.n_vocab, lambda t: tok.encode(t, False))
        plan.params = msgspec.structs.replace(plan.params, logit_bias=ids)


async def encode(tok: ServerTokenizer, text: str, special: bool) -> list[int]:
    """Long texts are tokenized on a worker thread so the event loop keeps streaming."""
    if len(text) < ENCODE_INLINE_CHARS:
        return tok.encode(text, special)
    return await asyncio.to_thread(tok.encode, text, special)


async def completions(request: Request) -> Response | sse.SSEResponse:
    t0 = time.monotonic()
    st = _state(request)
    req: CompletionRequest = convert(await read_json(request), CompletionRequest)
    st.check_model(req.model)
    client, tok = st.ready()
    if req.echo:
        raise APIError(400, "echo: not supported", param="echo")
    if req.best_of is not None and req.best_of != (req.n or 1):
        raise APIError(400, "best_of: only equal to n is supported", param="best_of")
    lp = req.logprobs
    plan = plan_common(
        req, lp is not None, lp or 0, st.config.max_top_logprobs, st.defaults, st.chain
    )
    bias(plan, req, tok)
    grammar, param = answer_grammar(req)
    if grammar is not None:  # compiled on a worker thread (see chat_prompt)
        grammar = await asyncio.to_thread(checked, grammar, param)
        plan.params = msgspec.structs.replace(plan.params, grammar=grammar)
    given = completion_prompts(req.prompt, tok.n_vocab)
    # special-token text is the special token, as llama-server and vLLM read a prompt
    prompts = [p if isinstance(p, list) else await encode(tok, p, True) for p in given]
    if req.suffix:  # fill in the middle: each prompt is the text before it ("": none)
        after = await encode(tok, req.suffix, False)
        prompts = [await fim_prompt(st, client, tok, p, after) for p in prompts]
    else:  # a text prompt led by BOS where the model asks (token ids are taken as they are)
        prompts = [
            ids if isinstance(p, list) else tok.with_bos(ids)
            for p, ids in zip(given, prompts, strict=True)
        ]
    return await _generate(request, st, client, tok, "completions", prompts, plan, t0)


async def fim_prompt(
    st: ServerState,
    client: EngineClient,
    tok: ServerTokenizer,
    prefix: list[int],
    suffix: list[int],
    extra: list[tuple[str, str]] | None = None,
    typed: list[int] | None = None,
    param: str = "suffix",
) -> list[int]:
    """A fill-in-the-middle prompt (OpenAI's completion `suffix`, llama-server's /infill): the
    text before the cursor and after it, other files' (name, text) and what is typed of the
    middle, laid out as llama-server lays them out (`strata.infill`)."""
    fim = tok.fim
    if fim is None:
        raise APIError(
            400,
            "this model has no fill-in-the-middle tokens (prefix, suffix, middle)",
            param=param,
            code="not_supported",
        )
    n_ctx = client.loaded.n_ctx_seq if client.loaded else st.config.n_ctx_seq
    return await asyncio.to_thread(
        lambda: infill_prompt(
            fim,
            lambda s: tok.encode(s, False),
            prefix,
            suffix,
            extra or [],
            typed or [],
            n_ctx=n_ctx,
            n_predict=st.config.n_predict,
            spm=st.config.spm_infill,
            # BOS where the model asks, after the other files' chunks (llama-server's layout)
            bos=tok.prompt_bos,
        )
    )


def _seed(base: int | None, j: int) -> int | None:
    return None if base is None else (base + j) & MAX_SEED


@dataclass(slots=True)
class Submitted:
    """A request's sequences in the engine: one `SeqRun` per choice (prompt × n)."""

    rid: str
    runs: list[SeqRun]
    streams: list[SeqStream]
    client: EngineClient

    def cancel_all(self) -> None:
        for s in self.streams:
            self.client.cancel(s)


def submit(
    st: ServerState,
    client: EngineClient,
    tok: ServerTokenizer,
    endpoint: str,
    prompts: list[list[int]],
    plan: Plan,
    t0: float,
    rid: str,
    param: str = "prompt",
) -> Submitted:
    """Checks the prompts against the context and queues them (n choices each); the 4xx/5xx
    that says why not. Shared by every generating route (OpenAI and Anthropic)."""
    n_ctx = client.loaded.n_ctx_seq if client.loaded else st.config.n_ctx_seq
    for i, p in enumerate(prompts):
        where = f"{param}[{i}]" if len(prompts) > 1 else param  # which of several
        if not p:
            raise APIError(400, f"{where}: the prompt is empty", param=where)
        if len(p) >= n_ctx:
            raise APIError(
                400,
                f"{where}: the prompt has {len(p)} tokens; a sequence's context holds "
                f"{n_ctx} (n_ctx / parallel), including at least one output token",
                param=where,
                code="context_length_exceeded",
            )
    seq_prompts, seq_params, seq_max = [], [], []
    # a request without max_tokens: the server's n_predict (-1: what the context leaves)
    want = plan.max_tokens or (st.config.n_predict if st.config.n_predict > 0 else None)
    for p in prompts:
        room = min(n_ctx - len(p), st.config.max_tokens_limit)
        for j in range(plan.n):
            seq_prompts.append(p)
            seq_params.append(_with_seed(plan.params, _seed(plan.params.seed, j)))
            seq_max.append(min(want or room, room))
    if plan.logprobs and not plan.stream:
        # a whole answer's log-probabilities are built in memory before the first byte goes
        entries = sum(seq_max) * (plan.top_logprobs + 1)
        if entries > MAX_LOGPROB_ENTRIES:
            raise APIError(
                400,
                f"logprobs: up to {entries} entries in one answer (at most "
                f"{MAX_LOGPROB_ENTRIES}); stream it, or ask for fewer tokens, choices or "
                "top log-probabilities",
                param="logprobs",
            )
    cap = client.slots + st.config.max_queue
    if len(seq_prompts) > cap:  # never takes a queue however empty: not a 429 to retry
        raise APIError(
            400,
            f"the request asks for {len(seq_prompts)} sequences (prompts × n); this server "
            f"takes at most {cap} at once (parallel + max_queue)",
            param="n",
        )
    try:
        stop_ids = [] if plan.ignore_eos else sorted(tok.eog_ids)
        streams = client.submit(seq_prompts, seq_params, seq_max, stop_ids)
    except QueueFull as e:
        st.metrics.request_done(endpoint, "rejected")
        raise APIError(429, str(e), code="queue_full", headers={"Retry-After": "1"}) from None
    except Unavailable as e:
        st.metrics.request_done(endpoint, "rejected")
        raise APIError(503, str(e), code="unavailable") from None
    first = FirstToken()
    runs = [
        SeqRun(
            client,
            tok,
            st.metrics,
            s,
            i,
            plan.stops,
            plan.logprobs,
            t0,
            rid,
            endpoint,
            first,
            LineLimit(plan.n_indent, plan.t_max_predict_ms / 1000)
            if plan.n_indent > 0 or plan.t_max_predict_ms > 0
            else None,
        )
        for i, s in enumerate(streams)
    ]
    return Submitted(rid, runs, streams, client)


async def _generate(
    request: Request,
    st: ServerState,
    client: EngineClient,
    tok: ServerTokenizer,
    endpoint: str,
    prompts: list[list[int]],
    plan: Plan,
    t0: float,
    setup: ChatSetup | None = None,
) -> Response | sse.SSEResponse:
    param = "messages" if endpoint == "chat" else "prompt"
    rid = ("chatcmpl-" if endpoint == "chat" else "cmpl-") + secrets.token_hex(12)
    sub = submit(st, client, tok, endpoint, prompts, plan, t0, rid, param)
    runs, streams, cancel_all = sub.runs, sub.streams, sub.cancel_all
    n_prompt = sum(len(p) for p in prompts)
    shape = OpenAIShape(endpoint, rid, st.model_id, plan, n_prompt, t0, setup, tok)
    if plan.stream:
        return sse.SSEResponse(_stream(shape, runs, st, streams), cancel_all)
    return await _complete(request, shape, runs, st, streams, cancel_all)


def _with_seed(p: SamplingParams, seed: int | None) -> SamplingParams:
    return msgspec.structs.replace(p, seed=seed)


def engine_error(e: BaseException) -> APIError:
    if isinstance(e, DeadlineExceeded):
        return APIError(504, "request deadline exceeded", code="timeout")
    if isinstance(e, Unavailable):
        return APIError(503, str(e), code="unavailable")
    # the first line, bounded: a native panic's text may carry a backtrace (RUST_BACKTRACE)
    # and echo a request's grammar; the whole of it is in the server's log
    log.error("engine error: %s", e)
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return APIError(500, f"engine error: {first[:300]}", code="engine_error")


async def _stream(
    shape: OpenAIShape, runs: list[SeqRun], st: ServerState, streams: list[SeqStream]
) -> AsyncIterator[bytes]:
    endpoint = "chat" if shape.chat else "completions"
    outcome = "cancelled"
    total = 0
    try:
        if shape.chat:
            yield sse.event(
                shape.chunk(
                    [
                        {
                            "index": r.index,
                            "delta": {"role": "assistant", "content": ""},
                            "logprobs": None,
                            "finish_reason": None,
                        }
                        for r in runs
                    ]
                )
            )
        async for d in merge(runs):
            if d.finish is not None:
                total += d.output_tokens
                if d.tier is not None:
                    shape.tier.append(d.tier)
                shape.cached[d.index] = d.cached_tokens
                if d.drafts is not None:
                    shape.drafts.append(d.drafts)
            for choice in shape.delta_choices(d, d.finish):
                yield sse.event(shape.chunk([choice]))
        if shape.plan.include_usage:
            last = shape.chunk([])
            last["usage"] = shape.usage(total)
            yield sse.event(last)
        yield sse.DONE
        outcome = "ok"
    except (EngineError, DeadlineExceeded, Unavailable) as e:
        outcome = outcome_of(e)
        yield sse.event(engine_error(e).body())
    finally:
        st.metrics.request_done(endpoint, outcome, shape.t0)


def outcome_of(e: BaseException) -> str:
    """A failed request's `strata_requests_total` outcome, streamed or not."""
    return "timeout" if isinstance(e, DeadlineExceeded) else "error"


async def until_done_or_gone(request: Request, work: asyncio.Task[None], cancel: Any) -> bool:
    """Waits for `work` unless the client disconnects first (then cancels it and the
    engine sequences); True when the work ran to its end (result or exception)."""

    async def disconnected() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    watch = asyncio.create_task(disconnected())
    try:
        await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
        if not work.done():
            work.cancel()
            cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await work
    return not work.cancelled()


async def _complete(
    request: Request,
    shape: OpenAIShape,
    runs: list[SeqRun],
    st: ServerState,
    streams: list[SeqStream],
    cancel_all: Any,
) -> Response:
    endpoint = "chat" if shape.chat else "completions"
    texts = {r.index: "" for r in runs}
    toks: dict[int, list[TokenInfo]] = {r.index: [] for r in runs}
    finish: dict[int, str] = {}
    total = 0

    async def collect() -> None:
        nonlocal total
        async for d in merge(runs):
            texts[d.index] += d.text
            toks[d.index] += d.tokens
            if d.finish is not None:
                finish[d.index] = d.finish
                total += d.output_tokens
                if d.tier is not None:
                    shape.tier.append(d.tier)
                shape.cached[d.index] = d.cached_tokens
                if d.drafts is not None:
                    shape.drafts.append(d.drafts)

    work = asyncio.create_task(collect())
    if not await until_done_or_gone(request, work, cancel_all):
        st.metrics.request_done(endpoint, "cancelled", shape.t0)
        return Response(status_code=499)
    err = work.exception()
    if err is not None:
        cancel_all()
        st.metrics.request_done(endpoint, outcome_of(err), shape.t0)
        if isinstance(err, (EngineError, DeadlineExceeded, Unavailable)):
            raise engine_error(err)
        raise err
    st.metrics.request_done(endpoint, "ok", shape.t0)
    choices = []
    for r in runs:
        i = r.index
        lp = shape.logprobs(i, toks[i])
        if shape.chat:
            msg = shape.message(i, texts[i])
            fr = shape.finish_reason(i, finish[i])
            choices.append({"index": i, "message": msg, "logprobs": lp, "finish_reason": fr})
        else:
            choices.append(
                {"index": i, "text": texts[i], "logprobs": lp, "finish_reason": finish[i]}
            )
    return JSONResponse(
        {
            "id": shape.rid,
            "object": "chat.completion" if shape.chat else "text_completion",
            "created": shape.created,
            "model": shape.model,
            "system_fingerprint": FINGERPRINT,
            "choices": choices,
            "usage": shape.usage(total),
        }
    )


routes = [
    Route("/", index, methods=["GET"]),
    Route("/health", health, methods=["GET"]),
    Route("/v1/health", health, methods=["GET"]),  # llama-server's other name
    Route("/v1/models", models, methods=["GET"]),
    Route("/models", models, methods=["GET"]),
    Route("/v1/models/{model:path}", model, methods=["GET"]),
    Route("/v1/chat/completions", chat_completions, methods=["POST"]),
    Route("/chat/completions", chat_completions, methods=["POST"]),
    Route("/v1/completions", completions, methods=["POST"]),
    Route("/tokenize", tokenize, methods=["POST"]),
    Route("/detokenize", detokenize, methods=["POST"]),
    Route("/v1/status", status, methods=["GET"]),
    Route("/metrics", metrics, methods=["GET"]),
]
