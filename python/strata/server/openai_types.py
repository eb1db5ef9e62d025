"""OpenAI request shapes (msgspec), their validation, and the error type with its JSON shape.

Validation turns every bad field into `APIError(400, message, param=field)`. Choices made where
the API leaves room (documented in the README):
- `max_tokens` / `max_completion_tokens` (the latter wins when both are given) must be >= 1;
  a value above what the context leaves (or above `max_tokens_limit`) is clamped, and the
  choice then ends with `finish_reason: "length"`.
- a prompt that leaves no room for one output token is 400 `context_length_exceeded`.
- `n` is 1..16; `stop` at most 4 non-empty strings; `top_logprobs` 0..`max_top_logprobs`.
- No field is dropped silently: a field the server does not know, or knows but does not
  support (`UNSUPPORTED`), is a 400 naming it; only `IGNORED_FIELDS` (no effect on the answer)
  are accepted and ignored. `model` may be omitted (the served model).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import msgspec

from strata import sampling_chain
from strata.sampling import SamplingParams

MAX_N = 16
# stop strings of one request: OpenAI documents 4; llama-server and vLLM take any number, and
# editors' completion requests send more (fill-in-the-middle markers, fences, blank lines).
# Bounded so that the per-token hold-back check (StopMatcher) stays cheap.
MAX_STOP = 32
MAX_STOP_CHARS = 256
MAX_LOGIT_BIAS = 1024  # entries of one request's logit_bias
ROLES = ("system", "developer", "user", "assistant", "tool")

_STATUS_TYPE = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "unavailable_error",
    504: "timeout_error",
}

# Anthropic's error types by status (https://docs.anthropic.com/en/api/errors); 503 (loading,
# draining) is its "overloaded_error", the type of a temporary refusal.
_ANTHROPIC_TYPE = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "request_too_large",
    415: "invalid_request_error",
    429: "rate_limit_error",
    503: "overloaded_error",
    504: "timeout_error",
}
ANTHROPIC_PATHS = ("/v1/messages",)  # routes whose errors take Anthropic's shape


class APIError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        type: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type or _STATUS_TYPE.get(status, "invalid_request_error")
        self.headers = headers or {}

    def body_for(self, path: str) -> dict[str, Any]:
        """The error body in the shape of the API that `path` belongs to."""
        if any(path == p or path.startswith(p + "/") for p in ANTHROPIC_PATHS):
            return self.anthropic_body()
        return self.body()

    def anthropic_body(self) -> dict[str, Any]:
        kind = _ANTHROPIC_TYPE.get(self.status, "api_error")
        return {"type": "error", "error": {"type": kind, "message": self.message}}

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


# -- request shapes ---------------------------------------------------------------------------

# Top-level fields accepted and ignored: they change nothing in the answer.
IGNORED_FIELDS = frozenset(
    {"metadata", "store", "service_tier", "prompt_cache_key", "safety_identifier"}
)
# Fields of the OpenAI API this server knows and refuses (why, in the 400's message).
UNSUPPORTED = {
    "functions": "deprecated by OpenAI and not supported; use tools",
    "function_call": "deprecated by OpenAI and not supported; use tool_choice",
    "audio": "not supported (text only)",
    "modalities": "not supported (text only)",
    "prediction": "not supported",
    "web_search_options": "not supported",
}


class _Strict(msgspec.Struct, forbid_unknown_fields=True):
    pass


class ContentPart(_Strict):
    type: str
    text: str | None = None
    # other part kinds, named so that they get "only text parts" rather than "unknown field"
    image_url: Any = None
    input_audio: Any = None
    file: Any = None
    refusal: str | None = None  # an assistant's refusal part: its text


class ToolCallFunction(_Strict):
    name: str
    arguments: str  # JSON text of an object


class MessageToolCall(_Strict):
    function: ToolCallFunction
    id: str | None = None
    type: Literal["function"] = "function"


class ChatMessage(_Strict):
    role: str
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[MessageToolCall] | None = None  # assistant
    tool_call_id: str | None = None  # tool
    reasoning_content: str | None = None  # assistant: earlier reasoning (templates may show it)
    # the SDK's fields of an assistant message sent back as it came (`model_dump()`): a
    # refusal's text stands for the content; annotations (web citations) are dropped; audio
    # and function_call only as null
    refusal: str | None = None
    annotations: list[Any] | None = None
    audio: None = None
    function_call: None = None


# llama.cpp's fields of samplers and features Strata lacks: accepted at these values only
_OFF: dict[str, tuple[Any, ...]] = {
    "post_sampling_probs": (False,),
    # a request pinned to a slot: the server's queue sends at most one request per slot to
    # the engine, which could not hold one back for a busy slot without stalling the others
    "id_slot": (-1,),
    "n_keep": (0, -1),
    "min_keep": (0, 1),
    "timings_per_token": (False,),  # the native routes answer it; the OpenAI ones do not
}
MAX_LIST = 64  # samplers, response_fields


class LlamaSampling(_Strict, kw_only=True):
    """llama-server's sampling fields beyond OpenAI's, which its clients send to every route
    (the chain `samplers`; the switches of the samplers Strata lacks, accepted off; their
    parameters, without effect while those are off)."""

    samplers: list[str] | str | None = None
    typical_p: float | None = None
    dry_multiplier: float | None = None
    dry_base: float | None = None
    dry_allowed_length: int | None = None
    dry_penalty_last_n: int | None = None
    dry_sequence_breakers: list[str] | None = None
    xtc_probability: float | None = None
    xtc_threshold: float | None = None
    mirostat: int | None = None
    mirostat_tau: float | None = None
    mirostat_eta: float | None = None
    adaptive_target: float | None = None
    adaptive_decay: float | None = None
    top_n_sigma: float | None = None
    dynatemp_range: float | None = None
    dynatemp_exponent: float | None = None
    post_sampling_probs: bool | None = None
    timings_per_token: bool | None = None
    id_slot: int | None = None
    n_keep: int | None = None
    min_keep: int | None = None


class StreamOptions(_Strict):
    include_usage: bool = False
    include_obfuscation: bool | None = None  # OpenAI's padding of stream events: none here


class SamplingRequest(LlamaSampling, kw_only=True):
    """The fields an OpenAI request and llama-server's own share (its routes take them too)."""

    model: str | None = None
    stream: bool | None = None  # OpenAI's schema allows null: not streamed
    max_tokens: int | None = None
    n_predict: int | None = None  # llama-server's: max_tokens (-1: to the context's end)
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    repeat_penalty: float | None = None  # llama-server's name of repetition_penalty
    repeat_last_n: int | None = None  # llama-server's: tokens the penalties look back over
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    cache_prompt: bool | None = None  # llama-server's: false: no cached prefix is reused
    # vLLM's / llama-server's: end-of-generation tokens do not stop it (null: they do)
    ignore_eos: bool | None = None
    # OpenAI's {"id": bias}, or llama-server's [[id or text, bias or false], …]: checked by
    # `logit_bias_ids` (it needs the tokenizer)
    logit_bias: dict[str, Any] | list[Any] | None = None
    # llama-server's constraints of the answer (JSON schema, GBNF grammar)
    json_schema: dict[str, Any] | None = None
    grammar: str | None = None


