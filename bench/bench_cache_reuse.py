"""An editor's code completion over a long file, Strata vs llama-server, `--cache-reuse` on
and off: the time each `/infill` spends on its prompt as the cursor moves down the file.

    python bench/bench_cache_reuse.py --model FILE.gguf --llama-server BIN [--reuse 256]
        [--rounds 12] [--step 4] [--prefix-lines 256] [--suffix-lines 64] [--threads 2]
        [--peer-args=--no-repack]

The file is a standard-library module's source (`argparse`); each round puts the cursor
`--step` lines further down and sends what llama.vscode sends: the `--prefix-lines` lines
before the cursor as `input_prefix`, the `--suffix-lines` after it as `input_suffix`, 16
tokens to predict, greedy. The window slides: a round's prompt drops the lines that left the
window at its start and gains lines at its end, so the prefix it shares with the last prompt
is short, and what the cache holds of the rest sits at other positions — what KV shifting
moves instead of reading again. Per configuration: the medians over the rounds after the first
of the server's own figures (`timings.prompt_ms`, `prompt_n`, `cache_n`: both servers report
them on /infill) and of the client's wall time per request. The model needs FIM tokens (a
Qwen3 vocabulary has them).
"""

from __future__ import annotations

import argparse
import http.client
import inspect
import json
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
import bench_serve as bs


def rounds(lines: list[str], n: int, step: int, pre: int, suf: int) -> list[dict[str, Any]]:
    start = pre + 8
    out = []
    for r in range(n):
        cur = start + r * step
        out.append(
            {
                "input_prefix": "".join(lines[cur - pre : cur]),
                "input_suffix": "".join(lines[cur : cur + suf]),
                "prompt": "",
                "n_predict": 16,
                "temperature": 0,
                "cache_prompt": True,
            }
        )
    return out


def run(port: int, bodies: list[dict[str, Any]]) -> list[tuple[float, int, int, float]]:
    """(prompt ms, prompt tokens read, cached tokens, wall ms) per request."""
    out = []
    for body in bodies:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
        t0 = bs.time.perf_counter()
        c.request("POST", "/infill", json.dumps(body), {"Content-Type": "application/json"})
        r = json.loads(c.getresponse().read())
        wall = (bs.time.perf_counter() - t0) * 1000
        c.close()
        t = r["timings"]
        out.append((float(t["prompt_ms"]), int(t["prompt_n"]), int(t.get("cache_n", 0)), wall))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--llama-server", help="llama.cpp's llama-server binary (the peer)")
    ap.add_argument("--reuse", type=int, default=256, help="--cache-reuse when on")
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--step", type=int, default=4, help="lines the cursor moves per round")
    ap.add_argument("--prefix-lines", type=int, default=256)
    ap.add_argument("--suffix-lines", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n-ctx", type=int, default=8192)
    ap.add_argument("--peer-args", default="", help="more llama-server flags (e.g. --no-repack)")
    args = ap.parse_args()
    bs.THREADS = args.threads
    import argparse as source_module

    lines = inspect.getsource(source_module).splitlines(keepends=True)
    bodies = rounds(lines, args.rounds, args.step, args.prefix_lines, args.suffix_lines)
    configs: list[tuple[str, Any]] = [
        ("Strata, --cache-reuse 0", lambda: bs.strata(args.model, 1, args.n_ctx, [])),
        (
            f"Strata, --cache-reuse {args.reuse}",
            lambda: bs.strata(args.model, 1, args.n_ctx, ["--cache-reuse", str(args.reuse)]),
        ),
    ]
    if args.llama_server:
        binary, peer = args.llama_server, args.peer_args.split()
        configs += [
            (
                f"llama-server, --cache-reuse {n}",
                lambda n=n: bs.llama(
                    binary, args.model, 1, args.n_ctx, [*peer, "--cache-reuse", str(n)]
                ),
            )
            for n in (0, args.reuse)
        ]
    print(f"{len(bodies)} rounds, cursor +{args.step} lines, windows {args.prefix_lines}"
          f"/{args.suffix_lines} lines, {args.threads} threads; medians of rounds 2..")  # fmt: skip
    print("| server | prompt ms | tokens read | tokens cached | wall ms |")
    print("|---|---|---|---|---|")
    for name, start in configs:
        srv = start()
        try:
            res = run(srv.port, bodies)[1:]
        finally:
            srv.stop()
        cols = [statistics.median(x[i] for x in res) for i in range(4)]
        print(f"| {name} | {cols[0]:.1f} | {cols[1]:.0f} | {cols[2]:.0f} | {cols[3]:.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
