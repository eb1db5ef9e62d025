"""`strata setup MODEL`: inspect this machine and the model, write a config that fits them.

    strata setup M.gguf [-o strata.toml] [--parallel N] [--n-ctx N] [--draft D.gguf]
                        [--calibrate] [--force]

It reads the CPU (physical cores, instruction set), the RAM (MemAvailable), the disk beside
the model, the GPU and its link (when one is usable) and the GGUF (expert and dense bytes, KV
bytes per position, training context), then recommends the settings a server on this machine
should start with — device, threads, RAM mode, KV type, context, parallel slots and speculative
decoding — and writes them as a TOML config (`STRATA_CONFIG=FILE` or `--config FILE`), each
with the reason beside it. Speculation: a draft model (`--draft`; the embedded default model's
own shipped draft), else the model's MTP layer on the CPU path, else prompt lookup (n-grams);
each adaptive (a sequence drafts only while it measurably pays). `--calibrate` then times a
short greedy decode through the engine's scheduler (speculation included, as the server runs
a request) under a few alternatives of the settings a machine decides — the compute threads;
on the GPU's hybrid mode the PCIe share; speculation off; the draft floor (`spec_p_min`: a
draft model stops at a token it gives less than this probability) — and keeps an alternative
only where it is measurably faster than the recommendation.

The rules are plain functions of the facts (`Machine`, `ModelFacts` → `Plan`), so they are
tested on made-up machines; the inspection is the only part that reads this one.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from strata.config import Config
from strata.errors import ConfigError, StrataError
from strata.spec.drafters import check_draft

GIB = 1 << 30
MIB = 1 << 20
CTX_GRID = 256  # contexts are chosen on llama.cpp's 256-token grid
CTX_WISH = 32768  # a sequence's context when the model and memory allow it
CTX_FLOOR = 4096  # below this per sequence, fewer slots are offered first
KV_SHARE_CPU = 0.25  # of the RAM left beside the model, at most this much for the KV cache
KV_SHARE_GPU = 0.20  # of the VRAM budget, at most this much for the KV cache
RAM_HEADROOM = 2 * GIB  # left to the OS and the server beside a resident model
KV_SCALE = {"f16": 1.0, "q8_0": 34 / 64, "q4_0": 18 / 64, "f32": 2.0}  # bytes against f16
GAIN = 1.03  # a calibrated alternative must beat the recommendation's median by 3%


@dataclass(slots=True)
class Machine:
    cores: int  # physical cores
    isa: str  # the CPU dot kernels' instruction set
    ram_available: int  # bytes (MemAvailable)
    disk_free: int  # bytes free beside the model
    gpu: str | None = None  # the usable GPU's name (None: CPU only)
    vram_free: int = 0  # bytes
    link_gbps: float = 0.0  # host → device, measured


@dataclass(slots=True)
class ModelFacts:
    path: str
    arch: str
    expert_bytes: int
    dense_bytes: int
    kv_bytes_per_pos: int  # one position of one sequence, f16 KV
    n_ctx_train: int
    has_mtp: bool = False  # a NextN / MTP layer Strata runs (on the CPU path)


@dataclass(slots=True)
class Plan:
    settings: dict[str, Any]  # Config field → value
    reasons: dict[str, str]  # Config field → why
    notes: list[str] = field(default_factory=list)  # what the config cannot say
    hybrid: bool = False  # on the GPU with experts left to the CPU pool


def _size(n: float) -> str:
    return f"{n / GIB:.1f} GiB" if n >= GIB else f"{n / MIB:.0f} MiB"


def _grid(n: int) -> int:
    return max(CTX_GRID, n // CTX_GRID * CTX_GRID)


def recommend(
    m: Machine, f: ModelFacts, parallel: int = 0, n_ctx: int = 0, draft: str = ""
) -> Plan:
    """The settings for model `f` on machine `m`. `parallel`/`n_ctx` 0: chosen here (n_ctx as
    llama.cpp's -c: all slots together); `draft`: a draft model's GGUF ("": none)."""
    s: dict[str, Any] = {"model": f.path}
    why: dict[str, str] = {"model": f"{f.arch}, {_size(f.expert_bytes)} of experts"}
    notes: list[str] = []
    model_bytes = f.expert_bytes + f.dense_bytes
    on_gpu = m.gpu is not None
    whole = False  # every weight in VRAM
    s["device"] = "cuda" if on_gpu else "cpu"
    if on_gpu:
        budget = max(0, m.vram_free - Config().vram_reserve_mib * MIB)
        whole = f.dense_bytes + f.expert_bytes <= budget * (1 - KV_SHARE_GPU)
        why["device"] = f"{m.gpu}: {m.vram_free / GIB:.1f} GiB free; " + (
            "the whole model fits in VRAM"
            if whole
            else "the hybrid mode: the dense weights and the hottest experts in VRAM, "
            "the rest computed by the CPU pool in RAM"
        )
        # the experts' slots take what the KV cache leaves (all of them: the rest of it)
        kv_room = budget - f.dense_bytes - f.expert_bytes if whole else int(budget * KV_SHARE_GPU)
    else:
        why["device"] = "no usable GPU: the CPU path"
        kv_room = int(max(0, m.ram_available - model_bytes - RAM_HEADROOM) * KV_SHARE_CPU)
    s["threads"] = 0
    why["threads"] = f"one compute thread per physical core ({m.cores}), as llama.cpp's -t"
    # the RAM tier: every expert resident when the model fits with room to spare
    left = m.ram_available - model_bytes - RAM_HEADROOM
    if whole:
        s["ram_mode"] = "mmap"
        why["ram_mode"] = "every expert in VRAM: the RAM tier is never read"
    elif on_gpu:
        s["ram_mode"] = "mmap"
        why["ram_mode"] = (
            "the CPU pool computes missed experts where they lie in the file's mapping (the "
            "RAM tier's modes are the CPU path's); `strata-fill warm` pre-faults the hottest"
        )
        if left < 0:
            notes.append(
                f"the model ({_size(model_bytes)}) exceeds the available RAM "
                f"({_size(m.ram_available)}): missed experts are read from disk"
            )
    elif left >= 0:
        s["ram_mode"] = "resident"
        why["ram_mode"] = (
            f"the model ({_size(model_bytes)}) fits the available RAM "
            f"({_size(m.ram_available)}): every expert read from RAM, never a page fault"
        )
    else:
        keep = max(0.0, (m.ram_available - f.dense_bytes - RAM_HEADROOM) * 0.8 / GIB)
        if keep < 1.0:
            s["ram_mode"] = "mmap"
            why["ram_mode"] = "too little RAM to keep experts resident: read through the page cache"
        else:
            s["ram_mode"] = "budget"
            s["ram_budget_gib"] = round(keep, 1)
            why["ram_budget_gib"] = "80% of what the dense weights and 2 GiB leave of the RAM"
            why["ram_mode"] = (
                f"the model ({model_bytes / GIB:.1f} GiB) exceeds the available RAM "
                f"({m.ram_available / GIB:.1f} GiB): the hottest {keep:.1f} GiB resident, the "
                "rest read from disk ahead of use (`strata-fill profile` picks the hottest)"
            )
            kv_room = int(max(0, m.ram_available - keep * GIB - f.dense_bytes) * KV_SHARE_CPU)
    # KV type, context and slots: the most slots whose sequences each keep at least the floor
    # context, f16 where the KV room holds it, else q8_0 (half the bytes)
    where = "VRAM" if on_gpu else "RAM"
    want = min(f.n_ctx_train or CTX_WISH, CTX_WISH)  # a sequence's context, when not asked
    floor = min(CTX_FLOOR, n_ctx or want)

    def per_seq(p: int, kv: str) -> int:
        if n_ctx:
            return n_ctx // p
        per_pos = f.kv_bytes_per_pos * KV_SCALE[kv] * p
        return min(want, _grid(int(kv_room / max(per_pos, 1))))

    def fits(p: int, kv: str) -> bool:
        return f.kv_bytes_per_pos * KV_SCALE[kv] * per_seq(p, kv) * p <= kv_room

    slots = [parallel] if parallel else [4, 2, 1]
    kvs = ("f16", "q8_0") if on_gpu else ("f16", "q8_0", "q4_0")  # q4_0: the CPU path's
    chosen = next(
        (
            (p, kv)
            for p in slots
            for kv in kvs
            if per_seq(p, kv) >= floor and (fits(p, kv) or (n_ctx and kv == kvs[-1]))
        ),
        None,
    )
    if chosen is None:  # not even the floor: the fewest slots, the widest type that fits
        chosen = (slots[-1], next((kv for kv in kvs if fits(slots[-1], kv)), kvs[-1]))
        notes.append(f"each sequence holds fewer than {floor} positions")
    p, kv = chosen
    ctx = max(16, per_seq(p, kv))
    if not fits(p, kv) and not n_ctx:
        notes.append(f"the KV cache of even {ctx} positions a sequence crowds the {where}")
    s["parallel"], s["kv_type"], s["n_ctx"] = p, kv, n_ctx or ctx * p
    kv_total = f.kv_bytes_per_pos * KV_SCALE[kv] * ctx * p
    why["parallel"] = (
        f"{p} concurrent sequences: an editor's or agent's parallel requests share each "
        "step's expert reads (4 streams give about twice the tokens/s of one: docs/BENCHMARKS.md)"
        if p > 1 and not parallel
        else f"{p} sequence{'s' if p > 1 else ''}" + (" (asked)" if parallel else "")
    )
    share = {"q8_0": "about half", "q4_0": "about a quarter"}
    why["kv_type"] = (
        "f16, as llama.cpp stores its cache"
        if kv == "f16"
        else f"{kv}: {share.get(kv, '')} of f16's bytes, so {ctx} positions a sequence fit "
        f"the {where} kept for the KV cache"
    )
    why["n_ctx"] = (
        f"{ctx} positions for each of the {p} sequences (n_ctx is all of them, as llama.cpp's "
        f"-c), {_size(kv_total)} of KV in {where}"
        + (f"; the model trained on {f.n_ctx_train}" if f.n_ctx_train else "")
    )
    if n_ctx and kv_total > kv_room:
        notes.append(
            f"the asked n_ctx {n_ctx} needs {kv_total / GIB:.2f} GiB of KV, more than the "
            f"{kv_room / GIB:.2f} GiB this plan keeps for it in {where}"
        )
    if m.disk_free < 8 * GIB:
        notes.append(f"only {m.disk_free / GIB:.1f} GiB free beside the model")
    if f.n_ctx_train and s["n_ctx"] // p > f.n_ctx_train:
        notes.append(
            f"each sequence's {s['n_ctx'] // p} positions pass the {f.n_ctx_train} the model "
            "trained on: quality past them is not what it was trained for"
        )
    _speculation(s, why, f, draft, on_gpu)
    return Plan(s, why, notes, hybrid=on_gpu and not whole)


def _speculation(
    s: dict[str, Any], why: dict[str, str], f: ModelFacts, draft: str, on_gpu: bool
) -> None:
    """The drafter: a draft model, else the model's MTP layer (the CPU path runs it), else
    prompt lookup; always the adaptive window (Config.spec_adaptive's default)."""
    adaptive = "each sequence drafts only while its measured acceptance and verify cost say it pays"
    if draft:
        s["spec"], s["spec_draft_model"] = "draft", draft
        why["spec"] = f"a draft model of the same vocabulary proposes tokens; {adaptive}"
        why["spec_draft_model"] = "the draft model"
    elif f.has_mtp and not on_gpu:
        s["spec"] = "mtp"
        why["spec"] = f"the model's own MTP layer proposes tokens; {adaptive}"
    else:
        s["spec"] = "ngram"
        why["spec"] = (
            "prompt lookup (n-grams of the prompt and the text so far): edits of text in the "
            f"prompt decode several tokens a step; {adaptive}"
            + ("; the MTP layer runs on the CPU path only" if f.has_mtp else "")
        )


# -- this machine and this model -----------------------------------------------------------------


def inspect_machine(model_dir: Path, probe_link: bool = True) -> Machine:
    from strata import _core
    from strata.engine.prefix import available_ram

    cores = len(_core.physical_cores()) or os.cpu_count() or 1
    m = Machine(
        cores=cores,
        isa=_core.dot_isa(),
        ram_available=available_ram(),
        disk_free=shutil.disk_usage(model_dir).free,
    )
    ok, _ = _core.gpu_status()
    if ok:
        info = _core.gpu_info()
        if info.get("kernels_built") and "mem_free" in info:
            m.gpu, m.vram_free = str(info["name"]), int(info["mem_free"])
            if probe_link:
                m.link_gbps = float(_core.pcie_probe_gbps())
    return m


def inspect_model(path: Path) -> ModelFacts:
    from strata._core import Model

    # a one-slot handle: the weights stay mapped, not read; its KV is 16 zeroed positions
    m = Model.open(path, n_ctx=16, n_slots=1, kv_type="f16", cpu_repack=False, threads=1)
    h = m.hparams
    return ModelFacts(
        path=str(path),
        arch=str(h["architecture"]),
        expert_bytes=int(h["expert_bytes"]),
        dense_bytes=int(h["non_expert_bytes"]),
        kv_bytes_per_pos=int(h["kv_bytes"]) // 16,
        n_ctx_train=int(h["n_ctx_train"]),
        has_mtp=bool(m.has_mtp),
    )


def shipped_draft(model: Path) -> str:
    """The embedded default model's own draft ("" for any other model)."""
    from strata import modelgen  # type: ignore[attr-defined, unused-ignore]

    if model.resolve() == modelgen.shipped_model_path("default").resolve():
        return str(modelgen.shipped_model_path("draft"))
    return ""


# -- calibration ----------------------------------------------------------------------------------

Timer = Callable[[dict[str, Any]], list[float]]  # settings → tokens/s of each repetition


PROMPTS = ("def fibonacci(n):\n    ", "The three laws of motion are")
P_MIN = (0.5, 0.8)  # draft floors tried against the recommendation's (spec_p_min 0)
MIN_RUN_S = 0.5  # a timed run decodes the prompts again until it is this long (small models)
TIMED_CTX = 2048  # the timed runs' context: one sequence (parallel 1)


def decode_rates(
    settings: dict[str, Any], tokens: int = 32, reps: int = 3, drafts: list[int] | None = None
) -> list[float]:
    """Greedy decode tokens/s of `reps` runs (after one warm-up) under `settings`, through the
    engine's scheduler with the settings' speculator, as the server runs a request. A run
    decodes `tokens` after each of PROMPTS; its rate is the tokens after each prompt's first
    (the prefill's) over their time, the prompts repeated until MIN_RUN_S. `drafts` (given):
    set to [offered, accepted] of all runs."""
    from strata.engine.backend import LLMBackend
    from strata.engine.protocol import Submit, Tokens
    from strata.engine.scheduler import Scheduler
    from strata.sampling import SamplingParams
    from strata.spec import make_speculator

    cfg = Config.load({**settings, "n_ctx": TIMED_CTX, "parallel": 1}, env={})
    be = LLMBackend(cfg)
    fill = getattr(be.llm, "fill", None)
    if fill is not None:
        fill.wait()  # the RAM tier filled: no fill threads beside the timed runs
    spec = make_speculator(cfg, be)
    tok = be.vocabulary()
    prompts = [tok.encode(p) for p in PROMPTS]
    out = []
    for i in range(reps + 1):
        n, dt = 0, 0.0
        while not dt or dt < MIN_RUN_S:  # the prompts again until the run is long enough
            for ids in prompts:
                be.free(0)
                if spec is not None:
                    spec.drafter.rollback(0, 0)  # no draft KV of the previous prompt
                sched = Scheduler(be, be.prefill_piece, 1, speculator=spec, reuse=False)
                sched.add(Submit(0, ids, SamplingParams(temperature=0), tokens, []))
                t1 = 0.0
                while sched.has_work():
                    for e in sched.step():
                        if isinstance(e, Tokens) and e.ids:
                            if not t1:
                                t1 = time.perf_counter()
                                n -= len(e.ids)  # the prefill's tokens are not decode's
                            n += len(e.ids)
                dt += time.perf_counter() - t1
        if i:
            out.append(n / dt)
    if drafts is not None:
        drafts[:] = [spec.offered, spec.accepted] if spec is not None else [0, 0]
    return out


def apply(settings: dict[str, Any], name: str, value: Any) -> dict[str, Any]:
    """`settings` with `name` = `value`; speculation off drops the drafter's own settings."""
    out = {**settings, name: value}
    if name == "spec" and value == "off":
        for k in ("spec_draft_model", "spec_p_min"):
            out.pop(k, None)
    return out


def alternatives(m: Machine, plan: Plan) -> list[tuple[str, Any]]:
    """(setting, value) pairs worth timing against the plan on this machine."""
    alt: list[tuple[str, Any]] = []
    if m.cores >= 3:
        alt.append(("threads", m.cores - 1))  # a core left to the OS and the server
    if plan.hybrid and m.link_gbps > 0:
        alt += [("pcie_frac", 0.0), ("pcie_frac", 0.5)]
    if plan.settings.get("spec", "off") != "off":
        alt.append(("spec", "off"))
        if plan.settings["spec"] == "draft":
            alt += [("spec_p_min", p) for p in P_MIN]
    return alt


def calibrate(plan: Plan, alts: Sequence[tuple[str, Any]], timer: Timer) -> list[str]:
    """Times the plan (before and after the alternatives: a machine's pace drifts) and each
    alternative; adopts an alternative (into `plan`) only where its median beats the plan's
    slower median by GAIN and its slowest run beats the plan's fastest; of winners of one
    setting (or of speculation: off, or a draft floor) the fastest. Returns the report's
    lines."""
    first = timer(plan.settings)
    results = [(name, value, timer(apply(plan.settings, name, value))) for name, value in alts]
    base = first + (timer(plan.settings) if alts else [])
    mb = max(statistics.median(first), statistics.median(base[len(first) :] or first))
    lines = [
        f"recommended: {statistics.median(base):.1f} tok/s (runs "
        f"{', '.join(f'{r:.1f}' for r in base)}; one greedy sequence, {TIMED_CTX} positions)"
    ]
    best: dict[str, tuple[float, str, Any]] = {}  # group → (tok/s, setting, value)
    for name, value, rates in results:
        med = statistics.median(rates)
        wins = med >= GAIN * mb and min(rates) > max(base)
        lines.append(
            f"{name} = {value!r}: {med:.1f} tok/s ({med / mb:.3f}×)"
            + (" — faster" if wins else " — not measurably faster")
        )
        group = "spec" if name.startswith("spec") else name  # speculation off or a floor
        if wins and med > best.get(group, (0.0, "", None))[0]:
            best[group] = (med, name, value)
    for med, name, value in best.values():
        plan.settings = apply(plan.settings, name, value)
        plan.reasons[name] = f"calibrated: {med:.1f} tok/s, {med / mb:.3f}× the recommendation"
    return lines


# -- output -------------------------------------------------------------------------------------


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return repr(v)


def render(plan: Plan, m: Machine, extra: Sequence[str] = ()) -> str:
    head = [
        "# Strata config written by `strata setup` "
        + time.strftime("%Y-%m-%d %H:%M", time.localtime()),
        f"# machine: {m.cores} physical cores ({m.isa}), {m.ram_available / GIB:.1f} GiB RAM "
        f"available, {m.disk_free / GIB:.0f} GiB free on disk"
        + (f", {m.gpu} ({m.vram_free / GIB:.1f} GiB free" if m.gpu else "")
        + (f", link {m.link_gbps:.1f} GB/s)" if m.gpu and m.link_gbps else ")" if m.gpu else ""),
        "# run: STRATA_CONFIG=this-file python -m strata.server   (or --config this-file)",
        *(f"# note: {n}" for n in plan.notes),
        *(f"# {line}" for line in extra),
        "",
    ]
    body = []
    for k, v in plan.settings.items():
        if k in plan.reasons:
            body.append(f"# {plan.reasons[k]}")
        body.append(f"{k} = {_toml_value(v)}")
    return "\n".join(head + body) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="strata setup", description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("model", help="the GGUF to serve (any shard of a split model)")
    p.add_argument("-o", "--out", default="strata.toml", help="the config to write")
    p.add_argument("--parallel", type=int, default=0, help="slots (default: chosen)")
    p.add_argument(
        "--n-ctx",
        type=int,
        default=None,
        help="context of all slots, as llama.cpp's -c (0: the model's training context; "
        "default: chosen)",
    )
    p.add_argument(
        "--draft", default="", help="a draft model's GGUF (the same vocabulary) for speculation"
    )
    p.add_argument("--calibrate", action="store_true", help="time the alternatives, keep wins")
    p.add_argument("--force", action="store_true", help="replace an existing --out file")
    ns = p.parse_args(argv)
    out = Path(ns.out)
    if out.exists() and not ns.force:
        print(f"strata setup: {out} exists (--force replaces it)", file=sys.stderr)
        return 2
    if not out.parent.is_dir():  # before the inspection (and the calibration's minutes)
        print(f"strata setup: {out.parent}: no such folder for --out", file=sys.stderr)
        return 2
    if ns.parallel < 0 or (ns.n_ctx or 0) < 0:
        print("strata setup: --parallel and --n-ctx must be >= 0", file=sys.stderr)
        return 2
    # absolute: the config is read from wherever the server starts
    path = Path(ns.model).absolute()
    try:
        if not path.is_file():
            raise ConfigError(f"model {ns.model}: no such file")
        draft = str(Path(ns.draft).absolute()) if ns.draft else ""
        if draft:
            if not Path(draft).is_file():
                raise ConfigError(f"draft model {ns.draft}: no such file")
            check_draft(draft, str(path))
        facts = inspect_model(path)
        machine = inspect_machine(path.parent)
        n_ctx = ns.n_ctx or 0
        if ns.n_ctx == 0:  # llama.cpp's -c 0: the training context, for all slots together
            if not facts.n_ctx_train:
                raise ConfigError("--n-ctx 0 asks for the training context; the file gives none")
            n_ctx = facts.n_ctx_train
        plan = recommend(machine, facts, ns.parallel, n_ctx, draft or shipped_draft(path))
        Config.load(plan.settings, env={})  # every value a valid setting
        extra: list[str] = []
        if ns.calibrate:
            extra = calibrate(plan, alternatives(machine, plan), decode_rates)
            Config.load(plan.settings, env={})
    except StrataError as e:
        print(f"strata setup: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("strata setup: interrupted; nothing written", file=sys.stderr)
        return 130
    text = render(plan, machine, extra)
    out.write_text(text)
    sys.stdout.write(text)
    print(f"\nwrote {out}", file=sys.stderr)
    return 0