class _Common(SamplingRequest, kw_only=True):
    stream_options: StreamOptions | None = None
    repetition_penalty: float | None = None
    n: int | None = None
    user: str | None = None
    speculative: bool | None = None  # false: this request never drafts (server's `spec` on)
    # the answer's constraint, one at most (checked in strata.server.structured): OpenAI's
    # response_format, llama-server's json_schema and grammar (GBNF), vLLM's
    # structured_outputs ({json | regex | choice | grammar | json_object})
    response_format: dict[str, Any] | None = None
    structured_outputs: dict[str, Any] | None = None


class ChatRequest(_Common, kw_only=True):
    messages: list[ChatMessage]
    max_completion_tokens: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    tools: list[Any] | None = None  # checked by strata.server.tools.ToolSpec.from_openai
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    chat_template_kwargs: dict[str, Any] | None = None  # vLLM's / llama-server's
    reasoning_format: str | None = None  # llama-server's: "none" | "parsed"
    reasoning_effort: str | None = None  # OpenAI's; passed to the template (gpt-oss reads it)
    # llama-server's: the thinking block's token cap (absent or -1: the server's
    # reasoning_budget; `thinking_budget_tokens` is its other name) and the text forced before
    # its close
    reasoning_budget_tokens: int | None = None
    thinking_budget_tokens: int | None = None
    reasoning_budget_message: str | None = None


