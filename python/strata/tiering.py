"""The RAM tier as the engine uses it: open it from the settings, start the fill, and report
its state for `/metrics` and `/v1/status`.

The model (`strata.llm.LLM`) calls `open_tier(config, path)` at load, keeps the tier and the
fill handle, feeds its router's picks to a `RoutingCounters`, and merges `tier_stats` into its
`stats()` and `tier_info` into its `info()["tiers"]` (see `strata.engine.backend.LLMBackend`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from strata._core import ExpertTier, FillHandle, HybridCounters, Profile, RoutingCounters
from strata.config import DEFAULT_FILL_THREADS, Config

GIB = float(1 << 30)


def open_tier(
    config: Config, model: str | Path, start_fill: bool = True
) -> tuple[ExpertTier, FillHandle | None]:
    """The tier of `model` in `config.ram_mode` (budget: `ram_budget_gib`), ordered by
    `config.profile` when set (a profile for another model raises ProfileMismatchError).
    With `start_fill`, the fill threads start at once (hottest experts first) and run in the
    background: `resident`/`budget` copy into the arena; `mmap` with a profile prefaults the
    hot set (`ram_budget_gib` GiB of it, all when 0); `mmap` without a profile starts none."""
    profile = Profile.load(config.profile, model) if config.profile else None
    tier = ExpertTier(model, config.ram_mode, config.ram_budget_gib, profile, lock=True)
    if not start_fill or (config.ram_mode == "mmap" and profile is None):
        return tier, None
    limit = int(config.ram_budget_gib * GIB) if config.ram_mode == "mmap" else 0
    handle = tier.fill(threads=config.fill_threads or DEFAULT_FILL_THREADS, limit_bytes=limit)
    return tier, handle


def readahead_threads(config: Config) -> int:
    """Prefetch threads the model gets for read-ahead (0: off). `auto` reads ahead in budget
    mode only: in mmap mode the page cache usually holds the model, and a resident tier has
    nothing mapped."""
    on = config.readahead == "on" or (config.readahead == "auto" and config.ram_mode == "budget")
    return config.readahead_threads if on and config.ram_mode != "resident" else 0


def tier_stats(
    tier: ExpertTier, fill: FillHandle | None = None, readahead: dict[str, int] | None = None
) -> dict[str, float]:
    """Counters (`_total`) and gauges for `/metrics`, without the `strata_` prefix. The
    `tier_*_hits_total` count the pool's expert reads from the arena (resident) or the
    mapping: one per expert a layer runs in a step, whatever the number of its tokens (the
    VRAM tier's `expert_hits_total` counts routed token-expert pairs). `readahead` is
    `Model.readahead_stats()` (None: off)."""
    u = tier.uses()
    n, b = tier.resident()
    out = {
        "tier_resident_hits_total": float(u["resident_hits"]),
        "tier_mapped_hits_total": float(u["mapped_hits"]),
        "tier_resident_read_bytes_total": float(u["resident_bytes"]),
        "tier_mapped_read_bytes_total": float(u["mapped_bytes"]),
        "tier_resident_experts": float(n),
        "tier_resident_bytes": float(b),
        "tier_arena_bytes": float(tier.arena_bytes),
    }
    if fill is not None:
        p = fill.progress()
        out["tier_fill_done_bytes"] = float(p["done_bytes"])
        out["tier_fill_total_bytes"] = float(p["total_bytes"])
    if readahead is not None:
        for k in ("hits", "late", "misses", "queued", "dropped", "cancelled"):
            out[f"tier_prefetch_{k}_total"] = float(readahead[k])
        out["tier_prefetch_read_bytes_total"] = float(readahead["bytes"])
    return out


def tier_info(
    tier: ExpertTier,
    counters: RoutingCounters | None = None,
    fill: FillHandle | None = None,
    top: int = 4,
    readahead: dict[str, int] | None = None,
) -> dict[str, Any]:
    """The tier state for `/v1/status`: mode, arena, locking, warnings, fill progress, the
    read-ahead's counts (`readahead`, None when off), the `top` most-routed experts of
    each layer (decayed counts) and the heat map (`tier_heat`)."""
    n, b = tier.resident()
    d: dict[str, Any] = {
        "ram_mode": tier.mode,
        "fingerprint": tier.fingerprint,
        "experts": tier.n_layer * tier.n_expert,
        "expert_gib": round(tier.total_bytes / GIB, 3),
        "resident_experts": n,
        "resident_gib": round(b / GIB, 3),
        "arena_gib": round(tier.arena_bytes / GIB, 3),
        "locked": tier.locked,
        "warnings": tier.warnings,
    }
    if fill is not None:
        p = fill.progress()
        d["fill"] = {k: p[k] for k in ("done_bytes", "total_bytes", "finished", "cancelled")}
    d["readahead"] = None
    if readahead is not None:
        used = readahead["hits"] + readahead["late"] + readahead["misses"]
        d["readahead"] = {
            **readahead,
            "hit_rate": round(readahead["hits"] / used, 4) if used else None,
        }
    if counters is not None:
        d["top_experts"] = [
            [[e, round(c, 2)] for e, c in counters.top_k(layer, top)]
            for layer in range(counters.n_layer)
        ]
        d["heat"] = tier_heat(tier, counters)
    return d


def tier_heat(tier: ExpertTier, counters: RoutingCounters) -> dict[str, list[list[int]]]:
    """The per-layer heat map the web page draws, small enough to send every second:
    `routing` [n_layer][n_expert], each layer's decayed routing counts scaled to 0..255 of its
    most-routed expert (a layer never routed is all 0); `resident` [n_layer][n_expert] is
    `tier.table()`: 1 resident in the RAM arena, 0 mapped, 255 a layer without experts."""
    snap = np.asarray(counters.snapshot(), dtype=np.float64)  # [n_layer, n_expert]
    peak = snap.max(axis=1, keepdims=True)  # [n_layer, 1]
    scaled = np.rint(255.0 * snap / np.where(peak > 0, peak, 1.0))  # [n_layer, n_expert]
    return {
        "routing": scaled.astype(np.int64).tolist(),
        "resident": np.asarray(tier.table()).astype(np.int64).tolist(),
    }


LabeledStat = tuple[str, dict[str, str], float]


def vram_stats(c: HybridCounters | None) -> list[LabeledStat]:
    """The VRAM tier's counters for `/metrics` (names without the `strata_` prefix): totals
    `expert_hits_total`, `expert_misses_total{by=cpu|pcie}` (what the JSON view's hit rate
    reads), `vram_swaps_total`, `vram_fill_bytes_total`, `vram_pcie_bytes_total`,
    `vram_handoff_bytes_total`, and per layer `vram_layer_hits_total{layer}` and
    `vram_layer_misses_total{layer,by}`. Empty without a VRAM tier (the CPU-only path)."""
    if c is None:
        return []
    s = c.snapshot()
    hits, cpu, pcie = s["hits"], s["miss_cpu"], s["miss_pcie"]
    out: list[LabeledStat] = [
        ("expert_hits_total", {"tier": "vram"}, float(sum(hits))),
        ("expert_misses_total", {"by": "cpu"}, float(sum(cpu))),
        ("expert_misses_total", {"by": "pcie"}, float(sum(pcie))),
        ("vram_swaps_total", {}, float(s["swaps"])),
        ("vram_fill_bytes_total", {}, float(s["fill_bytes"])),
        ("vram_pcie_bytes_total", {}, float(s["pcie_bytes"])),
        ("vram_handoff_bytes_total", {}, float(s["handoff_bytes"])),
    ]
    for layer, (h, m_cpu, m_pcie) in enumerate(zip(hits, cpu, pcie, strict=True)):
        lab = str(layer)
        out.append(("vram_layer_hits_total", {"layer": lab}, float(h)))
        out.append(("vram_layer_misses_total", {"layer": lab, "by": "cpu"}, float(m_cpu)))
        out.append(("vram_layer_misses_total", {"layer": lab, "by": "pcie"}, float(m_pcie)))
    return out


def stage_stats(stages: list[dict[str, Any]]) -> list[LabeledStat]:
    """The layer split's stages for `/metrics` (`Model.stages()`, docs/PROTOCOL.md), labeled
    by `stage` and `device`: `stage_compute_seconds_total` (host-seen time with a window on
    the stage), `stage_windows_total`, `stage_gaps_total`, `stage_swaps_total` (its VRAM
    tier's), `stage_swap_bytes_total` (the tier's swaps onto its device) and the gauge
    `stage_busy` (1 while a window is on it); where there are stages to pass between, also
    `stage_waiting_seconds_total` (a window waiting to enter it), `stage_copying_seconds_total`
    (device time of the activation hops into it), `stage_hop_bytes_total` (activations
    hopping in) and `stage_windows_beside_total` (windows whose part there ran beside another
    window's part on another stage, pipelined in the hybrid mode), which one stage never
    fills. Unlabeled, the model's gauge
    `pipeline_windows_in_flight` (windows launched and not yet settled). Empty on the CPU
    path."""
    out: list[LabeledStat] = []
    if stages:
        out.append(("pipeline_windows_in_flight", {}, float(stages[0]["windows_in_flight"])))
    keys = [
        ("stage_compute_seconds_total", "compute_s"),
        ("stage_windows_total", "windows"),
        ("stage_gaps_total", "gaps"),
        ("stage_swaps_total", "swaps"),
        ("stage_swap_bytes_total", "swap_bytes"),
    ]
    if len(stages) > 1:
        keys += [
            ("stage_waiting_seconds_total", "waiting_s"),
            ("stage_copying_seconds_total", "copying_s"),
            ("stage_hop_bytes_total", "hop_bytes"),
            ("stage_windows_beside_total", "beside"),
        ]
    for i, s in enumerate(stages):
        lab = {"stage": str(i), "device": str(s["device"])}
        out += [(name, lab, float(s[key])) for name, key in keys]
        out.append(("stage_busy", lab, 1.0 if s["busy"] else 0.0))
    return out


def _rate(num: int, den: int) -> float | None:
    return round(num / den, 6) if den > 0 else None


def vram_info(c: HybridCounters | None, plan: dict[str, Any] | None = None) -> dict[str, Any]:
    """The VRAM tier for `/v1/status`: hit rate in total and per layer, PCIe share of the
    misses, swaps and bytes moved, and the slot plan when given. `{"enabled": False}` on the
    CPU-only path."""
    if c is None:
        return {"enabled": False}
    s = c.snapshot()
    hits, cpu, pcie = s["hits"], s["miss_cpu"], s["miss_pcie"]
    h, mc, mp = sum(hits), sum(cpu), sum(pcie)
    d: dict[str, Any] = {
        "enabled": True,
        "hit_rate": _rate(h, h + mc + mp),
        "pcie_share": _rate(mp, mc + mp),
        "hits": h,
        "misses_cpu": mc,
        "misses_pcie": mp,
        "swaps": s["swaps"],
        "fill_bytes": s["fill_bytes"],
        "pcie_bytes": s["pcie_bytes"],
        "layer_hit_rate": [_rate(a, a + b + p) for a, b, p in zip(hits, cpu, pcie, strict=True)],
    }
    if plan is not None:
        d["plan"] = plan
    return d
