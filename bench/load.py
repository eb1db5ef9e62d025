"""Load test: N concurrent streaming clients for M seconds against a Strata server.

Reports throughput (output tokens/s, requests/s), p50/p99 time to first token and inter-token
latency, errors, and the server's RSS over time (and the engine's). Either point it at a
running server (`--url`, RSS read from /proc for the pids that /v1/status reports, so run it on
the same machine) or let it start one (`--spawn`, with STRATA_* settings from the environment
plus `--fake` for the fake engine).

    python bench/load.py --spawn --fake --clients 16 --duration 30
    python bench/load.py --url http://127.0.0.1:8000 --clients 16 --duration 300
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import httpx


@dataclass
class Tally:
    ttft: list[float] = field(default_factory=list)
    itl: list[float] = field(default_factory=list)
    tokens: int = 0
    requests: int = 0
    errors: list[str] = field(default_factory=list)


def rss_kib(pid: int | None) -> int | None:
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


async def one_client(
    http: httpx.AsyncClient, model: str, args: argparse.Namespace, stop_at: float, t: Tally, i: int
) -> None:
    rng = random.Random(i)
    while time.monotonic() < stop_at:
        words = " ".join(f"w{rng.randint(0, 999)}" for _ in range(args.prompt_words))
        body = {
            "model": model,
            "messages": [{"role": "user", "content": words}],
            "max_tokens": args.max_tokens,
            "temperature": 0.7,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        t0 = time.monotonic()
        last = None
        try:
            async with http.stream("POST", "/v1/chat/completions", json=body) as r:
                if r.status_code != 200:
                    t.errors.append(f"HTTP {r.status_code}: {(await r.aread())[:200]!r}")
                    continue
                async for line in r.aiter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    chunk = json.loads(line[6:])
                    if "error" in chunk:
                        t.errors.append(str(chunk["error"])[:200])
                        break
                    if chunk.get("usage"):
                        t.tokens += chunk["usage"]["completion_tokens"]
                    if chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                        now = time.monotonic()
                        if last is None:
                            t.ttft.append(now - t0)
                        else:
                            t.itl.append(now - last)
                        last = now
            t.requests += 1
        except httpx.HTTPError as e:
            t.errors.append(f"{type(e).__name__}: {e}")


async def run(args: argparse.Namespace) -> dict[str, Any]:
    headers = {"authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    limits = httpx.Limits(max_connections=args.clients + 4)
    async with httpx.AsyncClient(
        base_url=args.url, headers=headers, timeout=600, limits=limits
    ) as http:
        status = (await http.get("/v1/status")).json()
        model = status["model"]["id"]
        server_pid = status["engine"].get("server_pid")
        tally = Tally()
        rss: list[tuple[float, int | None, int | None]] = []
        t_start = time.monotonic()
        stop_at = t_start + args.duration

        async def sample_rss() -> None:
            while time.monotonic() < stop_at:
                eng = (await http.get("/v1/status")).json()["engine"].get("pid")
                rss.append((time.monotonic() - t_start, rss_kib(server_pid), rss_kib(eng)))
                await asyncio.sleep(args.rss_every)

        await asyncio.gather(
            sample_rss(),
            *(one_client(http, model, args, stop_at, tally, i) for i in range(args.clients)),
        )
        elapsed = time.monotonic() - t_start
    srv = [r for _, r, _ in rss if r is not None]
    # RSS drift: last sample vs the first after warm-up (10% of the run)
    warm = [r for t, r, _ in rss if r is not None and t >= 0.1 * args.duration] or srv
    drift = (warm[-1] - warm[0]) / warm[0] * 100 if len(warm) >= 2 else float("nan")
    return {
        "model": model,
        "clients": args.clients,
        "duration_s": round(elapsed, 1),
        "requests": tally.requests,
        "errors": len(tally.errors),
        "error_samples": tally.errors[:5],
        "output_tokens": tally.tokens,
        "tokens_per_s": round(tally.tokens / elapsed, 1),
        "requests_per_s": round(tally.requests / elapsed, 2),
        "ttft_p50_ms": round(pct(tally.ttft, 0.5) * 1000, 1),
        "ttft_p99_ms": round(pct(tally.ttft, 0.99) * 1000, 1),
        "itl_p50_ms": round(pct(tally.itl, 0.5) * 1000, 2),
        "itl_p99_ms": round(pct(tally.itl, 0.99) * 1000, 2),
        "itl_mean_ms": round(statistics.fmean(tally.itl) * 1000, 2) if tally.itl else None,
        "server_rss_mib": [round(r / 1024, 1) for r in srv[:: max(1, len(srv) // 10)]],
        "server_rss_drift_pct_after_warmup": round(drift, 2),
        "engine_rss_mib_last": round((rss[-1][2] or 0) / 1024, 1) if rss else None,
    }


def spawn(args: argparse.Namespace) -> subprocess.Popen[bytes]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ)
    env.setdefault("STRATA_PARALLEL", str(args.clients))
    env.setdefault("STRATA_MAX_QUEUE", str(args.clients * 2))
    # 4096 positions a stream, as before n_ctx became the total of the slots (llama.cpp's -c)
    env.setdefault("STRATA_N_CTX", str(4096 * args.clients))
    if args.fake:
        env["STRATA_ENGINE"] = "fake"
    cmd = [sys.executable, "-m", "uvicorn", "strata.app:app", "--port", str(port)]
    proc = subprocess.Popen([*cmd, "--log-level", "warning"], env=env)
    args.url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        try:
            if httpx.get(args.url + "/health").status_code == 200:
                return proc
        except httpx.TransportError:
            pass
        if proc.poll() is not None:
            raise SystemExit("server exited during start")
        time.sleep(0.2)
    proc.kill()
    raise SystemExit("server did not become ready")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--url", default="http://127.0.0.1:8000")
    p.add_argument("--spawn", action="store_true", help="start a server for the run")
    p.add_argument("--fake", action="store_true", help="with --spawn: the fake engine")
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--duration", type=float, default=30.0, help="seconds")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--prompt-words", type=int, default=24)
    p.add_argument("--rss-every", type=float, default=1.0, help="seconds between RSS samples")
    p.add_argument("--api-key", default="")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = p.parse_args()
    proc = spawn(args) if args.spawn else None
    try:
        res = asyncio.run(run(args))
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(60)
    if args.json:
        print(json.dumps(res, indent=2))
        return
    w = max(len(k) for k in res)
    for k, v in res.items():
        print(f"{k:<{w}}  {v}")


if __name__ == "__main__":
    main()
