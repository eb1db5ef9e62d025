"""The RAM tier as the engine uses it: open it from the settings, start the fill, and report
its state for `/metrics` and `/v1/status`.

The model (`strata.llm.LLM`) calls `open_tier(config, path)` at load, keeps the tier and the
fill handle, feeds its router's picks to a `RoutingCounters`, and merges `tier_stats` into its
`stats()` and `tier_info` into its `info()["tiers"]` (see `strata.engine.backend.LLMBackend`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from strata._core import ExpertTier, FillHandle, Profile, RoutingCounters
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
    """Counters (`_total`) and gauges for `/metrics`, without the `strata_` prefix.
    `readahead` is `Model.readahead_stats()` (None: off)."""
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
    read-ahead's counts (`readahead`, None when off) and the `top` most-routed experts of
    each layer (decayed counts)."""
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
    return d
