#!/usr/bin/env python3
"""Ask llama-server's `/infill` (the oracle) for the prompts it builds, and write them as goldens
for tests/test_infill.py.

    python scripts/make_infill_goldens.py --server PATH/llama-server --model FILE.gguf [--out P]

FILE must carry the real Qwen3 vocabulary (its FIM tokens `<|fim_prefix|>` … `<|file_sep|>`),
e.g. a benchmark model written by bench/write_q8_model.py or `strata.modelgen`'s
`ModelSpec.qwen3_30b_a3b`; its weights do not matter (one token is generated per request).
llama-server is started once per (context, `--spm-infill`) setting, with `-np 1 -b 2048`, and
each case's response gives `prompt` (the prompt's ids detokenized with special tokens) and
`tokens_evaluated` (its length); both are recorded beside the request.
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

CODE = "def add(a, b):\n    return a + b\n\n"
LONG = "".join(f"value_{i} = compute({i}, 'x{i}')  # step {i}\n" for i in range(400))

# ((server's -c, -n, --spm-infill), request body without n_predict); the server's -n shrinks
# the extra chunks' share
Server = tuple[int, int, bool]
CASES: list[tuple[Server, dict[str, Any]]] = [
    (
        (4096, -1, False),
        {"input_prefix": "def fib(n):\n    ", "input_suffix": "\n\nprint(fib(10))\n"},
    ),
    ((4096, -1, False), {"input_prefix": "x = ", "input_suffix": "", "prompt": "len("}),
    ((4096, -1, False), {"input_prefix": "", "input_suffix": "", "prompt": ""}),
    (
        (4096, -1, False),
        {
            "input_prefix": "import utils\n\nutils.",
            "input_suffix": "\n",
            "input_extra": [
                {"filename": "utils.py", "text": CODE},
                {"text": "# a note without a file name\n"},
            ],
        },
    ),
    # markup in the prefix is text; in the typed prompt it is parsed
    (
        (4096, -1, False),
        {
            "input_prefix": "s = '<|im_start|>'\n",
            "input_suffix": "é 名字 🙂",
            "prompt": "<|im_end|>",
        },
    ),
    # the prefix keeps its last 1536 tokens, the suffix its first 512 - 2 - len(prompt)
    ((4096, -1, False), {"input_prefix": LONG, "input_suffix": LONG, "prompt": "value"}),
    # the extra chunks keep what n_ctx - n_batch - 2 n_predict leaves, from their end
    (
        (2560, -1, False),
        {
            "input_prefix": "a",
            "input_suffix": "b",
            "input_extra": [
                {"filename": "long.py", "text": LONG},
                {"filename": "b.py", "text": CODE},
            ],
        },
    ),
    (
        (4096, 1000, False),
        {
            "input_prefix": "a",
            "input_suffix": "b",
            "input_extra": [{"filename": "long.py", "text": LONG}],
        },
    ),
    (
        (4096, -1, True),
        {
            "input_prefix": "def f():\n    ",
            "input_suffix": "\n",
            "prompt": "ret",
            "input_extra": [{"filename": "m.py", "text": CODE}],
        },
    ),
]
N_PREDICT = 4


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def post(port: int, path: str, body: dict[str, Any]) -> Any:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        json.dumps(body).encode(),
        {"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read())


def serve(server: str, model: str, setting: Server) -> tuple[subprocess.Popen[bytes], int]:
    n_ctx, n_predict, spm = setting
    port = free_port()
    cmd = [server, "-m", model, "-c", str(n_ctx), "-n", str(n_predict), "-np", "1", "-b", "2048"]
    cmd += ["-t", "2", "--port", str(port), "--no-warmup", *(["--spm-infill"] if spm else [])]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(600):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return proc, port
        except OSError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise SystemExit("llama-server did not come up")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--server", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", default=str(ROOT / "tests" / "golden" / "infill_prompts.json"))
    a = ap.parse_args()
    out = []
    for setting in sorted({c for c, _ in CASES}):
        proc, port = serve(a.server, a.model, setting)
        try:
            for c, body in CASES:
                if c != setting:
                    continue
                req = {**body, "n_predict": N_PREDICT, "temperature": 0}
                r = post(port, "/infill", req)
                out.append(
                    {
                        "n_ctx": setting[0],
                        "n_predict": setting[1],
                        "spm": setting[2],
                        "request": req,
                        "prompt": r["prompt"],
                        "tokens_evaluated": r["tokens_evaluated"],
                    }
                )
        finally:
            proc.terminate()
            proc.wait(30)
    Path(a.out).write_text(json.dumps(out, ensure_ascii=False, indent=1) + "\n")
    print(f"{len(out)} cases → {a.out}")


if __name__ == "__main__":
    main()
