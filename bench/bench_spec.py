"""Speculative decoding: verify cost curve, edit task, draft model; optionally vs llama-server.

    python bench/bench_spec.py cost [--model FILE] [--threads 2] [--reps 40] [--k-max 8]
    python bench/bench_spec.py edit [--model FILE] [--threads 2] [--gen 256] [--reps 3]
    python bench/bench_spec.py draft [--threads 2] [--gen 128] [--reps 3]
    python bench/bench_spec.py serve --llama-server BIN [--model FILE] [--gen 256] [--reps 3]
    python bench/bench_spec.py mtp --model FILE [--code] [--threads 2] [--gen 128] [--reps 3]

- cost: one slot at 300 positions; the step time of a window of k+1 tokens with every row's
  logits (`forward_batch`, logits "window", as the scheduler verifies) against a one-token
  decode, k = 0..k_max: the cost(k)/cost(1) curve the adaptive window reads (min and median
  of `--reps`, the k interleaved).
- edit: the edit task. The prompt holds a ~1K-token source file (the held-out stdlib file
  `graphlib.py`, its first ~1000 tokens, in the training corpus's `# <path>` format) and asks
  for it again with one rename (a base model: the request is the second header's comment);
  greedy, `--gen` tokens, through the engine's scheduler in this process (no HTTP). Decode
  tok/s (tokens after the first ÷ the time after the first) with spec off, ngram (adaptive)
  and ngram with every window drafting `spec_max`; the output is the same in all (greedy).
  Each mode keeps one speculator over all its requests (as the engine does), so the adaptive
  window's measured costs and acceptance carry over.
- draft: the trained default with its shipped dense draft (spec=draft), on code prompts;
  off vs adaptive vs fixed windows.
- mtp: a file with an MTP layer (bench/mtp_model.py makes small random ones) and spec=mtp,
  on three prompts of 32 random token ids (`--code`: the draft run's code prompts, for the
  trained one of scripts/train_mtp_model.py): off vs adaptive vs fixed windows. The MTP layer
  runs (caught up on every forward call) only in the spec=mtp runs.
- serve: the edit task over HTTP, one client for both servers, interleaved: Strata `--spec
  ngram` (adaptive, and every window `spec_max`) and off vs llama-server with its n-gram
  speculation (`--spec-type ngram-simple --spec-draft-n-max 8`, llama.cpp's prompt lookup)
  and without. Decode tok/s = (completion tokens − 1) ÷ (last
  chunk − first chunk), completion tokens from the final usage.
Medians of `--reps` where it says so. The machine and its load are the caller's to report.
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import sys
import sysconfig
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from bench_serve import Server, free_port, model_id

EDIT_FILE = "graphlib.py"
EDIT_TOKENS = 1000


def device_kw(a: argparse.Namespace) -> dict[str, Any]:
    """The device settings (`--device cuda --vram-budget-mib N`: the hybrid mode)."""
    kw: dict[str, Any] = {"device": a.device}
    if a.vram_budget_mib:
        kw["vram_budget_mib"] = a.vram_budget_mib
    return kw


def hybrid_slots(a: argparse.Namespace) -> None:
    """`--vram-slots S`: the hybrid mode with S expert slots in VRAM (as bench_hybrid.py's
    share), for `strata.LLM` too (which takes no such setting: its `Model.open` is wrapped
    here, in this benchmark process only)."""
    if a.vram_slots < 0:
        return
    import strata.llm
    from strata._core import Model

    class Slotted:
        open = staticmethod(lambda *p, **kw: Model.open(*p, **kw, vram_slots=a.vram_slots))

    strata.llm.Model = Slotted  # type: ignore[misc, assignment]


def default_model() -> str:
    from strata import modelgen

    return str(modelgen.shipped_model_path("default"))


def cost(a: argparse.Namespace) -> None:
    from strata._core import Model

    slots = {"vram_slots": a.vram_slots} if a.vram_slots >= 0 else {}
    m = Model.open(a.model, n_ctx=1024, n_slots=1, threads=a.threads, **device_kw(a), **slots)
    print(f"device {a.device}, hybrid {m.hybrid_info()}")
    rng = np.random.default_rng(0)
    n_vocab = int(m.n_vocab)
    m.forward(0, [int(t) for t in rng.integers(0, n_vocab, 300)], logits="last")
    ks = list(range(a.k_max + 1))
    times: dict[int, list[float]] = {k: [] for k in ks}
    for _ in range(a.reps):
        for k in ks:  # interleaved: the machine's load falls on every k alike
            start = m.slot_len(0)
            ids = [int(t) for t in rng.integers(0, n_vocab, k + 1)]
            t0 = time.perf_counter()
            m.forward_batch([(0, ids, "window")])
            times[k].append(time.perf_counter() - t0)
            # keep the window's first token (a window's first checkpoint: qwen35moe /
            # qwen3next restore their recurrent state only there), so the context grows by one
            # position per measurement
            m.truncate(0, start + 1)
    print(f"model {a.model}, threads {a.threads}, reps {a.reps}")
    print("| k (drafts) | window tokens | min ms | median ms | cost(k)/cost(1) min | median |")
    print("|---|---|---|---|---|---|")
    lo0, md0 = min(times[0]), statistics.median(times[0])
    for k in ks:
        lo, md = min(times[k]), statistics.median(times[k])
        print(
            f"| {k} | {k + 1} | {lo * 1e3:.2f} | {md * 1e3:.2f} | {lo / lo0:.2f} | {md / md0:.2f} |"
        )


def edit_prompt(tok: Any) -> tuple[str, str]:
    """(prompt, the file's text in it)."""
    src = (Path(sysconfig.get_paths()["stdlib"]) / EDIT_FILE).read_text()
    body = ""
    for line in src.splitlines(keepends=True):
        if len(tok.encode(body + line)) > EDIT_TOKENS:
            break
        body += line
    head = f"# {EDIT_FILE}"
    ask = f"{head} (the same file with `_NodeInfo` renamed to `NodeInfo`)\n"
    return f"{head}\n{body}<|endoftext|>{ask}", body


def engine_run(be: Any, sp: Any, ids: list[int], gen: int) -> tuple[float, list[int]]:
    """(decode tok/s, output ids) of one greedy request through the scheduler, with the
    speculator `sp` (None: off; kept across requests, as the engine keeps its one)."""
    from strata.engine.protocol import Submit, Tokens
    from strata.engine.scheduler import Scheduler
    from strata.sampling import SamplingParams

    be.free(0)
    if sp is not None:
        sp.drafter.rollback(0, 0)  # no draft KV carried over from the previous request
    model = getattr(getattr(be, "llm", None), "model", None)
    if model is not None and getattr(model, "has_mtp", False):
        model.set_mtp(sp is not None and sp.drafter.name == "mtp")  # its cost only with it
    sched = Scheduler(be, 512, 1, speculator=sp, reuse=False)
    sched.add(Submit(0, ids, SamplingParams(temperature=0), gen, []))
    out: list[int] = []
    t1, n1 = 0.0, 0
    while sched.has_work():
        for e in sched.step():
            if isinstance(e, Tokens) and e.ids:
                if not out:
                    t1, n1 = time.perf_counter(), len(e.ids)
                out += e.ids
    dt = time.perf_counter() - t1
    return (len(out) - n1) / dt, out


def compare(a: argparse.Namespace, prompts: list[list[int]], kinds: list[str]) -> None:
    from strata.config import Config
    from strata.engine.backend import LLMBackend
    from strata.spec import make_speculator

    be = LLMBackend(
        Config(model=a.model, parallel=1, n_ctx=4096, threads=a.threads, **device_kw(a))
    )
    modes = [("off", True)] + [(k, ad) for k in kinds for ad in (True, False)]
    specs = {
        m: make_speculator(
            Config(
                model=a.model,
                spec=m[0],
                parallel=1,
                n_ctx=4096,
                threads=a.threads,
                # the window's settings only with speculation on (off, they change nothing)
                **({} if m[0] == "off" else {"spec_adaptive": m[1], "spec_max": a.k_max}),
            ),
            be,
        )
        for m in modes
    }
    res: dict[tuple[str, bool], list[float]] = {m: [] for m in modes}
    acc: dict[tuple[str, bool], list[int]] = {m: [0, 0] for m in modes}
    outs: dict[tuple[str, bool], list[list[int]]] = {m: [] for m in modes}
    for _ in range(a.reps):
        for ids in prompts:
            for m in modes:  # interleaved
                sp = specs[m]
                before = (sp.offered, sp.accepted) if sp is not None else (0, 0)
                tps, out = engine_run(be, sp, ids, a.gen)
                res[m].append(tps)
                outs[m].append(out)
                if sp is not None:
                    acc[m][0] += sp.offered - before[0]
                    acc[m][1] += sp.accepted - before[1]
    same = all(outs[m] == outs[("off", True)] for m in modes)
    print(
        f"model {a.model}, threads {a.threads}, {a.gen} tokens, reps {a.reps}; same output: {same}"
    )
    print("| spec | window | decode tok/s (median) | × off | drafts accepted / offered |")
    print("|---|---|---|---|---|")
    off = statistics.median(res[("off", True)])
    for m in modes:
        t = statistics.median(res[m])
        window = "—" if m[0] == "off" else ("adaptive" if m[1] else f"spec_max ({a.k_max})")
        o, k = acc[m]
        rate = f"{k} / {o} ({k / o:.0%})" if o else "—"
        print(f"| {m[0]} | {window} | {t:.1f} | {t / off:.2f} | {rate} |")


def edit(a: argparse.Namespace) -> None:
    from strata.gguf import GGUFFile
    from strata.tokenizer import Tokenizer

    with GGUFFile(a.model) as g:
        tok = Tokenizer.from_metadata(g.metadata)
    prompt, _ = edit_prompt(tok)
    ids = tok.encode(prompt)
    print(f"edit task: {len(ids)} prompt tokens ({EDIT_FILE}, first {EDIT_TOKENS} tokens)")
    compare(a, [ids], ["ngram"])


def draft(a: argparse.Namespace) -> None:
    compare(a, code_prompts(a.model), ["draft"])


CODE_PROMPTS = [
    "import os\n\n\ndef walk_files(root):\n",
    "class Stack:\n    def __init__(self):\n",
    'def parse_args(argv):\n    """Parse the command line."""\n',
]


def code_prompts(path: str) -> list[list[int]]:
    """CODE_PROMPTS in the file's own tokenizer (models trained on the stdlib corpus)."""
    from strata.gguf import GGUFFile
    from strata.tokenizer import Tokenizer

    with GGUFFile(path) as g:
        tok = Tokenizer.from_metadata(g.metadata)
    return [tok.encode(p) for p in CODE_PROMPTS]


def mtp(a: argparse.Namespace) -> None:
    """Random files: three prompts of 32 random ids; `--code` (a file trained on the
    stdlib corpus, scripts/train_mtp_model.py): the draft run's code prompts."""
    if a.code:
        prompts = code_prompts(a.model)
    else:
        rng = np.random.default_rng(0)
        prompts = [[int(t) for t in rng.integers(0, 500, 32)] for _ in range(3)]
    compare(a, prompts, ["mtp"])


def http_stream(port: int, body: dict[str, Any]) -> tuple[float, int, dict[str, Any]]:
    """(decode tok/s, completion tokens, final extra fields) of one streamed completion."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    c.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        raise RuntimeError(f"HTTP {r.status}: {r.read()[:300]!r}")
    first = last = 0.0
    n = 0
    extra: dict[str, Any] = {}
    for raw in r:
        line = raw.strip()
        if not line.startswith(b"data: ") or line == b"data: [DONE]":
            continue
        ev = json.loads(line[6:])
        if any(ch.get("text") for ch in ev.get("choices") or []):
            last = time.monotonic()
            first = first or last
        if ev.get("usage"):
            n = int(ev["usage"]["completion_tokens"])
            extra.update(ev["usage"])
        if ev.get("timings"):
            extra["timings"] = ev["timings"]
    c.close()
    return ((n - 1) / (last - first) if last > first else float("nan")), n, extra


def serve(a: argparse.Namespace) -> None:
    import os

    from strata.gguf import GGUFFile
    from strata.tokenizer import Tokenizer

    with GGUFFile(a.model) as g:
        tok = Tokenizer.from_metadata(g.metadata)
    prompt, _ = edit_prompt(tok)
    th = str(a.threads)

    def strata_srv(spec: str, *extra: str) -> Server:
        port = free_port()
        argv = [sys.executable, "-m", "strata.server", "--model", a.model, "--port", str(port)]
        argv += ["--n-ctx", "4096", "--threads", th, "--spec", spec, "--no-cache-prompt", *extra]
        return Server(f"strata-{spec}", argv, port, dict(os.environ))

    def llama_srv(spec: bool) -> Server:
        port = free_port()
        argv = [a.llama_server, "-m", a.model, "--port", str(port), "-np", "1", "-c", "4096"]
        argv += ["-t", th, "-tb", th]
        if spec:
            argv += a.llama_spec.split()
        return Server(f"llama-{'spec' if spec else 'off'}", argv, port, dict(os.environ))

    servers = {
        "strata off": strata_srv("off"),
        "strata ngram": strata_srv("ngram"),
        "strata ngram, spec_max windows": strata_srv("ngram", "--no-spec-adaptive"),
        "llama-server off": llama_srv(False),
        "llama-server ngram": llama_srv(True),
    }
    res: dict[str, list[float]] = {k: [] for k in servers}
    own: dict[str, list[float]] = {k: [] for k in servers}  # llama-server's own timings
    info: dict[str, Any] = {}
    try:
        for _ in range(a.reps):
            for name, srv in servers.items():
                body = {
                    "model": model_id(srv.port),
                    "prompt": prompt,
                    "max_tokens": a.gen,
                    "temperature": 0,
                    "cache_prompt": False,
                }
                if name.startswith("strata"):
                    body.pop("cache_prompt")
                tps, _, extra = http_stream(srv.port, body)
                res[name].append(tps)
                t = extra.get("timings") or {}
                if "predicted_per_second" in t:
                    own[name].append(float(t["predicted_per_second"]))
                keep = ("drafts_offered", "drafts_accepted")
                info[name] = {k: v for k, v in extra.items() if k in keep} or {
                    k: t[k] for k in ("draft_n", "draft_n_accepted") if k in t
                }
    finally:
        for srv in servers.values():
            srv.stop()
    print(f"serve edit task: {a.model}, threads {a.threads}, {a.gen} tokens, reps {a.reps}")
    print(f"llama-server speculation flags: {a.llama_spec}")
    print("| server | decode tok/s (median) | its own timing (median) | last run's drafts |")
    print("|---|---|---|---|")
    for name, v in res.items():
        o = f"{statistics.median(own[name]):.1f}" if own[name] else "—"
        print(f"| {name} | {statistics.median(v):.1f} | {o} | {info.get(name)} |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("what", choices=("cost", "edit", "draft", "serve", "mtp"))
    ap.add_argument("--model", default="")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--k-max", type=int, default=8)
    ap.add_argument("--code", action="store_true", help="mtp: code prompts (a trained file)")
    ap.add_argument("--gen", type=int, default=256)
    ap.add_argument("--llama-server", default="")
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--vram-budget-mib", type=int, default=0, help="cuda: the hybrid mode")
    ap.add_argument("--vram-slots", type=int, default=-1, help="cuda: hybrid, S expert slots")
    ap.add_argument("--llama-spec", default="--spec-type ngram-simple --spec-draft-n-max 8")
    a = ap.parse_args()
    a.model = a.model or default_model()
    hybrid_slots(a)
    {"cost": cost, "edit": edit, "draft": draft, "serve": serve, "mtp": mtp}[a.what](a)
    return 0


if __name__ == "__main__":
    sys.exit(main())
