"""Pipelined windows (issue #21): greedy decode through the engine's scheduler with n-gram
speculation on one GPU as two stages, `pipeline_windows` 1 vs 2, the adaptive tier's choice
sync vs async (`tier_async`), in the hybrid mode (the CPU pool serving the misses: 25% of the
experts in slots by default) and on the pure GPU path. Requests run one after another
(one sequence decoding: speculation's case) through one engine per configuration (kept over
all its requests, as the server keeps it: what the adaptive window and the guess policy
measured carries over), a warm-up request first; REPS rounds of the requests, interleaved
over the configurations (all engines open at once), the median round's decode tok/s is
reported, and its greedy output is compared with the first configuration's. `--arms` adds pw2
with the guess policy pinned to each arm (serial steps only; a guess on every window): what
each costs alone. Prints a table last (drafts and windows counted over all rounds).

    python bench/bench_pipeline.py MODEL.gguf [--prompt code|phrase] [--tokens 128] \
        [--requests 4] [--reps 3] [--slots-frac 0.25] [--threads 3] [--gpus 0,0] [--arms]

`--prompt code` (the trained default's case): a source file in the model's own vocabulary
that the request continues (the n-gram drafter finds what follows); `edit`: bench_spec.py's
edit task (a 1K-token stdlib file, asked for again with one rename); `phrase`: a random
phrase repeated (any vocabulary, for the random-weight test models).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from strata import _core
from strata.config import Config
from strata.engine.backend import LLMBackend
from strata.engine.protocol import Submit, Tokens
from strata.engine.scheduler import Scheduler
from strata.sampling import SamplingParams
from strata.spec import make_speculator

SOURCE = '''def area(width, height):
    """Area of a rectangle."""
    return width * height


def perimeter(width, height):
    """Perimeter of a rectangle."""
    return 2 * (width + height)


def volume(width, height, depth):
    """Volume of a box."""
    return width * height * depth


def area(width, height):
'''


def prompts(be: LLMBackend, kind: str, n: int) -> list[list[int]]:
    if kind == "edit":  # bench_spec.py's edit task: a 1K-token file, asked for again
        sys.path.insert(0, str(Path(__file__).parent))
        from bench_spec import edit_prompt

        tok = be.vocabulary()
        return [tok.encode(edit_prompt(tok)[0]) for _ in range(n)]
    if kind == "code":
        tok = be.vocabulary()
        base = tok.encode(SOURCE)
        return [base + tok.encode(f"    # variant {i}\n") for i in range(n)]
    rng = np.random.default_rng(0)
    out = []
    for i in range(n):
        phrase = [int(t) for t in rng.integers(0, be.n_vocab, 6)]
        out.append(phrase * 8 + [int(t) for t in rng.integers(0, be.n_vocab, 2 + i)])
    return out


class Engine:
    """One configuration's backend, speculator and scheduler, kept over all its requests (as
    the engine keeps them: the adaptive window's and the guess policy's measurements carry
    over)."""

    def __init__(self, cfg: Config) -> None:
        self.be = LLMBackend(cfg)
        self.spec = make_speculator(cfg, self.be)
        self.sched = Scheduler(
            self.be, cfg.prefill_chunk, 1, max_batch_tokens=cfg.max_batch_tokens,
            speculator=self.spec,
        )  # fmt: skip
        self.rid = 0

    def request(self, prompt: list[int], tokens: int) -> tuple[float, int, list[int]]:
        """(decode seconds after the first token, tokens after it, output ids)."""
        self.sched.add(Submit(self.rid, prompt, SamplingParams(temperature=0), tokens, []))
        self.rid += 1
        ids: list[int] = []
        t_first = None
        while self.sched.has_work():
            for e in self.sched.step():
                if isinstance(e, Tokens):
                    if t_first is None and e.ids:
                        t_first = time.perf_counter()
                    ids += e.ids
        assert t_first is not None
        return time.perf_counter() - t_first, len(ids) - 1, ids

    def round(self, ps: list[list[int]], tokens: int) -> tuple[float, list[list[int]]]:
        """Decode tok/s over the requests `ps`, one after another, and their outputs."""
        dec_s, n_tok, outs = 0.0, 0, []
        for p in ps:
            s, n, ids = self.request(p, tokens)
            dec_s, n_tok = dec_s + s, n_tok + n
            outs.append(ids)
        return n_tok / dec_s, outs

    def info(self) -> dict[str, int]:
        sp, sc = self.spec, self.sched
        return {
            "offered": sp.offered if sp else 0,
            "accepted": sp.accepted if sp else 0,
            "windows": sc.pipe_windows,
            "held": sc.pipe_held,
            # windows whose stage 1 ran beside the next one's stage 0 (the hybrid mode)
            "beside": int(self.be.llm.model.stages()[0]["beside"]),
        }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model", type=Path)
    ap.add_argument("--prompt", choices=("code", "phrase", "edit"), default="phrase")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--requests", type=int, default=4)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--slots-frac", type=float, default=0.25)
    ap.add_argument("--threads", type=int, default=3)
    ap.add_argument("--adapt-every", type=int, default=0, help="0: the Config default")
    ap.add_argument("--gpus", default="0,0", help="the stages' devices (two cards: 0,1)")
    ap.add_argument(
        "--arms", action="store_true", help="also pw2 with the guess policy pinned to each arm"
    )
    ap.add_argument(
        "--only", default="", help="run the configurations whose name has one of these (a|b|..)"
    )
    ap.add_argument("--curves", action="store_true", help="print the adaptive window's curves")
    ap.add_argument(
        "--window-graphs-ab",
        action="store_true",
        help="each configuration also opened with windows run kernel by kernel (no graphs)",
    )
    a = ap.parse_args()
    base: dict[str, Any] = dict(
        model=str(a.model), device="cuda", n_ctx=2048, parallel=1, threads=a.threads,
        gpus=a.gpus, pcie_frac=0.0, spec="ngram",
    )  # fmt: skip
    probe = LLMBackend(Config(**dict(base, spec="off", gpus="0")))
    hp = probe.llm.hparams
    n_exp = int(hp["n_layer"]) * int(hp["n_expert"])
    ps = prompts(probe, a.prompt, a.requests)
    del probe
    hy: dict[str, Any] = dict(vram_slots=max(1, int(n_exp * a.slots_frac)))
    if a.adapt_every:
        hy["adapt_every"] = a.adapt_every
    pw2 = dict(pipeline_windows=2)
    configs: list[tuple[str, dict[str, Any], str]] = [
        ("pure, no spec", dict(spec="off"), ""),
        ("pure, pw1", dict(pipeline_windows=1), ""),
        ("pure, pw2", pw2, ""),
        ("pure, pw2 serial only", pw2, "serial"),
        ("pure, pw2 guess always", pw2, "guess"),
        ("hybrid sync, no spec", dict(hy, spec="off"), ""),
        ("hybrid sync, pw1", dict(hy, pipeline_windows=1), ""),
        ("hybrid async, pw1", dict(hy, pipeline_windows=1, tier_async=True), ""),
        ("hybrid sync, pw2", dict(hy, **pw2), ""),
        ("hybrid async, pw2", dict(hy, **pw2, tier_async=True), ""),
        ("hybrid async, pw2 serial only", dict(hy, **pw2, tier_async=True), "serial"),
        ("hybrid async, pw2 guess always", dict(hy, **pw2, tier_async=True), "guess"),
    ]
    if not a.arms:
        configs = [c for c in configs if not c[2]]
    configs = [c for c in configs if any(o in c[0] for o in a.only.split("|"))]
    if a.window_graphs_ab:  # the same configurations with windows' steps run eagerly
        configs += [(f"{n}, eager windows", kw, arm) for n, kw, arm in configs]
    engines = []
    for name, kw, arm in configs:
        prev = _core.set_gpu_window_graphs(not name.endswith("eager windows"))
        eng = Engine(Config(**{**base, **kw}))
        _core.set_gpu_window_graphs(prev)
        if arm:  # the guess policy's arm pinned (a diagnostic: what each arm costs alone)
            eng.sched._guess_pays = (lambda: True) if arm == "guess" else (lambda: False)  # type: ignore[method-assign]
        eng.request(ps[0], a.tokens)  # warm-up: graphs, the first costs measured
        engines.append(eng)
    # rounds interleaved over the configurations (the host's drift shared by all), every
    # engine kept from the start (the server's case: measurements carry over)
    speeds: list[list[float]] = [[] for _ in configs]
    outs: list[list[list[int]]] = [[] for _ in configs]
    for _ in range(a.reps):
        for i, eng in enumerate(engines):
            tps, outs[i] = eng.round(ps, a.tokens)
            speeds[i].append(tps)
    rows = []
    ref: dict[str, list[list[int]]] = {}
    for (name, _, _), eng, sps, out in zip(configs, engines, speeds, outs, strict=True):
        info = eng.info()
        kind = name.split(",")[0]
        same = ref.setdefault(kind, out) == out
        med = statistics.median(sps)
        rows.append((name, med, min(sps), max(sps), info, same))
        print(f"{name:24s} {med:8.1f} tok/s  {info}  same-greedy={same}", flush=True)
        if eng.spec is not None and a.curves:  # the adaptive window's cost curves, T(1+k)/T(1)
            sp = eng.spec
            print(
                f"    serial T(1) {sp.cost.time(1)} c {sp.cost.curve(1, 6)}\n"
                f"    pipelined T(1) {sp.pipe_cost.time(1)} c {sp.pipe_cost.curve(1, 6)}\n"
                f"    windows by accepted drafts {sp.hist}",
                flush=True,
            )
    print(
        f"\n{a.model.name}, prompt {a.prompt}, {a.requests} requests x {a.tokens} tokens, "
        f"reps {a.reps}, slots {hy['vram_slots']} of {n_exp}"
    )
    print(
        f"{'config':30s} {'tok/s':>8s} {'min':>8s} {'max':>8s} {'acc/off':>10s} "
        f"{'held/win':>10s} same"
    )
    for name, med, lo, hi, info, same in rows:
        acc = f"{info['accepted']}/{info['offered']}"
        held = f"{info['held']}/{info['windows']}"
        print(f"{name:30s} {med:8.1f} {lo:8.1f} {hi:8.1f} {acc:>10s} {held:>10s} {same}")
    # issue 21's comparisons, paired by round (the rounds are interleaved, so a round's ratio
    # shares the host's drift): the median of the per-round ratios, with their min-max
    names = [c[0] for c in configs]
    pairs = [
        ("hybrid async, pw2", "hybrid async, pw1"),
        ("hybrid async, pw2", "hybrid sync, pw2"),
        ("pure, pw2", "pure, pw1"),
        ("hybrid async, pw2 serial only", "hybrid async, pw1"),
        ("hybrid async, pw1", "hybrid async, pw1, eager windows"),
        ("hybrid async, pw2", "hybrid async, pw2, eager windows"),
        ("pure, pw1", "pure, pw1, eager windows"),
    ]
    for x, y in pairs:
        if x in names and y in names:
            r = [p / q for p, q in zip(speeds[names.index(x)], speeds[names.index(y)], strict=True)]
            print(
                f"{x} / {y}: median of {len(r)} rounds {statistics.median(r):.3f} "
                f"(min {min(r):.3f}, max {max(r):.3f})"
            )


if __name__ == "__main__":
    main()