class CompletionRequest(_Common, kw_only=True):
    prompt: Any  # str | list[str] | list[int] | list[list[int]]: checked by hand
    logprobs: int | None = None
    echo: bool | None = None
    best_of: int | None = None
    suffix: str | None = None  # fill in the middle (the model's FIM tokens)


class TokenizeRequest(_Strict, kw_only=True):
    model: str | None = None
    prompt: str | None = None
    content: str | None = None  # llama.cpp's name for prompt
    messages: list[ChatMessage] | None = None
    # llama-server's: special-token text in the prompt becomes the special token (default
    # true, as there and as a completion's prompt is read)
    parse_special: bool | None = None
    with_pieces: bool | None = None  # llama-server's: tokens as {id, piece}
    add_special: bool | None = None  # llama-server's: BOS where the model asks (default off)


class DetokenizeRequest(_Strict, kw_only=True):
    model: str | None = None
    tokens: list[int]


# -- parsing ----------------------------------------------------------------------------------

_PATH = re.compile(r"at `\$\.?(.*)`")


def parse_json_object(body: bytes, content_type: str) -> dict[str, Any]:
    """The body as a JSON object, or a 4xx naming what is wrong."""
    ctype = content_type.split(";")[0].strip().lower()
    if ctype != "application/json":
        raise APIError(415, f"Content-Type must be application/json (got {ctype or 'none'!r})")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise APIError(400, f"request body is not valid UTF-8 (byte {e.start})") from None
    try:
        obj = json.loads(text)  # accepts NaN/Infinity so that they are reported per field
    except (json.JSONDecodeError, RecursionError, ValueError) as e:
        # ValueError: an integer past Python's digit limit
        raise APIError(400, f"malformed JSON: {e}") from None
    # a surrogate can only come from a "\ud800".."\udfff" escape (valid UTF-8 holds none):
    # the walk runs only for a body that has such an escape
    if ("\\ud" in text or "\\uD" in text) and _has_lone_surrogate(obj):
        raise APIError(
            400, "request body has a string with an unpaired surrogate escape (\\ud800-\\udfff)"
        )
    if not isinstance(obj, dict):
        raise APIError(400, f"request body must be a JSON object, got {type(obj).__name__}")
    return obj


def _has_lone_surrogate(obj: Any) -> bool:
    """Whether a string anywhere in `obj` holds an unpaired UTF-16 surrogate (a JSON escape
    such as "\\ud800" alone): such text has no UTF-8 form to tokenize."""
    stack = [obj]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            try:
                v.encode("utf-8")
            except UnicodeEncodeError:
                return True
        elif isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
    return False


_UNKNOWN = re.compile(r"unknown field `([^`]*)`")


def convert(
    obj: dict[str, Any],
    cls: type[Any],
    ignored: frozenset[str] = IGNORED_FIELDS,
    unsupported: dict[str, str] | None = None,
) -> Any:
    """The body as `cls`, or a 400 naming the bad field. Unknown fields are errors except
    `ignored` (dropped here; OpenAI's `IGNORED_FIELDS` by default); `unsupported` (OpenAI's
    `UNSUPPORTED` by default) says why a known field is refused."""
    refused = UNSUPPORTED if unsupported is None else unsupported
    known = set(cls.__struct_fields__)
    for k in list(obj):
        if k in known:
            continue
        if k in ignored:
            del obj[k]
        elif k in refused:
            raise APIError(400, f"{k}: {refused[k]}", param=k, code="unsupported_field")
        else:
            raise APIError(
                400, f"{k}: unknown field (not part of this API)", param=k, code="unknown_field"
            )
    try:
        return msgspec.convert(obj, cls)
    except msgspec.ValidationError as e:
        m = _PATH.search(str(e))
        param = m.group(1) if m else None
        u = _UNKNOWN.search(str(e))
        if u is not None:
            param = f"{param}.{u.group(1)}" if param else u.group(1)
            raise APIError(
                400, f"{param}: unknown field", param=param, code="unknown_field"
            ) from None
        raise APIError(400, f"invalid request: {e}", param=param) from None


