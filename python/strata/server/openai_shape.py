"""The OpenAI answer objects of one request: completions and chat completions, whole and
streamed (chunks, deltas, log-probabilities, usage), the chat answer parsed into reasoning,
content and tool calls (`OpenAIShape`, used by `strata.server.routes`)."""

from __future__ import annotations

import time
from typing import Any

from strata import __version__
from strata.server.assistant import AssistantParser, Part
from strata.server.chat import ChatSetup
from strata.server.generate import Delta, TokenInfo, draft_usage, usage_extras
from strata.server.openai_types import Plan
from strata.server.tokenizing import ServerTokenizer

FINGERPRINT = f"strata-{__version__}"


class OpenAIShape:
    """Builds the OpenAI JSON objects of one request (`tokenizer`: counts the reasoning's
    tokens for the usage)."""

    def __init__(
        self,
        endpoint: str,
        rid: str,
        model: str,
        plan: Plan,
        prompt_tokens: int,
        t0: float,
        setup: ChatSetup | None = None,
        tokenizer: ServerTokenizer | None = None,
    ) -> None:
        self.chat = endpoint == "chat"
        self.setup = setup
        self.parsers: dict[int, AssistantParser] = {}  # choice index → its answer's parser
        self.rid, self.model, self.plan = rid, model, plan
        self.prompt_tokens = prompt_tokens
        self.created = int(time.time())
        self.offsets: dict[int, int] = {}
        self.t0 = t0
        self.tier: list[tuple[int, int, int]] = []  # choices' VRAM tier counts (hybrid only)
        self.calls_sent: dict[int, int] = {}  # choice index → tool calls streamed
        self.cached: dict[int, int] = {}  # choice index → its prompt tokens reused from a KV cache
        self.drafts: list[tuple[int, int]] = []  # choices' (drafts offered, accepted)
        self.thought: dict[int, str] = {}  # choice index → its reasoning text (chat)
        self.tokenizer = tokenizer

    def reasoning_tokens(self) -> int | None:
        """The choices' reasoning tokens (OpenAI's `completion_tokens_details`): each one's
        reasoning text tokenized again (the parser splits text, not tokens, as the Responses
        API counts them); None without reasoning."""
        if not self.thought or self.tokenizer is None:
            return None
        return sum(len(self.tokenizer.encode(t, False)) for t in self.thought.values())

    def cached_tokens(self) -> int:
        """Prompt tokens found cached, counted as `prompt_tokens` counts them: each prompt
        once (choice i reads prompt i // n), the tokens all of its choices found cached."""
        per_prompt: dict[int, int] = {}
        for i, c in self.cached.items():
            k = i // self.plan.n
            per_prompt[k] = min(per_prompt.get(k, c), c)
        return sum(per_prompt.values())

    def usage(self, completion_tokens: int) -> dict[str, Any]:
        p = self.prompt_tokens
        out = {
            "prompt_tokens": p,
            "completion_tokens": completion_tokens,
            "total_tokens": p + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens()},
            **usage_extras(self.tier),
            **draft_usage(self.drafts),
        }
        thought = self.reasoning_tokens()
        if thought is not None:
            reasoning = min(thought, completion_tokens)
            out["completion_tokens_details"] = {"reasoning_tokens": reasoning}
        return out

    def logprobs(self, index: int, toks: list[TokenInfo]) -> dict[str, Any] | None:
        if not self.plan.logprobs:
            return None
        if self.chat:
            return {
                "content": [
                    {
                        "token": t.text,
                        "logprob": t.logprob,
                        "bytes": t.bytes,
                        "top_logprobs": [
                            {"token": s, "logprob": lp, "bytes": b} for s, b, lp in t.top
                        ],
                    }
                    for t in toks
                ]
            }
        off = self.offsets.get(index, 0)
        offsets = []
        for t in toks:
            offsets.append(off)
            off += len(t.text)
        self.offsets[index] = off
        return {
            "tokens": [t.text for t in toks],
            "token_logprobs": [t.logprob for t in toks],
            "top_logprobs": [{s: lp for s, _, lp in t.top} for t in toks],
            "text_offset": offsets,
        }

    def chunk(self, choices: list[dict[str, Any]]) -> dict[str, Any]:
        d: dict[str, Any] = {
            "id": self.rid,
            "object": "chat.completion.chunk" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": FINGERPRINT,
            "choices": choices,
        }
        if self.plan.include_usage:
            d["usage"] = None
        return d

    def parser(self, index: int) -> AssistantParser:
        p = self.parsers.get(index)
        if p is None:
            p = self.setup.parser(self.plan.stream) if self.setup else AssistantParser()
            self.parsers[index] = p
        return p

    def finish_reason(self, index: int, finish: str) -> str:
        """ "tool_calls" when the answer made calls and ended by itself."""
        p = self.parsers.get(index)
        return "tool_calls" if finish == "stop" and p is not None and p.n_calls else finish

    def deltas(self, index: int, parts: list[Part]) -> list[dict[str, Any]]:
        """Chat `delta` objects for parsed parts: a call's first delta has its index, id and
        name, the following ones pieces of its arguments, as OpenAI streams them."""
        out: list[dict[str, Any]] = []
        for kind, v in parts:
            if kind == "content":
                out.append({"content": v})
            elif kind == "reasoning":
                out.append({"reasoning_content": v})
                self.thought[index] = self.thought.get(index, "") + v
            elif kind == "call_start":
                k = self.calls_sent.get(index, 0)
                self.calls_sent[index] = k + 1
                fn = {"name": v.name, "arguments": ""}
                out.append(
                    {"tool_calls": [{"index": k, "id": v.id, "type": "function", "function": fn}]}
                )
            elif kind == "call_args":
                k = self.calls_sent[index] - 1
                out.append({"tool_calls": [{"index": k, "function": {"arguments": v}}]})
        return out

    def delta_choices(self, d: Delta, finish: str | None) -> list[dict[str, Any]]:
        """The choice objects of one engine delta (chat: one per parsed part, the last one
        carrying `finish_reason`)."""
        lp = self.logprobs(d.index, d.tokens) if d.tokens else None
        if not self.chat:
            return [{"index": d.index, "text": d.text, "logprobs": lp, "finish_reason": finish}]
        p = self.parser(d.index)
        parts = p.push(d.text) if d.text else []
        if finish is not None:
            parts += p.finish()
        deltas = self.deltas(d.index, parts)
        if finish is not None:
            deltas.append({})
            finish = self.finish_reason(d.index, finish)
        elif not deltas and lp is not None:
            deltas.append({"content": ""})  # the logprobs of text held back
        out = []
        for j, delta in enumerate(deltas):
            last = j == len(deltas) - 1
            out.append(
                {
                    "index": d.index,
                    "delta": delta,
                    "logprobs": lp if j == 0 else None,
                    "finish_reason": finish if last else None,
                }
            )
        return out

    def message(self, index: int, text: str) -> dict[str, Any]:
        """The whole answer of a non-streamed chat choice."""
        p = self.parser(index)
        content, reasoning, calls = "", "", []
        for kind, v in p.push(text) + p.finish():
            if kind == "content":
                content += v
            elif kind == "reasoning":
                reasoning += v
            elif kind == "call":
                calls.append(v.openai())
        msg: dict[str, Any] = {"role": "assistant", "content": content or (None if calls else "")}
        if reasoning:
            msg["reasoning_content"] = reasoning
            self.thought[index] = reasoning
        if calls:
            msg["tool_calls"] = calls
        return msg
