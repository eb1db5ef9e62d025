"""`strata-fill`: expert hotness profiles and the RAM-tier warm-up.

    strata-fill profile --model M.gguf [--prompts FILE] [--tokens N] -o P
    strata-fill warm --model M.gguf [--profile P] [--mode mmap|resident|budget]
                     [--budget-gib G] [--fill-threads N]
    strata-fill show P [--model M.gguf] [--top K]

Settings flags are generated from `strata.config.Config` (same names, help, choices and
validation as `STRATA_*` and the config file); bad flags exit with status 2, runtime errors
(unreadable files, a profile for another model) with 1, Ctrl-C with 130.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from strata.config import DEFAULT_FILL_THREADS, Config
from strata.errors import ConfigError, StrataError

GIB = float(1 << 30)
PROG = "strata-fill"
# Config fields each subcommand exposes, and the flags renamed from the field name.
PROFILE_FIELDS = ("model", "profile_tokens", "n_ctx")
WARM_FIELDS = ("model", "profile", "ram_mode", "ram_budget_gib", "fill_threads")
RENAMED = {
    "ram_mode": "--mode",
    "ram_budget_gib": "--budget-gib",
    "fill_threads": "--fill-threads",  # `--threads` elsewhere is the compute threads
    "profile_tokens": "--tokens",
}


class _Fail(Exception):
    """A runtime error to report with exit status 1."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Expert hotness profiles and the RAM-tier warm-up for Strata.",
        epilog="Settings also come from STRATA_* environment variables and a TOML config "
        "file (--config or STRATA_CONFIG); flags win.",
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def common(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--config", metavar="FILE", help="TOML config file [env STRATA_CONFIG]")

    pr = sub.add_parser(
        "profile",
        help="record which experts a set of prompts routes to",
        description="Run prompts through the model and write a hotness profile (routing "
        "counts per layer and expert, tied to the model's fingerprint).",
    )
    Config.add_arguments(pr, only=PROFILE_FIELDS, flags=RENAMED)
    pr.add_argument(
        "--prompts",
        metavar="FILE",
        help='prompts, one per line (.jsonl: one JSON string or {"prompt": ...} per line); '
        "default: a built-in varied set (code, prose, chat, other languages)",
    )
    pr.add_argument("-o", "--output", required=True, metavar="P", help="profile file to write")
    common(pr)

    wa = sub.add_parser(
        "warm",
        help="pre-fault the hot experts into the page cache, or prepare the arena",
        description="First the weights every token reads (attention, norms, routers, "
        "embeddings, output) are read into the page cache. mmap: then the experts (hottest "
        "first with a profile), so a server started next finds them there. resident/budget: "
        "build the arena exactly as the server will (a dry run that reports time, locking "
        "and warnings; the arena itself lives in the serving process).",
    )
    Config.add_arguments(wa, only=WARM_FIELDS, flags=RENAMED)
    common(wa)

    sh = sub.add_parser("show", help="print a profile summary")
    sh.add_argument("path", metavar="P", help="profile file")
    sh.add_argument("--model", metavar="M", help="also check that the profile fits this model")
    sh.add_argument("--top", type=int, default=8, metavar="K", help="experts listed per layer")
    sh.add_argument("--json", action="store_true", help="print the summary as JSON")
    return p


def _config(parser: argparse.ArgumentParser, ns: argparse.Namespace) -> Config:
    try:
        return Config.from_args(ns, config_file=ns.config)
    except ConfigError as e:
        parser.error(str(e))


def _model_path(cfg: Config) -> Path:
    if cfg.model:
        p = Path(cfg.model)
        if not p.is_file():
            raise _Fail(f"model {cfg.model}: no such file")
        return p
    from strata import modelgen

    return modelgen.shipped_model_path("default")


class _Progress:
    """A tqdm bar on a terminal, plain lines (every 10 % or 5 s) otherwise; `unit` "B" counts
    bytes (shown in GiB), any other a count of that unit."""

    def __init__(self, total: int, desc: str, out: TextIO, unit: str = "B") -> None:
        self.total, self.desc, self.out, self.unit = total, desc, out, unit
        self.done = 0
        self.bar: Any = None
        self.last_line = (time.monotonic(), -1)
        if out.isatty():
            from tqdm import tqdm

            scaled = {"unit_scale": True, "unit_divisor": 1024} if unit == "B" else {}
            self.bar = tqdm(total=total, desc=desc, unit=unit, file=out, **scaled)

    def update(self, done: int) -> None:
        if self.bar is not None:
            self.bar.update(done - self.done)
        else:
            now = time.monotonic()
            tenth = done * 10 // max(self.total, 1)
            t0, last = self.last_line
            if tenth > last or now - t0 >= 5.0:
                pct = 100.0 * done / max(self.total, 1)
                amount = (
                    f"{done / GIB:.2f} / {self.total / GIB:.2f} GiB"
                    if self.unit == "B"
                    else f"{done} / {self.total} {self.unit}"
                )
                print(f"{self.desc}: {amount} ({pct:.0f}%)", file=self.out, flush=True)
                self.last_line = (now, tenth)
        self.done = done

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


# ---- profile -----------------------------------------------------------------------------


def _read_prompts(path: str | None) -> tuple[list[str], str]:
    if not path:
        from strata.cli._prompts import DEFAULT_PROMPTS

        return list(DEFAULT_PROMPTS), f"built-in prompts ({len(DEFAULT_PROMPTS)})"
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise _Fail(f"prompts {path}: {e}") from None
    prompts: list[str] = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        if path.endswith(".jsonl"):
            try:
                item = json.loads(line)
            except json.JSONDecodeError as e:
                raise _Fail(f"prompts {path}:{n}: {e}") from None
            if isinstance(item, dict):
                item = item.get("prompt")
            if not isinstance(item, str):
                raise _Fail(f'prompts {path}:{n}: expected a string or {{"prompt": "..."}}')
            prompts.append(item)
        else:
            prompts.append(line)
    if not prompts:
        raise _Fail(f"prompts {path}: no prompts in the file")
    return prompts, f"{Path(path).name} ({len(prompts)} prompts)"


def cmd_profile(cfg: Config, ns: argparse.Namespace) -> int:
    prompts, source = _read_prompts(ns.prompts)
    path = _model_path(cfg)
    from strata.engine.backend import LLMBackend
    from strata.tokenizer import Tokenizer

    cfg.model = str(path)
    backend = LLMBackend(cfg)
    if not backend.llm.counts_routing:
        # nothing would be measured: refuse rather than write a profile of zeros
        raise ConfigError(
            "strata-fill profile: the GPU path with every expert in VRAM does not count the "
            "routing; profile on the CPU (STRATA_DEVICE=cpu: the same routing) or in the "
            "hybrid mode (STRATA_VRAM_BUDGET_MIB)"
        )
    tok = Tokenizer.from_gguf(path)
    eog = tok.eog_ids
    n_ctx = backend.n_ctx_seq
    if cfg.profile_tokens >= n_ctx - 1:  # n_ctx 0 (the training context) is known only now
        raise ConfigError(
            f"profile_tokens: {cfg.profile_tokens} leaves no room in a sequence's context of "
            f"{n_ctx} (at most n_ctx_seq - 2)"
        )
    tokens = 0
    bar = _Progress(len(prompts), "profile", sys.stderr, unit="prompts")
    for i, prompt in enumerate(prompts):
        text = prompt
        if tok.chat_template:
            text = tok.apply_chat_template([{"role": "user", "content": prompt}])
        ids = tok.encode(text)[: max(1, n_ctx - cfg.profile_tokens - 1)]
        backend.truncate(0, 0)
        (logits,) = backend.forward_batch([(0, ids, "last")])
        tokens += len(ids)
        for _ in range(cfg.profile_tokens):
            nxt = int(np.argmax(np.asarray(logits)))
            if nxt in eog:
                break
            (logits,) = backend.forward_batch([(0, [nxt], "last")])
            tokens += 1
        backend.free(0)
        bar.update(i + 1)
    bar.close()
    from strata._core import Profile

    counts = np.ascontiguousarray(backend.llm.routing_counts(), dtype=np.float32)
    prof = Profile.from_counts(path, counts, tokens, source)
    prof.save(ns.output)
    print(f"wrote {ns.output}: {tokens} tokens over {len(prompts)} prompts, {prof.model}")
    return 0


# ---- warm --------------------------------------------------------------------------------


def cmd_warm(cfg: Config, ns: argparse.Namespace) -> int:
    from strata._core import ExpertTier, Profile

    path = _model_path(cfg)
    profile = Profile.load(cfg.profile, path) if cfg.profile else None
    tier = ExpertTier(path, cfg.ram_mode, cfg.ram_budget_gib, profile, lock=True)
    for w in tier.warnings:
        print(f"{PROG}: warning: {w}", file=sys.stderr)
    threads = cfg.fill_threads or DEFAULT_FILL_THREADS
    # The weights every token reads (attention, norms, routers, embeddings, output) first.
    t0 = time.monotonic()
    dense = tier.prefault_dense(threads)
    dense_line = f"dense weights {dense / GIB:.2f} GiB in {time.monotonic() - t0:.2f} s"
    print(f"{PROG}: {dense_line}", file=sys.stderr)
    mmap = cfg.ram_mode == "mmap"
    limit = int(cfg.ram_budget_gib * GIB) if mmap else 0
    handle = tier.fill(threads=threads, limit_bytes=limit)
    total = int(handle.progress()["total_bytes"])
    bar = _Progress(total, "warm" if mmap else "arena", sys.stderr)
    try:
        while not handle.wait(0.2):
            bar.update(int(handle.progress()["done_bytes"]))
    except KeyboardInterrupt:
        handle.cancel()
        handle.wait()
        bar.close()
        p = handle.progress()
        print(f"cancelled after {p['done_bytes'] / GIB:.2f} GiB ({p['done_experts']} experts)")
        return 130
    p = handle.progress()
    bar.update(int(p["done_bytes"]))
    bar.close()
    secs = max(float(p["seconds"]), 1e-9)
    rate = p["done_bytes"] / GIB / secs
    order = "profile order" if profile else "file order"
    head = (
        f"{p['done_experts']} experts, {p['done_bytes'] / GIB:.2f} GiB in {secs:.2f} s "
        f"({rate:.2f} GiB/s, {threads} threads, {order})"
    )
    if mmap:
        frac = tier.page_cache_fraction()
        print(
            f"warmed {head}; the page cache holds {100 * frac:.1f}% of all expert bytes; "
            f"{dense_line}"
        )
    else:
        n, b = tier.resident()
        lock = "locked" if tier.locked else "not locked"
        print(
            f"arena ({cfg.ram_mode}): {head}; {n} experts, {b / GIB:.2f} GiB resident, {lock}. "
            f"The arena lives in the serving process: start the server with "
            f"STRATA_RAM_MODE={cfg.ram_mode}"
            + (f" STRATA_RAM_BUDGET_GIB={cfg.ram_budget_gib:g}" if cfg.ram_mode == "budget" else "")
            + (f" STRATA_PROFILE={cfg.profile}" if cfg.profile else "")
            + "; its source pages are now in the page cache."
        )
    return 0


# ---- show --------------------------------------------------------------------------------


def summarize(path: str, top: int) -> dict[str, Any]:
    from strata._core import Profile

    prof = Profile.load(path)
    counts = prof.counts()  # [L, E]
    layers = []
    shares = []
    for layer in range(prof.n_layer):
        row = counts[layer]
        s = float(row.sum())
        order = np.argsort(-row, kind="stable")[:top]
        layers.append(
            {
                "layer": layer,
                "count": s,
                "top": [[int(e), float(row[e]) / s if s else 0.0] for e in order],
            }
        )
        if s:
            srt = np.sort(row)[::-1]
            k = max(1, prof.n_expert // 4)
            shares.append(float(srt[:k].sum()) / s)
    return {
        "path": path,
        "model": prof.model,
        "fingerprint": prof.fingerprint,
        "source": prof.source,
        "tokens": prof.tokens,
        "n_layer": prof.n_layer,
        "n_expert": prof.n_expert,
        "hottest_quarter_share": float(np.mean(shares)) if shares else 0.0,
        "layers": layers,
    }


def cmd_show(ns: argparse.Namespace) -> int:
    if ns.model:
        from strata._core import Profile

        Profile.load(ns.path, ns.model)
    d = summarize(ns.path, ns.top)
    if ns.json:
        print(json.dumps(d, indent=1))
        return 0
    print(f"profile {d['path']}")
    print(f"  model       {d['model']}  [fingerprint {d['fingerprint']}]")
    if ns.model:
        print(f"  fits        {ns.model}")
    print(f"  source      {d['source']}")
    print(f"  tokens      {d['tokens']}")
    print(f"  shape       {d['n_layer']} layers × {d['n_expert']} experts")
    print(
        f"  skew        the hottest quarter of each layer's experts takes "
        f"{100 * d['hottest_quarter_share']:.1f}% of its routing (25% if uniform)"
    )
    print(f"  {'layer':>5}  {'routed':>10}  top experts (share of the layer)")
    for row in d["layers"]:
        tops = ", ".join(f"{e} ({100 * s:.1f}%)" for e, s in row["top"])
        print(f"  {row['layer']:>5}  {row['count']:>10.0f}  {tops}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    ns = parser.parse_args(argv)
    try:
        if ns.command == "show":
            if ns.top < 1:
                parser.error("--top must be at least 1")
            return cmd_show(ns)
        cfg = _config(parser, ns)
        if ns.command == "profile" and cfg.n_ctx and cfg.profile_tokens >= cfg.n_ctx_seq - 1:
            # each prompt keeps at least one token and its generated ones in the context
            parser.error(
                f"--tokens {cfg.profile_tokens} leaves no room in --n-ctx {cfg.n_ctx} "
                f"({cfg.n_ctx_seq} a sequence; at most n_ctx_seq - 2)"
            )
        if ns.command == "profile" and not Path(ns.output).absolute().parent.is_dir():
            raise _Fail(f"{ns.output}: no such folder for --output")  # before the prompts
        return cmd_profile(cfg, ns) if ns.command == "profile" else cmd_warm(cfg, ns)
    except (_Fail, StrataError, OSError) as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