@dataclass(slots=True)
class Plan:
    """A validated request, ready to tokenize and run."""

    stream: bool
    include_usage: bool
    n: int
    max_tokens: int | None  # None: as much as the context allows
    stops: list[str]
    params: SamplingParams  # seed is the base; choice i uses seed + i
    logprobs: bool
    top_logprobs: int
    ignore_eos: bool = False  # generate max_tokens whatever end-of-generation tokens come
    n_indent: int = 0  # llama-server's: later lines indented less end it (0: off)
    t_max_predict_ms: int = 0  # llama-server's: past it, a line break ends it (0: off)


def check_stops(stops: list[str], param: str) -> None:
    """A 400 unless `stops` are at most MAX_STOP non-empty strings of MAX_STOP_CHARS at most."""
    if len(stops) > MAX_STOP or any(not s or len(s) > MAX_STOP_CHARS for s in stops):
        raise APIError(
            400,
            f"{param}: at most {MAX_STOP} non-empty strings of at most {MAX_STOP_CHARS} characters",
            param=param,
        )


def _finite(name: str, v: float | None) -> None:
    if v is not None and not math.isfinite(v):
        raise APIError(400, f"{name}: must be a finite number (got {v!r})", param=name)


# a request's fields that are SamplingParams' own, by the same names (the numbers finite)
_FLOAT_FIELDS = (
    "temperature", "top_p", "min_p", "typical_p", "xtc_probability", "xtc_threshold",
    "top_n_sigma", "dry_multiplier", "dry_base", "dynatemp_range", "dynatemp_exponent",
    "repetition_penalty", "presence_penalty", "frequency_penalty", "mirostat_tau",
    "mirostat_eta", "adaptive_target", "adaptive_decay",
)  # fmt: skip
_PARAM_FIELDS = (
    *_FLOAT_FIELDS, "top_k", "repeat_last_n", "seed", "speculative", "cache_prompt",
    "dry_allowed_length", "dry_penalty_last_n", "dry_sequence_breakers", "mirostat",
)  # fmt: skip


def plan_common(
    req: ChatRequest | CompletionRequest,
    logprobs: bool,
    top: int,
    limit: int,
    defaults: SamplingParams,
    chain: list[str] | str | None = None,
) -> Plan:
    """The request's plan; its sampling fields over `defaults` (the server's: its settings,
    else the model's recommendations, else llama.cpp's defaults), sampled by its `samplers`
    chain, else by `chain` (the server's: `--samplers`, else the model's
    general.sampling.sequence), else by llama.cpp's default chain."""
    n = 1 if req.n is None else req.n
    if not (1 <= n <= MAX_N):
        raise APIError(400, f"n: must be in 1..{MAX_N} (got {n})", param="n")
    check_off(req)
    mt, name = req.max_tokens, "max_tokens"
    if isinstance(req, ChatRequest) and req.max_completion_tokens is not None:
        mt, name = req.max_completion_tokens, "max_completion_tokens"
    if req.n_predict is not None:  # llama-server's, over the others (as there)
        mt, name = req.n_predict, "n_predict"
    if mt == -1:  # llama-server's "to the context's end"
        mt = None
    if mt is not None and mt < 1:
        raise APIError(400, f"{name}: must be at least 1, or -1 (got {mt})", param=name)
    if req.repeat_penalty is not None and req.repetition_penalty is not None:
        raise APIError(
            400, "repeat_penalty: the same setting as repetition_penalty", param="repeat_penalty"
        )
    stops = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
    check_stops(stops, "stop")
    if req.stream_options is not None and not req.stream:
        raise APIError(
            400, "stream_options: only allowed with stream: true", param="stream_options"
        )
    if not (0 <= top <= limit):
        # completions name the count `logprobs`; chat `top_logprobs`
        name = "top_logprobs" if isinstance(req, ChatRequest) else "logprobs"
        raise APIError(400, f"{name}: must be in 0..{limit} (got {top})", param=name)
    for name in _FLOAT_FIELDS:
        _finite(name, getattr(req, name))
    fields: dict[str, Any] = {
        k: getattr(req, k) for k in _PARAM_FIELDS if getattr(req, k) is not None
    }
    if req.repeat_penalty is not None:
        _finite("repeat_penalty", req.repeat_penalty)
        fields["repetition_penalty"] = req.repeat_penalty
    for name in ("xtc_probability", "xtc_threshold"):  # llama-server's soft limits: clamped
        if name in fields:
            fields[name] = min(max(fields[name], 0.0), 1.0)
    if fields.get("dry_base", 1.0) < 1.0:  # llama-server takes its default there
        fields["dry_base"] = SamplingParams().dry_base
    fields["top_logprobs"] = top if logprobs else -1
    try:
        params = msgspec.structs.replace(defaults, **fields).validate()
        if (names := req.samplers if req.samplers is not None else chain) is not None:
            params = with_samplers(params, names)
    except ValueError as e:
        raise APIError(400, str(e), param=getattr(e, "param", None)) from None
    return Plan(
        stream=bool(req.stream),
        include_usage=bool(req.stream_options and req.stream_options.include_usage),
        n=n,
        max_tokens=mt,
        stops=stops,
        params=params,
        logprobs=logprobs,
        top_logprobs=top,
        ignore_eos=bool(req.ignore_eos),
    )


