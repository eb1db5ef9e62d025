"""Served speed, Strata's server vs llama.cpp's `llama-server`, driven by one client over HTTP.

    python bench/bench_serve.py --model FILE.gguf --llama-server BIN [--streams 1,2,4,8]
        [--gen 128] [--reps 5] [--turns 8] [--turn-words 260] [--skip decode,chat,bare]
        [--scaling N] [--server-cpu N]

Three measurements, each interleaved (A B A B ...) on the same file, the same thread count:
- decode: N concurrent greedy streams (/v1/completions, stream, temperature 0, `--gen` tokens
  each, a 16-word prompt); aggregate decode tok/s = tokens after each stream's first ÷ the time
  from the first stream's first token to the last stream's last token. Strata runs with
  `--parallel N`, llama-server with `-np N -t THREADS` (its continuous batching and prompt
  cache on, as by default).
- chat: an 8-turn conversation whose prompt grows to ~4K tokens, each turn resending the whole
  history plus `--turn-words` new words (~500 tokens) and generating 32 tokens; the sum of
  the turns' time to first token. Strata with prefix reuse (default), Strata without
  (`--no-cache-prompt`), llama-server (its cache_prompt on).
- bare: Strata's forward pass alone (no server), one greedy stream of `--gen` tokens after the
  same prompt: the speed a served stream is held against.
- chunk: one forward_batch step of a prompt chunk of n tokens plus one decoding sequence:
  prompt tok/s and the step time by n (what `max_batch_tokens` trades).
- scaling (`--scaling N`): Strata's N-stream aggregate against its own single stream, and its
  served single stream against the bare pass, paired: each repetition runs a bare decode, then
  a 1-stream and an N-stream round on one `--parallel N` server, back to back; the medians of
  the per-repetition ratios (rounds minutes apart, as the decode table's "÷ its 1 stream"
  column divides, move with the machine's RAM rate; a repetition shares it).
- server CPU (`--server-cpu N`): the server process's CPU time (user + system, /proc) per
  streamed token over one greedy stream of N tokens, `--reps` times after a warm-up: what the
  HTTP side takes from the cores the compute threads fill (the engine process not counted).
The client is the standard library (one thread per stream, SSE parsed by hand), the same code
for both servers. Medians of `--reps`.
"""

from __future__ import annotations

import argparse
import http.client
import itertools
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

_WORDS = (
    "the of and to in is was he for it with as his on be at by had are but from or have an they "
    "which one you were all her she there would their we him been has when who will no more if "
    "out so up said what its about than into them can only other time new some could these two "
    "may first then do any like my now over such our man me even most made after also did many "
    "before must through back years where much your way well down should because each just"
)
WORDS = _WORDS.split(" ")
THREADS = 2
# --cpus: the cores the servers (and the bare pass) are pinned to, e.g. "0,1" on a larger host
CPUS: list[str] = []


def text(seed: int, n_words: int) -> str:
    """Deterministic pseudo-English of `n_words` words."""
    x = seed * 2654435761 + 1
    out = []
    for _ in range(n_words):
        x = (x * 6364136223846793005 + 1442695040888963407) % (1 << 64)
        out.append(WORDS[(x >> 33) % len(WORDS)])
    return " ".join(out)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    def __init__(self, name: str, argv: list[str], port: int, env: dict[str, str]) -> None:
        self.name, self.port = name, port
        self.log = open(f"/tmp/bench_serve_{name}_{port}.log", "w")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [*CPUS, *argv], stdout=self.log, stderr=subprocess.STDOUT, env=env
        )
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{name} exited; see {self.log.name}")
            try:
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                c.request("GET", "/health")
                if c.getresponse().status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"{name} did not get ready")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


def strata(model: Path, parallel: int, n_ctx: int, extra: list[str]) -> Server:
    """`n_ctx` positions for each of the `parallel` streams: `--n-ctx` is all of them together,
    as llama-server's `-c`."""
    port = free_port()
    argv = [sys.executable, "-m", "strata.server", "--model", str(model), "--port", str(port)]
    argv += ["--parallel", str(parallel), "--n-ctx", str(n_ctx * parallel)]
    argv += ["--threads", str(THREADS), *extra]
    return Server("strata", argv, port, dict(os.environ))


