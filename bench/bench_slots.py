"""A long prompt kept across a restart, Strata vs llama-server (`--slot-save-path`): the
prompt's first read, its slot saved, the slot erased (as after a restart), restored, and the
same prompt sent again — the time a restore saves against reading the prompt again.

    python bench/bench_slots.py --model FILE.gguf [--llama-server BIN] [--words 1500] \
        [--threads 2] [--reps 3] [--peer-args=--no-repack]

The prompt: `--words` words of bench_serve's seeded text, 1 token predicted, greedy. Per
server, medians over `--reps` rounds of: `/completion` (the first read: `timings.prompt_ms`),
`POST /slots/0?action=save` (`timings.save_ms`, the file's bytes), `action=erase`,
`action=restore` (`timings.restore_ms`), `/completion` again (its `prompt_ms`, `cache_n`).
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
import bench_serve as bs


def post(port: int, path: str, body: dict[str, Any]) -> dict[str, Any]:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    c.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    out: dict[str, Any] = json.loads(r.read())
    if r.status != 200:
        raise RuntimeError(f"{path}: {r.status} {out}")
    return out


def one_round(port: int, prompt: str) -> list[float]:
    """[first prompt ms, save ms, bytes, restore ms, prompt ms after, tokens cached after]"""
    body = {"prompt": prompt, "n_predict": 1, "temperature": 0, "cache_prompt": True}
    post(port, "/slots/0?action=erase", {})
    first = post(port, "/completion", body)
    saved = post(port, "/slots/0?action=save", {"filename": "bench.bin"})
    post(port, "/slots/0?action=erase", {})
    restored = post(port, "/slots/0?action=restore", {"filename": "bench.bin"})
    again = post(port, "/completion", body)
    return [
        first["timings"]["prompt_ms"],
        saved["timings"]["save_ms"],
        saved["n_written"],
        restored["timings"]["restore_ms"],
        again["timings"]["prompt_ms"],
        again["timings"].get("cache_n", again.get("tokens_cached", 0)),
    ]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--llama-server", help="llama.cpp's llama-server binary (the peer)")
    ap.add_argument("--words", type=int, default=1500)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--n-ctx", type=int, default=8192)
    ap.add_argument("--peer-args", default="", help="more llama-server flags (e.g. --no-repack)")
    args = ap.parse_args()
    bs.THREADS = args.threads
    prompt = bs.text(7, args.words)
    with tempfile.TemporaryDirectory() as d:
        flags = ["--slot-save-path", d]
        configs: list[tuple[str, Any]] = [
            ("Strata", lambda: bs.strata(args.model, 1, args.n_ctx, flags))
        ]
        if args.llama_server:
            peer = [*args.peer_args.split(), *flags]
            configs.append(
                (
                    "llama-server",
                    lambda: bs.llama(args.llama_server, args.model, 1, args.n_ctx, peer),
                )
            )
        print(f"{args.words} words, 1 token predicted, {args.threads} threads; medians of "
              f"{args.reps} rounds")  # fmt: skip
        print("| server | prompt ms (first read) | save ms | file MB | restore ms | prompt ms "
              "after the restore | tokens cached |")  # fmt: skip
        print("|---|---|---|---|---|---|---|")
        for name, start in configs:
            srv = start()
            try:
                rows = [one_round(srv.port, prompt) for _ in range(args.reps)]
            finally:
                srv.stop()
            m = [statistics.median(r[i] for r in rows) for i in range(6)]
            print(f"| {name} | {m[0]:.1f} | {m[1]:.1f} | {m[2] / 1e6:.1f} | {m[3]:.1f} | "
                  f"{m[4]:.1f} | {m[5]:.0f} |")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