def chat_messages(req: ChatRequest) -> list[dict[str, Any]]:
    """The conversation as dicts (role, content text; an assistant's `tool_calls` as
    {id, name, arguments} and `reasoning_content`; a tool result's `tool_call_id`), or a 400
    naming the bad message."""
    if not req.messages:
        raise APIError(400, "messages: must be a non-empty array", param="messages")
    out = []
    for i, m in enumerate(req.messages):
        where = f"messages[{i}]"
        if m.role not in ROLES:
            raise APIError(
                400,
                f"{where}.role: must be one of {', '.join(ROLES)} (got {m.role!r})",
                param=f"{where}.role",
            )
        content = m.content
        if isinstance(content, list):
            texts = []
            for j, part in enumerate(content):
                if m.role == "assistant" and part.type == "refusal" and part.refusal is not None:
                    texts.append(part.refusal)
                    continue
                if part.type != "text" or part.text is None:
                    raise APIError(
                        400,
                        f"{where}.content[{j}]: only text parts are supported",
                        param=f"{where}.content",
                    )
                texts.append(part.text)
            content = "".join(texts)
        if content is None and m.role == "assistant":
            content = m.refusal  # a refusal sent back stands for what the assistant said
        elif m.refusal is not None and m.role != "assistant":
            raise APIError(400, f"{where}.refusal: only on assistant messages", f"{where}.refusal")
        if content is None and m.role != "assistant":
            raise APIError(
                400, f"{where}.content: required for role {m.role}", param=f"{where}.content"
            )
        if m.role in ("user", "system", "developer") and not content:
            raise APIError(400, f"{where}.content: must not be empty", param=f"{where}.content")
        d: dict[str, Any] = {"role": m.role, "content": content or ""}
        for name, only in (
            ("tool_calls", "assistant"),
            ("reasoning_content", "assistant"),
            ("tool_call_id", "tool"),
        ):
            if getattr(m, name) is not None and m.role != only:
                raise APIError(
                    400, f"{where}.{name}: only for role {only}", param=f"{where}.{name}"
                )
        if m.tool_calls:
            d["tool_calls"] = [
                {"id": c.id, "name": c.function.name, "arguments": c.function.arguments}
                for c in m.tool_calls
            ]
        if m.reasoning_content:
            d["reasoning_content"] = m.reasoning_content
        if m.tool_call_id is not None:
            d["tool_call_id"] = m.tool_call_id
        if m.name is not None:
            d["name"] = m.name
        out.append(d)
    return out