def llama(
    binary: str, model: Path, parallel: int, n_ctx: int, extra: list[str] | None = None
) -> Server:
    port = free_port()
    argv = [binary, "-m", str(model), "--port", str(port), "-np", str(parallel)]
    argv += ["-t", str(THREADS), "-tb", str(THREADS), "-c", str(n_ctx * parallel), *(extra or [])]
    return Server("llama", argv, port, dict(os.environ))


def model_id(port: int) -> str:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("GET", "/v1/models")
    out = str(json.loads(c.getresponse().read())["data"][0]["id"])
    c.close()
    return out


def stream(port: int, body: dict[str, Any]) -> tuple[float, list[tuple[float, str]]]:
    """One streamed completion: (t_sent, [(t_arrived, text)] per content chunk; both servers
    send one chunk per token)."""
    t0, chunks, _ = stream_usage(port, body)
    return t0, chunks


def stream_usage(
    port: int, body: dict[str, Any], with_empty: bool = False
) -> tuple[float, list[tuple[float, str]], int | None]:
    """`stream` plus the usage's completion tokens (None where the server sent no usage): the
    token count whatever a chunk holds (a token that ends inside a UTF-8 character has no
    text of its own). `with_empty`: chunks without text are timed too (a random model's
    tokens may decode to nothing; the finishing chunk then marks the last token)."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    t0 = time.monotonic()
    c.request(
        "POST",
        "/v1/completions",
        json.dumps({**body, "stream": True, "stream_options": {"include_usage": True}}),
        {"Content-Type": "application/json"},
    )
    r = c.getresponse()
    if r.status != 200:
        raise RuntimeError(f"HTTP {r.status}: {r.read()[:300]!r}")
    chunks: list[tuple[float, str]] = []
    used: int | None = None
    for raw in r:
        line = raw.strip()
        if not line.startswith(b"data: ") or line == b"data: [DONE]":
            continue
        obj = json.loads(line[6:])
        if obj.get("usage"):
            used = int(obj["usage"]["completion_tokens"])
        for ch in obj.get("choices") or []:
            if ch.get("text") or (with_empty and used is None):
                chunks.append((time.monotonic(), ch.get("text") or ""))
    c.close()
    return t0, chunks, used


ROUNDS = itertools.count()


def decode_round(port: int, n: int, gen: int) -> tuple[float, int]:
    """N concurrent greedy streams: (aggregate decode tok/s, tokens). Every round has prompts
    of its own: a greedy stream from a prompt seen before decodes the same tokens, which an
    adaptive expert tier (the hybrid server's) learns round by round."""
    model = model_id(port)
    res: list[list[tuple[float, str]]] = [[] for _ in range(n)]
    used: list[int | None] = [None] * n
    base = 100 + 1000 * next(ROUNDS)

    def one(i: int) -> None:
        body = {
            "model": model,
            "prompt": text(base + i, 16),
            "max_tokens": gen,
            "temperature": 0,
            "ignore_eos": True,  # both servers: every stream decodes `gen` tokens
        }
        _, res[i], used[i] = stream_usage(port, body, with_empty=True)

    ts = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    if any(not r for r in res):
        raise RuntimeError(f"a stream sent no text: {[len(r) for r in res]} chunks")
    first = min(r[0][0] for r in res)
    last = max(r[-1][0] for r in res)
    counts = [u if u is not None else len(r) for u, r in zip(used, res, strict=True)]
    chunks = [len(r) for r in res]
    if last <= first or sum(chunks) < 0.8 * sum(counts):
        # the rate assumes about a chunk per token (a character split over two tokens goes out
        # in one): streams whose tokens decode to no text (a padded test vocabulary) send far
        # fewer chunks, and their first-to-last window is short
        raise RuntimeError(f"streams sent {chunks} chunks for {counts} tokens: no decode span")
    return (sum(counts) - n) / (last - first), sum(counts)


def chat_round(port: int, turns: int, turn_words: int, seed: int) -> float:
    """Total time to first token over a growing conversation (seconds)."""
    history = ""
    total = 0.0
    model = model_id(port)
    for k in range(turns):
        history += f"\nUser: {text(seed * 100 + k, turn_words)}\nAssistant:"
        body = {"model": model, "prompt": history, "max_tokens": 32, "temperature": 0}
        t0, chunks = stream(port, body)
        total += (chunks[0][0] if chunks else time.monotonic()) - t0
        got = "".join(t for _, t in chunks)
        history += got
    return total


def bare_decode(model: Path, gen: int) -> float:
    """Strata's forward pass alone: greedy decode tok/s after the same 16-word prompt. Pinned
    to the servers' cores for its run only (the client's threads must not share them after)."""
    import numpy as np
    from strata.llm import LLM

    mask = os.sched_getaffinity(0)
    if CPUS:
        os.sched_setaffinity(0, {int(c) for c in CPUS[-1].split(",")})
    try:
        llm = LLM(model, n_ctx=1024, threads=THREADS)
        ids = llm.encode_prompt(text(100, 16))
        m = llm.model
        logits = m.forward(llm._own, ids, logits="last")
        tok = int(np.argmax(logits))
        t0 = time.perf_counter()
        for _ in range(gen - 1):
            tok = int(np.argmax(m.forward(llm._own, [tok], logits="last")))
        rate = (gen - 1) / (time.perf_counter() - t0)
        del llm, m  # its compute threads end before the affinity is restored
        return rate
    finally:
        os.sched_setaffinity(0, mask)


def chunk_sizes(model: Path, sizes: list[int], reps: int) -> None:
    """Prompt tokens/s of one forward_batch step by prompt-chunk size, with one decoding
    sequence sharing the step: what `max_batch_tokens` trades (prompt speed against the
    decoding sequences' step time)."""
    from strata.llm import LLM

    llm = LLM(model, n_ctx=8192, parallel=2)  # 4096 to each
    print("| chunk tokens | prompt tok/s | step ms (a decode waits this long) |")
    print("|---|---|---|")
    for n in sizes:
        times = []
        for r in range(reps):
            llm.truncate(0, 0)
            llm.truncate(1, 0)
            llm.forward_batch([(1, [5, 6, 7, 8], "last")])
            ids = [(7 * i + r) % 1000 + 10 for i in range(n)]
            t0 = time.perf_counter()
            llm.forward_batch([(0, ids, "last"), (1, [9], "last")])
            times.append(time.perf_counter() - t0)
        t = med(times)
        print(f"| {n} | {n / t:.0f} | {t * 1000:.1f} |", flush=True)


def med(xs: list[float]) -> float:
    return statistics.median(xs)


def scaling(model: Path, n: int, gen: int, reps: int, extra: list[str]) -> None:
    """Strata's n-stream aggregate ÷ its 1-stream speed, and its served 1 stream ÷ the bare
    forward pass: each repetition runs a bare decode, then a 1-stream and an n-stream round on
    one `--parallel n` server, back to back (one RAM moment); prints the triples and the
    medians of the per-repetition ratios."""
    srv = strata(model, n, 1024, extra)
    runs: list[tuple[float, float, float]] = []
    try:
        for _ in range(reps):
            bare = bare_decode(model, gen)
            one = decode_round(srv.port, 1, gen)[0]
            many = decode_round(srv.port, n, gen)[0]
            runs.append((bare, one, many))
    finally:
        srv.stop()
    ratios = [m / o for _, o, m in runs]
    served = [o / b for b, o, _ in runs]
    print(
        f"scaling: {n} streams ÷ 1 stream, paired rounds: median {med(ratios):.2f} "
        f"(min {min(ratios):.2f}, max {max(ratios):.2f}); 1 stream "
        f"{med([o for _, o, _ in runs]):.1f}, {n} streams {med([m for _, _, m in runs]):.1f} "
        f"tok/s; served 1 stream ÷ bare, paired: median {med(served):.3f} "
        f"(min {min(served):.3f}, max {max(served):.3f}); bare / 1 / {n} "
        f"{[tuple(round(x, 1) for x in r) for r in runs]}",
        flush=True,
    )


def proc_cpu_s(pid: int) -> float:
    """User + system CPU seconds of process `pid`, all its threads (/proc/PID/stat)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def server_cpu(model: Path, gen: int, reps: int, extra: list[str]) -> None:
    """The Strata server process's CPU ms per streamed token (one stream of `gen` tokens)."""
    srv = strata(model, 1, gen + 64, extra)
    per_token: list[float] = []
    try:
        decode_round(srv.port, 1, 16)  # warm-up
        for _ in range(reps):
            c0 = proc_cpu_s(srv.proc.pid)
            _, tokens = decode_round(srv.port, 1, gen)
            per_token.append((proc_cpu_s(srv.proc.pid) - c0) / tokens * 1e3)
    finally:
        srv.stop()
    print(
        f"server CPU per streamed token: median {med(per_token):.3f} ms "
        f"{[round(x, 3) for x in per_token]}",
        flush=True,
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--llama-server", default="")
    ap.add_argument("--streams", default="1,2,4,8")
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--turn-words", type=int, default=260, help="new words per turn (~500 tokens)")
    ap.add_argument("--skip", default="", help="comma list of decode, chat, bare, chunk")
    ap.add_argument("--chunks", default="64,128,256,512,1024,2048")
    ap.add_argument("--strata-args", default="", help="extra strata.server flags")
    ap.add_argument(
        "--llama-args",
        default="",
        help='extra llama-server flags (e.g. "--no-repack --poll 0" where its repacked path fails)',
    )
    ap.add_argument("--cpus", default="", help="pin the servers and the bare pass (taskset -c)")
    ap.add_argument(
        "--scaling", type=int, default=0, help="N: Strata's N streams ÷ its 1 stream, paired rounds"
    )
    ap.add_argument(
        "--server-cpu", type=int, default=0, help="N: server CPU ms per token over N-token streams"
    )
    a = ap.parse_args()
    if a.cpus:
        CPUS[:] = ["taskset", "-c", a.cpus]
    skip = set(a.skip.split(",")) - {""}
    extra = a.strata_args.split()
    lextra = a.llama_args.split()
    print(f"model {a.model}, {THREADS} threads, load average {os.getloadavg()}", flush=True)
    if "chunk" not in skip:
        chunk_sizes(a.model, [int(x) for x in a.chunks.split(",")], a.reps)
    if "bare" not in skip:
        bare = [bare_decode(a.model, a.gen) for _ in range(min(a.reps, 3))]
        print(f"bare forward decode: {med(bare):.1f} tok/s {[round(x, 1) for x in bare]}")
    if a.scaling:
        scaling(a.model, a.scaling, a.gen, a.reps, extra)
    if a.server_cpu:
        server_cpu(a.model, a.server_cpu, a.reps, extra)
    if "decode" not in skip:
        print("| streams | strata tok/s | llama-server tok/s | strata ÷ llama |")
        print("|---|---|---|---|")
        single = 0.0
        for n in [int(x) for x in a.streams.split(",")]:
            servers = [("strata", strata(a.model, n, 1024, extra))]
            if a.llama_server:
                servers.append(("llama", llama(a.llama_server, a.model, n, 1024, lextra)))
            got: dict[str, list[float]] = {k: [] for k, _ in servers}
            try:
                for _ in range(a.reps):
                    for k, s in servers:
                        got[k].append(decode_round(s.port, n, a.gen)[0])
            finally:
                for _, s in servers:
                    s.stop()
            st = med(got["strata"])
            single = single or st
            ll = med(got["llama"]) if "llama" in got else float("nan")
            print(
                f"| {n} | {st:.1f} | {ll:.1f} | {st / ll:.2f} |  "
                f"(strata ÷ its 1 stream {st / single:.2f}; runs {got})",
                flush=True,
            )
    if "chat" not in skip:
        ctx = 8192
        runs: dict[str, list[float]] = {"strata reuse": [], "strata no reuse": [], "llama": []}
        chat_servers = {
            "strata reuse": strata(a.model, 1, ctx, extra),
            "strata no reuse": strata(a.model, 1, ctx, [*extra, "--no-cache-prompt"]),
        }
        if a.llama_server:
            chat_servers["llama"] = llama(a.llama_server, a.model, 1, ctx, lextra)
        try:
            for rep in range(a.reps):
                for k, s in chat_servers.items():
                    runs[k].append(chat_round(s.port, a.turns, a.turn_words, rep))
        finally:
            for s in chat_servers.values():
                s.stop()
        for k, v in runs.items():
            if v:
                print(f"chat TTFT total, {k}: {med(v):.2f} s {[round(x, 2) for x in v]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