def logit_bias_ids(
    value: dict[str, Any] | list[Any], n_vocab: int, encode: Callable[[str], list[int]]
) -> dict[int, float]:
    """A request's `logit_bias` as token id → bias, or a 400. OpenAI's form maps token ids
    (decimal strings) to biases in [-100, 100]; llama-server's also takes a list of [token,
    bias] pairs, a text for the token (every token of the text gets the bias) and `false` for
    the bias (the token is never picked: -inf). A token named twice gets the sum of its biases
    (llama.cpp's sampler adds each entry)."""

    def bad(why: str) -> APIError:
        return APIError(400, f"logit_bias: {why}", param="logit_bias")

    if isinstance(value, dict):
        pairs: list[Any] = list(value.items())
    elif all(isinstance(p, list) and len(p) == 2 for p in value):
        pairs = value
    else:
        raise bad("must be an object of token id → bias or a list of [token, bias] pairs")
    if len(pairs) > MAX_LOGIT_BIAS:
        raise bad(f"at most {MAX_LOGIT_BIAS} entries")
    out: dict[int, float] = {}
    for tok, b in pairs:
        if b is False:
            bias = -math.inf
        elif isinstance(b, bool) or not isinstance(b, (int, float)) or not math.isfinite(b):
            raise bad(f"the bias of {tok!r} must be a number in [-100, 100] or false")
        elif not -100.0 <= b <= 100.0:
            raise bad(f"the bias of {tok!r} must be in [-100, 100] (got {b})")
        else:
            bias = float(b)
        if isinstance(tok, str) and re.fullmatch(r"-?[0-9]+", tok):
            ids = [int(tok)]
        elif isinstance(tok, str):
            ids = encode(tok)  # llama-server's: the text's tokens
            if not ids:
                raise bad(f"the text {tok!r} is no token")
        elif isinstance(tok, int) and not isinstance(tok, bool):
            ids = [tok]
        else:
            raise bad(f"a token must be an id or a text (got {tok!r})")
        for t in ids:
            if not 0 <= t < n_vocab:
                raise bad(f"token id {t} out of the vocabulary 0..{n_vocab - 1}")
            out[t] = out.get(t, 0.0) + bias
    return out


def completion_prompts(prompt: Any, n_vocab: int) -> list[str | list[int]]:
    """`prompt` as a list of texts or id lists (a batch), or a 400."""

    def bad(why: str) -> APIError:
        return APIError(400, f"prompt: {why}", param="prompt")

    def ids_ok(ids: list[Any]) -> list[int]:
        if not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
            raise bad("must be a string, an array of strings, or an array of token ids")
        if any(not (0 <= t < n_vocab) for t in ids):
            raise bad(f"token id out of the vocabulary 0..{n_vocab - 1}")
        return list(ids)

    if isinstance(prompt, str):
        items: list[str | list[int]] = [prompt]
    elif isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        items = list(prompt)
    elif isinstance(prompt, list) and prompt and all(isinstance(p, list) for p in prompt):
        items = [ids_ok(p) for p in prompt]
    elif isinstance(prompt, list) and prompt:
        items = [ids_ok(prompt)]
    elif prompt is None:
        raise bad("required")
    elif isinstance(prompt, list) and not prompt:
        raise bad("must not be empty")
    else:
        raise bad("must be a string, an array of strings, or an array of token ids")
    if len(items) > MAX_N:
        raise bad(f"at most {MAX_N} prompts in one request")
    if any(len(p) == 0 for p in items):
        raise bad("must not be empty")
    return items


def with_samplers(params: SamplingParams, value: list[str] | str) -> SamplingParams:
    """`sampling_chain.with_samplers`, its ValueError a 400 naming `samplers`."""
    try:
        return sampling_chain.with_samplers(params, value)
    except ValueError as e:
        raise APIError(400, str(e), param="samplers") from None


def check_off(req: Any, answered: frozenset[str] = frozenset()) -> None:
    """A 400 for a llama.cpp sampler or feature Strata lacks that is asked for (anything
    but its "off" value); `answered`: the fields the caller handles itself."""
    for name, ok in _OFF.items():
        if name in answered:
            continue
        v = getattr(req, name)
        if v is not None and v not in ok:
            raise APIError(
                400,
                f"{name}: not supported (only {ok[0]!r}, off, is accepted)",
                param=name,
                code="unsupported_field",
            )
